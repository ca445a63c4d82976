package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestScheduleCommands: `autoprov schedule` against the real deployer: a
// cron schedule in a time zone and an RRULE one show their next
// occurrences, list, pause and resume, delete; a cron the API refuses
// names the field; a key of another project finds neither the template's
// schedules nor the schedule, a key without templates:launch may not
// schedule.
func TestScheduleCommands(t *testing.T) {
	t.Parallel()
	d := startDeployer(t)
	env := d.cliEnv(d.key(t, "templates:write,templates:launch", testProject))
	tpl := createTemplate(t, env)

	stdout, stderr, code := run(t, env, "schedule", "create", tpl, "--name", "nightly", "--cron", "30 2 * * *",
		"--timezone", "Europe/Paris", "--missed", "run_once", "--set", "replicas=2")
	if code != 0 || !strings.Contains(stdout, "schedule nightly ") || !strings.Contains(stdout, ": active") ||
		!strings.Contains(stdout, "cron 30 2 * * * in Europe/Paris, missed occurrences: run_once") ||
		!strings.Contains(stdout, "\n  next: ") || !strings.Contains(stdout, " 02:30:00 CET (") || !strings.Contains(stdout, "\n  then: ") {
		t.Fatalf("schedule create: %d %s %s", code, stdout, stderr)
	}
	id := strings.TrimSuffix(strings.Fields(stdout)[2], ":")

	stdout, stderr, code = run(t, env, "--json", "schedule", "create", tpl, "--name", "weekly",
		"--rrule", "FREQ=WEEKLY;BYDAY=MO;BYHOUR=9;BYMINUTE=0", "--dtstart", "2026-01-05T09:00:00Z")
	var weekly struct {
		ID       string
		NextAt   time.Time   `json:"next_at"`
		Upcoming []time.Time `json:"upcoming"`
		Launch   struct{ Survey map[string]any }
	}
	if code != 0 || json.Unmarshal([]byte(stdout), &weekly) != nil || weekly.NextAt.Weekday() != time.Monday ||
		weekly.NextAt.Hour() != 9 || len(weekly.Upcoming) == 0 || !weekly.Upcoming[0].Equal(weekly.NextAt.AddDate(0, 0, 7)) {
		t.Fatalf("schedule create --rrule: %d %s %s", code, stdout, stderr)
	}

	if _, stderr, code := run(t, env, "schedule", "create", tpl, "--name", "bad", "--cron", "61 * * * *"); code != ExitFailed ||
		!strings.Contains(stderr, "create the schedule: HTTP 422") || !strings.Contains(stderr, "\n  cron: ") {
		t.Errorf("an invalid cron: %d %s", code, stderr)
	}
	if _, stderr, code := run(t, env, "schedule", "create", tpl, "--name", "bad"); code != ExitUsage || !strings.Contains(stderr, "--cron") {
		t.Errorf("neither --cron nor --rrule: %d %s", code, stderr)
	}
	if _, stderr, code := run(t, env, "schedule", "create", tpl, "--name", "bad", "--cron", "@daily", "--set", "replicas=many"); code != ExitUsage ||
		!strings.Contains(stderr, "whole number") {
		t.Errorf("a word for an integer: %d %s", code, stderr)
	}

	stdout, stderr, code = run(t, env, "schedule", "list", tpl)
	if code != 0 || !strings.Contains(stdout, "nightly") || !strings.Contains(stdout, "rrule FREQ=WEEKLY") || !strings.Contains(stdout, "NEXT") {
		t.Errorf("schedule list: %d %s %s", code, stdout, stderr)
	}
	if stdout, stderr, code := run(t, env, "schedule", "pause", id); code != 0 || !strings.Contains(stdout, ": paused") ||
		!strings.Contains(stdout, "next: - (paused)") {
		t.Errorf("schedule pause: %d %s %s", code, stdout, stderr)
	}
	if stdout, stderr, code := run(t, env, "schedule", "resume", id); code != 0 || !strings.Contains(stdout, ": active") ||
		!strings.Contains(stdout, " CET (") {
		t.Errorf("schedule resume: %d %s %s", code, stdout, stderr)
	}
	if stdout, stderr, code := run(t, env, "schedule", "show", weekly.ID); code != 0 || !strings.Contains(stdout, "schedule weekly ") ||
		!strings.Contains(stdout, "dtstart: 2026-01-05 09:00:00Z") {
		t.Errorf("schedule show: %d %s %s", code, stdout, stderr)
	}

	other := d.cliEnv(d.key(t, "templates:write,templates:launch", "0c9d8e7f-6a5b-4c3d-9e2f-1a0b9c8d7e6f"))
	for _, args := range [][]string{{"schedule", "list", tpl}, {"schedule", "show", id}, {"schedule", "pause", id},
		{"schedule", "delete", id}, {"schedule", "create", tpl, "--name", "mine", "--cron", "@daily"}} {
		if _, stderr, code := run(t, other, args...); code != ExitFailed || !strings.Contains(stderr, "HTTP 404") {
			t.Errorf("%v with another project's key: %d %s", args, code, stderr)
		}
	}
	noLaunch := d.cliEnv(d.key(t, "templates:write", testProject))
	if _, stderr, code := run(t, noLaunch, "schedule", "create", tpl, "--name", "mine", "--cron", "@daily"); code != ExitFailed ||
		!strings.Contains(stderr, "HTTP 403") || !strings.Contains(stderr, "templates:launch") {
		t.Errorf("a key without templates:launch: %d %s", code, stderr)
	}

	if stdout, stderr, code := run(t, env, "schedule", "delete", id); code != 0 || stdout != "schedule "+id+" deleted\n" {
		t.Errorf("schedule delete: %d %s %s", code, stdout, stderr)
	}
	if stdout, stderr, code := run(t, env, "schedule", "list", tpl); code != 0 || strings.Contains(stdout, "nightly") {
		t.Errorf("schedule list after the delete: %d %s %s", code, stdout, stderr)
	}
}
