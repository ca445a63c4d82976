package deployments

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/webhooks"
)

// ErrNotFound: no such deployment.
var ErrNotFound = errors.New("deployment not found")

// selectDeployment reads deployments with their run (infra's row of the
// job), which says whether a queued deployment has started, and their
// commit group's publish mark (the entry id of a deployment published with
// its group).
const selectDeployment = `
	SELECT d.id::text, d.job_id, d.source, COALESCE(d.api_key_id::text, ''), d.status,
		COALESCE(d.project_id, ''), COALESCE(d.repo_full_name, ''), COALESCE(d.branch, ''), COALESCE(d.server_ip, ''),
		COALESCE(d.port, 0), d.modules, COALESCE(d.github_token_ref, ''), COALESCE(d.secrets_ref, ''),
		COALESCE(d.correlation_id, ''), COALESCE(d.timeout_seconds, 0), COALESCE(d.callback_url, ''),
		COALESCE(d.request_id, g.entries[d.publish_pos], ''), COALESCE(d.published_at, g.published_at), d.cancel_requested_at, d.result, d.created_at, d.finished_at,
		COALESCE(r.state, ''), r.started_at, d.kind, d.job_request, COALESCE(d.queue, '')
	FROM deployments d LEFT JOIN runs r ON r.job_id = d.job_id
		LEFT JOIN deployment_publish_groups g ON g.id = d.publish_group`

func scanDeployment(row pgx.Row) (*Deployment, error) {
	var d Deployment
	var status, runState string
	var result []byte
	var runStarted *time.Time
	var jobRequest []byte
	err := row.Scan(&d.ID, &d.JobID, &d.Source, &d.apiKeyID, &status,
		&d.Request.ProjectID, &d.Request.RepoFullName, &d.Request.Branch, &d.Request.ServerIP,
		&d.Request.Port, &d.Request.Modules, &d.Request.GitHubTokenRef, &d.Request.SecretsRef,
		&d.Request.CorrelationID, &d.Request.Options.TimeoutSeconds, &d.callbackURL,
		&d.RequestID, &d.publishedAt, &d.CancelRequestedAt, &result, &d.CreatedAt, &d.FinishedAt,
		&runState, &runStarted, &d.Kind, &jobRequest, &d.queue)
	if err != nil {
		return nil, err
	}
	d.Status = Status(status)
	if d.Status == StatusQueued && runState != "" {
		d.Status = StatusRunning // infra has started it; its result is not in yet
	}
	if d.callbackURL != "" {
		d.Request.Options.CallbackURL = webhooks.RedactURL(d.callbackURL)
	}
	if len(result) > 0 {
		var r Result
		if err := json.Unmarshal(result, &r); err != nil {
			return nil, fmt.Errorf("stored result of %s: %w", d.ID, err)
		}
		r.OutputTail = ""
		d.Result = &r
	}
	if len(jobRequest) > 0 {
		jr, err := JobRequestOf(jobRequest)
		if err != nil {
			return nil, fmt.Errorf("deployment %s: %w", d.ID, err)
		}
		jr.Options.CallbackURL = d.Request.Options.CallbackURL // shown redacted
		d.Job = jr
	}
	d.StartedAt = runStarted
	if d.Result != nil && d.Result.StartedAt != "" {
		if t, err := time.Parse(time.RFC3339Nano, d.Result.StartedAt); err == nil {
			d.StartedAt = &t
		}
	}
	d.Links = linksFor(d.ID, d.Kind)
	return &d, nil
}

func getDeployment(ctx context.Context, q store.Querier, where string, args ...any) (*Deployment, error) {
	d, err := scanDeployment(q.QueryRow(ctx, selectDeployment+" WHERE "+where, args...))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read deployment: %w", err)
	}
	return d, nil
}

// Visibility is what a caller may see and act on: the deployments of its
// API key's projects, or every deployment for a fleet-wide key. The zero
// value sees nothing, so a caller that forgets it fails closed. A
// deployment outside it is answered exactly as one that does not exist.
type Visibility struct {
	// All: every project (a fleet-wide key).
	All bool
	// Projects are the projects seen, canonical (lower-case) ids.
	Projects []string
}

// AllProjects sees every deployment.
var AllProjects = Visibility{All: true}

// Holds reports whether v covers project (canonical form).
func (v Visibility) Holds(project string) bool {
	return v.All || slices.Contains(v.Projects, project)
}

// clause returns the SQL condition limiting a query to v, with ? for its
// argument (nil: none): "" for every project.
func (v Visibility) clause() (string, any) {
	switch {
	case v.All:
		return "", nil
	case len(v.Projects) == 0:
		return "false", nil
	}
	return "d.project_id = ANY(?)", v.Projects
}

// Filter selects deployments for List. Zero fields do not filter, except
// Visibility, whose zero value sees nothing.
type Filter struct {
	// Visibility limits the list to what the caller may see; it is a
	// condition of the query, so that pages and cursors hold only them.
	Visibility    Visibility
	ProjectID     string
	ServerIP      string // the deployment's server address
	ServerHandle  string // a registered server, by its address
	Status        Status
	JobID         string
	CorrelationID string
	Source        string
	// Kind lists one kind only (KindDeploy, KindJob); "" lists both.
	Kind         string
	Since, Until time.Time // created_at in [Since, Until)
	Limit        int       // 1-100, default 20
	Cursor       string    // from Page.Next
}

// Page is one page of deployments, newest first.
type Page struct {
	Items []*Deployment
	// Next is the cursor of the next page; "" on the last one.
	Next string
}

// ErrBadCursor: the cursor is not one List returned.
var ErrBadCursor = errors.New("invalid cursor")

// encodeCursor makes an opaque cursor of the last item's sort key.
func encodeCursor(d *Deployment) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(d.CreatedAt.UnixMicro(), 10) + "." + d.ID))
}

func decodeCursor(s string) (time.Time, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) > 100 {
		return time.Time{}, "", ErrBadCursor
	}
	ts, id, ok := strings.Cut(string(b), ".")
	us, err := strconv.ParseInt(ts, 10, 64)
	if !ok || err != nil || len(id) != 36 {
		return time.Time{}, "", ErrBadCursor
	}
	return time.UnixMicro(us), id, nil
}

func list(ctx context.Context, q store.Querier, f Filter) (*Page, error) {
	var where []string
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, strings.ReplaceAll(cond, "?", "$"+strconv.Itoa(len(args))))
	}
	switch cond, arg := f.Visibility.clause(); {
	case arg != nil:
		add(cond, arg)
	case cond != "":
		where = append(where, cond)
	}
	if f.ProjectID != "" {
		add("d.project_id = ?", strings.ToLower(f.ProjectID))
	}
	if f.ServerIP != "" {
		add("d.server_ip = ?", f.ServerIP)
	}
	if f.ServerHandle != "" {
		add("d.server_ip IN (SELECT address FROM servers WHERE handle = ?)", f.ServerHandle)
	}
	switch f.Status {
	case "":
	case StatusQueued:
		where = append(where, "d.status = 'queued' AND r.job_id IS NULL")
	case StatusRunning:
		where = append(where, "d.status = 'queued' AND r.job_id IS NOT NULL")
	default:
		add("d.status = ?", string(f.Status))
	}
	if f.JobID != "" {
		add("d.job_id = ?", f.JobID)
	}
	if f.CorrelationID != "" {
		add("d.correlation_id = ?", f.CorrelationID)
	}
	if f.Source != "" {
		add("d.source = ?", f.Source)
	}
	if f.Kind != "" {
		add("d.kind = ?", f.Kind)
	}
	if !f.Since.IsZero() {
		add("d.created_at >= ?", f.Since)
	}
	if !f.Until.IsZero() {
		add("d.created_at < ?", f.Until)
	}
	if f.Cursor != "" {
		at, id, err := decodeCursor(f.Cursor)
		if err != nil {
			return nil, err
		}
		args = append(args, at, id)
		where = append(where, fmt.Sprintf("(d.created_at, d.id) < ($%d, $%d::uuid)", len(args)-1, len(args)))
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 20
	}
	sql := selectDeployment
	if len(where) > 0 {
		sql += " WHERE " + strings.Join(where, " AND ")
	}
	sql += fmt.Sprintf(" ORDER BY d.created_at DESC, d.id DESC LIMIT %d", limit+1)
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list deployments: %w", err)
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Deployment, error) { return scanDeployment(r) })
	if err != nil {
		return nil, fmt.Errorf("list deployments: %w", err)
	}
	p := &Page{Items: items}
	if len(items) > limit {
		p.Items = items[:limit]
		p.Next = encodeCursor(p.Items[limit-1])
	}
	return p, nil
}

// CursorAt returns the cursor of List that starts after the deployment
// created at at with id: the web console's merged runs list pages
// deployments from another list's position.
func CursorAt(at time.Time, id string) string {
	return encodeCursor(&Deployment{CreatedAt: at, ID: id})
}

// Hourly counts the rows of kinds (KindDeploy, KindJob) v sees created
// since since, by hour (UTC, truncated) and status (queued and running
// together as "running").
func (s *Service) Hourly(ctx context.Context, v Visibility, kinds []string, since time.Time) (map[time.Time]map[string]int, error) {
	args := []any{since, kinds}
	where := "d.created_at >= $1 AND d.kind = ANY($2)"
	switch cond, arg := v.clause(); {
	case arg != nil:
		args = append(args, arg)
		where += " AND " + strings.ReplaceAll(cond, "?", "$3")
	case cond != "":
		where += " AND " + cond
	}
	out, err := store.Hourly(ctx, s.db, `SELECT date_trunc('hour', d.created_at),
		CASE WHEN d.status = 'queued' THEN 'running' ELSE d.status END, count(*)
		FROM deployments d WHERE `+where+` GROUP BY 1, 2`, args...)
	if err != nil {
		return nil, fmt.Errorf("hourly deployments: %w", err)
	}
	return out, nil
}
