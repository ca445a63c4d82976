package secrets

import (
	"errors"
	"io"
	"sync"
)

// ErrWriterClosed is returned by a redacting writer's Write after Close.
var ErrWriterClosed = errors.New("secrets: write to closed redacting writer")

// NewWriter returns a writer that masks r's secrets in everything written
// through it before passing it on to w, even when a secret is split across
// two Write calls.
//
// The writer passes everything on at once except the end that may be the
// start of a secret (of one of its encodings, or of one split by a line
// break): that end is kept back until more data or Close decides it. Close
// flushes what is kept back; it does not close w. The writer is safe for
// concurrent use.
func (r *Redactor) NewWriter(w io.Writer) io.WriteCloser {
	return &redactWriter{r: r, w: w}
}

type redactWriter struct {
	r *Redactor
	w io.Writer

	mu      sync.Mutex
	pending []byte
	out     []byte
	closed  bool
	err     error // sticky error from w
}

func (rw *redactWriter) Write(p []byte) (int, error) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.closed {
		return 0, ErrWriterClosed
	}
	if rw.err != nil {
		return 0, rw.err
	}
	rw.pending = append(rw.pending, p...)
	if err := rw.flush(false); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Close passes on what is kept back and refuses further writes.
func (rw *redactWriter) Close() error {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.closed {
		return nil
	}
	rw.closed = true
	if rw.err != nil {
		return rw.err
	}
	err := rw.flush(true)
	clear(rw.pending)
	rw.pending = nil
	return err
}

// flush writes the part of pending that no future write can change (all of
// it when final) to w, redacted, and keeps the rest.
func (rw *redactWriter) flush(final bool) error {
	buf := rw.pending
	spans, tail := rw.r.scan(buf)
	cut := len(buf)
	if !final {
		// Keep back the end that may begin a secret (also one that a
		// line break splits), and a known occurrence that crosses the
		// cut, whole: it may be part of a longer secret.
		cut = tail
		for _, sp := range spans {
			if sp.start < cut && sp.end > cut {
				cut = sp.start
				break
			}
		}
	}
	if cut == 0 {
		return nil
	}
	rw.out = rw.out[:0]
	prev := 0
	for _, sp := range spans {
		if sp.start >= cut {
			break
		}
		rw.out = append(rw.out, buf[prev:sp.start]...)
		rw.out = append(rw.out, Redacted...)
		prev = sp.end
	}
	rw.out = append(rw.out, buf[prev:cut]...)
	// Move the kept-back bytes to the front and zero the rest, so the
	// buffer does not hold on to secrets already passed on (masked).
	n := copy(buf, buf[cut:])
	clear(buf[n:])
	rw.pending = buf[:n]
	if _, err := rw.w.Write(rw.out); err != nil {
		rw.err = err
		return err
	}
	return nil
}
