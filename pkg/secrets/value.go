package secrets

import (
	"fmt"
	"log/slog"

	"github.com/rs/zerolog"
)

// Redacted is what a [Value] prints, and what a [Redactor] writes in place of
// a secret.
const Redacted = "[REDACTED]"

// Value holds a resolved secret. Every way of printing or serialising it
// (fmt verbs, JSON, text, zerolog, slog) yields [Redacted]; the bytes are
// read only through [Value.Bytes] or [Value.Reveal].
//
// Copies of a Value share one buffer, so [Value.Wipe] on any copy zeroes
// the secret for all of them. The zero Value is empty.
//
// Value implements [encoding.TextUnmarshaler], so configuration structs can
// hold secrets (VAULT_TOKEN, VAULT_SECRET_ID) that print masked.
type Value struct {
	buf *secretBuf
}

type secretBuf struct {
	b []byte
}

// NewValue returns a Value that takes ownership of b: the caller must not
// use b afterwards (Wipe zeroes it).
func NewValue(b []byte) Value {
	return Value{buf: &secretBuf{b: b}}
}

// ValueFromString returns a Value holding a copy of s. The string itself
// cannot be wiped; prefer [NewValue] when the secret arrives as bytes.
func ValueFromString(s string) Value {
	return NewValue([]byte(s))
}

// Bytes returns the secret's buffer itself (not a copy): do not keep it
// beyond the Value's use, and do not modify it. It is nil after Wipe.
func (v Value) Bytes() []byte {
	if v.buf == nil {
		return nil
	}
	return v.buf.b
}

// Reveal returns the secret as a string. The string is a copy that Wipe
// cannot reach: use it only where an API demands a string, and never log it.
func (v Value) Reveal() string {
	return string(v.Bytes())
}

// Len returns the length of the secret in bytes.
func (v Value) Len() int { return len(v.Bytes()) }

// IsZero reports whether the Value is empty (never set, or wiped).
func (v Value) IsZero() bool { return v.Len() == 0 }

// Wipe zeroes the secret's buffer and empties the Value (and every copy of
// it). It is safe to call more than once.
func (v Value) Wipe() {
	if v.buf == nil {
		return
	}
	clear(v.buf.b)
	v.buf.b = nil
}

// String returns [Redacted].
func (v Value) String() string { return Redacted }

// GoString returns [Redacted], for %#v.
func (v Value) GoString() string { return Redacted }

// Format prints [Redacted] for every verb and flag, so no fmt verb
// (%x, %q, %+v, ...) can reach the bytes.
func (v Value) Format(f fmt.State, _ rune) {
	_, _ = f.Write([]byte(Redacted))
}

// MarshalJSON returns the JSON string "[REDACTED]".
func (v Value) MarshalJSON() ([]byte, error) {
	return []byte(`"` + Redacted + `"`), nil
}

// MarshalText returns [Redacted].
func (v Value) MarshalText() ([]byte, error) {
	return []byte(Redacted), nil
}

// UnmarshalText sets the Value from text (a copy is kept), for
// configuration parsers such as caarlos0/env.
func (v *Value) UnmarshalText(text []byte) error {
	b := make([]byte, len(text))
	copy(b, text)
	*v = NewValue(b)
	return nil
}

// MarshalZerologObject writes {"secret":"[REDACTED]"} for
// zerolog's Event.Object and EmbedObject.
func (v Value) MarshalZerologObject(e *zerolog.Event) {
	e.Str("secret", Redacted)
}

// LogValue returns [Redacted] for log/slog.
func (v Value) LogValue() slog.Value {
	return slog.StringValue(Redacted)
}

var (
	_ fmt.Formatter              = Value{}
	_ fmt.GoStringer             = Value{}
	_ zerolog.LogObjectMarshaler = Value{}
	_ slog.LogValuer             = Value{}
)
