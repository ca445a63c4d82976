// Package webhooks delivers the deployer's webhooks: a signed POST of a
// deployment's final state to the callback_url its request gave.
//
// Deliveries wait in a durable queue in Postgres (webhook_deliveries), so
// they survive a restart of the deployer; any replica delivers them, with
// retries and exponential backoff for a bounded time, and every attempt is
// recorded (webhook_attempts) and visible through the API.
//
// Outbound requests go through a Guard that checks the address each
// connection is about to be made to (after DNS resolution, so a name that
// resolves, or later re-resolves, to a refused address never gets a
// packet): loopback, link-local (cloud metadata included), private and
// other non-public ranges are refused unless an allow-list permits them.
// Proxies and redirects are never followed.
//
// # Signatures
//
// Each request carries the Autoprov-Signature of pkg/hmacsig, computed
// with the API key's webhook secret (DeriveSecret). Receivers recompute
// it, compare in constant time, and refuse timestamps too far from their
// clock (replays). docs/webhooks.md shows how, in Python and Go.
package webhooks

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
)

// SecretPrefix starts every webhook secret.
const SecretPrefix = "whsec_"

// DeriveSecret returns the webhook secret of the API key keyID: an HMAC of
// the key id under the deployer's signing key. Secrets are derived, never
// stored; a receiver gets its secret once, when its API key is created.
func DeriveSecret(signingKey []byte, keyID string) string {
	m := hmac.New(sha256.New, signingKey)
	m.Write([]byte("autoprov-webhook-secret:" + keyID))
	return SecretPrefix + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}
