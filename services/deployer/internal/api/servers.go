package api

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// Fleet is what the servers endpoints need: pkg/fleet's Store, which owns
// the fleet's operations (the scheduler's reconcile loop turns requests into
// ProvisionerMessages, at most one job per server in flight).
type Fleet interface {
	List(ctx context.Context, f fleet.Filter, after string, limit int) (*fleet.Page, error)
	Count(ctx context.Context, f fleet.Filter) (map[string]int, error)
	Show(ctx context.Context, handle string, historyLimit, runLimit int) (*fleet.Detail, error)
	RequestAction(ctx context.Context, handle string, action fleet.Action, actor, reason string) (*fleet.Server, error)
	Pause(ctx context.Context, handle, actor, reason string) (*fleet.Server, error)
	Resume(ctx context.Context, handle, actor, reason string) (*fleet.Server, error)
	SetProjects(ctx context.Context, handle string, projects []string, actor, reason string) (*fleet.Server, error)
}

var _ Fleet = (*fleet.Store)(nil)

// Operation is an operator's action on a server.
type Operation string

// The operations, each POST /servers/{handle}/<operation>.
const (
	OpProvision Operation = "provision"
	OpRecovery  Operation = "recovery"
	OpRebuild   Operation = "rebuild"
	OpPause     Operation = "pause"
	OpResume    Operation = "resume"
)

// Operations returns every operation.
func Operations() []Operation {
	return []Operation{OpProvision, OpRecovery, OpRebuild, OpPause, OpResume}
}

// ServerView is a server as the API shows it.
type ServerView struct {
	Handle          string            `json:"handle"`
	Address         string            `json:"address"`
	SSHPort         int               `json:"ssh_port"`
	SSHUser         string            `json:"ssh_user"`
	Status          string            `json:"status"`
	Labels          map[string]string `json:"labels"`
	Source          string            `json:"source"`
	ProviderID      string            `json:"provider_id,omitempty"`
	Paused          bool              `json:"paused"`
	Attempts        int               `json:"attempts"`
	LastError       string            `json:"last_error,omitempty"`
	LastJobID       string            `json:"last_job_id,omitempty"`
	RequestedAction string            `json:"requested_action,omitempty"`
	RequestedBy     string            `json:"requested_by,omitempty"`
	PendingJobID    string            `json:"pending_job_id,omitempty"`
	PendingAction   string            `json:"pending_action,omitempty"`
	HostKeyPinned   bool              `json:"host_key_pinned"`
	// Projects own the server: only their deployments and jobs may target
	// it (empty: fleet-only). ProjectsFromSource: its source sets them.
	Projects           []string  `json:"projects"`
	ProjectsFromSource bool      `json:"projects_from_source"`
	CreatedAt          time.Time `json:"created_at"`
	UpdatedAt          time.Time `json:"updated_at"`
	StatusChangedAt    time.Time `json:"status_changed_at"`
}

func viewServer(s *fleet.Server) ServerView {
	labels := s.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	return ServerView{
		Handle: s.Handle, Address: s.Address, SSHPort: s.SSHPort, SSHUser: s.SSHUser, Status: s.Status,
		Labels: labels, Source: s.Source, ProviderID: s.ProviderID, Paused: s.Paused, Attempts: s.Attempts,
		LastError: s.LastError, LastJobID: s.LastJobID, RequestedAction: string(s.RequestedAction),
		RequestedBy: s.RequestedBy, PendingJobID: s.PendingJobID, PendingAction: string(s.PendingAction),
		HostKeyPinned: s.HostKey != "", CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt, StatusChangedAt: s.StatusChangedAt,
		Projects: projectsOrEmpty(s.Projects), ProjectsFromSource: s.ProjectsFromSource,
	}
}

// projectsOrEmpty is a list of owners for JSON: [] rather than null.
func projectsOrEmpty(p []string) []string {
	if p == nil {
		return []string{}
	}
	return p
}

// ServerList is a page of servers with the counts by status of all the
// servers the filter selects.
type ServerList struct {
	Items      []ServerView   `json:"items"`
	Counts     map[string]int `json:"counts"`
	NextCursor string         `json:"next_cursor,omitempty"`
}

// cursorRE matches the cursors of the server list: a handle, or base64url.
var cursorRE = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,512}$`)

var serverListParams = map[string]bool{"status": true, "source": true, "label": true, "search": true,
	"paused": true, "requested": true, "project": true, "limit": true, "cursor": true, "sort": true}

func (a *API) fleetOr503(w http.ResponseWriter, r *http.Request) bool {
	if a.deps.Fleet == nil {
		writeProblem(w, r, http.StatusServiceUnavailable, ProbUnavailable, "the servers endpoints are not enabled on this deployer")
		return false
	}
	return true
}

func (a *API) listServers(w http.ResponseWriter, r *http.Request) {
	if !a.fleetOr503(w, r) {
		return
	}
	q := r.URL.Query()
	bad := func(field, msg string) {
		writeProblem(w, r, http.StatusBadRequest, ProbInvalidParameter, msg, FieldProblem{Field: field, Message: msg})
	}
	for name := range q {
		if !serverListParams[name] {
			if fieldNameRE.MatchString(name) {
				bad(name, "unknown query parameter")
			} else {
				bad("query", "an unknown query parameter (its name is not repeated here)")
			}
			return
		}
	}
	var f fleet.Filter
	for _, st := range q["status"] {
		for s := range strings.SplitSeq(st, ",") {
			s = strings.ToUpper(strings.TrimSpace(s))
			if !fleet.ValidStatus(s) {
				bad("status", "must be a comma-separated list of "+strings.Join(fleet.Statuses(), ", "))
				return
			}
			f.Statuses = append(f.Statuses, s)
		}
	}
	f.Source = q.Get("source")
	f.Search = q.Get("search")
	if len(f.Source) > 256 || len(f.Search) > 256 {
		bad("search", "must be at most 256 characters")
		return
	}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" || len(l) > 256 {
			bad("label", "must be key=value (or key=* for any value)")
			return
		}
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		f.Labels[k] = v
	}
	for name, dst := range map[string]**bool{"paused": &f.Paused} {
		if v := q.Get(name); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				bad(name, "must be true or false")
				return
			}
			*dst = &b
		}
	}
	if v := q.Get("project"); v != "" {
		if v != "-" {
			list, err := fleet.CanonicalProjects([]string{v})
			if err != nil {
				bad("project", "must be a project id, or - for the fleet-only servers")
				return
			}
			v = list[0]
		}
		f.Project = v
	}
	if v := q.Get("requested"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			bad("requested", "must be true or false")
			return
		}
		f.Requested = b
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > fleet.MaxPageSize {
			bad("limit", "must be an integer between 1 and "+strconv.Itoa(fleet.MaxPageSize))
			return
		}
		limit = n
	}
	if v := q.Get("sort"); v != "" && v != "handle" {
		if !slices.Contains(fleet.Orders(), v) {
			bad("sort", "must be one of "+strings.Join(fleet.Orders(), ", "))
			return
		}
		f.Order = fleet.Order(v)
	}
	cursor := q.Get("cursor")
	if cursor != "" && ((f.Order == fleet.OrderHandle && !messages.ValidServerHandle(cursor)) || !cursorRE.MatchString(cursor)) {
		bad("cursor", "is not a cursor this API returned")
		return
	}
	page, err := a.deps.Fleet.List(r.Context(), f, cursor, limit)
	if errors.Is(err, fleet.ErrBadCursor) {
		bad("cursor", "is not a cursor of this sort order")
		return
	}
	if errors.Is(err, fleet.ErrInvalid) {
		bad("label", "has an invalid key")
		return
	}
	if err != nil {
		a.internal(w, r, "list servers", err)
		return
	}
	counts, err := a.deps.Fleet.Count(r.Context(), f)
	if err != nil {
		a.internal(w, r, "count servers", err)
		return
	}
	out := ServerList{Items: make([]ServerView, 0, len(page.Servers)), Counts: counts, NextCursor: page.Next}
	for _, s := range page.Servers {
		out.Items = append(out.Items, viewServer(s))
	}
	writeJSON(w, http.StatusOK, out)
}

// ServerDetail is one server with its history and runs, newest first.
type ServerDetail struct {
	Server  ServerView      `json:"server"`
	History []HistoryView   `json:"history"`
	Runs    []ServerRunView `json:"runs"`
}

// HistoryView is one change of a server.
type HistoryView struct {
	Event  string    `json:"event"`
	From   string    `json:"from,omitempty"`
	To     string    `json:"to"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
	JobID  string    `json:"job_id,omitempty"`
	Actor  string    `json:"actor"`
}

// ServerRunView is one run on a server.
type ServerRunView struct {
	JobID      string     `json:"job_id"`
	Kind       string     `json:"kind"`
	Playbook   string     `json:"playbook,omitempty"`
	State      string     `json:"state"`
	Status     string     `json:"status,omitempty"`
	ErrorKind  string     `json:"error_kind,omitempty"`
	Attempt    int        `json:"attempt"`
	CreatedAt  time.Time  `json:"created_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

func (a *API) serverHandle(w http.ResponseWriter, r *http.Request) (string, bool) {
	h := chi.URLParam(r, "handle")
	if !messages.ValidServerHandle(h) {
		writeProblem(w, r, http.StatusNotFound, ProbNotFound, "no server has this handle")
		return "", false
	}
	return h, true
}

func (a *API) fleetError(w http.ResponseWriter, r *http.Request, what string, err error) {
	switch {
	case errors.Is(err, fleet.ErrNotFound):
		writeProblem(w, r, http.StatusNotFound, ProbNotFound, "no server has this handle")
	case errors.Is(err, fleet.ErrNotAllowed) && what == "set projects of server":
		writeProblem(w, r, http.StatusConflict, ProbConflict, "the server's source sets its projects (an inventory's autoprov_projects, an EC2 tag autoprov:projects): change them there")
	case errors.Is(err, fleet.ErrNotAllowed):
		writeProblem(w, r, http.StatusConflict, ProbConflict, "the operation does not apply to the server in its current state (for example an ORPHANED server)")
	case errors.Is(err, fleet.ErrConflict):
		writeProblem(w, r, http.StatusConflict, ProbConflict, "the server changed concurrently; try again")
	default:
		a.internal(w, r, what, err)
	}
}

func (a *API) getServer(w http.ResponseWriter, r *http.Request) {
	if !a.fleetOr503(w, r) {
		return
	}
	h, ok := a.serverHandle(w, r)
	if !ok {
		return
	}
	d, err := a.deps.Fleet.Show(r.Context(), h, 50, 50)
	if err != nil {
		a.fleetError(w, r, "show server", err)
		return
	}
	out := ServerDetail{Server: viewServer(d.Server), History: []HistoryView{}, Runs: []ServerRunView{}}
	for _, hv := range d.History {
		out.History = append(out.History, HistoryView{Event: hv.Event, From: hv.From, To: hv.To, At: hv.At,
			Reason: hv.Reason, JobID: hv.JobID, Actor: hv.Actor})
	}
	for _, run := range d.Runs {
		rv := ServerRunView{JobID: run.JobID, Kind: run.Kind, Playbook: run.Playbook, State: run.State,
			Status: run.Status, ErrorKind: run.ErrorKind, Attempt: run.Attempt, CreatedAt: run.CreatedAt}
		if !run.FinishedAt.IsZero() {
			t := run.FinishedAt
			rv.FinishedAt = &t
		}
		out.Runs = append(out.Runs, rv)
	}
	writeJSON(w, http.StatusOK, out)
}

type operationRequest struct {
	Reason string `json:"reason,omitempty"`
}

// reasonProblem is the problem of an operator's reason, if any: it goes
// into the server's history, at most 500 characters.
func reasonProblem(reason string) (FieldProblem, bool) {
	if len(reason) > 500 {
		return FieldProblem{Field: "reason", Message: "must be at most 500 characters"}, true
	}
	return FieldProblem{}, false
}

func (a *API) serverOperation(op Operation) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !a.fleetOr503(w, r) {
			return
		}
		h, ok := a.serverHandle(w, r)
		if !ok {
			return
		}
		var req operationRequest
		if r.ContentLength != 0 && !decodeJSON(w, r, a.cfg.MaxBody, &req) {
			return
		}
		if p, bad := reasonProblem(req.Reason); bad {
			writeProblem(w, r, http.StatusUnprocessableEntity, ProbInvalidRequest, "the reason is too long", p)
			return
		}
		actor := "api:" + authedKey(r.Context()).Name
		var srv *fleet.Server
		var err error
		status := http.StatusAccepted
		switch op {
		case OpPause:
			srv, err = a.deps.Fleet.Pause(r.Context(), h, actor, req.Reason)
			status = http.StatusOK
		case OpResume:
			srv, err = a.deps.Fleet.Resume(r.Context(), h, actor, req.Reason)
			status = http.StatusOK
		default:
			srv, err = a.deps.Fleet.RequestAction(r.Context(), h, fleet.Action(op), actor, req.Reason)
		}
		if err != nil {
			a.fleetError(w, r, string(op)+" server", err)
			return
		}
		writeJSON(w, status, viewServer(srv))
	}
}

// projectsRequest is the body of PUT /servers/{handle}/projects.
type projectsRequest struct {
	Projects []string `json:"projects"`
	Reason   string   `json:"reason,omitempty"`
}

// setServerProjects sets the projects that own a server (an operator's
// decision, servers:write: keys with it are fleet-wide); [] makes it
// fleet-only. A server whose source sets its owners answers 409.
func (a *API) setServerProjects(w http.ResponseWriter, r *http.Request) {
	if !a.fleetOr503(w, r) {
		return
	}
	h, ok := a.serverHandle(w, r)
	if !ok {
		return
	}
	var req projectsRequest
	if !decodeJSON(w, r, a.cfg.MaxBody, &req) {
		return
	}
	var fields []FieldProblem
	if req.Projects == nil {
		fields = append(fields, FieldProblem{Field: "projects", Message: "is required: a list of project ids ([] for a fleet-only server)"})
	} else if _, err := fleet.CanonicalProjects(req.Projects); err != nil {
		fields = append(fields, FieldProblem{Field: "projects", Message: "must be at most " + strconv.Itoa(fleet.MaxProjects) + " project ids (UUIDs)"})
	}
	if p, bad := reasonProblem(req.Reason); bad {
		fields = append(fields, p)
	}
	if len(fields) > 0 {
		writeProblem(w, r, http.StatusUnprocessableEntity, ProbInvalidRequest, "the request is invalid: see errors", fields...)
		return
	}
	srv, err := a.deps.Fleet.SetProjects(r.Context(), h, req.Projects, "api:"+authedKey(r.Context()).Name, req.Reason)
	if err != nil {
		a.fleetError(w, r, "set projects of server", err)
		return
	}
	writeJSON(w, http.StatusOK, viewServer(srv))
}
