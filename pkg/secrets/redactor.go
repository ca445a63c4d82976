package secrets

import (
	"sync"
	"sync/atomic"
)

// Redactor masks registered secrets in text. It is safe for concurrent use.
//
// For every secret it masks the secret itself and its encodings: base64
// (standard and URL alphabets, padded or not, at the three byte offsets at
// which the secret can sit in a longer encoded stream, as GitHub's runner
// does), URL query and path escapes, JSON string escapes, and each line of a
// multi-line secret. Secrets, lines and encoded forms shorter than
// [MinSecretLength] are not registered.
//
// A child Redactor ([Redactor.Child]), one per run, masks its parent's
// secrets (including those the parent learns later) and its own; its own are
// dropped with [Redactor.Release] when the run ends.
type Redactor struct {
	parent *Redactor

	mu       sync.Mutex
	secrets  map[string]int // registered secret -> number of Add calls
	released bool
	m        atomic.Pointer[matcher] // nil when secrets changed since the last build
}

// NewRedactor returns an empty root Redactor.
func NewRedactor() *Redactor {
	return &Redactor{secrets: make(map[string]int)}
}

// Child returns a Redactor that masks r's secrets and its own.
func (r *Redactor) Child() *Redactor {
	c := NewRedactor()
	c.parent = r
	return c
}

// Add registers secret (the bytes are copied). It reports false, and
// registers nothing, when the secret is shorter than MinSecretLength or r
// was released.
func (r *Redactor) Add(secret []byte) bool {
	if len(secret) < MinSecretLength {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.released {
		return false
	}
	r.secrets[string(secret)]++
	r.m.Store(nil)
	return true
}

// AddString registers secret; see [Redactor.Add].
func (r *Redactor) AddString(secret string) bool { return r.Add([]byte(secret)) }

// AddValue registers the bytes of v; see [Redactor.Add].
func (r *Redactor) AddValue(v Value) bool { return r.Add(v.Bytes()) }

// Remove undoes one Add of secret (for example an expired Vault token);
// the secret stays masked while other Adds of it remain.
func (r *Redactor) Remove(secret []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.secrets[string(secret)]
	if !ok {
		return
	}
	if n <= 1 {
		delete(r.secrets, string(secret))
	} else {
		r.secrets[string(secret)] = n - 1
	}
	r.m.Store(nil)
}

// Len returns the number of secrets registered with r and its parents.
func (r *Redactor) Len() int {
	n := 0
	for x := r; x != nil; x = x.parent {
		x.mu.Lock()
		n += len(x.secrets)
		x.mu.Unlock()
	}
	return n
}

// Release drops r's own secrets and refuses new ones; the parent's secrets
// are untouched and still masked by r. Call it when the run that owns a
// child Redactor ends.
func (r *Redactor) Release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.released = true
	clear(r.secrets)
	r.m.Store(nil)
}

// matcher returns r's own matcher (nil when r holds no secret), building it
// when the secrets changed.
func (r *Redactor) matcher() *matcher {
	if m := r.m.Load(); m != nil {
		return m
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := r.m.Load(); m != nil {
		return m
	}
	var patterns [][]byte
	for s := range r.secrets {
		patterns = append(patterns, variants([]byte(s))...)
	}
	m := newMatcher(patterns)
	r.m.Store(m)
	return m
}

// spans returns the merged ranges of text to mask, from r and its parents.
func (r *Redactor) spans(text []byte) []span {
	var spans []span
	levels := 0
	for x := r; x != nil; x = x.parent {
		m := x.matcher()
		if m.maxLen == 0 {
			continue
		}
		spans = m.find(text, spans)
		levels++
	}
	if levels > 1 {
		spans = mergeSpans(spans)
	}
	return spans
}

// holdback returns how many trailing bytes a stream must keep back so that
// no single-line pattern can straddle two writes.
func (r *Redactor) holdback() int {
	h := 0
	for x := r; x != nil; x = x.parent {
		if m := x.matcher(); m.maxSingleLine-1 > h {
			h = m.maxSingleLine - 1
		}
	}
	return h
}

// Redact returns text with every registered secret (and encoding) replaced
// by [Redacted]. When nothing matches it returns text itself, not a copy.
func (r *Redactor) Redact(text []byte) []byte {
	spans := r.spans(text)
	if len(spans) == 0 {
		return text
	}
	return applySpans(make([]byte, 0, len(text)), text, spans)
}

// RedactString is [Redactor.Redact] for strings.
func (r *Redactor) RedactString(text string) string {
	b := []byte(text)
	spans := r.spans(b)
	if len(spans) == 0 {
		return text
	}
	return string(applySpans(make([]byte, 0, len(b)), b, spans))
}

// applySpans appends text to dst with each span replaced by Redacted.
func applySpans(dst, text []byte, spans []span) []byte {
	prev := 0
	for _, sp := range spans {
		dst = append(dst, text[prev:sp.start]...)
		dst = append(dst, Redacted...)
		prev = sp.end
	}
	return append(dst, text[prev:]...)
}
