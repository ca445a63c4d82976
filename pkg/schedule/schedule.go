// Package schedule holds job template schedules (issue 36): when a
// schedule's occurrences fall (a cron expression in a time zone), and the
// one step that turns due schedules into occurrences (Materialize), which
// the scheduler's leader runs. The deployer launches each occurrence's job
// once (its Idempotency-Key names the occurrence), so one job per
// occurrence holds across kill -9 and leader changes: an occurrence is a
// row whose key is (schedule, time), written in the transaction that moves
// the schedule on.
package schedule

import (
	"errors"
	"fmt"
	"strings"
	"time"
	_ "time/tzdata" // time zones on machines without a zoneinfo database

	"github.com/robfig/cron/v3"
)

// Missed is what a schedule does with occurrences that passed while it
// could not run (the scheduler down, the schedule paused).
type Missed string

// The policies for missed occurrences.
const (
	// Skip drops them: the next occurrence is the next one to come.
	Skip Missed = "skip"
	// RunOnce runs one job for all of them, then goes on.
	RunOnce Missed = "run_once"
)

// Grace is how late an occurrence may be materialized and still count as
// on time: a later one is missed.
const Grace = time.Minute

// Spec is when a schedule runs.
type Spec struct {
	// Cron is a five-field cron expression (minute hour day month
	// weekday) or a descriptor (@hourly, @daily, @weekly, @monthly,
	// @yearly, @every <duration> of at least a second).
	Cron string
	// Timezone is an IANA time zone name; "" is UTC.
	Timezone string
}

// Schedule is a parsed Spec.
type Schedule struct {
	s   cron.Schedule
	loc *time.Location
}

var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Parse checks spec and returns its schedule.
func Parse(spec Spec) (*Schedule, error) {
	expr := strings.TrimSpace(spec.Cron)
	if expr == "" || len(expr) > 200 {
		return nil, errors.New("must be a cron expression of at most 200 characters")
	}
	if strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ=") {
		return nil, errors.New("give the time zone in timezone, not in the expression")
	}
	loc := time.UTC
	if spec.Timezone != "" {
		l, err := time.LoadLocation(spec.Timezone)
		if err != nil || spec.Timezone == "Local" {
			return nil, fmt.Errorf("unknown time zone %q (an IANA name such as Europe/Vilnius)", truncate(spec.Timezone, 64))
		}
		loc = l
	}
	if d, ok := strings.CutPrefix(expr, "@every "); ok {
		// The parser rounds a shorter delay up to a second: refuse it.
		if v, err := time.ParseDuration(strings.TrimSpace(d)); err == nil && v < time.Second {
			return nil, errors.New("@every must be at least 1s")
		}
	}
	s, err := parser.Parse(expr)
	if err != nil {
		return nil, fmt.Errorf("not a cron expression: %v", err)
	}
	if c, ok := s.(*cron.SpecSchedule); ok {
		c.Location = loc
	}
	if s.Next(time.Now()).IsZero() {
		return nil, errors.New("the expression has no occurrence")
	}
	return &Schedule{s: s, loc: loc}, nil
}

// Next returns the first occurrence after t.
func (s *Schedule) Next(t time.Time) time.Time { return s.s.Next(t).UTC() }

// Upcoming returns the n occurrences after t.
func (s *Schedule) Upcoming(t time.Time, n int) []time.Time {
	out := make([]time.Time, 0, n)
	for range n {
		t = s.Next(t)
		if t.IsZero() {
			break
		}
		out = append(out, t)
	}
	return out
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
