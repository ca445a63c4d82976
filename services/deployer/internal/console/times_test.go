package console

import (
	"testing"
	"time"
)

func TestHumanMS(t *testing.T) {
	for _, tc := range []struct {
		ms   int64
		want string
	}{{0, "0 ms"}, {850, "850 ms"}, {4200, "4.2 s"}, {192_400, "3m12s"}, {3_840_000, "1h4m0s"}} {
		if got := humanMS(tc.ms); got != tc.want {
			t.Errorf("humanMS(%d) = %q, want %q", tc.ms, got, tc.want)
		}
	}
}

func TestWhen(t *testing.T) {
	at := time.Date(2026, 11, 29, 10, 4, 5, 0, time.FixedZone("CET", 3600))
	want := `<time datetime="2026-11-29T09:04:05Z" title="2026-11-29 09:04:05Z UTC">2026-11-29 09:04:05Z</time>`
	if got := string(when(at)); got != want {
		t.Errorf("when(t) = %s, want %s", got, want)
	}
	if got := string(when(&at)); got != want {
		t.Errorf("when(&t) = %s", got)
	}
	var none *time.Time
	if got := string(when(none)); got != "-" {
		t.Errorf("when(nil) = %q", got)
	}
	if got := string(when(time.Time{})); got != "-" {
		t.Errorf("when(zero) = %q", got)
	}
}
