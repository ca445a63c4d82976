package templates

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/autoprovisioner/autoprovisioner/pkg/schedule"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// Schedule launches a template on a cron expression or an RFC 5545 RRULE
// in a time zone, as the API key that made it. The scheduler's leader writes its occurrences
// (pkg/schedule); a Launcher launches each once.
type Schedule struct {
	ID         string `json:"id"`
	ProjectID  string `json:"project_id"`
	TemplateID string `json:"template_id"`
	Name       string `json:"name"`
	// Cron or RRule (with its DTStart), exactly one.
	Cron     string          `json:"cron,omitempty"`
	RRule    string          `json:"rrule,omitempty"`
	DTStart  *time.Time      `json:"dtstart,omitempty"`
	Timezone string          `json:"timezone,omitempty"`
	Missed   schedule.Missed `json:"missed"`
	// Launch is what each occurrence launches with (no secret answer).
	Launch Launch `json:"launch"`
	Paused bool   `json:"paused"`
	// NextAt is the next occurrence the scheduler will write (none while
	// paused, nor once an RRULE's COUNT or UNTIL has passed: it never
	// fires again); Upcoming the ones after it.
	NextAt    *time.Time  `json:"next_at,omitempty"`
	Upcoming  []time.Time `json:"upcoming,omitempty"`
	CreatedAt time.Time   `json:"created_at"`
	// Recent are the latest occurrences, newest first (GET of one).
	Recent []Occurrence `json:"recent,omitempty"`
}

// Occurrence is one time a schedule fell due, and what came of it.
type Occurrence struct {
	At         time.Time  `json:"at"`
	LaunchedAt *time.Time `json:"launched_at,omitempty"`
	JobID      string     `json:"job_id,omitempty"`
	Error      string     `json:"error,omitempty"`
}

// NewSchedule is a schedule to create: on Cron or RRule, exactly one.
type NewSchedule struct {
	Name  string `json:"name"`
	Cron  string `json:"cron,omitempty"`
	RRule string `json:"rrule,omitempty"`
	// DTStart is an RRule's DTSTART (its wall clock in Timezone matters:
	// the fields the rule does not give come from it); default the
	// schedule's creation, truncated to the minute. Stored, so the
	// occurrences stay the same across restarts.
	DTStart  *time.Time      `json:"dtstart,omitempty"`
	Timezone string          `json:"timezone,omitempty"`
	Missed   schedule.Missed `json:"missed,omitempty"`
	Launch   Launch          `json:"launch"`
}

// ErrScheduleExists: a schedule of this name exists in the project.
var ErrScheduleExists = errors.New("a schedule of this name exists in the project")

// CreateSchedule stores a schedule of template templateID (as v sees it)
// that launches as the API key keyID. Its launch is checked against the
// template now (and again at each occurrence, against the version then
// current); a secret answer is refused: it would be stored.
func (s *Service) CreateSchedule(ctx context.Context, keyID string, v deployments.Visibility, templateID string, n NewSchedule) (*Schedule, error) {
	t, err := s.Get(ctx, v, templateID, n.Launch.Version)
	if err != nil {
		return nil, err
	}
	var fields []deployments.FieldError
	add := func(field, msg string) { fields = append(fields, deployments.FieldError{Field: field, Message: msg}) }
	if !NameRE.MatchString(n.Name) {
		add("name", "must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
	}
	now := time.Now()
	var dtstart *time.Time
	switch {
	case strings.TrimSpace(n.RRule) == "" && n.DTStart != nil:
		add("dtstart", "only an rrule schedule has a start")
	case strings.TrimSpace(n.RRule) != "":
		d := now.Truncate(time.Minute)
		if n.DTStart != nil {
			d = n.DTStart.Truncate(time.Second)
		}
		dtstart = &d
	}
	spec, err := schedule.Parse(newSpec(n.Cron, n.RRule, dtstart, n.Timezone))
	var next *time.Time
	switch {
	case err != nil:
		field := schedule.ErrField(err)
		if field == "" {
			field = "cron"
		}
		add(field, err.Error())
	default:
		if at := spec.Next(now); !at.IsZero() {
			next = &at
		} else {
			add("rrule", "the rule has no occurrence after now (its COUNT or UNTIL has passed)")
		}
	}
	switch n.Missed {
	case "":
		n.Missed = schedule.Skip
	case schedule.Skip, schedule.RunOnce:
	default:
		add("missed", "must be skip or run_once")
	}
	if err := checkStoredLaunch(t, n.Launch, "schedule", add); err != nil {
		return nil, err
	}
	if len(fields) > 0 {
		return nil, &deployments.InvalidError{Fields: fields}
	}
	id, launch, err := newStored(n.Launch)
	if err != nil {
		return nil, err
	}
	_, err = s.db.Exec(ctx, `INSERT INTO job_schedules (id, project_id, template_id, name, cron, rrule, dtstart, timezone, missed, launch, next_at, api_key_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
		id, t.ProjectID, t.ID, n.Name, strings.TrimSpace(n.Cron), strings.TrimSpace(n.RRule), dtstart, n.Timezone, string(n.Missed), launch, next, nullUUID(keyID))
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" {
		return nil, ErrScheduleExists
	}
	if err != nil {
		return nil, fmt.Errorf("store schedule: %w", err)
	}
	return s.GetSchedule(ctx, v, id.String())
}

const scheduleColumns = `id::text, project_id, template_id::text, name, cron, rrule, dtstart, timezone, missed, launch, paused, next_at, created_at`

// newSpec is the schedule.Spec of a schedule's columns.
func newSpec(cron, rrule string, dtstart *time.Time, tz string) schedule.Spec {
	spec := schedule.Spec{Cron: cron, RRule: rrule, Timezone: tz}
	if dtstart != nil {
		spec.DTStart = *dtstart
	}
	return spec
}

func (sc *Schedule) spec() schedule.Spec { return newSpec(sc.Cron, sc.RRule, sc.DTStart, sc.Timezone) }

func scanSchedule(row pgx.Row) (*Schedule, error) {
	var sc Schedule
	var launch []byte
	var next *time.Time
	if err := row.Scan(&sc.ID, &sc.ProjectID, &sc.TemplateID, &sc.Name, &sc.Cron, &sc.RRule, &sc.DTStart, &sc.Timezone, &sc.Missed, &launch,
		&sc.Paused, &next, &sc.CreatedAt); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(launch, &sc.Launch); err != nil {
		return nil, fmt.Errorf("schedule %s: %w", sc.ID, err)
	}
	if !sc.Paused && next != nil {
		sc.NextAt = next
		if spec, err := schedule.Parse(sc.spec()); err == nil {
			sc.Upcoming = spec.Upcoming(*next, 4)
		}
	}
	return &sc, nil
}

// GetSchedule returns schedule id with its recent occurrences; one v
// does not see is ErrNotFound.
func (s *Service) GetSchedule(ctx context.Context, v deployments.Visibility, id string) (*Schedule, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, ErrNotFound
	}
	sc, err := scanSchedule(s.db.QueryRow(ctx, `SELECT `+scheduleColumns+` FROM job_schedules WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) || err == nil && !v.Holds(sc.ProjectID) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read schedule: %w", err)
	}
	rows, err := s.db.Query(ctx, `SELECT occurrence, launched_at, COALESCE(job_id::text, ''), COALESCE(error, '')
		FROM schedule_occurrences WHERE schedule_id = $1 ORDER BY occurrence DESC LIMIT 20`, id)
	if err != nil {
		return nil, fmt.Errorf("read occurrences: %w", err)
	}
	sc.Recent, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Occurrence, error) {
		var o Occurrence
		return o, r.Scan(&o.At, &o.LaunchedAt, &o.JobID, &o.Error)
	})
	if err != nil {
		return nil, fmt.Errorf("read occurrences: %w", err)
	}
	return sc, nil
}

// ListSchedules returns the schedules of template templateID.
func (s *Service) ListSchedules(ctx context.Context, v deployments.Visibility, templateID string) ([]*Schedule, error) {
	if _, err := s.Get(ctx, v, templateID, 0); err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, `SELECT `+scheduleColumns+` FROM job_schedules WHERE template_id = $1 ORDER BY name LIMIT 1000`, templateID)
	if err != nil {
		return nil, fmt.Errorf("list schedules: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Schedule, error) { return scanSchedule(r) })
	if err != nil {
		return nil, fmt.Errorf("list schedules: %w", err)
	}
	return out, nil
}

// SetPaused pauses or resumes schedule id. A resumed schedule's next
// occurrence is the next one to come: what fell due while it was paused
// is not run (an RRULE's COUNT counts them all the same).
func (s *Service) SetPaused(ctx context.Context, v deployments.Visibility, id string, paused bool) (*Schedule, error) {
	sc, err := s.GetSchedule(ctx, v, id)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	next := &now
	if spec, err := schedule.Parse(sc.spec()); err == nil {
		next = nil // a rule done: none
		if at := spec.Next(now); !at.IsZero() {
			next = &at
		}
	}
	if _, err := s.db.Exec(ctx, `UPDATE job_schedules SET paused = $2,
		next_at = CASE WHEN $2 THEN next_at ELSE $3 END WHERE id = $1`, sc.ID, paused, next); err != nil {
		return nil, fmt.Errorf("pause schedule: %w", err)
	}
	return s.GetSchedule(ctx, v, id)
}

// DeleteSchedule removes schedule id and its occurrences (the jobs they
// launched stay).
func (s *Service) DeleteSchedule(ctx context.Context, v deployments.Visibility, id string) error {
	sc, err := s.GetSchedule(ctx, v, id)
	if err != nil {
		return err
	}
	if _, err := s.db.Exec(ctx, `DELETE FROM job_schedules WHERE id = $1`, sc.ID); err != nil {
		return fmt.Errorf("delete schedule: %w", err)
	}
	return nil
}
