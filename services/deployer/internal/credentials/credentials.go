// Package credentials holds the deployer's named credentials (issue 23):
// per project, a name for a secret reference, so that a job's request can
// name "prod-ssh" instead of a reference. Only references are stored: a
// value posted is written to Vault KV under the project's path (when the
// deployer has a Vault client for it) and its reference is stored. A key
// sees, manages and uses only its projects' credentials; one of another
// project answers as an unknown one.
package credentials

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// Credential is a named reference, as the API shows it: never a value.
type Credential struct {
	ProjectID   string `json:"project_id"`
	Name        string `json:"name"`
	Ref         string `json:"ref"`
	Description string `json:"description,omitempty"`
	// VaultWritten: the deployer wrote the value to Vault (POST with a
	// value); else the client gave the reference.
	VaultWritten bool      `json:"vault_written"`
	CreatedAt    time.Time `json:"created_at"`
}

// New is a credential to create: a reference, or a value to write to
// Vault (exactly one).
type New struct {
	ProjectID   string
	Name        string
	Ref         string
	Value       secrets.Value
	Description string
}

// Writer writes a value to Vault KV (secrets.Vault.WriteKV).
type Writer interface {
	WriteKV(ctx context.Context, mount, path string, fields map[string]secrets.Value) (secrets.Ref, error)
}

// Config configures the Service.
type Config struct {
	// Refs checks references against the project's templates
	// (DEPLOY_SECRET_REFS); nil accepts any well-formed reference.
	Refs *authz.Authorizer
	// Vault writes posted values; nil refuses values.
	Vault Writer
	// Mount is the KV v2 mount values are written to. Default "secret".
	Mount string
	// Path is where a value is written under Mount: {project_id} and
	// {name} are replaced. Default "projects/{project_id}/credentials/{name}".
	Path string
}

// Service stores credentials.
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
		cfg.Path = "projects/{project_id}/credentials/{name}"
	}
	return &Service{db: db, cfg: cfg}
}

// The errors of the Service.
var (
	ErrExists   = errors.New("a credential of this name exists in the project")
	ErrNotFound = errors.New("no such credential")
)

// NameRE is the shape of a credential's name.
var NameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

func invalid(field, msg string) error {
	return &deployments.InvalidError{Fields: []deployments.FieldError{{Field: field, Message: msg}}}
}

// HeldProject checks a request's project id against v: a malformed one
// is invalid (project_id), one v does not hold is
// deployments.ErrForbiddenProject.
func HeldProject(v deployments.Visibility, id string) (string, error) {
	p, ok := messages.CanonicalProjectID(id)
	if !ok {
		return "", invalid("project_id", "must be a project id (a UUID)")
	}
	if !v.Holds(p) {
		return "", deployments.ErrForbiddenProject
	}
	return p, nil
}

// CheckRef validates ref and checks it against project's templates; field
// names the request's field in errors, which never repeat the value.
func (s *Service) CheckRef(project, field, ref string) error {
	if _, err := secrets.ParseRef(ref); err != nil {
		return invalid(field, "must be a secret reference (vault:, env: or file:) or a credential's name")
	}
	if s.cfg.Refs == nil {
		return nil
	}
	if _, err := s.cfg.Refs.Ref(project, field, ref, nil); err != nil {
		msg := "this reference is not allowed for the project"
		var re *authz.RefError
		if errors.As(err, &re) {
			msg = "refused: " + re.Reason
		}
		return invalid(field, msg)
	}
	return nil
}

// Create stores a credential for the API key keyID, which sees v. With a
// value, the value is written to Vault first and only its reference is
// stored; the value is never stored, logged or returned.
func (s *Service) Create(ctx context.Context, keyID string, v deployments.Visibility, n New) (*Credential, error) {
	defer n.Value.Wipe()
	p, err := HeldProject(v, n.ProjectID)
	if err != nil {
		return nil, err
	}
	var fields []deployments.FieldError
	if !NameRE.MatchString(n.Name) {
		fields = append(fields, deployments.FieldError{Field: "name", Message: "must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"})
	}
	if len(n.Description) > 200 {
		fields = append(fields, deployments.FieldError{Field: "description", Message: "must be at most 200 characters"})
	}
	switch {
	case n.Ref != "" && !n.Value.IsZero():
		fields = append(fields, deployments.FieldError{Field: "value", Message: "give either ref or value, not both"})
	case n.Ref == "" && n.Value.IsZero():
		fields = append(fields, deployments.FieldError{Field: "ref", Message: "give a secret reference (ref) or, with Vault configured, a value"})
	case n.Ref != "":
		var ie *deployments.InvalidError
		if err := s.CheckRef(p, "ref", n.Ref); errors.As(err, &ie) {
			fields = append(fields, ie.Fields...)
		}
	case s.cfg.Vault == nil:
		fields = append(fields, deployments.FieldError{Field: "value", Message: "this deployer has no Vault to write values to (CREDENTIALS_VAULT_ADDR): give a reference"})
	case n.Value.Len() > 32<<10:
		fields = append(fields, deployments.FieldError{Field: "value", Message: "must be at most 32 KiB"})
	}
	if len(fields) > 0 {
		return nil, &deployments.InvalidError{Fields: fields}
	}
	c := &Credential{ProjectID: p, Name: n.Name, Ref: n.Ref, Description: n.Description}
	if c.Ref == "" {
		// Refuse a duplicate before writing to Vault, which would add a
		// version under the existing credential's path.
		if _, err := s.Get(ctx, v, p, n.Name); err == nil {
			return nil, ErrExists
		}
		path := strings.NewReplacer("{project_id}", p, "{name}", n.Name).Replace(s.cfg.Path)
		ref, err := s.cfg.Vault.WriteKV(ctx, s.cfg.Mount, path, map[string]secrets.Value{"value": n.Value})
		if err != nil {
			return nil, fmt.Errorf("write the credential's value to Vault: %w", err)
		}
		c.Ref, c.VaultWritten = ref.String(), true
	}
	err = s.db.QueryRow(ctx, `INSERT INTO credentials (project_id, name, ref, vault_written, description, api_key_id)
		VALUES ($1, $2, $3, $4, $5, $6) RETURNING created_at`,
		c.ProjectID, c.Name, c.Ref, c.VaultWritten, c.Description, nullUUID(keyID)).Scan(&c.CreatedAt)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" {
		return nil, ErrExists
	}
	if err != nil {
		return nil, fmt.Errorf("store credential: %w", err)
	}
	return c, nil
}

func nullUUID(s string) any {
	if s == "" {
		return nil
	}
	return s
}

const columns = `project_id, name, ref, description, vault_written, created_at`

func scan(row pgx.Row) (*Credential, error) {
	var c Credential
	if err := row.Scan(&c.ProjectID, &c.Name, &c.Ref, &c.Description, &c.VaultWritten, &c.CreatedAt); err != nil {
		return nil, err
	}
	return &c, nil
}

// List returns the credentials v sees (of project only, when given),
// by project and name.
func (s *Service) List(ctx context.Context, v deployments.Visibility, projectID string) ([]*Credential, error) {
	q := `SELECT ` + columns + ` FROM credentials WHERE ($1::text IS NULL OR project_id = $1)`
	args := []any{nil}
	if projectID != "" {
		p, err := HeldProject(v, projectID)
		if err != nil {
			return nil, err
		}
		args[0] = p
	}
	if !v.All {
		q += ` AND project_id = ANY($2)`
		args = append(args, v.Projects)
	}
	rows, err := s.db.Query(ctx, q+` ORDER BY project_id, name LIMIT 1000`, args...)
	if err != nil {
		return nil, fmt.Errorf("list credentials: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Credential, error) { return scan(r) })
	if err != nil {
		return nil, fmt.Errorf("list credentials: %w", err)
	}
	return out, nil
}

// Get returns project's credential name; one v does not see is
// ErrNotFound.
func (s *Service) Get(ctx context.Context, v deployments.Visibility, projectID, name string) (*Credential, error) {
	p, ok := messages.CanonicalProjectID(projectID)
	if !ok || !v.Holds(p) || !NameRE.MatchString(name) {
		return nil, ErrNotFound
	}
	c, err := scan(s.db.QueryRow(ctx, `SELECT `+columns+` FROM credentials WHERE project_id = $1 AND name = $2`, p, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read credential: %w", err)
	}
	return c, nil
}

// Delete removes project's credential name (a project v does not hold is
// deployments.ErrForbiddenProject, an unknown name ErrNotFound). A value
// the deployer wrote stays in Vault, where the operator may destroy it.
func (s *Service) Delete(ctx context.Context, v deployments.Visibility, projectID, name string) (*Credential, error) {
	p, err := HeldProject(v, projectID)
	if err != nil {
		return nil, err
	}
	if !NameRE.MatchString(name) {
		return nil, ErrNotFound
	}
	c, err := scan(s.db.QueryRow(ctx, `DELETE FROM credentials WHERE project_id = $1 AND name = $2 RETURNING `+columns, p, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("delete credential: %w", err)
	}
	return c, nil
}

// Resolve turns what a job's credential field holds into the reference to
// put on the wire: a credential's name of project is its reference; a
// reference is checked against project's templates. field names the
// request's field in errors (*deployments.InvalidError). "" stays "".
func (s *Service) Resolve(ctx context.Context, projectID, field, nameOrRef string) (string, error) {
	if nameOrRef == "" {
		return "", nil
	}
	if NameRE.MatchString(nameOrRef) && !strings.Contains(nameOrRef, ":") {
		c, err := s.Get(ctx, deployments.AllProjects, projectID, nameOrRef)
		if errors.Is(err, ErrNotFound) {
			return "", invalid(field, "no credential of this name in the project (GET /api/v1/credentials lists them)")
		}
		if err != nil {
			return "", err
		}
		return c.Ref, nil
	}
	if err := s.CheckRef(projectID, field, nameOrRef); err != nil {
		return "", err
	}
	return nameOrRef, nil
}
