package console

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
)

// pageNames are the pages, each templates/<name>.html with the layout.
var pageNames = []string{"signin", "error", "overview", "fleet", "server", "confirm", "runs", "deployment",
	"provision", "deploy", "job", "jobform", "queues", "keys", "credentials", "templates", "template", "launch", "workflows", "workflow", "workflowrun"}

func (c *Console) parse() error {
	funcs := template.FuncMap{
		"when":       when,
		"ms":         humanMS,
		"iso":        func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"ago":        func(d time.Duration) string { return d.Round(time.Second).String() },
		"join":       strings.Join,
		"lower":      strings.ToLower,
		"has":        func(a *authInfo, scope string) bool { return a != nil && a.key.Has(auth.Scope(scope)) },
		"fieldError": func(errs map[string]string, f string) string { return errs[f] },
		"input":      newFieldInput,
		// resignOnly: a dead letter refused for its signature, which only
		// `autoprov dead replay --resign` may put back.
		"resignOnly": messages.IsSignatureReason,
		"logLines":   logLines,
		"short":      short,
	}
	layout, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html")
	if err != nil {
		return fmt.Errorf("console templates: %w", err)
	}
	c.pages = map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.Must(layout.Clone()).ParseFS(templateFS, "templates/"+name+".html", "templates/graph.html")
		if err != nil {
			return fmt.Errorf("console template %s: %w", name, err)
		}
		c.pages[name] = t
	}
	return nil
}

// view is what every page's template gets.
type view struct {
	Title string
	Nav   string
	Auth  *authInfo
	// KeyName is the signed-in key's name.
	KeyName string
	CSRF    string
	Flash   string
	// Refresh, when set, reloads the page every Refresh seconds (a meta
	// refresh: no script).
	Refresh int
	Data    any
}

// render writes page with data, as the signed-in key when there is one.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, page string, data any) {
	v := view{Title: page, Nav: page, Auth: authOf(r.Context()), Data: data, Flash: r.URL.Query().Get("done")}
	if len(v.Flash) > 200 {
		v.Flash = ""
	}
	if v.Auth != nil {
		v.CSRF, v.KeyName = v.Auth.session.CSRF, v.Auth.key.Name
	}
	if m, ok := data.(map[string]any); ok {
		if t, ok := m["Title"].(string); ok {
			v.Title = t
		}
		if n, ok := m["Refresh"].(int); ok {
			v.Refresh = n
		}
	}
	var buf bytes.Buffer
	if err := c.pages[page].ExecuteTemplate(&buf, "layout.html", v); err != nil {
		c.log.Error().Err(err).Str("page", page).Msg("render")
		http.Error(w, "the page cannot be shown", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fail shows an error page.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	c.render(w, r, status, "error", map[string]any{"Title": http.StatusText(status), "Message": msg, "Status": status})
}

// failStore shows the error page of what a store could not do: 503 with
// Retry-After when Postgres or Redis cannot be reached right now (a
// restart, a failover: the page works again in a moment), else 500, logged
// as what.
func (c *Console) failStore(w http.ResponseWriter, r *http.Request, err error, what, msg string) {
	if api.Unreachable(err) {
		c.log.Warn().Err(err).Msg(what + ": a store cannot be reached")
		api.RetryAfter(w.Header())
		c.fail(w, r, http.StatusServiceUnavailable, msg+" Try again in a few seconds.")
		return
	}
	c.log.Error().Err(err).Msg(what)
	c.fail(w, r, http.StatusInternalServerError, msg)
}

// apiResult is the answer of an in-process API call.
type apiResult struct {
	Status  int
	Header  http.Header
	Body    []byte
	Problem *api.Problem
}

// recorder is the ResponseWriter of in-process API calls.
type recorder struct {
	h      http.Header
	status int
	buf    bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.h }
func (r *recorder) WriteHeader(s int) {
	if r.status == 0 {
		r.status = s
	}
}
func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.buf.Write(b)
}

// apiRequest makes a request to the API as the session's key: a fresh
// routing context (the API's router is not a sub-router of the console's).
func apiRequest(r *http.Request, method, path string, body io.Reader) (*http.Request, error) {
	ctx := context.WithValue(r.Context(), chi.RouteCtxKey, nil)
	ctx = api.WithKey(ctx, authOf(r.Context()).key)
	req, err := http.NewRequestWithContext(ctx, method, path, body)
	if err != nil {
		return nil, err
	}
	req.RemoteAddr = r.RemoteAddr
	// The API authenticates it as the key in its context (api.WithKey);
	// its middleware wants a Bearer value to be there.
	req.Header.Set("Authorization", "Bearer console-session")
	if id := r.Header.Get("X-Request-Id"); id != "" {
		req.Header.Set("X-Request-Id", id)
	}
	return req, nil
}

// call calls the API in-process as the session's key; out, when not nil,
// receives a 2xx JSON answer, and a problem is decoded otherwise.
func (c *Console) call(r *http.Request, method, path string, in, out any) (*apiResult, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := apiRequest(r, method, path, body)
	if err != nil {
		return nil, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := &recorder{h: http.Header{}}
	c.deps.API.ServeHTTP(rec, req)
	res := &apiResult{Status: rec.status, Header: rec.h, Body: rec.buf.Bytes()}
	if res.Status >= 200 && res.Status < 300 {
		if out != nil {
			if err := json.Unmarshal(res.Body, out); err != nil {
				return nil, fmt.Errorf("%s %s: decode: %w", method, path, err)
			}
		}
		return res, nil
	}
	var p api.Problem
	if json.Unmarshal(res.Body, &p) == nil && p.Status != 0 {
		res.Problem = &p
	} else {
		res.Problem = &api.Problem{Status: res.Status, Detail: strings.TrimSpace(string(res.Body))}
	}
	return res, nil
}

// failAPI shows the API's problem as an error page.
func (c *Console) failAPI(w http.ResponseWriter, r *http.Request, res *apiResult, err error) {
	if err != nil {
		c.log.Error().Err(err).Msg("api call")
		c.fail(w, r, http.StatusInternalServerError, "An internal error occurred.")
		return
	}
	msg := res.Problem.Detail
	if msg == "" {
		msg = res.Problem.Title
	}
	if ra := res.Header.Get("Retry-After"); ra != "" {
		w.Header().Set("Retry-After", ra) // a 503 or 429 the API says to retry
	}
	c.fail(w, r, res.Status, msg)
}

// short cuts s to at most 80 characters, marking the cut (the whole text
// goes in a title).
func short(s string) string {
	if r := []rune(s); len(r) > 80 {
		return string(r[:79]) + "…"
	}
	return s
}
