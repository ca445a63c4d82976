package workflows

import "testing"

// TestCycle: a graph with a cycle names a node on it; one without names
// none, however its edges cross.
func TestCycle(t *testing.T) {
	t.Parallel()
	nodes := func(ids ...string) []Node {
		var n []Node
		for _, id := range ids {
			n = append(n, Node{ID: id})
		}
		return n
	}
	for _, tc := range []struct {
		name  string
		g     Graph
		cycle bool
	}{
		{"one node", Graph{Nodes: nodes("a")}, false},
		{"chain", Graph{Nodes: nodes("a", "b", "c"), Edges: []Edge{{"a", "b", OnSuccess}, {"b", "c", OnFailure}}}, false},
		{"diamond", Graph{Nodes: nodes("a", "b", "c", "d"), Edges: []Edge{{"a", "b", OnSuccess}, {"a", "c", OnFailure},
			{"b", "d", OnAlways}, {"c", "d", OnAlways}}}, false},
		{"self loop", Graph{Nodes: nodes("a"), Edges: []Edge{{"a", "a", OnFailure}}}, true},
		{"two-node loop", Graph{Nodes: nodes("a", "b"), Edges: []Edge{{"a", "b", OnSuccess}, {"b", "a", OnFailure}}}, true},
		{"loop after a root", Graph{Nodes: nodes("r", "a", "b", "c"), Edges: []Edge{{"r", "a", OnSuccess}, {"a", "b", OnSuccess},
			{"b", "c", OnSuccess}, {"c", "a", OnAlways}}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.g.cycle()
			if (got != "") != tc.cycle {
				t.Fatalf("cycle() = %q, want a cycle: %v", got, tc.cycle)
			}
			if got == "" {
				return
			}
			// The node named is on the cycle: it reaches itself.
			seen := map[string]bool{}
			queue := []string{got}
			for len(queue) > 0 {
				id := queue[0]
				queue = queue[1:]
				for _, e := range tc.g.Edges {
					if e.From == id && !seen[e.To] {
						seen[e.To] = true
						queue = append(queue, e.To)
					}
				}
			}
			if !seen[got] {
				t.Errorf("%s is not on a cycle", got)
			}
		})
	}
}

// TestTaken: which edges a node's end takes.
func TestTaken(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status, on string
		want       bool
	}{
		{NodeSucceeded, OnSuccess, true}, {NodeSucceeded, OnFailure, false}, {NodeSucceeded, OnAlways, true},
		{NodeFailed, OnSuccess, false}, {NodeFailed, OnFailure, true}, {NodeFailed, OnAlways, true},
		{NodeSkipped, OnAlways, false}, {NodeCancelled, OnAlways, false},
	} {
		if got := taken(&NodeRun{Status: tc.status}, tc.on); got != tc.want {
			t.Errorf("%s on %s: %v, want %v", tc.status, tc.on, got, tc.want)
		}
	}
}
