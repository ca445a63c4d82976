package console

import (
	"cmp"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// Run is one row of the Runs list, of any kind.
type Run struct {
	Kind       string // the RunSource's kind
	ID         string
	Status     string
	Target     string // the server or address it ran on
	What       string // what ran: a repository, a playbook
	CreatedAt  time.Time
	FinishedAt *time.Time
	Link       string // its page
}

// RunFilter selects runs; zero fields do not filter.
type RunFilter struct {
	Status string
	Server string // a server handle
}

// Position is a place in the Runs list, which is ordered by (created_at,
// kind, id) descending: a page starts after it.
type Position struct {
	At   time.Time
	Kind string
	ID   string
}

// until is the time bound that keeps the runs of kind after (below)
// p in the list, for a source that can only filter by time: created at
// p.At or earlier when kind sorts below p.Kind, before p.At otherwise.
func (p *Position) until(kind string) time.Time {
	if kind < p.Kind {
		return p.At.Add(time.Microsecond) // created_at <= p.At
	}
	return p.At // created_at < p.At
}

// RunSource is one kind of run in the Runs list: deployments, Ansible
// jobs, provisioning runs. Runs returns up to
// limit runs the signed-in key may see, newest first, after before (nil:
// from the top); a kind equal to before.Kind resumes after before.ID.
type RunSource interface {
	Kind() string
	// Visible reports whether key may see this kind at all.
	Visible(key *auth.Key) bool
	Runs(r *http.Request, f RunFilter, before *Position, limit int) ([]Run, error)
}

// errBadFilter is a filter the source's API refused, shown to the user.
type errBadFilter struct{ msg string }

func (e *errBadFilter) Error() string { return e.msg }

// deploymentRuns lists deployments through the API's list handler.
type deploymentRuns struct{ c *Console }

func (deploymentRuns) Kind() string { return "deployment" }
func (deploymentRuns) Visible(key *auth.Key) bool {
	return key.Has(auth.ScopeDeploymentsRead)
}

func (s deploymentRuns) Runs(r *http.Request, f RunFilter, before *Position, limit int) ([]Run, error) {
	q := url.Values{"limit": {strconv.Itoa(min(limit, 100))}}
	if f.Status != "" {
		q.Set("status", f.Status)
	}
	if f.Server != "" {
		q.Set("server", f.Server)
	}
	if before != nil {
		if before.Kind == s.Kind() {
			q.Set("cursor", deployments.CursorAt(before.At, before.ID))
		} else {
			q.Set("until", before.until(s.Kind()).UTC().Format(time.RFC3339Nano))
		}
	}
	var list api.DeploymentList
	res, err := s.c.call(r, http.MethodGet, "/api/v1/deployments?"+q.Encode(), nil, &list)
	if err != nil {
		return nil, err
	}
	if res.Problem != nil {
		return nil, &errBadFilter{problemText(res.Problem)}
	}
	out := make([]Run, 0, len(list.Items))
	for _, d := range list.Items {
		out = append(out, Run{Kind: s.Kind(), ID: d.ID, Status: string(d.Status), Target: d.Request.ServerIP,
			What: d.Request.RepoFullName, CreatedAt: d.CreatedAt, FinishedAt: d.FinishedAt,
			Link: Prefix + "/runs/deployment/" + d.ID})
	}
	return out, nil
}

// jobRuns lists Ansible jobs through the API's jobs list handler (its
// scope jobs:read, the key's projects).
type jobRuns struct{ c *Console }

func (jobRuns) Kind() string { return "job" }
func (jobRuns) Visible(key *auth.Key) bool {
	return key.Has(auth.ScopeJobsRead)
}

func (s jobRuns) Runs(r *http.Request, f RunFilter, before *Position, limit int) ([]Run, error) {
	if f.Server != "" {
		// A job runs on an inventory, not on one server: the server
		// filter (the deployments' column) never matches one.
		return nil, nil
	}
	q := url.Values{"limit": {strconv.Itoa(min(limit, 100))}}
	if f.Status != "" {
		q.Set("status", f.Status)
	}
	if before != nil {
		if before.Kind == s.Kind() {
			q.Set("cursor", deployments.CursorAt(before.At, before.ID))
		} else {
			q.Set("until", before.until(s.Kind()).UTC().Format(time.RFC3339Nano))
		}
	}
	var list struct {
		Items []jobView `json:"items"`
	}
	res, err := s.c.call(r, http.MethodGet, "/api/v1/jobs?"+q.Encode(), nil, &list)
	if err != nil {
		return nil, err
	}
	if res.Problem != nil {
		return nil, &errBadFilter{problemText(res.Problem)}
	}
	out := make([]Run, 0, len(list.Items))
	for _, j := range list.Items {
		run := Run{Kind: s.Kind(), ID: j.ID, Status: string(j.Status), CreatedAt: j.CreatedAt, FinishedAt: j.FinishedAt,
			Link: Prefix + "/runs/job/" + j.ID}
		run.Target, run.What = jobTarget(&j.Request), jobWhat(&j.Request)
		out = append(out, run)
	}
	return out, nil
}

// jobView is a job as GET /api/v1/jobs/{id} shows it, its request
// decoded as a job's.
type jobView struct {
	api.Job
	Request deployments.JobRequest `json:"request"`
}

// jobWhat is what a job runs, in a few words.
func jobWhat(r *deployments.JobRequest) string {
	src := r.Source
	switch src.Type {
	case "playbook":
		w := src.Repository
		if src.Ref != "" {
			w += "@" + src.Ref
		}
		if len(src.Paths) > 0 {
			w += " " + strings.Join(src.Paths, ", ")
		}
		return w
	case "collection_role":
		return src.Collection + "." + src.Role
	case "role":
		return "role " + cmp.Or(src.RolePath, src.Repository)
	}
	return src.Type
}

// jobTarget is where a job runs: an inline inventory's hosts, or its
// inventory's kind.
func jobTarget(r *deployments.JobRequest) string {
	if names := r.HostNames(); len(names) > 0 {
		if len(names) > 3 {
			return strings.Join(names[:3], ", ") + fmt.Sprintf(" and %d more", len(names)-3)
		}
		return strings.Join(names, ", ")
	}
	return r.Inventory.Type + " inventory"
}

// provisioningRuns lists the fleet's provisioning runs (infra's runs),
// for keys that may read the servers (as the API's server page shows
// them).
type provisioningRuns struct{ c *Console }

func (provisioningRuns) Kind() string { return "provision" }
func (provisioningRuns) Visible(key *auth.Key) bool {
	return key.Has(auth.ScopeServersRead)
}

func (s provisioningRuns) Runs(r *http.Request, f RunFilter, before *Position, limit int) ([]Run, error) {
	if s.c.deps.Fleet == nil {
		return nil, nil
	}
	rf := fleet.RunFilter{Kind: fleet.RunKindProvision, Status: f.Status, Server: f.Server}
	switch f.Status {
	case "queued": // a provisioning run exists once it runs
		return nil, nil
	}
	if before != nil {
		if before.Kind == s.Kind() {
			rf.BeforeAt, rf.BeforeID = before.At, before.ID
		} else {
			rf.Until = before.until(s.Kind())
		}
	}
	runs, err := s.c.deps.Fleet.Runs(r.Context(), rf, limit)
	if err != nil {
		return nil, err
	}
	out := make([]Run, 0, len(runs))
	for _, run := range runs {
		st := run.Status
		if st == "" {
			st = run.State
		}
		rr := Run{Kind: s.Kind(), ID: run.JobID, Status: st, Target: run.Server, What: run.Playbook,
			CreatedAt: run.CreatedAt, Link: Prefix + "/runs/provision/" + url.PathEscape(run.JobID)}
		if rr.Target == "" {
			rr.Target = run.Target
		}
		if !run.FinishedAt.IsZero() {
			t := run.FinishedAt
			rr.FinishedAt = &t
		}
		out = append(out, rr)
	}
	return out, nil
}

// runStatuses are the statuses the Runs list filters by.
var runStatuses = []string{"queued", "running", "succeeded", "failed", "unreachable", "rejected", "cancelled"}

// listRuns merges the visible sources' runs into one page, newest first.
func (c *Console) listRuns(r *http.Request, kind string, f RunFilter, before *Position, limit int) ([]Run, *Position, error) {
	var all []Run
	key := authOf(r.Context()).key
	for _, src := range c.deps.Runs {
		if (kind != "" && src.Kind() != kind) || !src.Visible(key) {
			continue
		}
		runs, err := src.Runs(r, f, before, limit+1)
		if err != nil {
			return nil, nil, err
		}
		all = append(all, runs...)
	}
	sort.Slice(all, func(i, j int) bool {
		a, b := all[i], all[j]
		if !a.CreatedAt.Equal(b.CreatedAt) {
			return a.CreatedAt.After(b.CreatedAt)
		}
		if a.Kind != b.Kind {
			return a.Kind > b.Kind
		}
		return a.ID > b.ID
	})
	if len(all) <= limit {
		return all, nil, nil
	}
	all = all[:limit]
	last := all[limit-1]
	return all, &Position{At: last.CreatedAt, Kind: last.Kind, ID: last.ID}, nil
}

func encodePosition(p *Position) string {
	if p == nil {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(p.At.UnixMicro(), 10) + "." + p.Kind + "." + p.ID))
}

var errBadCursor = errors.New("not a cursor of this list")

func decodePosition(s string) (*Position, error) {
	if s == "" {
		return nil, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) > 400 {
		return nil, errBadCursor
	}
	parts := strings.SplitN(string(b), ".", 3)
	if len(parts) != 3 || parts[1] == "" || parts[2] == "" {
		return nil, errBadCursor
	}
	us, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil {
		return nil, errBadCursor
	}
	return &Position{At: time.UnixMicro(us).UTC(), Kind: parts[1], ID: parts[2]}, nil
}

func problemText(p *api.Problem) string {
	var msgs []string
	for _, e := range p.Errors {
		msgs = append(msgs, e.Field+": "+e.Message)
	}
	if len(msgs) > 0 {
		return strings.Join(msgs, "; ")
	}
	if p.Detail != "" {
		return p.Detail
	}
	return p.Title
}
