package ansible

import (
	"strings"
	"sync"
	"unicode/utf8"
)

// maxOutputLine caps how much of one output line is read (and redacted as a
// whole) before it is cut for the tail.
const maxOutputLine = 64 * 1024

// tail keeps the last lines of the output, redacted, within a line and a
// byte budget. Lines are redacted whole before they are cut, so a cut never
// leaves part of a secret behind.
type tail struct {
	mu       sync.Mutex
	redact   func(string) string
	maxLines int
	maxBytes int
	maxLine  int
	lines    []string // ring
	start    int
	bytes    int
}

func newTail(maxLines, maxBytes int, redact func(string) string) *tail {
	maxLine := maxBytes / 4
	if maxLine > 4096 {
		maxLine = 4096
	}
	if maxLine < 80 {
		maxLine = 80
	}
	return &tail{redact: redact, maxLines: maxLines, maxBytes: maxBytes, maxLine: maxLine}
}

// add appends one line (long: it was cut at maxOutputLine) and returns it
// redacted, in valid UTF-8, before the tail's own cut.
func (t *tail) add(raw []byte, long bool) string {
	full := strings.ToValidUTF8(t.redact(string(raw)), "\uFFFD")
	line := full
	if long || len(line) > t.maxLine {
		line = cutUTF8(line, t.maxLine) + " …[cut]"
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) < t.maxLines {
		t.lines = append(t.lines, line)
	} else {
		t.bytes -= len(t.lines[t.start]) + 1
		t.lines[t.start] = line
		t.start = (t.start + 1) % len(t.lines)
	}
	t.bytes += len(line) + 1
	for t.bytes > t.maxBytes && len(t.lines) > 1 {
		t.dropOldest()
	}
	return full
}

func (t *tail) dropOldest() {
	// Rotate the ring into order, then drop the first line.
	ordered := append(t.lines[t.start:len(t.lines):len(t.lines)], t.lines[:t.start]...)
	t.bytes -= len(ordered[0]) + 1
	t.lines = append(t.lines[:0:0], ordered[1:]...)
	t.start = 0
}

// String returns the kept lines, oldest first, redacted once more as a
// whole (for secrets spanning lines).
func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var b strings.Builder
	for i := range t.lines {
		b.WriteString(t.lines[(t.start+i)%len(t.lines)])
		b.WriteByte('\n')
	}
	return t.redact(b.String())
}

// summary returns the line that best says why ansible-playbook failed: the
// last one holding "ERROR!" (Ansible's own errors), else the last non-empty.
func (t *tail) summary() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	last := ""
	for i := len(t.lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(t.lines[(t.start+i)%len(t.lines)])
		if strings.Contains(l, "ERROR!") {
			return l
		}
		if last == "" {
			last = l
		}
	}
	return last
}

// cutUTF8 returns at most n bytes of s without splitting a rune.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
