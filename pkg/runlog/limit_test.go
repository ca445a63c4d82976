package runlog

import (
	"strconv"
	"strings"
	"testing"
)

func TestCapture(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		limit     int64
		want      string // exact, when not truncated
		truncated bool
	}{
		{"empty", "", 100, "", false},
		{"short", "abc\n", 100, "abc\n", false},
		{"exactly the limit", strings.Repeat("x", 100), 100, strings.Repeat("x", 100), false},
		{"one byte over", strings.Repeat("x", 101), 100, "", true},
		{"far over", strings.Repeat("0123456789", 1000), 100, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, truncated, err := capture(strings.NewReader(tt.in), tt.limit)
			if err != nil {
				t.Fatal(err)
			}
			if truncated != tt.truncated {
				t.Fatalf("truncated %v, want %v", truncated, tt.truncated)
			}
			if !truncated {
				if string(got) != tt.want {
					t.Errorf("got %q, want %q", got, tt.want)
				}
				return
			}
			half := int(tt.limit / 2)
			if !strings.HasPrefix(string(got), tt.in[:half]) || !strings.HasSuffix(string(got), tt.in[len(tt.in)-half:]) {
				t.Errorf("head or tail lost: %q", got)
			}
			skipped := len(tt.in) - 2*half
			if !strings.Contains(string(got), "["+"... "+itoa(skipped)+" bytes of output left out") {
				t.Errorf("marker does not count %d bytes: %q", skipped, got)
			}
		})
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
