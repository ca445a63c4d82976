package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
)

type ctxKey int

const (
	ctxRequestID ctxKey = iota
	ctxKeyInfo
)

// requestIDRE is the shape of a request id accepted from a client.
var requestIDRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)

// withRequestID gives each request an id: the client's X-Request-Id when it
// is sane, else a new one. It is returned in X-Request-Id, logged, and put
// in problem details.
func withRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Request-Id")
		if !requestIDRE.MatchString(id) {
			var b [8]byte
			_, _ = rand.Read(b[:])
			id = hex.EncodeToString(b[:])
		}
		w.Header().Set("X-Request-Id", id)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxRequestID, id)))
	})
}

func requestID(ctx context.Context) string {
	id, _ := ctx.Value(ctxRequestID).(string)
	return id
}

// keyInfo is filled by the auth middleware, for the request log.
type keyInfo struct {
	key *auth.Key
}

func authedKey(ctx context.Context) *auth.Key {
	if ki, _ := ctx.Value(ctxKeyInfo).(*keyInfo); ki != nil {
		return ki.key
	}
	return nil
}

// logRequests logs each request once it is done: request id, method,
// path, route, status, size, duration and the API key's name. Headers and
// query strings are never logged (they may hold keys or tokens).
func logRequests(log zerolog.Logger, duration *prometheus.HistogramVec) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			ki := &keyInfo{}
			r = r.WithContext(context.WithValue(r.Context(), ctxKeyInfo, ki))
			ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
			defer func() {
				took := time.Since(start)
				route := chi.RouteContext(r.Context()).RoutePattern()
				if route == "" {
					route = "unmatched"
				}
				status := ww.Status()
				if status == 0 {
					status = http.StatusOK
				}
				duration.WithLabelValues(r.Method, route, strconv.Itoa(status)).Observe(took.Seconds())
				ev := log.Info()
				if status >= 500 {
					ev = log.Error()
				}
				ev = ev.Str("request_id", requestID(r.Context())).Str("method", r.Method).Str("path", r.URL.Path).
					Str("route", route).Int("status", status).Int("bytes", ww.BytesWritten()).
					Float64("duration_ms", float64(took.Microseconds())/1000).Str("remote", remoteIP(r))
				if ki.key != nil {
					ev = ev.Str("key", ki.key.Name).Str("key_id", ki.key.ID)
				}
				ev.Msg("request")
			}()
			next.ServeHTTP(ww, r)
		})
	}
}

// recoverPanics turns a panic into a 500 problem (and a log line with the
// stack), never a dropped connection.
func recoverPanics(log zerolog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				if p := recover(); p != nil {
					if p == http.ErrAbortHandler {
						panic(p)
					}
					log.Error().Str("request_id", requestID(r.Context())).Interface("panic", p).
						Bytes("stack", debug.Stack()).Msg("handler panicked")
					writeProblem(w, r, http.StatusInternalServerError, ProbInternal, "")
				}
			}()
			next.ServeHTTP(w, r)
		})
	}
}

func remoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// Authenticator is what the API needs to check keys.
type Authenticator interface {
	Authenticate(ctx context.Context, secret string) (*auth.Key, error)
}

// RateLimiter is what the API needs to limit keys.
type RateLimiter interface {
	Allow(ctx context.Context, bucket string, rate int) (auth.Decision, error)
}

// authenticate checks the Bearer key and its scope, then the key's rate
// limit. Failed authentications are rate limited per client address.
func (a *API) authenticate(scopes ...auth.Scope) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			secret, ok := bearer(r)
			if !ok {
				w.Header().Set("WWW-Authenticate", `Bearer realm="autoprov"`)
				writeProblem(w, r, http.StatusUnauthorized, ProbUnauthorized,
					"send an API key as Authorization: Bearer <key> (`deployer keys create` makes one)")
				return
			}
			key, err := a.deps.Auth.Authenticate(r.Context(), secret)
			if err != nil {
				if !errors.Is(err, auth.ErrNotFound) && !errors.Is(err, auth.ErrRevoked) {
					// Keys cannot be checked: Postgres is away (a key not
					// cached), or the check failed otherwise (logged as
					// an error). Either way the key may be fine: 503.
					ev := a.log.Error()
					if Unreachable(err) {
						ev = a.log.Warn()
					}
					ev.Err(err).Str("request_id", requestID(r.Context())).Msg("authenticate")
					retryLater(w, r, "cannot check API keys right now; retry after the Retry-After delay")
					return
				}
				if a.limited(w, r, "authfail:"+remoteIP(r), a.cfg.AuthFailureRate, authFailuresSpent) {
					return
				}
				w.Header().Set("WWW-Authenticate", `Bearer realm="autoprov", error="invalid_token"`)
				detail := "the API key is not valid"
				if errors.Is(err, auth.ErrRevoked) {
					detail = "the API key has been revoked"
				}
				writeProblem(w, r, http.StatusUnauthorized, ProbUnauthorized, detail)
				return
			}
			if ki, _ := r.Context().Value(ctxKeyInfo).(*keyInfo); ki != nil {
				ki.key = key
			}
			if !hasAnyScope(key, scopes) {
				names := make([]string, len(scopes))
				for i, s := range scopes {
					names[i] = string(s)
				}
				writeProblem(w, r, http.StatusForbidden, ProbForbidden,
					"this API key does not have the scope "+strings.Join(names, " or "))
				return
			}
			if a.limited(w, r, "key:"+key.ID, key.RateLimit, keyBudgetSpent) {
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// The details of the two 429s: a key's budget, and the failed
// authentications of a client address (no valid key was sent).
const (
	keyBudgetSpent    = "the rate limit of this API key is spent; retry after the Retry-After delay"
	authFailuresSpent = "too many requests with a missing, unknown or revoked API key from this address; " +
		"retry after the Retry-After delay with a valid key (`deployer keys create` makes one)"
)

// limited takes a request from bucket's budget and writes a 429 with
// detail when it is spent. Limiter failures let the request through (and
// are logged).
//
// The headers follow the IETF draft "RateLimit header fields for HTTP":
// RateLimit-Limit is the quota RateLimit-Remaining counts against (the
// budget's burst: what a full budget holds), RateLimit-Remaining what is
// left of it now, RateLimit-Reset the seconds until it is full again, and
// RateLimit-Policy the quota and the window over which it refills
// ("100;w=2": 100 requests per 2 seconds for a rate of 50/s, burst 100).
func (a *API) limited(w http.ResponseWriter, r *http.Request, bucket string, rate int, detail string) bool {
	if a.deps.Limiter == nil {
		return false
	}
	d, err := a.deps.Limiter.Allow(r.Context(), bucket, rate)
	if err != nil {
		a.log.Warn().Err(err).Str("request_id", requestID(r.Context())).Msg("rate limiter unavailable: request let through")
		return false
	}
	h := w.Header()
	h.Set("RateLimit-Limit", strconv.Itoa(d.Limit))
	h.Set("RateLimit-Remaining", strconv.Itoa(min(max(d.Remaining, 0), d.Limit)))
	h.Set("RateLimit-Reset", strconv.Itoa(int((d.ResetAfter+time.Second-1)/time.Second)))
	if d.Rate > 0 {
		h.Set("RateLimit-Policy", strconv.Itoa(d.Limit)+";w="+strconv.Itoa((d.Limit+d.Rate-1)/d.Rate))
	}
	if d.Allowed {
		return false
	}
	h.Set("Retry-After", strconv.Itoa(max(1, int((d.RetryAfter+time.Second-1)/time.Second))))
	writeProblem(w, r, http.StatusTooManyRequests, ProbRateLimited, detail)
	return true
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// hasAnyScope reports whether key holds one of scopes ("" or none: any
// key will do).
func hasAnyScope(key *auth.Key, scopes []auth.Scope) bool {
	for _, s := range scopes {
		if s == "" || key.Has(s) {
			return true
		}
	}
	return len(scopes) == 0
}
