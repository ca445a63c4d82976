// Package schedule holds job template schedules (issue 36): when a
// schedule's occurrences fall (a cron expression or an RFC 5545 RRULE in a
// time zone), and the
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

// Spec is when a schedule runs: Cron or RRule, exactly one.
type Spec struct {
	// Cron is a five-field cron expression (minute hour day month
	// weekday) or a descriptor (@hourly, @daily, @weekly, @monthly,
	// @yearly, @every <duration> of at least a second).
	Cron string
	// RRule is an RFC 5545 recurrence rule, its value alone (such as
	// FREQ=WEEKLY;BYDAY=MO,WE;BYHOUR=9;BYMINUTE=30): FREQ from YEARLY to
	// MINUTELY (not SECONDLY), COUNT up to MaxCount, UNTIL (a UTC time,
	// or a wall clock in Timezone). Its DTSTART is DTStart, on the wall
	// clock of Timezone: where the rule starts, and what it takes the
	// fields it does not give from (FREQ=DAILY without BYHOUR runs at
	// DTSTART's hour).
	RRule string
	// DTStart is an RRule's start (required with one; truncated to the
	// second).
	DTStart time.Time
	// Timezone is an IANA time zone name; "" is UTC.
	Timezone string
}

// Schedule is a parsed Spec.
type Schedule struct {
	s interface{ Next(time.Time) time.Time }
}

var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Parse checks spec and returns its schedule. An error names its field
// (ErrField): cron, rrule, timezone or dtstart. A rule whose COUNT or
// UNTIL has passed parses: it has no next occurrence.
func Parse(spec Spec) (*Schedule, error) {
	hasCron, hasRule := strings.TrimSpace(spec.Cron) != "", strings.TrimSpace(spec.RRule) != ""
	if hasCron && hasRule {
		return nil, fieldError("rrule", "give cron or rrule, not both")
	}
	loc := time.UTC
	if spec.Timezone != "" {
		l, err := time.LoadLocation(spec.Timezone)
		if err != nil || spec.Timezone == "Local" {
			return nil, fieldError("timezone", fmt.Sprintf("unknown time zone %q (an IANA name such as Europe/Vilnius)", truncate(spec.Timezone, 64)))
		}
		loc = l
	}
	if hasRule {
		r, err := parseRule(spec.RRule, spec.DTStart, loc)
		if err != nil {
			return nil, err
		}
		return &Schedule{s: r}, nil
	}
	s, err := parseCron(spec.Cron, loc)
	if err != nil {
		return nil, fieldError("cron", err.Error())
	}
	return &Schedule{s: s}, nil
}

func parseCron(expr string, loc *time.Location) (cron.Schedule, error) {
	expr = strings.TrimSpace(expr)
	if expr == "" || len(expr) > 200 {
		return nil, errors.New("must be a cron expression of at most 200 characters (or give rrule)")
	}
	if strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ=") {
		return nil, errors.New("give the time zone in timezone, not in the expression")
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
	return s, nil
}

// Next returns the first occurrence after t; zero when there is none (a
// rule done).
func (s *Schedule) Next(t time.Time) time.Time {
	n := s.s.Next(t)
	if n.IsZero() {
		return n
	}
	return n.UTC()
}

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
