package messages

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern"
)

// Signed requests (docs/wire-contract.md): a producer may add a second field
// to a stream entry, SigField, holding an HMAC-SHA256 of the entry's data
// under a key the consumer knows by its id. A consumer that requires
// signatures refuses an entry that no known producer signed for that
// stream, so a writer that is not a producer cannot queue work even with
// write access to the stream. The field is optional: unsigned entries stay
// valid for consumers that do not require signatures.

// SigField is the optional field of a stream entry that holds the
// producer's signature of DataField.
const SigField = "sig"

// MinSigningKeyLen is the shortest signing key accepted, in bytes.
const MinSigningKeyLen = 32

// KeyIDPattern is the shape of a signing key's id.
const KeyIDPattern = `^[a-z0-9][a-z0-9._-]{0,63}$`

// SignaturePattern is the shape of a SigField value: "v1:", the key id,
// ":" and the HMAC-SHA256 in base64url without padding (43 characters).
const SignaturePattern = `^v1:[a-z0-9][a-z0-9._-]{0,63}:[A-Za-z0-9_-]{43}$`

var (
	keyIDRE     = pattern.MustCompile(`^[a-z0-9][a-z0-9._-]*$`, 64) // KeyIDPattern
	signatureRE = pattern.MustCompileParts(`^v1:[a-z0-9][a-z0-9._-]*:[A-Za-z0-9_-]{43}$`, ":", 64)
)

// ValidKeyID reports whether id has the shape of a signing key id
// (KeyIDPattern).
func ValidKeyID(id string) bool { return keyIDRE.MatchString(id) }

// StreamEntry is the field set of a stream entry, as producers write it
// with XADD: the message and, optionally, its signature.
type StreamEntry struct {
	// The message, msgpack-encoded (sent as a Redis bulk string).
	Data []byte `msgpack:"data"`
	// The producer's signature of data for this stream:
	// "v1:<key_id>:<base64url HMAC-SHA256>" (see Sign). Absent: unsigned.
	Sig string `msgpack:"sig,omitempty"`
}

// mac is the HMAC-SHA256 under key of a domain label, the stream (so a
// request signed for one queue is refused on another) and the data.
func mac(key []byte, stream string, data []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte("autoprov-sig-v1\x00"))
	h.Write([]byte(stream))
	h.Write([]byte{0})
	h.Write(data)
	return h.Sum(nil)
}

// Sign returns the SigField value signing data, to be appended to stream,
// with the key keyID. The key must be at least MinSigningKeyLen bytes.
func Sign(keyID string, key []byte, stream string, data []byte) (string, error) {
	if !keyIDRE.MatchString(keyID) {
		return "", fmt.Errorf("sign: key id %q: want %s", keyID, KeyIDPattern)
	}
	if len(key) < MinSigningKeyLen {
		return "", fmt.Errorf("sign: key %s is %d bytes, want at least %d", keyID, len(key), MinSigningKeyLen)
	}
	return "v1:" + keyID + ":" + base64.RawURLEncoding.EncodeToString(mac(key, stream, data)), nil
}

// Errors of Verify, wrapped in a *SignatureError.
var (
	// ErrUnsigned: the entry has no signature.
	ErrUnsigned = errors.New("request not signed")
	// ErrBadSignature: the signature is malformed, names an unknown key or
	// a key not allowed on the stream, or does not match the data.
	ErrBadSignature = errors.New("request signature refused")
)

// Dead-letter reasons of a request a consumer refused for its signature
// (infra's REQUEST_SIGNATURES): it has no result and must not be replayed
// as it is (see IsSignatureReason).
const (
	ReasonUnsigned     = "unsigned"      // no signature where one is required
	ReasonBadSignature = "bad_signature" // malformed, unknown key, key not allowed on the stream, or no match
)

// IsSignatureReason reports whether a dead letter's reason says no known
// producer signed its request: replaying it unchanged would be refused
// again, and re-signing it would turn a request nobody vouched for into
// one the replaying operator's key vouches for (autoprov dead replay
// refuses it without --resign and a confirmation).
func IsSignatureReason(reason string) bool {
	return reason == ReasonUnsigned || reason == ReasonBadSignature
}

// SignatureError is a refused (or missing) signature. Its text never holds
// a key.
type SignatureError struct {
	Kind   error // ErrUnsigned or ErrBadSignature
	Detail string
}

func (e *SignatureError) Error() string { return e.Kind.Error() + ": " + e.Detail }

// Unwrap returns the kind.
func (e *SignatureError) Unwrap() error { return e.Kind }

// VerifierKey is a producer's key as a consumer knows it: its id, the key,
// and the streams it may sign for.
type VerifierKey struct {
	ID      string
	Key     []byte
	Streams []string
}

// Verifier checks the signatures of entries against known producer keys.
// It is safe for concurrent use.
type Verifier struct {
	keys map[string]VerifierKey
}

// NewVerifier returns a Verifier for keys, checking their ids, lengths and
// streams.
func NewVerifier(keys ...VerifierKey) (*Verifier, error) {
	v := &Verifier{keys: make(map[string]VerifierKey, len(keys))}
	var errs []error
	for _, k := range keys {
		switch {
		case !keyIDRE.MatchString(k.ID):
			errs = append(errs, fmt.Errorf("signing key id %q: want %s", k.ID, KeyIDPattern))
		case len(k.Key) < MinSigningKeyLen:
			errs = append(errs, fmt.Errorf("signing key %s: %d bytes, want at least %d", k.ID, len(k.Key), MinSigningKeyLen))
		case len(k.Streams) == 0:
			errs = append(errs, fmt.Errorf("signing key %s: no stream it may sign for", k.ID))
		default:
			if _, dup := v.keys[k.ID]; dup {
				errs = append(errs, fmt.Errorf("signing key %s: listed twice", k.ID))
			}
			v.keys[k.ID] = VerifierKey{ID: k.ID, Key: slices.Clone(k.Key), Streams: slices.Clone(k.Streams)}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return v, nil
}

// Verify checks sig (the entry's SigField, "" when absent) against data
// appended to stream and returns the id of the key that signed it. The
// error is a *SignatureError wrapping ErrUnsigned or ErrBadSignature.
func (v *Verifier) Verify(stream string, data []byte, sig string) (string, error) {
	bad := func(format string, args ...any) (string, error) {
		return "", &SignatureError{Kind: ErrBadSignature, Detail: fmt.Sprintf(format, args...)}
	}
	if sig == "" {
		return "", &SignatureError{Kind: ErrUnsigned, Detail: "the entry has no " + SigField + " field"}
	}
	if !signatureRE.MatchString(sig) {
		return bad("malformed (want %s)", SignaturePattern)
	}
	rest := strings.TrimPrefix(sig, "v1:")
	id, enc, _ := strings.Cut(rest, ":")
	k, ok := v.keys[id]
	if !ok {
		return bad("unknown key %s", id)
	}
	if !slices.Contains(k.Streams, stream) {
		return bad("key %s may not sign for %s", id, stream)
	}
	got, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return bad("malformed")
	}
	if !hmac.Equal(got, mac(k.Key, stream, data)) {
		return bad("key %s: signature does not match the data", id)
	}
	return id, nil
}
