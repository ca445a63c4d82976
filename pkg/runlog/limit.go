package runlog

import (
	"bytes"
	"fmt"
	"io"
)

// DefaultMaxBytes is the default limit of a stored log: 16 MiB.
const DefaultMaxBytes = 16 << 20

// capture reads r to its end and returns its content, or, when it is longer
// than limit, its first and last limit/2 bytes joined by a marker line
// saying how much was left out.
func capture(r io.Reader, limit int64) (data []byte, truncated bool, err error) {
	if limit <= 0 {
		limit = DefaultMaxBytes
	}
	half := int(limit / 2)
	var head bytes.Buffer
	n, err := io.CopyN(&head, r, limit)
	if err == io.EOF {
		return head.Bytes(), false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read run output: %w", err)
	}
	// Longer than the limit: keep the head's first half, and a ring of the
	// last half of everything after it.
	tail := newRing(int(limit) - half)
	_, _ = tail.Write(head.Bytes()[half:])
	m, err := io.Copy(tail, r)
	if err != nil {
		return nil, false, fmt.Errorf("read run output: %w", err)
	}
	total := n + m
	kept := tail.Bytes()
	skipped := total - int64(half) - int64(len(kept))
	if skipped <= 0 { // exactly at the limit
		return append(head.Bytes()[:half:half], kept...), false, nil
	}
	out := make([]byte, 0, half+len(kept)+80)
	out = append(out, head.Bytes()[:half]...)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	out = fmt.Appendf(out, "[... %d bytes of output left out: the log keeps its first and last %d bytes ...]\n", skipped, half)
	out = append(out, kept...)
	return out, true, nil
}

// ring keeps the last size bytes written to it.
type ring struct {
	buf  []byte
	size int
	full bool
	pos  int
}

func newRing(size int) *ring { return &ring{buf: make([]byte, size), size: size} }

func (r *ring) Write(p []byte) (int, error) {
	n := len(p)
	if r.size == 0 {
		return n, nil
	}
	if len(p) >= r.size {
		copy(r.buf, p[len(p)-r.size:])
		r.pos, r.full = 0, true
		return n, nil
	}
	c := copy(r.buf[r.pos:], p)
	if c < len(p) {
		copy(r.buf, p[c:])
		r.full = true
	}
	r.pos = (r.pos + len(p)) % r.size
	if r.pos == 0 && len(p) > 0 {
		r.full = true
	}
	return n, nil
}

// Bytes returns the kept bytes in order.
func (r *ring) Bytes() []byte {
	if !r.full {
		return append([]byte(nil), r.buf[:r.pos]...)
	}
	out := make([]byte, 0, r.size)
	out = append(out, r.buf[r.pos:]...)
	return append(out, r.buf[:r.pos]...)
}
