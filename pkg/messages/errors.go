package messages

import (
	"errors"
	"fmt"
	"strings"
)

// FieldError is one problem with one value of a message. Field is the wire
// path of the value: a snake_case key ("server_ip"), an element of a list
// ("modules[2]") or a value inside a nested map ("hosts[web1].ok",
// "error.fields[0].field"). Message says what is wrong without repeating the
// value (it could be a secret pasted into the wrong key).
//
// FieldError is also the wire form of the entries of ErrorInfo.Fields.
type FieldError struct {
	// Wire path of the rejected value, e.g. "port" or "modules[2]".
	Field string `msgpack:"field"`
	// What is wrong with the value, for humans.
	Message string `msgpack:"message,omitempty"`
}

// String returns "field: message".
func (f FieldError) String() string {
	if f.Field == "" {
		return f.Message
	}
	return f.Field + ": " + f.Message
}

// MaxFieldErrors is the most field errors a *ValidationError or
// *DecodeError lists (and a rejection publishes); the others are only
// counted, so that a small hostile message (thousands of wrong entries)
// cannot produce a rejection larger than the limit of a message.
const MaxFieldErrors = 20

// ValidationError reports a message that decoded but breaks the contract's
// rules: a required key missing, a value out of range or not matching its
// pattern, an unsupported schema_version. Such a request is rejected, never
// retried.
type ValidationError struct {
	// Fields lists the problems found, in the order of the message's keys:
	// all of them, or the first MaxFieldErrors.
	Fields []FieldError
	// Omitted counts the problems found beyond MaxFieldErrors.
	Omitted int
}

// Error lists the field errors.
func (e *ValidationError) Error() string {
	return "invalid message: " + joinFields(e.Fields, e.Omitted)
}

// DecodeError reports input that is not a message at all: not msgpack, not a
// map, truncated, larger than MaxMessageSize, nested too deeply, followed by
// trailing bytes, or holding values of the wrong type (a string where an
// integer belongs). Such a request is rejected, never retried.
type DecodeError struct {
	// Reason describes what is wrong with the input as a whole; empty when
	// only the types of some values are wrong (see Fields).
	Reason string
	// Fields lists the keys whose values have the wrong msgpack type, or
	// are duplicated, in the order they were met: all of them, or the first
	// MaxFieldErrors.
	Fields []FieldError
	// Omitted counts the problems found beyond MaxFieldErrors.
	Omitted int
	// Err is the underlying msgpack error, if any.
	Err error
}

// Error describes the problem.
func (e *DecodeError) Error() string {
	var b strings.Builder
	b.WriteString("undecodable message")
	if e.Reason != "" {
		b.WriteString(": ")
		b.WriteString(e.Reason)
	}
	if len(e.Fields) > 0 {
		b.WriteString(": ")
		b.WriteString(joinFields(e.Fields, e.Omitted))
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns the underlying msgpack error.
func (e *DecodeError) Unwrap() error { return e.Err }

// IsInvalid reports whether err (or an error it wraps) says the input is
// bad: a *DecodeError or a *ValidationError. Bad input is rejected with a
// result of status rejected and kind invalid_message, and never retried:
// the same bytes fail the same way every time.
func IsInvalid(err error) bool {
	var de *DecodeError
	var ve *ValidationError
	return errors.As(err, &de) || errors.As(err, &ve)
}

// fieldErrors returns the field errors carried by err, if it is (or wraps)
// a *DecodeError or a *ValidationError.
func fieldErrors(err error) []FieldError {
	var de *DecodeError
	if errors.As(err, &de) {
		return de.Fields
	}
	var ve *ValidationError
	if errors.As(err, &ve) {
		return ve.Fields
	}
	return nil
}

func joinFields(fields []FieldError, omitted int) string {
	parts := make([]string, len(fields), len(fields)+1)
	for i, f := range fields {
		parts[i] = f.String()
	}
	if omitted > 0 {
		parts = append(parts, fmt.Sprintf("and %d more", omitted))
	}
	return strings.Join(parts, "; ")
}
