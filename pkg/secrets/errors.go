package secrets

import (
	"errors"
	"fmt"
	"strings"
)

// Kinds of resolution failure. Every error this package returns from
// resolution wraps exactly one of them; test with errors.Is, or with
// [IsBadRef] and [IsUnavailable].
var (
	// ErrBadRef: the reference is malformed, or names something the
	// configuration forbids (an env: name without the prefix, a file
	// outside the root). An input error: never retry it.
	ErrBadRef = errors.New("bad secret reference")
	// ErrNotFound: the reference is valid but nothing is there (Vault 404,
	// an unset variable, a missing file or field). Retrying the same
	// reference will not help until someone stores the secret.
	ErrNotFound = errors.New("secret not found")
	// ErrPermission: the backend refused (Vault 403, invalid credentials,
	// a file the service may not read).
	ErrPermission = errors.New("secret access denied")
	// ErrUnavailable: the backend could not answer (network error,
	// timeout, Vault 5xx, 429, sealed). Transient: retry later.
	ErrUnavailable = errors.New("secret backend unavailable")
	// ErrDisabled: the reference's backend is not configured.
	ErrDisabled = errors.New("secret backend not configured")
	// ErrTooLarge: the secret is larger than its consumer can take (a file
	// over MaxFileSize, a value over ResolverOptions.MaxValueSize). Never
	// retried: the same secret is as large next time.
	ErrTooLarge = errors.New("secret too large")
)

// IsBadRef reports whether err is an input error that must not be retried.
func IsBadRef(err error) bool { return errors.Is(err, ErrBadRef) }

// IsUnavailable reports whether err is a transient backend failure that
// may succeed when retried.
func IsUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }

// Error is a failure to parse or resolve a secret reference. Its text holds
// the reference (never a value) and a detail written by this package.
type Error struct {
	// Ref is the reference in its tidy form (see [Ref.String]); empty when
	// the input did not parse.
	Ref string
	// Kind is one of ErrBadRef, ErrNotFound, ErrPermission,
	// ErrUnavailable, ErrDisabled, ErrTooLarge.
	Kind error
	// Detail says what went wrong, in words of this package.
	Detail string
	// Err is the underlying cause when it is safe to expose (never an
	// error from vault-client-go, which carries the request and its token).
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Ref != "" {
		b.WriteString("secret ")
		b.WriteString(e.Ref)
		b.WriteString(": ")
	}
	if e.Kind != nil {
		b.WriteString(e.Kind.Error())
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns the kind and the cause, for errors.Is and errors.As.
func (e *Error) Unwrap() []error {
	errs := make([]error, 0, 2)
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

func badRef(format string, args ...any) *Error {
	return &Error{Kind: ErrBadRef, Detail: fmt.Sprintf(format, args...)}
}

// VaultError is a Vault response outside 2xx, rebuilt from the status code
// and Vault's "errors" list only: the request (and its token header) that
// vault-client-go keeps in its own error is never kept or printed.
type VaultError struct {
	// Op is what was attempted ("read secret/data/app", "approle login").
	Op string
	// Status is the HTTP status code.
	Status int
	// Errors is Vault's "errors" list (each entry cut to 200 bytes).
	Errors []string
}

func (e *VaultError) Error() string {
	msg := fmt.Sprintf("vault %s: status %d", e.Op, e.Status)
	if len(e.Errors) > 0 {
		msg += ": " + strings.Join(e.Errors, "; ")
	}
	return msg
}
