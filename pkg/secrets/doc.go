// Package secrets resolves secret references and keeps resolved values out of
// logs, errors and output.
//
// Messages and database rows carry references, never values. A reference
// names a backend and a location:
//
//	vault:<mount>/<path>[#<field>]   Vault KV v2 (vault-client-go)
//	env:<NAME>                       an environment variable of the service,
//	                                 only names with the configured prefix
//	file:<path>[#<field>]            a file under the configured root directory
//
// [ParseRef] validates a reference, a [Resolver] turns it into a [Value], and
// every resolved value is registered with a [Redactor], which masks it (and
// its base64, URL and JSON encodings, and each line of a multi-line value)
// in any text or stream passed through it. A Value prints as [Redacted] in
// every format (fmt, JSON, text, zerolog) and is read only through
// [Value.Bytes] or [Value.Reveal]; [Value.Wipe] zeroes it.
//
// Errors never contain a value or a Vault token: Vault errors are rebuilt
// from the status code and Vault's own error list, never from
// vault-client-go's error (which holds the request and its token header).
// [IsBadRef] tells an input error (do not retry) from [IsUnavailable], a
// transient backend failure.
//
// The syntax, configuration and security rules are documented in
// docs/secrets.md.
package secrets
