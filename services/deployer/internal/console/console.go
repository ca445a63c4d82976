// Package console is the deployer's web console, served under /ui/ on the
// API's port: server-rendered pages (html/template, a little plain
// JavaScript, every asset embedded) over the same handlers and scopes as
// the API. A signed-in operator's session holds an API key's id; each page
// calls the API's own handlers in-process as that key (api.WithKey), so
// what a page shows and offers follows the key's projects and scopes, and
// the console has no model of the data of its own. What the API does not
// serve (the fleet's provisioning runs, runs per hour, the queues and
// their dead letters, readiness) is read from the same stores the
// services and `autoprov` use.
package console

import (
	"context"
	"embed"
	"errors"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/runlog"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/events"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Prefix is where the console is mounted.
const Prefix = "/ui"

// Config configures the console. Zero values take the defaults.
type Config struct {
	// SessionTTL is how long a session lasts. Default 12h.
	SessionTTL time.Duration
	// Secure marks the cookies Secure (the API serves TLS, or sits behind
	// a TLS proxy).
	Secure bool
	// AuthFailureRate is how many failed sign-ins per second one client
	// address may make (the API's bucket). Default 10.
	AuthFailureRate int
	// Streams are the streams the Queues page always shows; beside them it
	// shows the streams matching Discover (Redis globs: the job pools'
	// queues) and every stream that has dead letters, found in Redis.
	Streams  []string
	Discover []string
	// Services are the services whose readiness the Overview shows.
	Services []Service
	// Events configures a provisioning run's live output stream.
	Events events.StreamConfig
}

// Service is a service whose readiness the Overview shows.
type Service struct {
	Name string
	// URL is its /readyz; empty for this deployer (ready while it serves).
	URL string
}

// Authenticator checks API keys (auth.Authenticator).
type Authenticator interface {
	Authenticate(ctx context.Context, secret string) (*auth.Key, error)
}

// Keys reads keys by id (auth.Store).
type Keys interface {
	Get(ctx context.Context, id string) (*auth.Key, error)
}

// RateLimiter limits failed sign-ins (auth.Limiter).
type RateLimiter interface {
	Allow(ctx context.Context, bucket string, rate int) (auth.Decision, error)
}

// Deps are the console's collaborators.
type Deps struct {
	// API is the API's handler; pages call it in-process as the session's
	// key.
	API         http.Handler
	Auth        Authenticator
	Keys        Keys
	Forget      func(keyID string)
	Limiter     RateLimiter
	Sessions    *Sessions
	Deployments *deployments.Service
	Fleet       *fleet.Store
	// ServerAt finds the handle of the registered server at an address
	// (a deployment's target), for keys that may read the fleet; nil, or
	// store.ErrServerNotFound: the page shows the address alone.
	ServerAt func(ctx context.Context, address string) (string, error)
	// Queues reads the streams and acts on dead letters; nil hides them.
	Queues *stream.Inspector
	// Events follows a provisioning run's progress for its live output;
	// Logs holds its full log once it ended. Nil leaves them out.
	Events *events.Hub
	Logs   runlog.Store
	// Shutdown, closed when the server shuts down, ends those streams
	// (as the API's own end). Nil: they end with their clients.
	Shutdown <-chan struct{}
	// Ping checks this deployer's Postgres and Redis for the readiness.
	Ping func(ctx context.Context) error
	// Runs are the kinds of runs in the Runs list; nil: deployments,
	// Ansible jobs and the fleet's provisioning runs.
	Runs   []RunSource
	Client *http.Client // for the readiness probes
	Logger zerolog.Logger
}

// Console is the web console.
type Console struct {
	cfg   Config
	deps  Deps
	log   zerolog.Logger
	pages map[string]*template.Template
	mux   chi.Router
	now   func() time.Time

	found discovered // the streams found in Redis, kept for discoverFor
}

// discoverFor is how long the streams found in Redis are kept: each scan
// walks the whole keyspace, and the overview is loaded often.
const discoverFor = 5 * time.Second

// discovered holds the last discovery of streams.
type discovered struct {
	mu    sync.Mutex
	at    time.Time
	names []string
}

// New builds the console.
func New(cfg Config, deps Deps) (*Console, error) {
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 12 * time.Hour
	}
	if cfg.AuthFailureRate <= 0 {
		cfg.AuthFailureRate = 10
	}
	if deps.Client == nil {
		deps.Client = &http.Client{Timeout: 2 * time.Second}
	}
	c := &Console{cfg: cfg, deps: deps, log: deps.Logger.With().Str("component", "console").Logger(), now: time.Now}
	if c.deps.Runs == nil {
		c.deps.Runs = []RunSource{deploymentRuns{c}, jobRuns{c}, provisioningRuns{c}}
	}
	if err := c.parse(); err != nil {
		return nil, err
	}
	c.mux = c.routes()
	return c, nil
}

// Handler returns the console's handler, to mount at Prefix.
func (c *Console) Handler() http.Handler { return c.mux }

func (c *Console) routes() chi.Router {
	r := chi.NewRouter()
	r.Use(securityHeaders)
	static, _ := fs.Sub(staticFS, "static")
	fsrv := http.StripPrefix(Prefix+"/static/", http.FileServerFS(static))
	r.Get("/static/*", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=300")
		fsrv.ServeHTTP(w, r)
	})
	r.Get("/signin", c.signinPage)
	r.Post("/signin", c.signin)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, http.StatusNotFound, "There is no such page.")
	})
	r.Group(func(r chi.Router) {
		r.Use(c.session)
		r.Post("/signout", c.signout)
		r.Get("/", c.overview)
		r.Get("/fleet", c.fleetPage)
		r.Get("/fleet/{handle}", c.serverPage)
		r.Post("/fleet/{handle}/{op}", c.serverAction)
		r.Post("/fleet/bulk", c.fleetBulk)
		r.Get("/runs", c.runsPage)
		r.Get("/runs/deployment/{id}", c.deploymentPage)
		r.Get("/runs/deployment/{id}/events", c.deploymentPassthrough("events"))
		r.Get("/runs/deployment/{id}/log", c.deploymentPassthrough("log"))
		r.Post("/runs/deployment/{id}/cancel", c.cancelDeployment)
		r.Get("/runs/job/{id}", c.jobPage)
		r.Get("/runs/job/{id}/stream", c.jobPassthrough("stream"))
		r.Get("/runs/job/{id}/logs", c.jobPassthrough("logs"))
		r.Post("/runs/job/{id}/cancel", c.cancelJob)
		r.Post("/runs/job/{id}/relaunch", c.relaunchJob)
		r.Get("/runs/provision/{id}", c.provisionPage)
		r.Get("/runs/provision/{id}/events", c.provisionEvents)
		r.Get("/runs/provision/{id}/log", c.provisionLogFile)
		r.Get("/deploy", c.deployForm)
		r.Post("/deploy", c.deploySubmit)
		r.Get("/job", c.jobForm)
		r.Post("/job", c.jobSubmit)
		r.Get("/templates", c.templatesPage)
		r.Get("/templates/{id}", c.templatePage)
		r.Get("/templates/{id}/launch", c.launchForm)
		r.Post("/templates/{id}/launch", c.launchSubmit)
		r.Post("/templates/{id}/schedules", c.createSchedule)
		r.Post("/templates/{id}/triggers", c.createTrigger)
		r.Post("/schedules/{id}/{op}", c.scheduleAction)
		r.Post("/triggers/{id}/{op}", c.triggerAction)
		r.Get("/workflows", c.workflowsPage)
		r.Get("/workflows/{id}", c.workflowPage)
		r.Post("/workflows/{id}/launch", c.launchWorkflow)
		r.Get("/workflow-runs/{id}", c.workflowRunPage)
		r.Post("/workflow-runs/{id}/cancel", c.cancelWorkflowRun)
		r.Post("/workflow-runs/{id}/nodes/{node}/{op}", c.decideWorkflowNode)
		r.Get("/queues", c.queuesPage)
		r.Post("/queues/dead/{action}", c.deadAction)
		r.Get("/credentials", c.credentialsPage)
		r.Post("/credentials", c.createCredential)
		r.Post("/credentials/{name}/delete", c.deleteCredential)
		r.Get("/keys", c.keysPage)
		r.Post("/keys", c.createKey)
		r.Post("/keys/{id}/revoke", c.revokeKey)
	})
	return r
}

// csp allows only the console's own scripts, styles and images: no inline
// script or style, no eval, no frames, forms only to itself.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

type ctxKey int

const ctxAuth ctxKey = iota

// authInfo is the signed-in session and its key.
type authInfo struct {
	key     *auth.Key
	session *Session
}

func authOf(ctx context.Context) *authInfo {
	a, _ := ctx.Value(ctxAuth).(*authInfo)
	return a
}

const sessionCookie = "autoprov_session"

// csrfRefused is the message of a POST without its CSRF token.
const csrfRefused = "The form is missing its security token (CSRF): reload the page and try again."

// session lets signed-in requests through with their key: others go to
// the sign-in page; a POST must carry the session's CSRF token.
func (c *Console) session(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ck, err := r.Cookie(sessionCookie)
		var ses *Session
		if err == nil {
			ses, err = c.deps.Sessions.Get(r.Context(), ck.Value)
		}
		var key *auth.Key
		if err == nil {
			key, err = c.deps.Keys.Get(r.Context(), ses.KeyID)
			if err == nil && !key.RevokedAt.IsZero() {
				err = auth.ErrRevoked
			}
			if errors.Is(err, auth.ErrNotFound) || errors.Is(err, auth.ErrRevoked) {
				_ = c.deps.Sessions.DeleteForKey(r.Context(), ses.KeyID)
				err = ErrNoSession
			}
		}
		switch {
		case errors.Is(err, http.ErrNoCookie), errors.Is(err, ErrNoSession):
			c.clearCookie(w, r, sessionCookie)
			if r.Method == http.MethodGet {
				http.Redirect(w, r, Prefix+"/signin?next="+safeNext(r.URL.Path), http.StatusSeeOther)
				return
			}
			c.fail(w, r, http.StatusUnauthorized, "Your session has ended: sign in again.")
			return
		case err != nil:
			c.log.Error().Err(err).Msg("read session")
			api.RetryAfter(w.Header()) // Postgres is away, for now
			c.fail(w, r, http.StatusServiceUnavailable, "Sessions cannot be checked right now.")
			return
		}
		if r.Method == http.MethodPost && !sameToken(r.PostFormValue("csrf"), ses.CSRF) {
			c.fail(w, r, http.StatusForbidden, csrfRefused)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxAuth, &authInfo{key: key, session: ses})))
	})
}

// safeNext keeps a redirect target inside the console.
func safeNext(p string) string {
	if !strings.HasPrefix(p, Prefix+"/") || strings.HasPrefix(p, "//") || strings.ContainsAny(p, "\\\r\n") {
		return Prefix + "/"
	}
	return p
}

func (c *Console) secure(r *http.Request) bool { return c.cfg.Secure || r.TLS != nil }

func (c *Console) setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge time.Duration) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: Prefix, MaxAge: int(maxAge.Seconds()),
		HttpOnly: true, Secure: c.secure(r), SameSite: http.SameSiteStrictMode})
}

func (c *Console) clearCookie(w http.ResponseWriter, r *http.Request, name string) {
	c.setCookie(w, r, name, "", -time.Second) // MaxAge -1: delete it now
}

// signinCookie carries the sign-in form's CSRF token (there is no session
// yet): the form sends it back, and both must match.
const signinCookie = "autoprov_signin"

func (c *Console) signinPage(w http.ResponseWriter, r *http.Request) {
	c.showSignin(w, r, http.StatusOK, "")
}

func (c *Console) showSignin(w http.ResponseWriter, r *http.Request, status int, msg string) {
	token := newToken()
	c.setCookie(w, r, signinCookie, token, 30*time.Minute)
	c.render(w, r, status, "signin", map[string]any{"CSRF": token, "Error": msg, "Next": safeNext(r.FormValue("next"))})
}

func (c *Console) signin(w http.ResponseWriter, r *http.Request) {
	ck, err := r.Cookie(signinCookie)
	if err != nil || !sameToken(r.PostFormValue("csrf"), ck.Value) {
		c.fail(w, r, http.StatusForbidden, csrfRefused)
		return
	}
	secret := strings.TrimSpace(r.PostFormValue("key"))
	key, err := c.deps.Auth.Authenticate(r.Context(), secret)
	switch {
	case errors.Is(err, auth.ErrNotFound), errors.Is(err, auth.ErrRevoked):
		if c.limited(r) {
			c.showSignin(w, r, http.StatusTooManyRequests, "Too many failed sign-ins from this address: wait a little.")
			return
		}
		c.showSignin(w, r, http.StatusUnauthorized, "This API key is not valid (unknown or revoked).")
		return
	case err != nil:
		c.log.Error().Err(err).Msg("sign in")
		api.RetryAfter(w.Header())
		c.showSignin(w, r, http.StatusServiceUnavailable, "API keys cannot be checked right now.")
		return
	}
	token, _, err := c.deps.Sessions.Create(r.Context(), key.ID, c.cfg.SessionTTL)
	if err != nil {
		c.log.Error().Err(err).Msg("sign in")
		api.RetryAfter(w.Header())
		c.showSignin(w, r, http.StatusServiceUnavailable, "Sessions cannot be made right now.")
		return
	}
	c.log.Info().Str("key", key.Name).Str("key_id", key.ID).Msg("console sign-in")
	c.clearCookie(w, r, signinCookie)
	c.setCookie(w, r, sessionCookie, token, c.cfg.SessionTTL)
	http.Redirect(w, r, safeNext(r.PostFormValue("next")), http.StatusSeeOther)
}

// limited takes a failed sign-in from the client address's budget (the
// API's failed-authentication bucket) and reports whether it is spent.
func (c *Console) limited(r *http.Request) bool {
	if c.deps.Limiter == nil {
		return false
	}
	ip, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		ip = r.RemoteAddr
	}
	d, err := c.deps.Limiter.Allow(r.Context(), "authfail:"+ip, c.cfg.AuthFailureRate)
	return err == nil && !d.Allowed
}

func (c *Console) signout(w http.ResponseWriter, r *http.Request) {
	if ck, err := r.Cookie(sessionCookie); err == nil {
		if err := c.deps.Sessions.Delete(r.Context(), ck.Value); err != nil {
			c.log.Error().Err(err).Msg("sign out")
		}
	}
	c.clearCookie(w, r, sessionCookie)
	http.Redirect(w, r, Prefix+"/signin", http.StatusSeeOther)
}
