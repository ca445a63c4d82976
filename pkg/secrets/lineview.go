package secrets

import (
	"bytes"
	"sort"
)

// lineView is a text without its line breaks: every "\n" or "\r\n", their
// escaped forms (the two bytes `\n`, `\r\n`, `\u000a`, `\u000d\u000a`,
// as a JSON string or a Python repr shows a break, escaped once more as in
// JSON inside JSON) and the blanks (spaces, tabs) that follow them are left
// out, so that a secret split over lines (wrapped output, an indented YAML
// block, a folded log line, a value a play printed in two parts) reads as
// one. Patterns are joined the same way (joinLines), so a
// multi-line secret matches however its lines are indented.
type lineView struct {
	text []byte     // the view
	cuts []viewJump // where bytes were left out, by view index
	n    int        // length of the original text
}

// viewJump says that before the view byte at, skip bytes of the original
// were left out in total.
type viewJump struct{ at, skip int }

func newLineView(text []byte) lineView {
	if !mayBreak(text) {
		return lineView{text: text, n: len(text)}
	}
	v := lineView{text: make([]byte, 0, len(text)), n: len(text)}
	skip := 0
	for i := 0; i < len(text); {
		brk := lineBreakLen(text, i)
		if brk == 0 {
			v.text = append(v.text, text[i])
			i++
			continue
		}
		skip += brk
		i += brk
		v.cuts = append(v.cuts, viewJump{at: len(v.text), skip: skip})
	}
	return v
}

// mayBreak reports whether text may hold a line break, raw or escaped.
func mayBreak(text []byte) bool {
	return bytes.IndexByte(text, '\n') >= 0 || bytes.IndexByte(text, '\\') >= 0
}

// escapedBreaks are the escaped line breaks a lineView leaves out, longest
// first: CR LF before LF, each with its backslash doubled (an escape
// escaped again) before the plain one.
var escapedBreaks = [][]byte{
	[]byte(`\\u000d\\u000a`), []byte(`\\u000D\\u000A`), []byte(`\u000d\u000a`), []byte(`\u000D\u000A`),
	[]byte(`\\r\\n`), []byte(`\r\n`),
	[]byte(`\\u000a`), []byte(`\\u000A`), []byte(`\u000a`), []byte(`\u000A`),
	[]byte(`\\n`), []byte(`\n`),
}

// lineBreakLen returns the length of the line break at text[i] ("\n" or
// "\r\n", or an escaped one) with the blanks after it, or 0 when there is
// none.
func lineBreakLen(text []byte, i int) int {
	j := i
	switch {
	case text[j] == '\r' && j+1 < len(text) && text[j+1] == '\n':
		j += 2
	case text[j] == '\n':
		j++
	case text[j] == '\\':
		for _, e := range escapedBreaks {
			if bytes.HasPrefix(text[j:], e) {
				j += len(e)
				break
			}
		}
		if j == i {
			return 0
		}
	default:
		return 0
	}
	for j < len(text) && (text[j] == ' ' || text[j] == '\t') {
		j++
	}
	return j - i
}

// joinLines returns p without its line breaks, as a lineView shows text.
func joinLines(p []byte) []byte {
	if !mayBreak(p) {
		return p
	}
	return newLineView(p).text
}

// orig returns the index in the original text of the view byte i.
func (v lineView) orig(i int) int { return viewToText(v.cuts, i) }

// viewToText returns the index in a text of the byte at index i of its
// view, given where the view skipped line breaks.
func viewToText(jumps []viewJump, i int) int {
	k := sort.Search(len(jumps), func(k int) bool { return jumps[k].at > i })
	if k == 0 {
		return i
	}
	return i + jumps[k-1].skip
}
