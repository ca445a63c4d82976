package schedule

import (
	"strings"
	"testing"
	"time"

	"github.com/teambition/rrule-go"
)

// TestRRule: RRULEs from a DTSTART on the wall clock of a time zone give
// their occurrences in UTC, across Vilnius's daylight saving changes (a
// wall clock in the spring gap falls an hour later, one in the autumn's
// repeated hour once, in standard time); a rule done by COUNT or UNTIL has no next
// occurrence; bad rules are refused naming their field.
func TestRRule(t *testing.T) {
	vilnius := "Europe/Vilnius"
	for _, tc := range []struct {
		name, rule, tz, dtstart, after string
		want                           []string
	}{
		{"Monday and Wednesday 9:30 in Vilnius in winter", "FREQ=WEEKLY;BYDAY=MO,WE;BYHOUR=9;BYMINUTE=30", vilnius,
			"2026-11-01T00:00:00Z", "2026-12-07T08:00:00Z",
			[]string{"2026-12-09T07:30:00Z", "2026-12-14T07:30:00Z", "2026-12-16T07:30:00Z"}},
		{"9:30 on the wall clock across the spring change", "FREQ=DAILY;BYHOUR=9;BYMINUTE=30", vilnius,
			"2026-01-01T00:00:00Z", "2026-03-28T00:00:00Z",
			[]string{"2026-03-28T07:30:00Z", "2026-03-29T06:30:00Z", "2026-03-30T06:30:00Z"}},
		{"9:30 on the wall clock across the autumn change", "FREQ=DAILY;BYHOUR=9;BYMINUTE=30", vilnius,
			"2026-01-01T00:00:00Z", "2026-10-24T00:00:00Z",
			[]string{"2026-10-24T06:30:00Z", "2026-10-25T07:30:00Z", "2026-10-26T07:30:00Z"}},
		{"3:30 falls in the spring gap: 4:30 summer time", "FREQ=DAILY;BYHOUR=3;BYMINUTE=30", vilnius,
			"2026-01-01T00:00:00Z", "2026-03-28T12:00:00Z",
			[]string{"2026-03-29T01:30:00Z", "2026-03-30T00:30:00Z"}},
		{"3:30 in the autumn's repeated hour: once", "FREQ=DAILY;BYHOUR=3;BYMINUTE=30", vilnius,
			"2026-01-01T00:00:00Z", "2026-10-24T12:00:00Z",
			[]string{"2026-10-25T01:30:00Z", "2026-10-26T01:30:00Z"}},
		{"every 5 hours on the wall clock through the spring change", "FREQ=HOURLY;INTERVAL=5;BYMINUTE=0", vilnius,
			"2026-03-28T22:00:00Z", "2026-03-28T22:00:00Z", // 00:00 EET
			[]string{"2026-03-29T02:00:00Z", "2026-03-29T07:00:00Z", "2026-03-29T12:00:00Z"}}, // 05:00 EEST, 10:00, 15:00
		{"the last working day of the month at 17:00 UTC", "FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1;BYHOUR=17;BYMINUTE=0", "",
			"2026-01-01T00:00:00Z", "2026-12-07T00:00:00Z",
			[]string{"2026-12-31T17:00:00Z", "2027-01-29T17:00:00Z", "2027-02-26T17:00:00Z"}},
		{"fields DTSTART implies: its hour and minute, daily", "FREQ=DAILY", vilnius,
			"2026-12-01T08:15:00Z", "2026-12-07T12:00:00Z",
			[]string{"2026-12-08T08:15:00Z", "2026-12-09T08:15:00Z"}},
		{"every other week from DTSTART's week", "FREQ=WEEKLY;INTERVAL=2;BYDAY=TU;BYHOUR=6;BYMINUTE=0", "",
			"2026-01-06T06:00:00Z", "2026-12-07T00:00:00Z", // a Tuesday; 8 December is 48 weeks on
			[]string{"2026-12-08T06:00:00Z", "2026-12-22T06:00:00Z"}},
		{"COUNT runs out", "FREQ=DAILY;COUNT=3;BYHOUR=12;BYMINUTE=0", "",
			"2026-12-01T00:00:00Z", "2026-12-01T13:00:00Z",
			[]string{"2026-12-02T12:00:00Z", "2026-12-03T12:00:00Z"}},
		{"UNTIL on the zone's wall clock", "FREQ=DAILY;BYHOUR=9;BYMINUTE=0;UNTIL=20261209T090000", vilnius,
			"2026-12-01T00:00:00Z", "2026-12-07T12:00:00Z",
			[]string{"2026-12-08T07:00:00Z", "2026-12-09T07:00:00Z"}},
		{"BYSECOND in a minutely rule: at most once a second", "FREQ=MINUTELY;INTERVAL=30;BYSECOND=0,30", "",
			"2026-12-07T10:00:00Z", "2026-12-07T10:00:00Z",
			[]string{"2026-12-07T10:00:30Z", "2026-12-07T10:30:00Z", "2026-12-07T10:30:30Z"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse(Spec{RRule: tc.rule, Timezone: tc.tz, DTStart: mustTime(t, tc.dtstart)})
			if err != nil {
				t.Fatal(err)
			}
			got := s.Upcoming(mustTime(t, tc.after), len(tc.want)+1)
			if strings.Contains(tc.rule, "COUNT") || strings.Contains(tc.rule, "UNTIL") {
				// The rule is done after these: nothing more.
				if len(got) != len(tc.want) {
					t.Fatalf("upcoming %v, want %v and no more", got, tc.want)
				}
			}
			for i, w := range tc.want {
				if i >= len(got) || !got[i].Equal(mustTime(t, w)) || got[i].Location() != time.UTC {
					t.Fatalf("upcoming %v, want %v", got, tc.want)
				}
			}
			if len(got) > 0 && !s.Next(got[len(got)-1]).IsZero() && len(got) == len(tc.want) {
				t.Errorf("done, yet a next occurrence after %v", got[len(got)-1])
			}
		})
	}
	for _, tc := range []struct{ name, cron, rule, tz, want, field string }{
		{"neither", "", "", "", "cron expression", "cron"},
		{"both", "0 9 * * *", "FREQ=DAILY", "", "not both", "rrule"},
		{"secondly", "", "FREQ=SECONDLY", "", "SECONDLY", "rrule"},
		{"no FREQ", "", "BYHOUR=9", "", "FREQ", "rrule"},
		{"unknown part", "", "FREQ=DAILY;BYFOO=1", "", "not an RRULE", "rrule"},
		{"hour out of range", "", "FREQ=DAILY;BYHOUR=24", "", "byhour", "rrule"},
		{"a DTSTART in the rule", "", "DTSTART:20260101T000000Z\nRRULE:FREQ=DAILY", "", "dtstart", "rrule"},
		{"COUNT too long", "", "FREQ=MINUTELY;COUNT=10001", "", "COUNT", "rrule"},
		{"never", "", "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30", "", "no occurrence", "rrule"},
		{"unknown zone", "", "FREQ=DAILY", "Mars/Olympus", "unknown time zone", "timezone"},
	} {
		_, err := Parse(Spec{Cron: tc.cron, RRule: tc.rule, Timezone: tc.tz, DTStart: time.Now()})
		if err == nil || !strings.Contains(err.Error(), tc.want) || ErrField(err) != tc.field {
			t.Errorf("%s: %v (field %q), want an error naming %s saying %q", tc.name, err, ErrField(err), tc.field, tc.want)
		}
	}
	if _, err := Parse(Spec{RRule: "FREQ=DAILY"}); ErrField(err) != "dtstart" {
		t.Errorf("a rule without its start: %v", err)
	}
}

// TestRRuleMovedStart: the first occurrence after t from a start moved
// on to just before t (what Next does for a rule without COUNT) is the
// one rrule-go finds walking from DTSTART itself, for rules of each
// frequency and interval, in zones with daylight saving changes, at times
// over three years.
func TestRRuleMovedStart(t *testing.T) {
	rules := []string{
		"FREQ=YEARLY;INTERVAL=2", "FREQ=YEARLY;BYMONTH=3,10;BYDAY=-1SU;BYHOUR=3;BYMINUTE=30", "FREQ=YEARLY;BYWEEKNO=1,53;BYDAY=MO",
		"FREQ=MONTHLY;INTERVAL=5", "FREQ=MONTHLY;BYMONTHDAY=31", "FREQ=MONTHLY;INTERVAL=3;BYDAY=2FR;BYHOUR=23",
		"FREQ=WEEKLY;INTERVAL=3", "FREQ=WEEKLY;BYDAY=SU;WKST=SU;INTERVAL=2;BYHOUR=2,3",
		"FREQ=DAILY;INTERVAL=9", "FREQ=DAILY;BYHOUR=0,3;BYMINUTE=30",
		"FREQ=HOURLY;INTERVAL=5", "FREQ=HOURLY;INTERVAL=7;BYHOUR=1,2,3,4,5;BYMINUTE=10",
		"FREQ=MINUTELY;INTERVAL=97", "FREQ=MINUTELY;INTERVAL=13;BYHOUR=3",
	}
	zones := []string{"Europe/Vilnius", "America/Santiago", "Australia/Lord_Howe", ""}
	t0 := time.Date(2025, 3, 30, 0, 47, 13, 0, time.UTC)
	for _, zone := range zones {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		for _, rule := range rules {
			r, err := parseRule(rule, t0, loc)
			if err != nil {
				t.Fatalf("%s: %v", rule, err)
			}
			walk, err := rrule.NewRRule(r.opt)
			if err != nil {
				t.Fatal(err)
			}
			all := walk.Between(t0, t0.AddDate(3, 0, 0), true)
			// Times at each of the first occurrences and between them,
			// and on a stride of 7h13m through the three years.
			var ats []time.Time
			for i, o := range all {
				if i < 50 {
					ats = append(ats, o, o.Add(-time.Second))
				}
			}
			for at := t0; at.Before(t0.AddDate(3, 0, 0)); at = at.Add(7*time.Hour + 13*time.Minute) {
				ats = append(ats, at)
			}
			for _, at := range ats {
				want := time.Time{}
				for _, o := range all {
					if o.After(at) {
						want = o
						break
					}
				}
				if want.IsZero() {
					continue
				}
				if got := r.Next(at); !got.Equal(want) {
					t.Fatalf("%s in %q after %s: %s, walking from DTSTART %s", rule, zone, at, got, want)
				}
			}
		}
	}
}
