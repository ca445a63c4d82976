// Package templates holds a project's job templates (issue 36): a stored
// Ansible job (source, inventory, credentials by name, options), what a
// launch may override (AWX's ask_*_on_launch is the model) and a survey of
// typed questions whose answers become extra variables. Every change makes
// a new version; a launch submits a job through deployments.SubmitJob (so
// idempotency, ?wait=, the stream and webhooks are a job's) that records
// the template's id, name and version. A key sees and launches only its
// projects' templates; another project's answers as an unknown one.
package templates

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/credentials"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// Ask says what a launch may override of the template's job.
type Ask struct {
	Limit     bool `json:"limit,omitempty"`
	Tags      bool `json:"tags,omitempty"` // tags and skip_tags
	ExtraVars bool `json:"extra_vars,omitempty"`
	Inventory bool `json:"inventory,omitempty"`
	// Ref is the source's git ref (a branch, tag or commit).
	Ref       bool `json:"ref,omitempty"`
	Check     bool `json:"check,omitempty"` // check and diff
	Verbosity bool `json:"verbosity,omitempty"`
}

// Definition is what a version of a template holds.
type Definition struct {
	Description string `json:"description,omitempty"`
	// Job is the job a launch submits; its project_id is the template's,
	// its credential fields name credentials or references, never values.
	Job    deployments.JobRequest `json:"job"`
	Ask    Ask                    `json:"ask_on_launch"`
	Survey []Question             `json:"survey,omitempty"`
}

// Template is a template's version, as the API shows it.
type Template struct {
	ID        string `json:"id"`
	ProjectID string `json:"project_id"`
	Name      string `json:"name"`
	// Version is the version shown; Latest the template's current one.
	Version int `json:"version"`
	Latest  int `json:"latest_version"`
	Definition
	CreatedAt time.Time `json:"created_at"`
	// VersionCreatedAt is when this version was saved.
	VersionCreatedAt time.Time `json:"version_created_at"`
}

// Save is a template to create, or the new version of one.
type Save struct {
	ProjectID string
	Name      string
	Definition
	// IfVersion, when not 0, refuses an update unless the template's
	// current version is this one (ErrVersionConflict).
	IfVersion int
}

// Checker validates a job as a submit would, without submitting it
// (deployments.Service.CheckJob).
type Checker interface {
	CheckJob(ctx context.Context, v deployments.Visibility, r deployments.JobRequest) error
}

// The errors of the Service.
var (
	ErrExists          = errors.New("a template of this name exists in the project")
	ErrNotFound        = errors.New("no such template")
	ErrVersionConflict = errors.New("the template has changed since the version given")
)

// NameRE is the shape of a template's name.
var NameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// Config configures the Service.
type Config struct {
	// Check validates a template's job as a submit would.
	Check Checker
	// Vault takes the answers of secret questions; nil refuses secret
	// questions.
	Vault credentials.Writer
	// Mount is the KV v2 mount answers are written to. Default "secret".
	Mount string
	// Path is where an answer is written under Mount: {project_id},
	// {launch} (an id of its own per launch) and {variable} are replaced.
	// Default "projects/{project_id}/launches/{launch}/{variable}".
	Path string
}

// Service stores templates.
type Service struct {
	db  *pgxpool.Pool
	cfg Config
}

// NewService returns a Service.
func NewService(db *pgxpool.Pool, cfg Config) *Service {
	if cfg.Mount == "" {
		cfg.Mount = "secret"
	}
	if cfg.Path == "" {
		cfg.Path = "projects/{project_id}/launches/{launch}/{variable}"
	}
	return &Service{db: db, cfg: cfg}
}

// validate checks s for the key that sees v and returns its canonical
// project.
func (s *Service) validate(ctx context.Context, v deployments.Visibility, sv *Save) (string, error) {
	p, ok := messages.CanonicalProjectID(sv.ProjectID)
	if !ok {
		return "", invalid("project_id", "must be a project id (a UUID)")
	}
	if !v.Holds(p) {
		return "", deployments.ErrForbiddenProject
	}
	var fields []deployments.FieldError
	if !NameRE.MatchString(sv.Name) {
		fields = append(fields, deployments.FieldError{Field: "name", Message: "must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"})
	}
	if len(sv.Description) > 1000 {
		fields = append(fields, deployments.FieldError{Field: "description", Message: "must be at most 1000 characters"})
	}
	if jp, _ := messages.CanonicalProjectID(sv.Job.ProjectID); sv.Job.ProjectID != "" && jp != p {
		fields = append(fields, deployments.FieldError{Field: "job.project_id", Message: "a template's job runs in the template's project: leave it out"})
	}
	sv.Job.ProjectID = p
	if sv.Job.Template != nil {
		fields = append(fields, deployments.FieldError{Field: "job.template", Message: "set by a launch, not by the template"})
	}
	if sv.Job.Options.CallbackURL != "" {
		fields = append(fields, deployments.FieldError{Field: "job.options.callback_url", Message: "give the webhook at launch: its URL holds the receiver's tokens"})
	}
	fields = append(fields, checkSurvey(sv.Survey, s.cfg.Vault != nil)...)
	var ie *deployments.InvalidError
	switch err := s.cfg.Check.CheckJob(ctx, v, sv.Job); {
	case errors.As(err, &ie):
		for _, f := range ie.Fields {
			fields = append(fields, deployments.FieldError{Field: "job." + f.Field, Message: f.Message})
		}
	case err != nil:
		return "", err
	}
	if len(fields) > 0 {
		return "", &deployments.InvalidError{Fields: fields}
	}
	return p, nil
}

func invalid(field, msg string) error {
	return &deployments.InvalidError{Fields: []deployments.FieldError{{Field: field, Message: msg}}}
}

// Create stores a new template (version 1) for the API key keyID, which
// sees v.
func (s *Service) Create(ctx context.Context, keyID string, v deployments.Visibility, sv Save) (*Template, error) {
	p, err := s.validate(ctx, v, &sv)
	if err != nil {
		return nil, err
	}
	id, err := uuid.NewV7FromReader(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("new template id: %w", err)
	}
	def, err := json.Marshal(sv.Definition)
	if err != nil {
		return nil, fmt.Errorf("encode template: %w", err)
	}
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO job_templates (id, project_id, name, version) VALUES ($1, $2, $3, 1)`,
			id, p, sv.Name); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO job_template_versions (template_id, version, definition, api_key_id)
			VALUES ($1, 1, $2, $3)`, id, def, nullUUID(keyID))
		return err
	})
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" {
		return nil, ErrExists
	}
	if err != nil {
		return nil, fmt.Errorf("store template: %w", err)
	}
	return s.Get(ctx, v, id.String(), 0)
}

// Update saves sv as the next version of template id (its name may
// change); one v does not see is ErrNotFound.
func (s *Service) Update(ctx context.Context, keyID string, v deployments.Visibility, id string, sv Save) (*Template, error) {
	cur, err := s.Get(ctx, v, id, 0)
	if err != nil {
		return nil, err
	}
	if sv.ProjectID == "" {
		sv.ProjectID = cur.ProjectID
	}
	if p, _ := messages.CanonicalProjectID(sv.ProjectID); p != cur.ProjectID {
		return nil, invalid("project_id", "a template stays in its project")
	}
	if _, err := s.validate(ctx, v, &sv); err != nil {
		return nil, err
	}
	def, err := json.Marshal(sv.Definition)
	if err != nil {
		return nil, fmt.Errorf("encode template: %w", err)
	}
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var version int
		err := tx.QueryRow(ctx, `UPDATE job_templates SET version = version + 1, name = $2, updated_at = now()
			WHERE id = $1 AND ($3 = 0 OR version = $3) RETURNING version`, cur.ID, sv.Name, sv.IfVersion).Scan(&version)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrVersionConflict // the row is there (Get saw it): its version moved
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO job_template_versions (template_id, version, definition, api_key_id)
			VALUES ($1, $2, $3, $4)`, cur.ID, version, def, nullUUID(keyID))
		return err
	})
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && pe.Code == "23505":
		return nil, ErrExists
	case errors.Is(err, ErrVersionConflict):
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("store template: %w", err)
	}
	return s.Get(ctx, v, cur.ID, 0)
}

const columns = `t.id::text, t.project_id, t.name, v.version, t.version, v.definition, t.created_at, v.created_at`

func scan(row pgx.Row) (*Template, error) {
	var t Template
	var def []byte
	if err := row.Scan(&t.ID, &t.ProjectID, &t.Name, &t.Version, &t.Latest, &def, &t.CreatedAt, &t.VersionCreatedAt); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(def, &t.Definition); err != nil {
		return nil, fmt.Errorf("template %s version %d: %w", t.ID, t.Version, err)
	}
	return &t, nil
}

// Get returns version of template id (0: its current one); a template v
// does not see, or an unknown version, is ErrNotFound.
func (s *Service) Get(ctx context.Context, v deployments.Visibility, id string, version int) (*Template, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, ErrNotFound
	}
	t, err := scan(s.db.QueryRow(ctx, `SELECT `+columns+` FROM job_templates t
		JOIN job_template_versions v ON v.template_id = t.id AND v.version = CASE WHEN $2 = 0 THEN t.version ELSE $2 END
		WHERE t.id = $1`, id, version))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read template: %w", err)
	}
	if !v.Holds(t.ProjectID) {
		return nil, ErrNotFound
	}
	return t, nil
}

// List returns the current versions of the templates v sees (of project
// only, when given), by project and name.
func (s *Service) List(ctx context.Context, v deployments.Visibility, projectID string) ([]*Template, error) {
	q := `SELECT ` + columns + ` FROM job_templates t
		JOIN job_template_versions v ON v.template_id = t.id AND v.version = t.version
		WHERE ($1::text IS NULL OR t.project_id = $1)`
	args := []any{nil}
	if projectID != "" {
		p, err := credentials.HeldProject(v, projectID)
		if err != nil {
			return nil, err
		}
		args[0] = p
	}
	if !v.All {
		q += ` AND t.project_id = ANY($2)`
		args = append(args, v.Projects)
	}
	rows, err := s.db.Query(ctx, q+` ORDER BY t.project_id, t.name LIMIT 1000`, args...)
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Template, error) { return scan(r) })
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	return out, nil
}

// Versions returns every version of template id, newest first.
func (s *Service) Versions(ctx context.Context, v deployments.Visibility, id string) ([]*Template, error) {
	if _, err := s.Get(ctx, v, id, 0); err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, `SELECT `+columns+` FROM job_templates t
		JOIN job_template_versions v ON v.template_id = t.id WHERE t.id = $1 ORDER BY v.version DESC LIMIT 1000`, id)
	if err != nil {
		return nil, fmt.Errorf("list template versions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Template, error) { return scan(r) })
	if err != nil {
		return nil, fmt.Errorf("list template versions: %w", err)
	}
	return out, nil
}

// Delete removes template id and its versions; jobs launched from it keep
// the id, name and version they ran.
func (s *Service) Delete(ctx context.Context, v deployments.Visibility, id string) error {
	t, err := s.Get(ctx, v, id, 0)
	if err != nil {
		return err
	}
	if _, err := s.db.Exec(ctx, `DELETE FROM job_templates WHERE id = $1`, t.ID); err != nil {
		return fmt.Errorf("delete template: %w", err)
	}
	return nil
}

func nullUUID(s string) any {
	if s == "" {
		return nil
	}
	return s
}
