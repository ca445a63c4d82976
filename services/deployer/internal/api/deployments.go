package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/runlog"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/events"
)

// idempotencyKeyRE is the shape of an Idempotency-Key header.
var idempotencyKeyRE = regexp.MustCompile(`^[!-~]{1,255}$`)

func (a *API) createDeployment(w http.ResponseWriter, r *http.Request) {
	key := authedKey(r.Context())
	idem, wait, ok := a.submitHeaders(w, r)
	if !ok {
		return
	}
	var req deployments.Request
	if !decodeJSON(w, r, a.cfg.MaxBody, &req) {
		return
	}
	// A client's W3C trace context (traceparent, tracestate headers) is
	// the parent of the deployment's trace; a malformed one is ignored.
	ctx := tracing.Extract(r.Context(), messages.TraceContext{
		Traceparent: r.Header.Get("traceparent"), Tracestate: r.Header.Get("tracestate")})
	sub, err := a.deps.Deployments.Submit(ctx, key.ID, visibility(key), req, idem)
	a.answerSubmit(w, r, sub, err, wait, deploymentView)
}

// view renders a deployment (or a job) for the route that serves it.
type view func(*deployments.Deployment) any

// deploymentView shows a deployment as /deployments does.
func deploymentView(d *deployments.Deployment) any { return d }

// submitHeaders reads a submit's Idempotency-Key and ?wait=; false when
// it answered a bad one.
func (a *API) submitHeaders(w http.ResponseWriter, r *http.Request) (string, time.Duration, bool) {
	idem := r.Header.Get("Idempotency-Key")
	if idem != "" && !idempotencyKeyRE.MatchString(idem) {
		writeProblem(w, r, http.StatusBadRequest, ProbInvalidParameter, "must be 1-255 printable ASCII characters without spaces",
			FieldProblem{Field: "Idempotency-Key", Message: "must be 1-255 printable ASCII characters without spaces"})
		return "", 0, false
	}
	wait, ok := a.parseWait(w, r)
	return idem, wait, ok
}

// answerSubmit answers a submit (of a deployment or a job): its refusal,
// or 202 (200 after a ?wait= that saw the end) with the view of it.
func (a *API) answerSubmit(w http.ResponseWriter, r *http.Request, sub *deployments.Submission, err error, wait time.Duration, show view) {
	var invalid *deployments.InvalidError
	var unknownServer *deployments.UnknownServerError
	switch {
	case errors.As(err, &unknownServer):
		// Another project's server answers as one that does not exist.
		writeProblem(w, r, http.StatusNotFound, ProbNotFound, "no registered server of the project has this handle",
			FieldProblem{Field: unknownServer.Field, Message: "no registered server of the project has this handle"})
		return
	case errors.Is(err, deployments.ErrForbiddenProject):
		writeProblemValue(w, r, Problem{Type: ProbForbidden, Status: http.StatusForbidden,
			Title:  "The API key does not act for this project",
			Detail: "this API key is not bound to the request's project_id; `deployer keys set-projects` binds keys",
			Errors: []FieldProblem{{Field: "project_id", Message: "not a project of this API key"}}})
		return
	case errors.As(err, &invalid):
		fields := make([]FieldProblem, len(invalid.Fields))
		for i, f := range invalid.Fields {
			fields[i] = FieldProblem{Field: f.Field, Message: f.Message}
		}
		detail := "the request breaks the wire contract's rules: see errors"
		writeProblem(w, r, http.StatusUnprocessableEntity, ProbInvalidRequest, detail, fields...)
		return
	case errors.Is(err, deployments.ErrIdempotencyMismatch):
		writeProblem(w, r, http.StatusUnprocessableEntity, ProbIdempotency,
			"this Idempotency-Key was first used with another request body; use a new key for a new request")
		return
	case err != nil:
		a.internal(w, r, "submit deployment", err)
		return
	}
	d := sub.Deployment
	w.Header().Set("Location", d.Links.Self)
	if sub.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	if wait > 0 {
		a.respondAfterWait(w, r, d.ID, wait, show)
		return
	}
	writeJSON(w, http.StatusAccepted, show(d))
}

// visibility is what key may see and act on: its projects, or every
// project for a fleet-wide key. Every handler that reads or acts on
// deployments for a key goes through it.
func visibility(key *auth.Key) deployments.Visibility {
	if key == nil {
		return deployments.Visibility{}
	}
	if key.FleetWide {
		return deployments.AllProjects
	}
	return deployments.Visibility{Projects: key.Projects}
}

// parseWait reads ?wait=<duration> (Go syntax like 30s or 2m, or seconds).
func (a *API) parseWait(w http.ResponseWriter, r *http.Request) (time.Duration, bool) {
	v := r.URL.Query().Get("wait")
	if v == "" {
		return 0, true
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		n, nerr := strconv.Atoi(v)
		d, err = time.Duration(n)*time.Second, nerr
	}
	if err != nil || d < 0 || d > a.cfg.MaxWait {
		msg := fmt.Sprintf("must be a duration like 30s or 5m, at most %s", a.cfg.MaxWait)
		writeProblem(w, r, http.StatusBadRequest, ProbInvalidParameter, msg, FieldProblem{Field: "wait", Message: msg})
		return 0, false
	}
	return d, true
}

// respondAfterWait holds the request until the deployment ends (200) or
// the wait runs out or the server shuts down (202 with the current state).
func (a *API) respondAfterWait(w http.ResponseWriter, r *http.Request, id string, wait time.Duration, show view) {
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	go func() {
		select {
		case <-a.shutdown:
			cancel()
		case <-ctx.Done():
		}
	}()
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Now().Add(wait + 30*time.Second))
	d, err := a.deps.Deployments.Wait(ctx, id)
	if err != nil {
		if r.Context().Err() != nil {
			return // the client went away
		}
		a.internal(w, r, "wait for deployment", err)
		return
	}
	if d.Status.Terminal() {
		writeJSON(w, http.StatusOK, show(d))
		return
	}
	writeJSON(w, http.StatusAccepted, show(d))
}

func (a *API) getDeployment(w http.ResponseWriter, r *http.Request) { a.get(w, r, deploymentView) }

// get answers GET of a deployment or job, shown with show.
func (a *API) get(w http.ResponseWriter, r *http.Request, show view) {
	wait, ok := a.parseWait(w, r)
	if !ok {
		return
	}
	if wait > 0 {
		d, ok := a.find(w, r, false)
		if ok {
			a.respondAfterWait(w, r, d.ID, wait, show)
		}
		return
	}
	key := authedKey(r.Context())
	d, err := a.deps.Deployments.GetWithProgress(r.Context(), visibility(key), chi.URLParam(r, "id"))
	if err == nil && !mayAct(key, d, false) {
		err = deployments.ErrNotFound
	}
	if err != nil {
		a.deploymentError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, show(d))
}

// mayAct reports whether key's scopes cover d's kind: jobs:read/write for
// an Ansible job, deployments:read/write for a deployment. Both route
// families serve both kinds; a kind the key has no scope of answers as an
// unknown id.
func mayAct(key *auth.Key, d *deployments.Deployment, write bool) bool {
	if key == nil {
		return false
	}
	switch {
	case d.Kind == deployments.KindJob && write:
		return key.Has(auth.ScopeJobsWrite)
	case d.Kind == deployments.KindJob:
		return key.Has(auth.ScopeJobsRead)
	case write:
		return key.Has(auth.ScopeDeploymentsWrite)
	}
	return key.Has(auth.ScopeDeploymentsRead)
}

// find reads the deployment or job of the route's id for the request's
// key (its projects and scopes), or answers 404.
func (a *API) find(w http.ResponseWriter, r *http.Request, write bool) (*deployments.Deployment, bool) {
	key := authedKey(r.Context())
	d, err := a.deps.Deployments.GetFor(r.Context(), visibility(key), chi.URLParam(r, "id"))
	if err == nil && !mayAct(key, d, write) {
		err = deployments.ErrNotFound
	}
	if err != nil {
		a.deploymentError(w, r, err)
		return nil, false
	}
	return d, true
}

// deploymentError answers err of reading a deployment or job: 404 naming
// what the route asked for, or the store's error.
func (a *API) deploymentError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, deployments.ErrNotFound) {
		what := "deployment"
		if strings.Contains(r.URL.Path, "/jobs/") {
			what = "job"
		}
		writeProblem(w, r, http.StatusNotFound, ProbNotFound, "no "+what+" has this id")
		return
	}
	a.internal(w, r, "read deployment", err)
}

// internal logs err and answers 500 for what the handler could not do. An
// error that says Postgres or Redis cannot be reached right now (a
// restart, a failover) is no bug: it answers 503 with Retry-After, so that
// clients and CI pipelines retry instead of failing.
func (a *API) internal(w http.ResponseWriter, r *http.Request, what string, err error) {
	if Unreachable(err) {
		a.log.Warn().Err(err).Str("request_id", requestID(r.Context())).Msg(what + ": a store cannot be reached")
		retryLater(w, r, "the database or Redis cannot be reached right now; retry after the Retry-After delay (a submit with the same Idempotency-Key)")
		return
	}
	a.log.Error().Err(err).Str("request_id", requestID(r.Context())).Msg(what)
	writeProblem(w, r, http.StatusInternalServerError, ProbInternal, "an internal error occurred; the request id is in the logs")
}

// Unreachable reports whether err says Postgres or Redis cannot be
// reached right now (and a client's own cancellation never does): what the
// API and the console's pages answer 503 with Retry-After for.
func Unreachable(err error) bool { return store.Unreachable(err) || stream.Unreachable(err) }

// retryLater answers 503 with detail and a Retry-After of unreachableRetry:
// what every 503 for a dependency that is away for now (and will be back)
// answers, so that clients wait and retry instead of failing. A 503 for
// what this deployer does not serve (configuration) carries none: waiting
// would not change it.
func retryLater(w http.ResponseWriter, r *http.Request, detail string) {
	RetryAfter(w.Header())
	writeProblem(w, r, http.StatusServiceUnavailable, ProbUnavailable, detail)
}

// RetryAfter sets h's Retry-After to unreachableRetry, the delay of a 503
// for a store that cannot be reached: the console's pages answer such
// 503s too.
func RetryAfter(h http.Header) { h.Set("Retry-After", strconv.Itoa(int(unreachableRetry/time.Second))) }

// unreachableRetry is the Retry-After of a 503 for a store that cannot be
// reached: about how long a Postgres restart or failover takes.
const unreachableRetry = 5 * time.Second

// DeploymentList is a page of deployments.
type DeploymentList struct {
	Items      []*deployments.Deployment `json:"items"`
	NextCursor string                    `json:"next_cursor,omitempty"`
	Links      struct {
		Next string `json:"next,omitempty"`
	} `json:"links"`
}

var listParams = map[string]bool{
	"project_id": true, "server": true, "server_ip": true, "status": true, "job_id": true, "correlation_id": true,
	"source": true, "since": true, "until": true, "limit": true, "cursor": true,
}

func (a *API) listDeployments(w http.ResponseWriter, r *http.Request) {
	a.list(w, r, deployments.KindDeploy, "/api/v1/deployments", func(items []*deployments.Deployment, next, nextLink string) any {
		out := DeploymentList{Items: items, NextCursor: next}
		out.Links.Next = nextLink
		return out
	})
}

// list answers a list of kind's rows, rendered by page.
func (a *API) list(w http.ResponseWriter, r *http.Request, kind, base string,
	page func(items []*deployments.Deployment, next, nextLink string) any) {
	q := r.URL.Query()
	bad := func(field, msg string) {
		writeProblem(w, r, http.StatusBadRequest, ProbInvalidParameter, msg, FieldProblem{Field: field, Message: msg})
	}
	for name := range q {
		if !listParams[name] {
			if fieldNameRE.MatchString(name) {
				bad(name, "unknown query parameter")
			} else {
				bad("query", "an unknown query parameter (its name is not repeated here)")
			}
			return
		}
	}
	f := deployments.Filter{
		Visibility: visibility(authedKey(r.Context())),
		ProjectID:  q.Get("project_id"), ServerIP: q.Get("server_ip"), JobID: q.Get("job_id"),
		CorrelationID: q.Get("correlation_id"), Source: q.Get("source"), Cursor: q.Get("cursor"), Kind: kind,
	}
	if f.ProjectID != "" && !uuidRE.MatchString(f.ProjectID) {
		bad("project_id", "must be a UUID")
		return
	}
	if s := q.Get("server"); s != "" {
		if ip, err := netipParse(s); err == nil {
			f.ServerIP = ip
		} else if messages.ValidServerHandle(s) {
			f.ServerHandle = s
		} else {
			bad("server", "must be a server handle or an IP address")
			return
		}
	}
	if f.ServerIP != "" {
		ip, err := netipParse(f.ServerIP)
		if err != nil {
			bad("server_ip", "must be an IP address")
			return
		}
		f.ServerIP = ip
	}
	if s := q.Get("status"); s != "" {
		f.Status = deployments.Status(s)
		if !f.Status.Valid() {
			bad("status", "must be one of queued, running, succeeded, failed, unreachable, rejected, cancelled")
			return
		}
	}
	if f.Source != "" && f.Source != "api" && f.Source != "stream" {
		bad("source", "must be api or stream")
		return
	}
	if len(f.JobID) > 255 || len(f.CorrelationID) > 255 {
		bad("job_id", "must be at most 255 characters")
		return
	}
	for _, p := range []struct {
		name string
		dst  *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if v := q.Get(p.name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				bad(p.name, "must be an RFC 3339 time, e.g. 2026-01-02T15:04:05Z")
				return
			}
			*p.dst = t
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			bad("limit", "must be an integer between 1 and 100")
			return
		}
		f.Limit = n
	}
	pg, err := a.deps.Deployments.List(r.Context(), f)
	if errors.Is(err, deployments.ErrBadCursor) {
		bad("cursor", "is not a cursor this API returned")
		return
	}
	if err != nil {
		a.internal(w, r, "list deployments", err)
		return
	}
	items, nextLink := pg.Items, ""
	if items == nil {
		items = []*deployments.Deployment{}
	}
	if pg.Next != "" {
		nq := url.Values{}
		for k, v := range q {
			nq[k] = v
		}
		nq.Set("cursor", pg.Next)
		nextLink = base + "?" + nq.Encode()
	}
	writeJSON(w, http.StatusOK, page(items, pg.Next, nextLink))
}

func (a *API) cancelDeployment(w http.ResponseWriter, r *http.Request) {
	a.cancel(w, r, deploymentView)
}

// cancel answers DELETE of a deployment or job, shown with show.
func (a *API) cancel(w http.ResponseWriter, r *http.Request, show view) {
	found, ok := a.find(w, r, true)
	if !ok {
		return
	}
	d, outcome, err := a.deps.Deployments.Cancel(r.Context(), deployments.AllProjects, found.ID) // found for the key already
	switch {
	case errors.Is(err, deployments.ErrFinished):
		writeProblemValue(w, r, Problem{Type: ProbConflict, Status: http.StatusConflict,
			Detail: "the deployment has already finished: " + string(d.Status), DeploymentStatus: string(d.Status)})
	case err != nil:
		a.deploymentError(w, r, err)
	case outcome == deployments.CancelledBeforeStart:
		writeJSON(w, http.StatusOK, show(d))
	default:
		writeJSON(w, http.StatusAccepted, show(d))
	}
}

func (a *API) deploymentEvents(w http.ResponseWriter, r *http.Request) {
	svc := a.deps.Deployments
	d, ok := a.find(w, r, false)
	if !ok {
		return
	}
	last := r.Header.Get("Last-Event-ID")
	if last == "" {
		last = r.URL.Query().Get("last_event_id")
	}
	if last != "" && last != events.FinalID && !entryIDRE.MatchString(last) {
		msg := "must be the id of an event this stream sent"
		writeProblem(w, r, http.StatusBadRequest, ProbInvalidParameter, msg, FieldProblem{Field: "Last-Event-ID", Message: msg})
		return
	}
	changed, stop := svc.Notifier().Watch(d.JobID)
	defer stop()
	a.deps.Hub.Serve(w, r, events.Request{
		JobID: d.JobID, Kind: d.ProgressKind(), LastEventID: last, Changed: changed, Shutdown: a.shutdown,
		Final: func(ctx context.Context) (string, bool, error) {
			cur, err := svc.Get(ctx, d.ID)
			if err != nil {
				return "", false, err
			}
			return string(cur.Status), cur.Status.Terminal(), nil
		},
	}, a.cfg.Events)
}

func (a *API) deploymentLog(w http.ResponseWriter, r *http.Request) {
	d, ok := a.find(w, r, false)
	if !ok {
		return
	}
	var rc io.ReadCloser
	var info runlog.Info
	var err error
	if a.deps.Logs != nil {
		rc, info, err = a.deps.Logs.Open(r.Context(), d.JobID)
	} else {
		err = runlog.ErrNotFound
	}
	switch {
	case errors.Is(err, runlog.ErrNotFound):
		if !d.Status.Terminal() {
			writeProblemValue(w, r, Problem{Type: ProbConflict, Status: http.StatusConflict, DeploymentStatus: string(d.Status),
				Detail: "the log is stored when the run ends; follow " + d.Links.Events + " meanwhile"})
			return
		}
		tail, terr := a.deps.Deployments.OutputTail(r.Context(), d.ID)
		if terr != nil || tail == "" {
			writeProblem(w, r, http.StatusNotFound, ProbNotFound, "no output was stored for this deployment (it may have expired, or never run)")
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Autoprov-Log", "tail")
		_, _ = io.WriteString(w, tail)
		return
	case err != nil:
		a.internal(w, r, "open run log", err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Length", strconv.FormatInt(info.Size, 10))
	w.Header().Set("Autoprov-Log", "full")
	if info.Truncated {
		w.Header().Set("Autoprov-Log", "truncated")
	}
	w.Header().Set("Content-Disposition", `inline; filename="`+safeFilename(d.ID)+`.log"`)
	rcw := http.NewResponseController(w)
	_ = rcw.SetWriteDeadline(time.Now().Add(5 * time.Minute))
	if _, err := io.Copy(w, rc); err != nil {
		a.log.Warn().Err(err).Str("request_id", requestID(r.Context())).Msg("send run log")
	}
}

func safeFilename(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') {
			return r
		}
		return '_'
	}, s)
}

func (a *API) deploymentWebhooks(w http.ResponseWriter, r *http.Request) {
	d, ok := a.find(w, r, false)
	if !ok {
		return
	}
	list, err := a.deps.Webhooks(r.Context(), d.ID)
	if err != nil {
		a.internal(w, r, "list webhooks", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": list})
}
