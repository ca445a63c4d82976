package deployments

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
)

// Row is a deployment submitted through the API, as stored: what Submit
// hands to its Publisher, and the package publishing stores (InsertGroup).
type Row struct {
	ID             string // also its job id
	KeyID          string // "" for none
	ProjectID      string
	RepoFullName   string
	Branch         string
	ServerIP       string
	Port           int
	Modules        []string
	GitHubTokenRef string
	SecretsRef     string
	CorrelationID  string
	TimeoutSeconds int // 0 for none
	CallbackURL    string
	CreatedAt      time.Time
	// Kind is KindDeploy ("" too) or KindJob, whose request is JobRequest
	// (JSON) and whose stream is Queue.
	Kind       string
	JobRequest []byte
	Queue      string
}

// args returns the arguments of insertDeployment; group is the id of the
// row's commit group ("" for none) and pos its position there (from 1).
func (r *Row) args(group string, pos int) []any {
	var timeout, position *int
	if r.TimeoutSeconds > 0 {
		timeout = &r.TimeoutSeconds
	}
	var groupID *string
	if group != "" {
		groupID, position = &group, &pos
	}
	return []any{r.ID, nullUUID(r.KeyID), r.ProjectID, r.RepoFullName, r.Branch, r.ServerIP, r.Port, r.Modules,
		r.GitHubTokenRef, r.SecretsRef, r.CorrelationID, timeout, r.CallbackURL, r.CreatedAt, r.ID, groupID, position,
		cmp.Or(r.Kind, KindDeploy), r.JobRequest, r.Queue}
}

// insertDeployment stores a deployment submitted through the API (the
// arguments of Row.args).
const insertDeployment = `
	INSERT INTO deployments (id, job_id, source, api_key_id, project_id, repo_full_name, branch, server_ip, port,
		modules, github_token_ref, secrets_ref, correlation_id, timeout_seconds, callback_url, created_at,
		publish_group, publish_pos, kind, job_request, queue)
	VALUES ($1, $15, 'api', $2, $3, $4, $5, $6, $7, $8, NULLIF($9, ''), NULLIF($10, ''), NULLIF($11, ''),
		$12, NULLIF($13, ''), $14, $16, $17, $18, $19, NULLIF($20, ''))`

// InsertRow stores r on its own; group is the id of its commit group (""
// for none) and pos its position there (from 1).
func InsertRow(ctx context.Context, q store.Querier, r *Row, group string, pos int) error {
	_, err := q.Exec(ctx, insertDeployment, r.args(group, pos)...)
	return err
}

// insertGroup stores the deployments of a commit group, in one statement:
// the rows come as one array per column, and WITH ORDINALITY numbers them
// from 1 in order (their positions in the group).
const insertGroup = `
	INSERT INTO deployments (id, job_id, source, api_key_id, project_id, repo_full_name, branch, server_ip, port,
		modules, github_token_ref, secrets_ref, correlation_id, timeout_seconds, callback_url, created_at,
		publish_group, publish_pos)
	SELECT u.id, u.id::text, 'api', NULLIF(u.key_id, '')::uuid, u.project_id, u.repo, u.branch, u.server_ip, u.port,
		CASE WHEN u.modules = '' THEN NULL ELSE ARRAY(SELECT jsonb_array_elements_text(u.modules::jsonb)) END,
		NULLIF(u.token_ref, ''), NULLIF(u.secrets_ref, ''), NULLIF(u.correlation_id, ''), NULLIF(u.timeout, 0),
		NULLIF(u.callback_url, ''), u.created_at, $14, u.pos
	FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int[], $8::text[],
		$9::text[], $10::text[], $11::text[], $12::int[], $13::text[], $15::timestamptz[])
		WITH ORDINALITY AS u(id, key_id, project_id, repo, branch, server_ip, port, modules,
			token_ref, secrets_ref, correlation_id, timeout, callback_url, created_at, pos)`

// InsertGroup stores rows as commit group groupID (their positions from 1
// in order) with one statement and one commit.
func InsertGroup(ctx context.Context, q store.Querier, groupID string, rows []*Row) error {
	if len(rows) == 1 {
		return InsertRow(ctx, q, rows[0], groupID, 1)
	}
	n := len(rows)
	ids, keys, projects, repos, branches, servers := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	ports, timeouts := make([]int, n), make([]int, n)
	modules, tokenRefs, secretsRefs, correlations, callbacks := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	created := make([]time.Time, n)
	for i, r := range rows {
		ids[i], keys[i], projects[i], repos[i], branches[i], servers[i] = r.ID, r.KeyID, r.ProjectID, r.RepoFullName, r.Branch, r.ServerIP
		ports[i], timeouts[i] = r.Port, max(r.TimeoutSeconds, 0) // 0 stores NULL
		if r.Modules != nil {                                    // nil stays NULL; an empty list stays empty
			modules[i] = string(mustJSON(r.Modules))
		}
		tokenRefs[i], secretsRefs[i], correlations[i], callbacks[i] = r.GitHubTokenRef, r.SecretsRef, r.CorrelationID, r.CallbackURL
		created[i] = r.CreatedAt
	}
	_, err := q.Exec(ctx, insertGroup, ids, keys, projects, repos, branches, servers, ports, modules,
		tokenRefs, secretsRefs, correlations, timeouts, callbacks, groupID, created)
	if err != nil {
		return fmt.Errorf("store %d deployments: %w", n, err)
	}
	return nil
}

// Unpublished returns up to limit deployments submitted through the API,
// still queued, stored more than after ago and never marked published (on
// their own or by their commit group), oldest first: the republisher's
// work.
func Unpublished(ctx context.Context, q store.Querier, after time.Duration, limit int) ([]*Deployment, error) {
	rows, err := q.Query(ctx, selectDeployment+`
		WHERE d.published_at IS NULL AND d.source = 'api' AND d.status = 'queued' AND d.created_at < now() - $1::interval
			AND g.id IS NULL
		ORDER BY d.created_at LIMIT $2`, after, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Deployment, error) { return scanDeployment(r) })
}
