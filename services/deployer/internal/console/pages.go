package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"golang.org/x/crypto/ssh"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/webhooks"
)

func (c *Console) key(r *http.Request) *auth.Key { return authOf(r.Context()).key }

// ---- Overview

type readiness struct {
	Name   string
	Ready  bool
	Detail string
}

type queueRow struct {
	Stream        string
	Group         string
	Length        int64
	Lag           int64
	Pending       int64
	OldestPending time.Duration
	HasOldest     bool
	DeadLetters   int64
	Err           string
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	key := c.key(r)
	data := map[string]any{"Title": "Overview"}
	since := c.now().UTC().Truncate(time.Hour).Add(-23 * time.Hour)
	// The parts are independent: they are read at once, and the page
	// takes as long as the slowest.
	var (
		wg             sync.WaitGroup
		counts         []statusCount
		total          int
		depHours, prov map[time.Time]map[string]int
		queues         []queueRow
		ready          []readiness
	)
	if key.Has(auth.ScopeServersRead) {
		wg.Go(func() {
			var list api.ServerList
			if res, err := c.call(r, http.MethodGet, "/api/v1/servers?limit=1", nil, &list); err == nil && res.Problem == nil {
				for _, st := range fleet.Statuses() {
					counts = append(counts, statusCount{st, list.Counts[st]})
					total += list.Counts[st]
				}
			}
		})
		if c.deps.Fleet != nil {
			wg.Go(func() {
				var err error
				if prov, err = c.deps.Fleet.HourlyRuns(r.Context(), fleet.RunKindProvision, since); err != nil {
					c.log.Warn().Err(err).Msg("hourly runs")
				}
			})
		}
		wg.Go(func() { queues = c.queueRows(r.Context(), c.streams(r.Context())) })
		wg.Go(func() { ready = c.readiness(r.Context()) })
	}
	// Deployments and jobs count for the keys that may read them.
	var kinds []string
	if key.Has(auth.ScopeDeploymentsRead) {
		kinds = append(kinds, deployments.KindDeploy)
	}
	if key.Has(auth.ScopeJobsRead) {
		kinds = append(kinds, deployments.KindJob)
	}
	if len(kinds) > 0 && c.deps.Deployments != nil {
		wg.Go(func() {
			var err error
			if depHours, err = c.deps.Deployments.Hourly(r.Context(), api.VisibilityOf(key), kinds, since); err != nil {
				c.log.Warn().Err(err).Msg("hourly deployments")
			}
		})
	}
	wg.Wait()
	hours := map[time.Time]map[string]int{}
	for _, m := range []map[time.Time]map[string]int{depHours, prov} {
		for at, by := range m {
			if hours[at] == nil {
				hours[at] = map[string]int{}
			}
			for st, n := range by {
				hours[at][st] += n
			}
		}
	}
	if counts != nil {
		data["Servers"], data["ServersTotal"] = counts, total
	}
	data["Chart"] = hourlyChart(since, hours)
	data["Attention"] = needsAttention(counts, ready, queues, hours, c.now())
	if key.Has(auth.ScopeServersRead) {
		data["Queues"], data["Ready"] = queues, ready
	}
	c.render(w, r, http.StatusOK, "overview", data)
}

// statusCount is a number of servers in a status.
type statusCount struct {
	Status string
	N      int
}

// readiness probes the services, concurrently.
func (c *Console) readiness(ctx context.Context) []readiness {
	out := make([]readiness, len(c.cfg.Services))
	var wg sync.WaitGroup
	for i, s := range c.cfg.Services {
		wg.Go(func() {
			out[i] = readiness{Name: s.Name, Ready: true, Detail: "ready"}
			ctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			var err error
			if s.URL == "" {
				if c.deps.Ping != nil {
					err = c.deps.Ping(ctx)
				}
			} else {
				var req *http.Request
				if req, err = http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil); err == nil {
					var res *http.Response
					if res, err = c.deps.Client.Do(req); err == nil {
						res.Body.Close()
						if res.StatusCode != http.StatusOK {
							err = fmt.Errorf("readyz answered %d", res.StatusCode)
						}
					}
				}
			}
			if err != nil {
				out[i] = readiness{Name: s.Name, Detail: err.Error()}
			}
		})
	}
	wg.Wait()
	return out
}

// streams returns the streams the Queues page shows: the configured ones,
// then those discovered (Config.Discover, and any with dead letters) in
// name order, found at most discoverFor ago. A failed scan leaves its
// streams out (logged).
func (c *Console) streams(ctx context.Context) []string {
	out := slices.Clone(c.cfg.Streams)
	if c.deps.Queues == nil {
		return out
	}
	for _, name := range c.discover(ctx) {
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// discover returns the streams found in Redis, scanning again once the
// last scan is discoverFor old.
func (c *Console) discover(ctx context.Context) []string {
	c.found.mu.Lock()
	defer c.found.mu.Unlock()
	if !c.found.at.IsZero() && c.now().Sub(c.found.at) < discoverFor {
		return c.found.names
	}
	var found []string
	for _, p := range c.cfg.Discover {
		names, err := c.deps.Queues.Discover(ctx, p)
		if err != nil {
			c.discoverFailed(err, p)
		}
		found = append(found, names...)
	}
	dead, err := c.deps.Queues.WithDeadLetters(ctx)
	if err != nil {
		c.discoverFailed(err, "*"+stream.DeadLetterSuffix)
	}
	found = append(found, dead...)
	slices.Sort(found)
	c.found.at, c.found.names = c.now(), slices.Compact(found)
	return c.found.names
}

// discoverFailed logs a failed discovery: at debug level for a Redis user
// without SCAN (the deployer's own; CONSOLE_REDIS_URL_FILE gives the
// console an operator's), else as a warning.
func (c *Console) discoverFailed(err error, pattern string) {
	ev := c.log.Warn()
	if strings.Contains(err.Error(), "NOPERM") {
		ev = c.log.Debug()
	}
	ev.Err(err).Str("pattern", pattern).Msg("streams not discovered")
}

func (c *Console) queueRows(ctx context.Context, streams []string) []queueRow {
	if c.deps.Queues == nil {
		return nil
	}
	var rows []queueRow
	for _, name := range streams {
		si, err := c.deps.Queues.Stream(ctx, name)
		if errors.Is(err, stream.ErrNotFound) {
			rows = append(rows, queueRow{Stream: name, Err: "no such stream yet"})
			continue
		}
		if err != nil {
			msg := "cannot read it"
			if strings.Contains(err.Error(), "NOPERM") {
				msg = "no permission: give the console an operator's Redis user (CONSOLE_REDIS_URL_FILE)"
			}
			rows = append(rows, queueRow{Stream: name, Err: msg})
			continue
		}
		if len(si.Groups) == 0 {
			rows = append(rows, queueRow{Stream: name, Length: si.Length, DeadLetters: si.DeadLetters, Lag: -1})
		}
		for _, g := range si.Groups {
			qr := queueRow{Stream: name, Group: g.Group, Length: si.Length, Lag: g.Lag, Pending: g.Pending, DeadLetters: si.DeadLetters}
			if g.OldestPending != nil {
				qr.OldestPending, qr.HasOldest = g.OldestPending.Age, true
			}
			rows = append(rows, qr)
		}
	}
	return rows
}

// ---- Fleet

func (c *Console) fleetPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	aq := url.Values{"limit": {"50"}}
	for _, p := range []string{"status", "source", "search", "paused", "cursor", "sort"} {
		if v := strings.TrimSpace(q.Get(p)); v != "" {
			aq.Set(p, v)
		}
	}
	if v := strings.TrimSpace(q.Get("label")); v != "" {
		aq.Set("label", v)
	}
	var list api.ServerList
	res, err := c.call(r, http.MethodGet, "/api/v1/servers?"+aq.Encode(), nil, &list)
	if err != nil || (res.Problem != nil && res.Status != http.StatusBadRequest) {
		c.failAPI(w, r, res, err)
		return
	}
	data := map[string]any{"Title": "Fleet", "Statuses": fleet.Statuses(), "Q": q, "List": list,
		"Sort": cmp.Or(q.Get("sort"), "handle"), "SortBy": sortLinks(q), "Done": q.Get("done")}
	if c.key(r).Has(auth.ScopeServersWrite) {
		data["Bulk"] = bulkOperations
	}
	if res.Problem != nil {
		data["Error"] = problemText(res.Problem)
	}
	if list.NextCursor != "" {
		nq := url.Values{}
		maps.Copy(nq, q)
		nq.Set("cursor", list.NextCursor)
		data["Next"] = Prefix + "/fleet?" + nq.Encode()
	}
	if q.Get("cursor") != "" {
		nq := url.Values{}
		maps.Copy(nq, q)
		nq.Del("cursor")
		data["First"] = Prefix + "/fleet?" + nq.Encode()
	}
	c.render(w, r, http.StatusOK, "fleet", data)
}

// sortLinks are the fleet's links that order it by each of the API's
// orders, keeping the filters (and starting at the first page).
func sortLinks(q url.Values) map[string]string {
	links := map[string]string{}
	for _, o := range fleet.Orders() {
		nq := url.Values{}
		maps.Copy(nq, q)
		nq.Del("cursor")
		nq.Set("sort", o)
		links[o] = Prefix + "/fleet?" + nq.Encode()
	}
	return links
}

func (c *Console) serverPage(w http.ResponseWriter, r *http.Request) {
	h := chi.URLParam(r, "handle")
	var d api.ServerDetail
	res, err := c.call(r, http.MethodGet, "/api/v1/servers/"+url.PathEscape(h), nil, &d)
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	data := map[string]any{"Title": "Server " + d.Server.Handle, "D": d, "Ops": api.Operations()}
	refreshing(data, r.URL.Query())
	if d.Server.HostKeyPinned && c.deps.Fleet != nil {
		if srv, err := c.deps.Fleet.Get(r.Context(), h); err == nil {
			data["HostKey"] = fingerprint(srv.HostKey)
		}
	}
	c.render(w, r, http.StatusOK, "server", data)
}

// refreshInterval is how often a page asked to refresh reloads.
const refreshInterval = 5

// refreshing sets up a page's refresh (?refresh=1) and the links that turn
// it on and off.
func refreshing(data map[string]any, q url.Values) {
	on := url.Values{}
	maps.Copy(on, q)
	if q.Get("refresh") == "1" {
		data["Refresh"] = refreshInterval
		on.Del("refresh")
		data["RefreshToggle"], data["RefreshLabel"] = "?"+on.Encode(), "Stop refreshing"
		return
	}
	on.Set("refresh", "1")
	data["RefreshToggle"], data["RefreshLabel"] = "?"+on.Encode(), "Refresh every "+strconv.Itoa(refreshInterval)+" s"
}

// fingerprint returns a pinned host key's type and SHA-256 fingerprint.
func fingerprint(hostKey string) string {
	pk, _, _, _, err := ssh.ParseAuthorizedKey([]byte(hostKey))
	if err != nil {
		return "(pinned; not a key in authorized_keys form)"
	}
	return pk.Type() + " " + ssh.FingerprintSHA256(pk)
}

// confirmation is a page that asks before an action that cannot be undone:
// its form posts the action again with confirm=yes.
type confirmation struct {
	Question, Warning string
	Action            string            // where the confirmed form posts
	Hidden            map[string]string // the action's own fields
	Reason            bool              // ask for a reason (the history records it)
	ReasonValue       string
	Button, ButtonID  string
	Cancel            string // where Cancel leads
}

// confirmed reports whether the posted form confirmed its action.
func confirmed(r *http.Request) bool { return r.PostFormValue("confirm") == "yes" }

// confirm renders the confirmation page of an action.
func (c *Console) confirm(w http.ResponseWriter, r *http.Request, cf confirmation) {
	c.render(w, r, http.StatusOK, "confirm", map[string]any{"Title": cf.Question, "Confirm": cf})
}

func (c *Console) serverAction(w http.ResponseWriter, r *http.Request) {
	h, op := chi.URLParam(r, "handle"), api.Operation(chi.URLParam(r, "op"))
	if op == "projects" {
		c.setServerProjects(w, r, h)
		return
	}
	if !slices.Contains(api.Operations(), op) {
		c.fail(w, r, http.StatusNotFound, "There is no such operation.")
		return
	}
	reason := r.PostFormValue("reason")
	if op == api.OpRebuild && !confirmed(r) {
		c.confirm(w, r, confirmation{Question: "Rebuild " + h + "?",
			Warning: "A rebuild reinstalls the server's operating system: everything on it is lost.",
			Action:  Prefix + "/fleet/" + url.PathEscape(h) + "/rebuild", Reason: true, ReasonValue: reason,
			Button: "Rebuild " + h, ButtonID: "confirm-rebuild", Cancel: Prefix + "/fleet/" + url.PathEscape(h)})
		return
	}
	res, err := c.call(r, http.MethodPost, "/api/v1/servers/"+url.PathEscape(h)+"/"+string(op),
		map[string]string{"reason": reason}, nil)
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	http.Redirect(w, r, Prefix+"/fleet/"+url.PathEscape(h)+"?done="+url.QueryEscape(string(op)+" requested"), http.StatusSeeOther)
}

// bulkOperations are the operations the fleet list applies to the
// selected servers at once (a rebuild, which wipes a server, is asked for
// one server at a time).
var bulkOperations = []api.Operation{api.OpProvision, api.OpRecovery, api.OpPause, api.OpResume}

// maxBulk bounds the servers of one bulk action (a page of the list).
const maxBulk = 50

// fleetBulk applies an operation to the servers selected in the fleet
// list, after one confirmation naming them all, through the API one by
// one as the session's key; it says how many were requested and which were
// refused, and why.
func (c *Console) fleetBulk(w http.ResponseWriter, r *http.Request) {
	op := api.Operation(r.PostFormValue("op"))
	if !slices.Contains(bulkOperations, op) {
		c.fail(w, r, http.StatusBadRequest, "Choose one of the operations offered.")
		return
	}
	handles := r.PostForm["handle"]
	if hs := r.PostFormValue("handles"); hs != "" {
		handles = strings.Split(hs, ",")
	}
	handles = slices.Compact(slices.Sorted(slices.Values(handles)))
	if len(handles) == 0 || len(handles) > maxBulk {
		c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("Select between 1 and %d servers.", maxBulk))
		return
	}
	reason := r.PostFormValue("reason")
	if !confirmed(r) {
		c.confirm(w, r, confirmation{Question: fmt.Sprintf("%s %d servers?", op, len(handles)),
			Warning: fmt.Sprintf("%s of %s.", op, strings.Join(handles, ", ")),
			Action:  Prefix + "/fleet/bulk", Hidden: map[string]string{"op": string(op), "handles": strings.Join(handles, ",")},
			Reason: true, ReasonValue: reason, Button: fmt.Sprintf("%s %d servers", op, len(handles)), ButtonID: "confirm-bulk",
			Cancel: Prefix + "/fleet"})
		return
	}
	var refused []string
	for _, h := range handles {
		res, err := c.call(r, http.MethodPost, "/api/v1/servers/"+url.PathEscape(h)+"/"+string(op),
			map[string]string{"reason": reason}, nil)
		switch {
		case err != nil:
			refused = append(refused, h+" ("+err.Error()+")")
		case res.Problem != nil:
			refused = append(refused, h+" ("+problemText(res.Problem)+")")
		}
	}
	done := fmt.Sprintf("%s requested for %d of %d servers", op, len(handles)-len(refused), len(handles))
	if len(refused) > 0 {
		done += "; refused: " + strings.Join(refused, "; ")
	}
	http.Redirect(w, r, Prefix+"/fleet?done="+url.QueryEscape(done), http.StatusSeeOther)
}

// setServerProjects posts the operator's form of a server's owning
// projects (ids separated by commas, spaces or lines; empty: fleet-only)
// to PUT /servers/{handle}/projects.
func (c *Console) setServerProjects(w http.ResponseWriter, r *http.Request, h string) {
	projects := strings.FieldsFunc(r.PostFormValue("projects"), func(c rune) bool {
		return c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r'
	})
	if projects == nil {
		projects = []string{}
	}
	res, err := c.call(r, http.MethodPut, "/api/v1/servers/"+url.PathEscape(h)+"/projects",
		map[string]any{"projects": projects, "reason": r.PostFormValue("reason")}, nil)
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	http.Redirect(w, r, Prefix+"/fleet/"+url.PathEscape(h)+"?done="+url.QueryEscape("projects set"), http.StatusSeeOther)
}

// ---- Runs

func (c *Console) runsPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := RunFilter{Status: q.Get("status"), Server: strings.TrimSpace(q.Get("server"))}
	kind := q.Get("kind")
	data := map[string]any{"Title": "Runs", "Q": q, "Statuses": runStatuses}
	refreshing(data, q)
	var kinds []string
	for _, s := range c.deps.Runs {
		if s.Visible(c.key(r)) {
			kinds = append(kinds, s.Kind())
		}
	}
	data["Kinds"] = kinds
	before, err := decodePosition(q.Get("cursor"))
	if err == nil && f.Status != "" && !slices.Contains(runStatuses, f.Status) {
		err = errors.New("status: must be one of " + strings.Join(runStatuses, ", "))
	}
	var runs []Run
	var next *Position
	limit := 50
	if n, perr := strconv.Atoi(q.Get("limit")); perr == nil && n >= 1 && n <= 100 {
		limit = n
	}
	if err == nil {
		runs, next, err = c.listRuns(r, kind, f, before, limit)
	}
	var bad *errBadFilter
	switch {
	case err == nil:
	case errors.As(err, &bad), errors.Is(err, errBadCursor), before == nil && runs == nil && f.Status != "" && !slices.Contains(runStatuses, f.Status):
		data["Error"] = err.Error()
	default:
		c.failStore(w, r, err, "list runs", "The runs cannot be listed right now.")
		return
	}
	data["Runs"] = runs
	if next != nil {
		nq := url.Values{}
		maps.Copy(nq, q)
		nq.Set("cursor", encodePosition(next))
		data["Next"] = Prefix + "/runs?" + nq.Encode()
	}
	if before != nil {
		nq := url.Values{}
		maps.Copy(nq, q)
		nq.Del("cursor")
		data["First"] = Prefix + "/runs?" + nq.Encode()
	}
	c.render(w, r, http.StatusOK, "runs", data)
}

// maxShownLog bounds the log shown in a run's page; the whole log is a
// link away.
const maxShownLog = 256 << 10

func (c *Console) deploymentPage(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	base := "/api/v1/deployments/" + url.PathEscape(id)
	var d deployments.Deployment
	res, err := c.call(r, http.MethodGet, base, nil, &d)
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	if d.Kind == deployments.KindJob {
		// The API answers a job's id here too: show it as a job.
		http.Redirect(w, r, Prefix+"/runs/job/"+url.PathEscape(d.ID), http.StatusSeeOther)
		return
	}
	data := map[string]any{"Title": "Deployment " + d.ID, "D": d, "Terminal": d.Status.Terminal()}
	if c.deps.ServerAt != nil && c.key(r).Has(auth.ScopeServersRead) {
		if handle, err := c.deps.ServerAt(r.Context(), d.Request.ServerIP); err == nil {
			data["Handle"] = handle
		}
	}
	data["Noun"], data["LogURL"], data["EventsURL"] = "deployment", Prefix+"/runs/deployment/"+d.ID+"/log", Prefix+"/runs/deployment/"+d.ID+"/events"
	c.runDetails(r, data, base+"/webhooks", base+"/log", d.Status.Terminal())
	c.render(w, r, http.StatusOK, "deployment", data)
}

// runDetails adds a run's webhook deliveries (Webhooks) and, once it
// ended, the end of its log (Log, LogCut) to a run page's data, read
// from the API's hooks and log paths as the session's key: what the
// template "runtail" shows, with the page's Noun, LogURL and EventsURL.
func (c *Console) runDetails(r *http.Request, data map[string]any, hooksPath, logPath string, ended bool) {
	var hooks struct {
		Items []webhooks.Delivery `json:"items"`
	}
	if res, err := c.call(r, http.MethodGet, hooksPath, nil, &hooks); err == nil && res.Problem == nil {
		data["Webhooks"] = hooks.Items
	}
	if !ended {
		return
	}
	if res, err := c.call(r, http.MethodGet, logPath, nil, nil); err == nil && res.Problem == nil {
		log := res.Body
		if len(log) > maxShownLog {
			data["LogCut"] = true
			log = log[len(log)-maxShownLog:]
		}
		data["Log"] = string(log)
	}
}

// deploymentPassthrough serves the API's events stream or log of a
// deployment as the session's key: the same handler, the same checks.
func (c *Console) deploymentPassthrough(what string) http.HandlerFunc {
	return c.passthrough("/api/v1/deployments/", what)
}

// passthrough serves the API's base+{id}+"/"+what (an events stream or a
// log) as the session's key, with the browser's Last-Event-ID.
func (c *Console) passthrough(base, what string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		path := base + url.PathEscape(chi.URLParam(r, "id")) + "/" + what
		req, err := apiRequest(r, http.MethodGet, path, nil)
		if err != nil {
			c.fail(w, r, http.StatusBadRequest, "Bad request.")
			return
		}
		if last := r.Header.Get("Last-Event-ID"); last != "" {
			req.Header.Set("Last-Event-ID", last)
		}
		c.deps.API.ServeHTTP(w, req)
	}
}

func (c *Console) cancelDeployment(w http.ResponseWriter, r *http.Request) {
	c.cancelRun(w, r, "/api/v1/deployments/", Prefix+"/runs/deployment/")
}

// cancelRun cancels the route's run through the API's DELETE apiBase+id
// as the session's key, and goes back to its page, pageBase+id.
func (c *Console) cancelRun(w http.ResponseWriter, r *http.Request, apiBase, pageBase string) {
	id := chi.URLParam(r, "id")
	res, err := c.call(r, http.MethodDelete, apiBase+url.PathEscape(id), nil, nil)
	if err != nil || (res.Problem != nil && res.Status != http.StatusConflict) {
		c.failAPI(w, r, res, err)
		return
	}
	done := "cancel requested"
	if res.Problem != nil {
		done = "already finished"
	}
	http.Redirect(w, r, pageBase+url.PathEscape(id)+"?done="+url.QueryEscape(done), http.StatusSeeOther)
}

func (c *Console) provisionPage(w http.ResponseWriter, r *http.Request) {
	run, result := c.provisionRun(w, r)
	if run == nil {
		return
	}
	data := map[string]any{"Title": "Provisioning run " + run.JobID, "Run": run}
	if len(result) > 0 {
		res, err := messages.DecodeProvisionerResult(result)
		if err != nil {
			c.log.Warn().Err(err).Str("job_id", run.JobID).Msg("decode provisioning result")
			data["ResultError"] = "The run's stored result does not decode."
		}
		data["Result"] = res
	}
	c.provisionLog(r.Context(), run, data)
	c.render(w, r, http.StatusOK, "provision", data)
}

// ---- New deployment

// deployFields are the form's fields, in order, with the API's names.
var deployFields = []struct{ Name, Label, Help string }{
	{"project_id", "Project", "the project (a UUID) the deployment belongs to"},
	{"repo_full_name", "Repository", "owner/name of the repository to deploy"},
	{"branch", "Branch", "empty: the default branch"},
	{"server_ip", "Server address", "the server's IP address"},
	{"port", "Application port", "the TCP port the project's stack publishes on the server (never its SSH port)"},
	{"modules", "Modules", "comma-separated; empty: all"},
	{"github_token_ref", "Git token reference", "a secret reference, never a token"},
	{"secrets_ref", "Secrets reference", "a secret reference"},
	{"correlation_id", "Correlation id", "optional"},
	{"options.timeout_seconds", "Timeout (seconds)", "empty: infra's limit"},
	{"options.callback_url", "Callback URL", "optional webhook on completion"},
}

func (c *Console) deployForm(w http.ResponseWriter, r *http.Request) {
	vals := map[string]string{} // no port prefilled: keeping a default would publish the app on it
	if ps := c.key(r).Projects; len(ps) > 0 {
		vals["project_id"] = ps[0]
	}
	note := ""
	if from := r.URL.Query().Get("from"); from != "" {
		// Run again: the form filled in with that deployment's request, as
		// the API gives it to this key (another project's: 404).
		var d deployments.Deployment
		res, err := c.call(r, http.MethodGet, "/api/v1/deployments/"+url.PathEscape(from), nil, &d)
		if err != nil || res.Problem != nil {
			c.failAPI(w, r, res, err)
			return
		}
		vals, note = deployFormValues(&d.Request), "Filled in from deployment "+d.ID+"."
	}
	c.renderDeploy(w, r, http.StatusOK, vals, nil, "", note)
}

// deployFormValues are the deployment form's values of req (what
// deploySubmit reads, for "Run again"); the correlation id is left out: it
// names one deployment.
func deployFormValues(req *deployments.Request) map[string]string {
	vals := map[string]string{"project_id": req.ProjectID, "repo_full_name": req.RepoFullName, "branch": req.Branch,
		"server_ip": req.ServerIP, "modules": strings.Join(req.Modules, ", "), "github_token_ref": req.GitHubTokenRef,
		"secrets_ref": req.SecretsRef, "options.callback_url": req.Options.CallbackURL}
	for name, n := range map[string]int{"port": req.Port, "options.timeout_seconds": req.Options.TimeoutSeconds} {
		if n > 0 {
			vals[name] = strconv.Itoa(n)
		}
	}
	return vals
}

func (c *Console) renderDeploy(w http.ResponseWriter, r *http.Request, status int, vals, errs map[string]string, general, note string) {
	c.render(w, r, status, "deploy", map[string]any{"Title": "New deployment", "Fields": deployFields,
		"Values": vals, "Errors": errs, "General": general, "Note": note, "Projects": c.key(r).Projects})
}

func (c *Console) deploySubmit(w http.ResponseWriter, r *http.Request) {
	vals := map[string]string{}
	for _, f := range deployFields {
		vals[f.Name] = strings.TrimSpace(r.PostFormValue(f.Name))
	}
	errs := map[string]string{}
	req := deployments.Request{ProjectID: vals["project_id"], RepoFullName: vals["repo_full_name"], Branch: vals["branch"],
		ServerIP: vals["server_ip"], GitHubTokenRef: vals["github_token_ref"], SecretsRef: vals["secrets_ref"],
		CorrelationID: vals["correlation_id"], Options: deployments.Options{CallbackURL: vals["options.callback_url"]}}
	for name, dst := range map[string]*int{"port": &req.Port, "options.timeout_seconds": &req.Options.TimeoutSeconds} {
		if v := vals[name]; v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				errs[name] = "must be a whole number"
				continue
			}
			*dst = n
		}
	}
	for m := range strings.SplitSeq(vals["modules"], ",") {
		if m = strings.TrimSpace(m); m != "" {
			req.Modules = append(req.Modules, m)
		}
	}
	if len(errs) > 0 {
		c.renderDeploy(w, r, http.StatusUnprocessableEntity, vals, errs, "Correct the fields marked below.", "")
		return
	}
	var d deployments.Deployment
	res, err := c.call(r, http.MethodPost, "/api/v1/deployments", req, &d)
	if err != nil {
		c.failAPI(w, r, res, err)
		return
	}
	if res.Problem != nil {
		general := problemFields(res.Problem, errs, func(field string) string {
			if slices.ContainsFunc(deployFields, func(f struct{ Name, Label, Help string }) bool { return f.Name == field }) {
				return field
			}
			return ""
		})
		c.renderDeploy(w, r, res.Status, vals, errs, general, "")
		return
	}
	http.Redirect(w, r, Prefix+"/runs/deployment/"+url.PathEscape(d.ID), http.StatusSeeOther)
}

// ---- Queues

func (c *Console) queuesPage(w http.ResponseWriter, r *http.Request) {
	if !c.key(r).Has(auth.ScopeServersRead) {
		c.fail(w, r, http.StatusForbidden, "The queues are shown to fleet-wide keys with servers:read or admin.")
		return
	}
	type deadGroup struct {
		Stream  string
		Letters []stream.DeadLetter
		Next    string // the link to the next page of this stream's
		Err     string
	}
	// ?stream=&after= pages through one stream's dead letters.
	q := r.URL.Query()
	only, after := q.Get("stream"), q.Get("after")
	var dead []deadGroup
	streams := c.streams(r.Context())
	if c.deps.Queues != nil {
		for _, name := range streams {
			if only != "" && name != only {
				continue
			}
			from := ""
			if name == only {
				from = after
			}
			page, err := c.deps.Queues.DeadLetters(r.Context(), name, from, 50)
			g := deadGroup{Stream: name}
			switch {
			case err != nil && errors.Is(err, stream.ErrNotFound):
				continue
			case err != nil:
				g.Err = "cannot read the dead letters"
			default:
				g.Letters = page.Letters
				if page.Next != "" {
					g.Next = Prefix + "/queues?" + url.Values{"stream": {name}, "after": {page.Next}}.Encode()
				}
			}
			if len(g.Letters) > 0 || g.Err != "" {
				dead = append(dead, g)
			}
		}
	}
	c.render(w, r, http.StatusOK, "queues", map[string]any{"Title": "Queues", "Queues": c.queueRows(r.Context(), streams),
		"Dead": dead, "Admin": c.key(r).Has(auth.ScopeAdmin)})
}

// deadAction replays or drops a dead letter, as `autoprov dead replay`
// (without --resign) and `autoprov dead drop` do.
func (c *Console) deadAction(w http.ResponseWriter, r *http.Request) {
	key := c.key(r)
	if !key.Has(auth.ScopeAdmin) {
		c.fail(w, r, http.StatusForbidden, "Replaying and dropping dead letters needs the admin scope.")
		return
	}
	if c.deps.Queues == nil {
		c.fail(w, r, http.StatusServiceUnavailable, "The queues are not available on this deployer.")
		return
	}
	name, id := r.PostFormValue("stream"), r.PostFormValue("id")
	if !slices.Contains(c.streams(r.Context()), name) {
		c.fail(w, r, http.StatusNotFound, "There is no such stream.")
		return
	}
	log := c.log.With().Str("key", key.Name).Str("key_id", key.ID).Str("stream", name).Str("dead_id", id).Logger()
	var done string
	switch chi.URLParam(r, "action") {
	case "replay":
		newID, err := c.deps.Queues.Replay(r.Context(), name, id, func(d *stream.DeadLetter) (map[string]any, error) {
			if messages.IsSignatureReason(d.Reason) {
				return nil, fmt.Errorf("refused: it was dead-lettered for its signature (%s), so no known producer vouches for it; "+
					"only `autoprov dead replay --resign` re-signs it", d.Reason)
			}
			values := maps.Clone(d.Values)
			values[stream.ReplayFieldBy] = "console:" + key.Name
			return values, nil
		})
		if err != nil {
			log.Warn().Err(err).Msg("dead letter not replayed")
			status := http.StatusConflict
			if errors.Is(err, stream.ErrNotFound) {
				status = http.StatusNotFound
			}
			c.fail(w, r, status, "Not replayed: "+err.Error())
			return
		}
		log.Info().Str("new_id", newID).Msg("dead letter replayed")
		done = "replayed as " + newID
	case "drop":
		if !confirmed(r) {
			c.confirm(w, r, confirmation{Question: "Drop dead letter " + id + "?",
				Warning: "Dropping deletes the dead letter of " + name + " for good: it can no longer be replayed.",
				Action:  Prefix + "/queues/dead/drop", Hidden: map[string]string{"stream": name, "id": id},
				Button: "Drop it", ButtonID: "confirm-drop", Cancel: Prefix + "/queues"})
			return
		}
		n, err := c.deps.Queues.Drop(r.Context(), name, id)
		if err != nil {
			log.Warn().Err(err).Msg("dead letter not dropped")
			c.fail(w, r, http.StatusBadRequest, "Not dropped: "+err.Error())
			return
		}
		log.Info().Int64("dropped", n).Msg("dead letter dropped")
		done = "dropped"
	default:
		c.fail(w, r, http.StatusNotFound, "There is no such action.")
		return
	}
	http.Redirect(w, r, Prefix+"/queues?done="+url.QueryEscape(done), http.StatusSeeOther)
}

// ---- Keys

func (c *Console) keysPage(w http.ResponseWriter, r *http.Request) {
	c.renderKeys(w, r, http.StatusOK, nil, "")
}

func (c *Console) renderKeys(w http.ResponseWriter, r *http.Request, status int, created *auth.CreatedKey, msg string) {
	var list auth.KeyList
	res, err := c.call(r, http.MethodGet, "/api/v1/keys", nil, &list)
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	c.render(w, r, status, "keys", map[string]any{"Title": "API keys", "Keys": list.Items, "Created": created,
		"Error": msg, "Scopes": auth.Scopes()})
}

func (c *Console) createKey(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, http.StatusBadRequest, "Bad form.")
		return
	}
	body := map[string]any{"name": strings.TrimSpace(r.PostFormValue("name")), "scopes": r.PostForm["scope"],
		"fleet_wide": r.PostFormValue("fleet_wide") == "on"}
	var projects []string
	for p := range strings.SplitSeq(r.PostFormValue("projects"), ",") {
		if p = strings.TrimSpace(p); p != "" {
			projects = append(projects, p)
		}
	}
	if len(projects) > 0 {
		body["projects"] = projects
	}
	var created auth.CreatedKey
	res, err := c.call(r, http.MethodPost, "/api/v1/keys", body, &created)
	if err != nil {
		c.failAPI(w, r, res, err)
		return
	}
	if res.Problem != nil {
		c.renderKeys(w, r, res.Status, nil, problemText(res.Problem))
		return
	}
	c.renderKeys(w, r, http.StatusCreated, &created, "")
}

func (c *Console) revokeKey(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	if !confirmed(r) {
		c.confirm(w, r, confirmation{Question: "Revoke key " + id + "?",
			Warning: "A revoked key stops working at once, on every replica, and cannot be restored; its sessions end.",
			Action:  Prefix + "/keys/" + url.PathEscape(id) + "/revoke",
			Button:  "Revoke it", ButtonID: "confirm-revoke", Cancel: Prefix + "/keys"})
		return
	}
	res, err := c.call(r, http.MethodDelete, "/api/v1/keys/"+url.PathEscape(id), nil, nil)
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	if err := c.deps.Sessions.DeleteForKey(r.Context(), id); err != nil {
		c.log.Warn().Err(err).Msg("end the sessions of a revoked key")
	}
	http.Redirect(w, r, Prefix+"/keys?done=revoked", http.StatusSeeOther)
}
