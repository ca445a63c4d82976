package stream

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// DataField is the one field every entry of the system's streams carries: a
// msgpack-encoded message (see package messages).
const DataField = "data"

// DeadLetterSuffix is appended to a stream's name to form its dead-letter
// stream.
const DeadLetterSuffix = ":dead"

// Fields added to a dead-lettered entry next to its original fields.
const (
	DeadFieldReason     = "dead_reason"
	DeadFieldError      = "dead_error"
	DeadFieldStream     = "dead_stream"
	DeadFieldID         = "dead_id"
	DeadFieldGroup      = "dead_group"
	DeadFieldConsumer   = "dead_consumer"
	DeadFieldDeliveries = "dead_deliveries"
	DeadFieldAt         = "dead_at"
)

// Message is one stream entry delivered to a Handler.
type Message struct {
	// Stream is the stream the entry was read from.
	Stream string
	// ID is the entry's id in the stream.
	ID string
	// Values holds the entry's fields as read from Redis (string values).
	Values map[string]any
	// Deliveries counts the deliveries of this entry to the group, this one
	// included: 1 on the first delivery.
	Deliveries int64
	// Pickup is how long the entry waited for this consumer, which had a
	// handler slot for it, before its handler started: from the later of
	// the entry's arrival in the stream (the time in its id, Redis's clock)
	// and the moment the consumer took the slot for it, to the start. The
	// slot is taken by the reader for an entry it reads, by the claim
	// round for an entry claimed or re-read, and at the hand-off for one
	// handed a slot just freed (HandOff). It is the consumer's idle time
	// between runs; the time an entry waited released (Later) is not in it.
	Pickup time.Duration
}

// Data returns the entry's DataField, or nil when it has none.
func (m *Message) Data() []byte {
	switch v := m.Values[DataField].(type) {
	case string:
		return []byte(v)
	case []byte:
		return v
	default:
		return nil
	}
}

// Handler processes one entry. It returns nil once the entry's outcome is
// durable; the runtime then acknowledges the entry. Any other error makes the
// entry eligible for redelivery, except errors wrapped with Permanent, which
// dead-letter it at once.
type Handler interface {
	Handle(ctx context.Context, msg *Message) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, msg *Message) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, msg *Message) error { return f(ctx, msg) }

var (
	// ErrLeaseLost is the cause of a handler's context cancellation when the
	// consumer no longer owns the entry. The handler must publish nothing.
	ErrLeaseLost = errors.New("stream: lease lost: another consumer owns the entry")
	// ErrShutdown is the cause of a handler's context cancellation when the
	// shutdown grace period is over. Its entry is released to other consumers.
	ErrShutdown = errors.New("stream: consumer shutting down")
)

// LeaseLost reports whether ctx was cancelled because the entry's lease was
// lost. A handler checks it before publishing anything.
func LeaseLost(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), ErrLeaseLost)
}

// PermanentError marks a handler error that must not be retried (bad input):
// the entry is dead-lettered at once.
type PermanentError struct {
	// Reason is a short machine-readable reason recorded in the dead-letter
	// entry (for example "invalid_message").
	Reason string
	Err    error
}

// Permanent wraps err so that the entry is dead-lettered without retry.
// Reason is recorded with it; it defaults to "permanent_error".
func Permanent(reason string, err error) error {
	if reason == "" {
		reason = "permanent_error"
	}
	return &PermanentError{Reason: reason, Err: err}
}

func (e *PermanentError) Error() string {
	return fmt.Sprintf("%s: %v", e.Reason, e.Err)
}

func (e *PermanentError) Unwrap() error { return e.Err }

// IsPermanent reports whether err (or an error it wraps) is a PermanentError.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// LaterError asks for the entry to be delivered again after Delay without
// counting this delivery: the entry is not done, but nothing failed either
// (its work is in the hands of another consumer right now, and the entry
// must stay pending until that work's outcome is durable). See Later.
type LaterError struct {
	// Delay is how long the entry stays unclaimable; at most the lease.
	Delay time.Duration
	Err   error
}

// Later wraps err so that the runtime neither acknowledges nor
// dead-letters the entry: it is released for redelivery after delay (capped
// at the lease), and this delivery does not count towards the delivery
// limit. A handler uses it when the entry's outcome is produced elsewhere
// and is not durable yet.
func Later(delay time.Duration, err error) error {
	return &LaterError{Delay: max(delay, 0), Err: err}
}

func (e *LaterError) Error() string {
	return fmt.Sprintf("later (in %s): %v", e.Delay, e.Err)
}

func (e *LaterError) Unwrap() error { return e.Err }
