package secrets

import (
	"bytes"
	"slices"
)

// matcher finds every occurrence of a set of byte patterns in a text,
// overlapping occurrences included, in one pass (Aho-Corasick).
//
// States are numbered breadth-first, so the shallow ones come first. The
// first nDense states (the root, and as many levels below it as fit in
// maxDenseRows) have full 256-entry transition rows, so most text bytes cost
// one table lookup; deeper states keep their few children in a sorted edge
// list and a failure link. A transition's sign bit says whether its target
// state ends a pattern. Memory is a few tens of bytes per pattern byte plus
// at most maxDenseRows KiB of rows.
type matcher struct {
	nDense    int32
	dense     []int32 // nDense rows of 256 transitions; bit 31 set: target has output
	edgeStart []int32 // first edge of the state in edgeByte/edgeTo
	edgeCount []int32
	edgeByte  []byte
	edgeTo    []int32
	fail      []int32
	out       []int32 // length of the longest pattern ending in the state, 0 if none
	depth     []int32 // length of the pattern prefix the state stands for

	maxLen int // longest pattern
}

// maxDenseRows caps the full transition rows (1 KiB each) of a matcher.
const maxDenseRows = 256

const (
	outFlag   = -1 << 31 // bit 31 of a dense transition
	stateMask = 1<<31 - 1
)

// span is a half-open byte range [start, end) of a text to be masked.
type span struct{ start, end int }

// buildNode is a trie node while the matcher is built.
type buildNode struct {
	next  []buildEdge
	depth int
	out   int
}

type buildEdge struct {
	b  byte
	to int32
}

func (n *buildNode) child(b byte) (int32, bool) {
	for _, e := range n.next {
		if e.b == b {
			return e.to, true
		}
	}
	return 0, false
}

// newMatcher builds a matcher for patterns (non-empty byte strings).
func newMatcher(patterns [][]byte) *matcher {
	nodes := []buildNode{{}}
	m := &matcher{}
	for _, p := range patterns {
		if len(p) == 0 {
			continue
		}
		if len(p) > m.maxLen {
			m.maxLen = len(p)
		}
		s := int32(0)
		for _, b := range p {
			t, ok := nodes[s].child(b)
			if !ok {
				t = int32(len(nodes))
				nodes = append(nodes, buildNode{depth: nodes[s].depth + 1})
				nodes[s].next = append(nodes[s].next, buildEdge{b: b, to: t})
			}
			s = t
		}
		nodes[s].out = len(p)
	}
	n := len(nodes)

	// Renumber breadth-first (trie ids -> matcher ids), children in byte
	// order, so a state's id is never below its parent's.
	order := make([]int32, 0, n) // matcher id -> trie id
	id := make([]int32, n)       // trie id -> matcher id
	order = append(order, 0)
	for qi := 0; qi < len(order); qi++ {
		nd := &nodes[order[qi]]
		slices.SortFunc(nd.next, func(a, b buildEdge) int { return int(a.b) - int(b.b) })
		for _, e := range nd.next {
			id[e.to] = int32(len(order))
			order = append(order, e.to)
		}
	}

	m.edgeStart = make([]int32, n)
	m.edgeCount = make([]int32, n)
	m.fail = make([]int32, n)
	m.out = make([]int32, n)
	m.depth = make([]int32, n)
	m.edgeByte = make([]byte, 0, n-1)
	m.edgeTo = make([]int32, 0, n-1)
	for s, old := range order {
		nd := &nodes[old]
		m.edgeStart[s] = int32(len(m.edgeByte))
		m.edgeCount[s] = int32(len(nd.next))
		for _, e := range nd.next {
			m.edgeByte = append(m.edgeByte, e.b)
			m.edgeTo = append(m.edgeTo, id[e.to])
		}
		m.out[s] = int32(nd.out)
		m.depth[s] = int32(nd.depth)
	}

	// Failure links and outputs, in id (breadth-first) order: they depend
	// only on shallower states.
	for s := int32(0); s < int32(n); s++ {
		for i := m.edgeStart[s]; i < m.edgeStart[s]+m.edgeCount[s]; i++ {
			t, b := m.edgeTo[i], m.edgeByte[i]
			if s != 0 {
				f := m.fail[s]
				for {
					if to, ok := m.child(f, b); ok {
						m.fail[t] = to
						break
					}
					if f == 0 {
						break
					}
					f = m.fail[f]
				}
			}
			if o := m.out[m.fail[t]]; o > m.out[t] {
				m.out[t] = o
			}
		}
	}

	// Full rows for the first states, as many levels as fit: a state's row
	// is its failure state's row (shallower, built already) with its own
	// children written over it.
	rows := 1 // whole levels: the root, then depth 1, 2, ... while they fit
	for rows < n {
		end := rows
		for end < n && nodes[order[end]].depth == nodes[order[rows]].depth {
			end++
		}
		if end > maxDenseRows {
			break
		}
		rows = end
	}
	m.nDense = int32(rows)
	m.dense = make([]int32, rows*256)
	for s := 0; s < rows; s++ {
		row := m.dense[s*256 : s*256+256]
		if s > 0 {
			f := int(m.fail[s]) * 256
			copy(row, m.dense[f:f+256])
		}
		for i := m.edgeStart[s]; i < m.edgeStart[s]+m.edgeCount[s]; i++ {
			t := m.edgeTo[i]
			v := t
			if m.out[t] > 0 {
				v |= outFlag
			}
			row[m.edgeByte[i]] = v
		}
	}
	return m
}

// child returns the child of state s on byte b.
func (m *matcher) child(s int32, b byte) (int32, bool) {
	start, cnt := m.edgeStart[s], m.edgeCount[s]
	for i := start; i < start+cnt; i++ {
		if m.edgeByte[i] == b {
			return m.edgeTo[i], true
		}
	}
	return 0, false
}

// step returns the state after reading b in state s.
func (m *matcher) step(s int32, b byte) int32 {
	for {
		if s < m.nDense {
			return m.dense[int(s)<<8|int(b)] & stateMask
		}
		start, cnt := m.edgeStart[s], m.edgeCount[s]
		for i := start; i < start+cnt; i++ {
			eb := m.edgeByte[i]
			if eb == b {
				return m.edgeTo[i]
			}
			if eb > b {
				break
			}
		}
		s = m.fail[s]
	}
}

// find appends to spans the merged ranges of text covered by pattern
// occurrences (overlapping and adjacent occurrences merged), in order. The
// spans already in the slice are left alone.
//
// Line breaks ("\n" or "\r\n", raw or escaped, and the blanks after them)
// are skipped as if they were not there (see lineView): an occurrence split by one is found,
// and its range covers the break. find also returns where the end of text
// that may be the start of an occurrence continued after text begins
// (len(text) when no end of text can be).
func (m *matcher) find(text []byte, spans []span) ([]span, int) {
	if m == nil || m.maxLen == 0 {
		return spans, len(text)
	}
	base := len(spans)
	var s int32
	var jumps []viewJump // where line breaks were skipped
	skip := 0            // bytes skipped so far
	nDense, dense, out := m.nDense, m.dense, m.out
	for i := 0; i < len(text); {
		end := nextBreak(text, i)
		for ; i < end; i++ {
			b := text[i]
			if s < nDense {
				t := dense[int(s)<<8|int(b)]
				s = t & stateMask
				if t >= 0 {
					continue
				}
			} else {
				s = m.step(s, b)
				if out[s] == 0 {
					continue
				}
			}
			start := i - skip + 1 - int(out[s]) // in the view
			if len(jumps) > 0 {
				start = viewToText(jumps, start)
			}
			spans = addSpan(spans, base, span{start: start, end: i + 1})
		}
		if end == len(text) {
			break
		}
		n := lineBreakLen(text, end)
		skip += n
		i = end + n
		jumps = append(jumps, viewJump{at: i - skip, skip: skip})
	}
	tail := len(text)
	if d := int(m.depth[s]); d > 0 {
		tail = viewToText(jumps, len(text)-skip-d)
	}
	return spans, tail
}

// nextBreak returns the index of the first line break (see lineBreakLen)
// at or after i in text, len(text) when there is none.
func nextBreak(text []byte, i int) int {
	end := len(text)
	if nl := bytes.IndexByte(text[i:], '\n'); nl >= 0 {
		end = i + nl
		if end > i && text[end-1] == '\r' {
			end--
		}
	}
	for j := i; j < end; j++ {
		k := bytes.IndexByte(text[j:end], '\\')
		if k < 0 {
			break
		}
		j += k
		if lineBreakLen(text, j) > 0 {
			return j
		}
	}
	return end
}

// addSpan appends sp to spans, whose ends from index base on are all
// <= sp.end, merging it with every such span it overlaps or touches.
func addSpan(spans []span, base int, sp span) []span {
	for len(spans) > base {
		last := spans[len(spans)-1]
		if last.end < sp.start {
			break
		}
		if last.start < sp.start {
			sp.start = last.start
		}
		spans = spans[:len(spans)-1]
	}
	return append(spans, sp)
}

// mergeSpans sorts spans by start and merges overlapping or touching ones.
func mergeSpans(spans []span) []span {
	slices.SortFunc(spans, func(a, b span) int { return a.start - b.start })
	out := spans[:0]
	for _, sp := range spans {
		if n := len(out); n > 0 && out[n-1].end >= sp.start {
			if sp.end > out[n-1].end {
				out[n-1].end = sp.end
			}
			continue
		}
		out = append(out, sp)
	}
	return out
}
