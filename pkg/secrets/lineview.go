package secrets

import (
	"bytes"
	"sort"
)

// lineView is a text without its line breaks: every "\n" or "\r\n" and the
// blanks (spaces, tabs) that follow it are left out, so that a secret split
// over lines (wrapped output, an indented YAML block, a folded log line)
// reads as one. Patterns are joined the same way (joinLines), so a
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
	if bytes.IndexByte(text, '\n') < 0 {
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

// lineBreakLen returns the length of the line break at text[i] ("\n" or
// "\r\n") with the blanks after it, or 0 when there is none.
func lineBreakLen(text []byte, i int) int {
	j := i
	if text[j] == '\r' && j+1 < len(text) && text[j+1] == '\n' {
		j++
	}
	if text[j] != '\n' {
		return 0
	}
	j++
	for j < len(text) && (text[j] == ' ' || text[j] == '\t') {
		j++
	}
	return j - i
}

// joinLines returns p without its line breaks, as a lineView shows text.
func joinLines(p []byte) []byte {
	if bytes.IndexByte(p, '\n') < 0 {
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
