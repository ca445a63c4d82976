package secrets

import (
	"slices"
	"sync"
	"sync/atomic"
)

// Redactor masks registered secrets in text. It is safe for concurrent use.
//
// For every secret it masks the secret itself and its encodings: base64
// (standard and URL alphabets, padded or not, at the three byte offsets at
// which the secret can sit in a longer encoded stream, as GitHub's runner
// does), the URL escapes of Go and Python, the JSON string escapes of Go
// and Python (ensure_ascii too), each of these applied twice, Python's repr
// and ascii() (also inside a JSON string), a multi-line secret with its line
// breaks escaped whichever way (\n, \r\n, \u000a), and each line of a
// multi-line secret; and it finds them also when line breaks, raw or
// escaped (a value printed in two parts inside a JSON string), split them. Secrets, lines and encoded forms shorter than [MinSecretLength] are
// not registered.
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
	rm       atomic.Pointer[matcher] // the patterns reversed (RedactTruncated); nil likewise
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
	r.invalidate()
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
	r.invalidate()
}

// invalidate drops the built matchers; r.mu is held.
func (r *Redactor) invalidate() {
	r.m.Store(nil)
	r.rm.Store(nil)
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
	r.invalidate()
}

// matcher returns r's own matcher (nil when r holds no secret), building it
// when the secrets changed.
func (r *Redactor) matcher() *matcher { return r.build(&r.m, false) }

// reverseMatcher is matcher for the patterns written backwards.
func (r *Redactor) reverseMatcher() *matcher { return r.build(&r.rm, true) }

func (r *Redactor) build(slot *atomic.Pointer[matcher], reverse bool) *matcher {
	if m := slot.Load(); m != nil {
		return m
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := slot.Load(); m != nil {
		return m
	}
	var patterns [][]byte
	for s := range r.secrets {
		for _, p := range variants([]byte(s)) {
			// Patterns are matched against text without its line
			// breaks (lineView), so they are joined the same way.
			p = joinLines(p)
			if len(p) < MinSecretLength {
				continue
			}
			if reverse {
				p = slices.Clone(p)
				slices.Reverse(p)
			}
			patterns = append(patterns, p)
		}
	}
	m := newMatcher(patterns)
	slot.Store(m)
	return m
}

// scan returns the merged ranges of text to mask, from r and its parents,
// and the index from which the end of text may be the start of a secret
// that continues after it (len(text) when no end of text can be).
//
// Text is matched without its line breaks (see lineView): a secret split
// over two lines is masked with the break, as is one whose lines are
// indented differently than they were registered.
func (r *Redactor) scan(text []byte) ([]span, int) {
	var spans []span
	levels, tail := 0, len(text)
	for x := r; x != nil; x = x.parent {
		m := x.matcher()
		if m.maxLen == 0 {
			continue
		}
		var t int
		spans, t = m.find(text, spans)
		tail = min(tail, t)
		levels++
	}
	if levels > 1 {
		spans = mergeSpans(spans)
	}
	return spans, tail
}

// spans returns the merged ranges of text to mask.
func (r *Redactor) spans(text []byte) []span {
	spans, _ := r.scan(text)
	return spans
}

// headPartial returns how many bytes at the start of text may be the end
// of a secret that began before it (0 when none can).
func (r *Redactor) headPartial(text []byte) int {
	v := newLineView(text)
	longest := 0
	for x := r; x != nil; x = x.parent {
		m := x.reverseMatcher()
		if m.maxLen == 0 {
			continue
		}
		// The final state after the reversed start of text is the longest
		// prefix of text that is a pattern's end.
		head := slices.Clone(v.text[:min(len(v.text), m.maxLen)])
		slices.Reverse(head)
		_, t := m.find(head, nil)
		longest = max(longest, len(head)-t)
	}
	if longest == 0 {
		return 0
	}
	return v.orig(longest-1) + 1
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

// RedactTruncated is [Redactor.RedactString] for text cut out of a longer
// one (a message shortened by a producer that knows no secrets): besides
// every registered secret it masks a secret cut in two at the edges, that
// is a start of text that may be the end of a secret (cutStart: text's
// start was cut off) and an end that may be the start of one (cutEnd: its
// end was cut off). Redact first, then shorten further: a cut made after
// redaction cannot leave part of a secret behind.
func (r *Redactor) RedactTruncated(text string, cutStart, cutEnd bool) string {
	b := []byte(text)
	spans, tail := r.scan(b)
	if cutEnd && tail < len(b) {
		spans = mergeSpans(append(spans, span{start: tail, end: len(b)}))
	}
	if cutStart {
		if h := r.headPartial(b); h > 0 {
			spans = mergeSpans(append(spans, span{start: 0, end: h}))
		}
	}
	if len(spans) == 0 {
		return text
	}
	return string(applySpans(make([]byte, 0, len(b)), b, spans))
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
