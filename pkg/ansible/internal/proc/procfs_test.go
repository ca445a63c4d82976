package proc

import "testing"

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Stat
		bad  bool
	}{
		{line: "123 (ssh) S 1 123 123 0 -1 4194560 ...", want: Stat{State: 'S', PPid: 1, Pgrp: 123}},
		{line: "9 (a b) (c)) Z 8 7 7 0", want: Stat{State: 'Z', PPid: 8, Pgrp: 7}},
		{line: "2 (kthreadd) S 0 0 0 0 -1", want: Stat{State: 'S', PPid: 0, Pgrp: 0}},
		{line: "5 (x) R 4 5", want: Stat{State: 'R', PPid: 4, Pgrp: 5}},
		{line: "5 (x) R 4", bad: true},
		{line: "5 x R 4 5", bad: true},
		{line: "5 (x) RR 4 5", bad: true},
		{line: "5 (x) R 4a 5", bad: true},
		{line: "5 (x) R 4 99999999999999999999", bad: true},
		{line: "", bad: true},
	} {
		got, err := parseStat([]byte(tc.line))
		if tc.bad {
			if err == nil {
				t.Errorf("%q: parsed as %+v, want an error", tc.line, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: got %+v, %v; want %+v", tc.line, got, err, tc.want)
		}
	}
}
