package schedule

import (
	"strings"
	"testing"
	"time"
)

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestParseAndNext: cron expressions and descriptors in a time zone give
// their next occurrences in UTC (across a daylight saving change too);
// malformed ones are refused with a reason.
func TestParseAndNext(t *testing.T) {
	for _, tc := range []struct {
		name, cron, tz, after string
		want                  []string
	}{
		{"every five minutes", "*/5 * * * *", "", "2026-12-07T10:02:00Z", []string{"2026-12-07T10:05:00Z", "2026-12-07T10:10:00Z"}},
		{"9:00 in Vilnius in winter", "0 9 * * *", "Europe/Vilnius", "2026-12-07T10:00:00Z", []string{"2026-12-08T07:00:00Z", "2026-12-09T07:00:00Z"}},
		{"9:00 in Vilnius across the spring change", "0 9 * * *", "Europe/Vilnius", "2026-03-28T12:00:00Z", []string{"2026-03-29T06:00:00Z", "2026-03-30T06:00:00Z"}},
		{"weekdays", "30 6 * * 1-5", "", "2026-12-04T07:00:00Z", []string{"2026-12-07T06:30:00Z", "2026-12-08T06:30:00Z"}},
		{"@hourly", "@hourly", "", "2026-12-07T10:59:59Z", []string{"2026-12-07T11:00:00Z", "2026-12-07T12:00:00Z"}},
		{"@every 90s", "@every 90s", "", "2026-12-07T10:00:00Z", []string{"2026-12-07T10:01:30Z", "2026-12-07T10:03:00Z"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse(Spec{Cron: tc.cron, Timezone: tc.tz})
			if err != nil {
				t.Fatal(err)
			}
			got := s.Upcoming(mustTime(t, tc.after), len(tc.want))
			for i, w := range tc.want {
				if i >= len(got) || !got[i].Equal(mustTime(t, w)) || got[i].Location() != time.UTC {
					t.Fatalf("upcoming %v, want %v", got, tc.want)
				}
			}
		})
	}
	for _, tc := range []struct{ name, cron, tz, want string }{
		{"empty", "", "", "cron expression"},
		{"six fields", "0 0 9 * * *", "", "not a cron expression"},
		{"bad minute", "61 * * * *", "", "not a cron expression"},
		{"unknown zone", "0 9 * * *", "Mars/Olympus", "unknown time zone"},
		{"zone in the expression", "CRON_TZ=UTC 0 9 * * *", "", "timezone"},
		{"too often", "@every 500ms", "", "at least 1s"},
		{"never", "0 0 30 2 *", "", "no occurrence"},
	} {
		if _, err := Parse(Spec{Cron: tc.cron, Timezone: tc.tz}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}
