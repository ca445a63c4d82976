package api_test

import (
	"context"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/schedule"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/templates"
)

// TestScheduleRRule: a schedule on an RRULE in a time zone shows its
// next occurrences on the zone's wall clock, its DTSTART (the creation,
// to the minute, when not given) stored; cron and rrule are exactly one,
// and a bad rule is a 422 naming its field. A rule whose COUNT runs out
// launches each occurrence once, then shows no next occurrence and gets
// none.
func TestScheduleRRule(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{})
	ctx := context.Background()
	key := e.Key("rrule", []auth.Scope{auth.ScopeTemplatesWrite, auth.ScopeTemplatesLaunch, auth.ScopeCredentialsWrite}, dt.Project)
	sshCredential(t, e, key)
	tpl := createTemplate(t, e, key, templateBody("site"))
	base := "/api/v1/templates/" + tpl.ID + "/schedules"
	launch := map[string]any{"survey": map[string]any{"release": "weekly"}}

	for _, tc := range []struct {
		name  string
		body  map[string]any
		field string
	}{
		{"cron and rrule", map[string]any{"name": "x", "cron": "0 9 * * *", "rrule": "FREQ=DAILY", "launch": launch}, "rrule"},
		{"neither", map[string]any{"name": "x", "launch": launch}, "cron"},
		{"every second", map[string]any{"name": "x", "rrule": "FREQ=SECONDLY", "launch": launch}, "rrule"},
		{"not a rule", map[string]any{"name": "x", "rrule": "FREQ=DAILY;BYHOUR=25", "launch": launch}, "rrule"},
		{"a start for a cron", map[string]any{"name": "x", "cron": "0 9 * * *", "dtstart": "2026-01-01T00:00:00Z", "launch": launch}, "dtstart"},
		{"done before it starts", map[string]any{"name": "x", "rrule": "FREQ=DAILY;UNTIL=20200101T000000Z", "launch": launch}, "rrule"},
		{"a zone unknown", map[string]any{"name": "x", "rrule": "FREQ=DAILY", "timezone": "Mars/Olympus", "launch": launch}, "timezone"},
	} {
		resp, body := e.Do("POST", base, key, tc.body)
		if p := dt.JSON[api.Problem](t, body); resp.StatusCode != 422 || len(p.Errors) == 0 || p.Errors[0].Field != tc.field {
			t.Errorf("%s: %d %s, want 422 naming %q", tc.name, resp.StatusCode, body, tc.field)
		}
	}

	// Mondays and Wednesdays at 9:30 in Vilnius.
	before := time.Now()
	resp, body := e.Do("POST", base, key, map[string]any{"name": "mon-wed", "rrule": "FREQ=WEEKLY;BYDAY=MO,WE;BYHOUR=9;BYMINUTE=30",
		"timezone": "Europe/Vilnius", "launch": launch})
	if resp.StatusCode != 201 {
		t.Fatalf("rrule schedule: %d %s", resp.StatusCode, body)
	}
	dt.CheckSchema(t, "Schedule", body)
	sc := dt.JSON[templates.Schedule](t, body)
	if sc.DTStart == nil || sc.DTStart.After(before) || before.Sub(*sc.DTStart) > time.Minute || sc.DTStart.Second() != 0 || sc.Cron != "" {
		t.Fatalf("created %s: its dtstart should be its creation to the minute", body)
	}
	vilnius, err := time.LoadLocation("Europe/Vilnius")
	if err != nil {
		t.Fatal(err)
	}
	if sc.NextAt == nil || !sc.NextAt.After(before) || sc.NextAt.Sub(before) > 7*24*time.Hour || len(sc.Upcoming) != 4 {
		t.Fatalf("created %s: want a next occurrence within a week, and 4 after it", body)
	}
	prev := *sc.NextAt
	for i, at := range append([]time.Time{*sc.NextAt}, sc.Upcoming...) {
		w := at.In(vilnius)
		if wd := w.Weekday(); wd != time.Monday && wd != time.Wednesday || w.Hour() != 9 || w.Minute() != 30 || w.Second() != 0 {
			t.Errorf("occurrence %d at %s (%s in Vilnius): want Monday or Wednesday 9:30", i, at, w)
		}
		if i > 0 && (!at.After(prev) || at.Sub(prev) > 5*24*time.Hour+time.Hour) {
			t.Errorf("occurrence %d at %s after %s: want the next Monday or Wednesday", i, at, prev)
		}
		prev = at
	}
	resp, body = e.Do("GET", "/api/v1/schedules/"+sc.ID, key, nil)
	if got := dt.JSON[templates.Schedule](t, body); resp.StatusCode != 200 || got.RRule != sc.RRule || !got.DTStart.Equal(*sc.DTStart) ||
		!got.NextAt.Equal(*sc.NextAt) || len(got.Upcoming) != 4 || !got.Upcoming[3].Equal(sc.Upcoming[3]) {
		t.Errorf("read back: %d %s, created %+v", resp.StatusCode, body, sc)
	}

	// Twice, a minute apart, from the next minute: each launched once,
	// then nothing more to come.
	start := time.Now().Truncate(time.Minute).Add(time.Minute)
	resp, body = e.Do("POST", base, key, map[string]any{"name": "twice", "rrule": "FREQ=MINUTELY;COUNT=2",
		"dtstart": start.Format(time.RFC3339), "launch": launch})
	if resp.StatusCode != 201 {
		t.Fatalf("a counted rule: %d %s", resp.StatusCode, body)
	}
	twice := dt.JSON[templates.Schedule](t, body)
	if twice.NextAt == nil || !twice.NextAt.Equal(start) || len(twice.Upcoming) != 1 || !twice.Upcoming[0].Equal(start.Add(time.Minute)) {
		t.Fatalf("a counted rule: %s, want next at %s and one more", body, start)
	}
	if n, err := schedule.Materialize(ctx, e.DB, start.Add(time.Minute), 0); err != nil || n != 2 {
		t.Fatalf("materialized %d (%v), want 2", n, err)
	}
	deadline := time.Now().Add(20 * time.Second)
	var got templates.Schedule
	for time.Now().Before(deadline) {
		_, body = e.Do("GET", "/api/v1/schedules/"+twice.ID, key, nil)
		if got = dt.JSON[templates.Schedule](t, body); len(got.Recent) == 2 && got.Recent[0].JobID != "" && got.Recent[1].JobID != "" {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	dt.CheckSchema(t, "Schedule", body)
	if len(got.Recent) != 2 || got.Recent[0].JobID == "" || got.Recent[1].JobID == "" || got.Recent[0].JobID == got.Recent[1].JobID {
		t.Fatalf("a counted rule's occurrences: %s", body)
	}
	if got.NextAt != nil || len(got.Upcoming) != 0 || got.Paused {
		t.Errorf("a rule done: %s, want no next occurrence", body)
	}
	if n, err := schedule.Materialize(ctx, e.DB, start.Add(time.Hour), 0); err != nil || n != 0 {
		t.Errorf("a rule done got %d more occurrences (%v)", n, err)
	}
	if q, _ := e.Redis.XLen(ctx, e.Streams.JobQueue).Result(); q != 2 {
		t.Errorf("%d jobs published for 2 occurrences", q)
	}
}
