package console

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"regexp"

	"github.com/go-chi/chi/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/runlog"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/events"
)

// entryID is a stream entry id, the only Last-Event-ID a stream sent.
var entryID = regexp.MustCompile(`^[0-9]{1,20}-[0-9]{1,20}$`)

// provisionRun reads the route's provisioning run for a fleet-wide key
// with servers:read, or answers the refusal and returns nil.
func (c *Console) provisionRun(w http.ResponseWriter, r *http.Request) (*fleet.RunOf, []byte) {
	if !c.key(r).Has(auth.ScopeServersRead) || c.deps.Fleet == nil {
		c.fail(w, r, http.StatusForbidden, "This API key does not have the scope servers:read.")
		return nil, nil
	}
	run, result, err := c.deps.Fleet.RunResult(r.Context(), chi.URLParam(r, "id"))
	if errors.Is(err, fleet.ErrNotFound) {
		c.fail(w, r, http.StatusNotFound, "No run has this id.")
		return nil, nil
	}
	if err != nil {
		c.failStore(w, r, err, "read run", "The run cannot be read right now.")
		return nil, nil
	}
	return run, result
}

// runEnded tells whether a provisioning run has its final status.
func runEnded(run *fleet.RunOf) bool { return run.Status != "" || !run.FinishedAt.IsZero() }

// provisionLog adds what the template "runlog" shows for a provisioning
// run: the live output's URL, or once it ended the stored log (infra
// stores it under the run's job id).
func (c *Console) provisionLog(ctx context.Context, run *fleet.RunOf, data map[string]any) {
	base := Prefix + "/runs/provision/" + url.PathEscape(run.JobID)
	data["Terminal"] = runEnded(run)
	data["LogURL"], data["EventsURL"] = base+"/log", base+"/events"
	if !runEnded(run) || c.deps.Logs == nil {
		return
	}
	rc, _, err := c.deps.Logs.Open(ctx, run.JobID)
	if err != nil {
		if !errors.Is(err, runlog.ErrNotFound) {
			c.log.Warn().Err(err).Str("job_id", run.JobID).Msg("open provisioning log")
		}
		return
	}
	defer rc.Close()
	log, err := io.ReadAll(rc)
	if err != nil {
		c.log.Warn().Err(err).Str("job_id", run.JobID).Msg("read provisioning log")
		return
	}
	if len(log) > maxShownLog {
		data["LogCut"] = true
		log = log[len(log)-maxShownLog:]
	}
	data["Log"] = string(log)
}

// provisionEvents streams a provisioning run's progress events (SSE),
// resuming after the browser's Last-Event-ID, until the run's end.
func (c *Console) provisionEvents(w http.ResponseWriter, r *http.Request) {
	run, _ := c.provisionRun(w, r)
	if run == nil {
		return
	}
	if c.deps.Events == nil {
		c.fail(w, r, http.StatusServiceUnavailable, "Live output is not available here.")
		return
	}
	last := r.Header.Get("Last-Event-ID")
	if last != "" && last != events.FinalID && !entryID.MatchString(last) {
		c.fail(w, r, http.StatusBadRequest, "Last-Event-ID must be the id of an event this stream sent.")
		return
	}
	c.deps.Events.Serve(w, r, events.Request{
		JobID: run.JobID, Kind: messages.JobKindProvision, LastEventID: last, Shutdown: c.deps.Shutdown,
		Final: func(ctx context.Context) (string, bool, error) {
			cur, _, err := c.deps.Fleet.RunResult(ctx, run.JobID)
			if err != nil {
				return "", false, err
			}
			return cur.Status, runEnded(cur), nil
		},
	}, c.cfg.Events)
}

// provisionLogFile serves a provisioning run's whole stored log.
func (c *Console) provisionLogFile(w http.ResponseWriter, r *http.Request) {
	run, _ := c.provisionRun(w, r)
	if run == nil {
		return
	}
	if c.deps.Logs == nil {
		c.fail(w, r, http.StatusNotFound, "No log was stored for this run.")
		return
	}
	rc, _, err := c.deps.Logs.Open(r.Context(), run.JobID)
	if errors.Is(err, runlog.ErrNotFound) {
		c.fail(w, r, http.StatusNotFound, "No log was stored for this run.")
		return
	}
	if err != nil {
		c.failStore(w, r, err, "open provisioning log of "+run.JobID, "The log cannot be read right now.")
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if _, err := io.Copy(w, rc); err != nil {
		c.log.Debug().Err(err).Str("job_id", run.JobID).Msg("send provisioning log")
	}
}
