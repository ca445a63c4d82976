package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
	_ "time/tzdata" // a schedule's time zone on machines without a zoneinfo database
)

// scheduleCmd is `autoprov schedule`: a template launched on a cron
// expression or an RFC 5545 RRULE in a time zone, by the scheduler
// (/api/v1/templates/{id}/schedules, /api/v1/schedules/{id}).
type scheduleCmd struct {
	List   scheduleListCmd   `cmd:"" help:"a template's schedules, with their next occurrence"`
	Show   scheduleShowCmd   `cmd:"" help:"a schedule: its next occurrences and its recent ones with their jobs"`
	Create scheduleCreateCmd `cmd:"" help:"schedule a template on a cron expression or an RRULE (the key needs templates:launch too: each occurrence launches as it)"`
	Pause  schedulePauseCmd  `cmd:"" help:"pause a schedule: no occurrence until it is resumed"`
	Resume scheduleResumeCmd `cmd:"" help:"resume a paused schedule"`
	Delete scheduleDeleteCmd `cmd:"" help:"delete a schedule (its jobs stay)"`
}

// apiSchedule is what autoprov reads of a schedule.
type apiSchedule struct {
	ID         string      `json:"id"`
	ProjectID  string      `json:"project_id"`
	TemplateID string      `json:"template_id"`
	Name       string      `json:"name"`
	Cron       string      `json:"cron"`
	RRule      string      `json:"rrule"`
	DTStart    *time.Time  `json:"dtstart"`
	Timezone   string      `json:"timezone"`
	Missed     string      `json:"missed"`
	Paused     bool        `json:"paused"`
	NextAt     *time.Time  `json:"next_at"`
	Upcoming   []time.Time `json:"upcoming"`
	CreatedAt  time.Time   `json:"created_at"`
	Recent     []struct {
		At         time.Time  `json:"at"`
		LaunchedAt *time.Time `json:"launched_at"`
		JobID      string     `json:"job_id"`
		Error      string     `json:"error"`
	} `json:"recent"`
}

// schedulePath is the API's path of schedule id.
func schedulePath(id string) string { return "/api/v1/schedules/" + url.PathEscape(id) }

// rule is the schedule's cron expression or RRULE.
func (s *apiSchedule) rule() string {
	if s.Cron != "" {
		return "cron " + s.Cron
	}
	return "rrule " + s.RRule
}

// zone is the schedule's time zone (UTC when none is given).
func (s *apiSchedule) zone() string {
	if s.Timezone == "" {
		return "UTC"
	}
	return s.Timezone
}

// at prints an occurrence on the schedule's wall clock, and in UTC when
// that is another.
func (s *apiSchedule) at(t *time.Time) string {
	if t == nil {
		if s.Paused {
			return "- (paused)"
		}
		return "- (none: the rule has ended)"
	}
	loc, err := time.LoadLocation(s.zone())
	if err != nil || loc == time.UTC {
		return when(*t)
	}
	return t.In(loc).Format("2006-01-02 15:04:05 MST") + " (" + when(*t) + ")"
}

// state is paused or active.
func (s *apiSchedule) state() string {
	if s.Paused {
		return "paused"
	}
	return "active"
}

// showSchedule prints a schedule: its rule, its next occurrences and
// (GET of one) its recent ones.
func (g *globals) showSchedule(_ *apiClient, raw json.RawMessage) error {
	if g.json {
		return g.writeRaw(raw)
	}
	var s apiSchedule
	if err := json.Unmarshal(raw, &s); err != nil {
		return err
	}
	w := g.env.Stdout
	fmt.Fprintf(w, "schedule %s %s: %s\n", oneLine(s.Name), s.ID, s.state())
	fmt.Fprintf(w, "  template: %s\n", s.TemplateID)
	fmt.Fprintf(w, "  %s in %s, missed occurrences: %s\n", oneLine(s.rule()), oneLine(s.zone()), oneLine(s.Missed))
	if s.DTStart != nil {
		fmt.Fprintf(w, "  dtstart: %s\n", s.at(s.DTStart))
	}
	fmt.Fprintf(w, "  next: %s\n", s.at(s.NextAt))
	for k := range s.Upcoming {
		fmt.Fprintf(w, "  then: %s\n", s.at(&s.Upcoming[k]))
	}
	if len(s.Recent) == 0 {
		return nil
	}
	fmt.Fprintln(w, "  recent:")
	t := newTable(w, "    AT", "LAUNCHED", "JOB", "ERROR")
	for _, o := range s.Recent {
		launched, job := "-", o.JobID
		if o.LaunchedAt != nil {
			launched = when(*o.LaunchedAt)
		}
		if job == "" {
			job = "-"
		}
		t.row("    "+when(o.At), launched, job, o.Error)
	}
	return t.flush()
}

type scheduleListCmd struct {
	Template string `arg:"" name:"template" help:"the template's id"`
}

func (c *scheduleListCmd) Run(g *globals) error {
	return listItems(g, templatePath(c.Template)+"/schedules", "schedules", []string{"ID", "NAME", "STATE", "RULE", "TIME ZONE", "MISSED", "NEXT"},
		func(_ *apiClient, s *apiSchedule) []string {
			return []string{s.ID, s.Name, s.state(), s.rule(), s.zone(), s.Missed, s.at(s.NextAt)}
		})
}

type scheduleShowCmd struct {
	ID string `arg:"" name:"id" help:"the schedule's id"`
}

func (c *scheduleShowCmd) Run(g *globals) error {
	return g.answer(http.MethodGet, schedulePath(c.ID), nil, "show the schedule", g.showSchedule)
}

type scheduleCreateCmd struct {
	Template    string `arg:"" name:"template" help:"the template's id"`
	Name        string `name:"name" required:"" help:"the schedule's name (unique in the project)"`
	Cron        string `name:"cron" xor:"rule" required:"" help:"five fields (minute hour day month weekday), or @hourly, @daily, @weekly, @monthly, @yearly, @every <duration>"`
	RRule       string `name:"rrule" xor:"rule" required:"" help:"an RFC 5545 recurrence rule (FREQ=WEEKLY;BYDAY=MO,WE;BYHOUR=9;BYMINUTE=30)"`
	DTStart     string `name:"dtstart" help:"with --rrule: its DTSTART (RFC 3339), read on the wall clock of --timezone (default: the schedule's creation, to the minute)"`
	Timezone    string `name:"timezone" help:"the IANA time zone of the rule (default UTC)"`
	Missed      string `name:"missed" help:"occurrences found more than a minute late (the scheduler was down): skip drops them (the API's default), run_once runs one job for them all"`
	launchFlags `embed:""`
}

func (c *scheduleCreateCmd) Run(g *globals) error {
	if c.DTStart != "" && c.RRule == "" {
		return usageError{errors.New("--dtstart is an RRULE's: give --rrule too")}
	}
	req := map[string]any{"name": c.Name}
	for k, v := range map[string]string{"cron": c.Cron, "rrule": c.RRule, "dtstart": c.DTStart, "timezone": c.Timezone, "missed": c.Missed} {
		if v != "" {
			req[k] = v
		}
	}
	return c.create(g, c.Template, "schedules", req, g.showSchedule)
}

type schedulePauseCmd struct {
	ID string `arg:"" name:"id" help:"the schedule's id"`
}

func (c *schedulePauseCmd) Run(g *globals) error {
	return g.answer(http.MethodPost, schedulePath(c.ID)+"/pause", nil, "pause the schedule", g.showSchedule)
}

type scheduleResumeCmd struct {
	ID string `arg:"" name:"id" help:"the schedule's id"`
}

func (c *scheduleResumeCmd) Run(g *globals) error {
	return g.answer(http.MethodPost, schedulePath(c.ID)+"/resume", nil, "resume the schedule", g.showSchedule)
}

type scheduleDeleteCmd struct {
	ID string `arg:"" name:"id" help:"the schedule's id"`
}

func (c *scheduleDeleteCmd) Run(g *globals) error {
	return g.deleteThing(schedulePath(c.ID), "schedule", c.ID)
}
