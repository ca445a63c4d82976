// Package time4vps is a client for the Time4VPS User API
// (https://billing.time4vps.com/api): list servers, read a server's details,
// list its OS templates, reinstall or reboot it and wait for the resulting task.
//
// Retries: GET requests are retried on network errors, 429 and 5xx with
// exponential backoff and jitter, honouring Retry-After. POST requests
// (reinstall, reboot) are never retried: they are not idempotent, and a failure
// that may have reached the API matches ErrOutcomeUnknown.
//
// Secrets: the password is sent only as the basic auth header; it never appears
// in errors or logs, and task results (which can hold a root password) are
// never logged.
//
// The sub-package time4vpstest is an in-memory stand-in of the API for tests.
package time4vps

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-resty/resty/v2"
	"github.com/rs/zerolog"
)

// maxResponseBytes bounds a response body; real ones are a few kilobytes.
const maxResponseBytes = 4 << 20

const userAgent = "autoprovisioner-time4vps/1"

// Option changes a Client built by New.
type Option func(*Client)

// WithTaskFailureFunc replaces LooksFailed, the test WaitTask uses to decide
// whether a completed task failed.
func WithTaskFailureFunc(f func(Task) bool) Option {
	return func(c *Client) {
		if f != nil {
			c.taskFailed = f
		}
	}
}

// Client calls the Time4VPS API. It is safe for concurrent use.
type Client struct {
	cfg        Config
	log        zerolog.Logger
	rc         *resty.Client
	redact     func(string) string
	taskFailed func(Task) bool
}

// New validates cfg (applying defaults to zero fields, reading PasswordFile)
// and returns a Client that logs to log.
func New(cfg Config, log zerolog.Logger, opts ...Option) (*Client, error) {
	cfg, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	c := &Client{
		cfg:        cfg,
		log:        log.With().Str("component", "time4vps").Logger(),
		redact:     newRedactor(cfg.Username, cfg.Password),
		taskFailed: LooksFailed,
	}
	for _, o := range opts {
		o(c)
	}

	base, _ := url.Parse(cfg.URL) // validated by resolve
	if base.Scheme == "http" && !isLoopback(base.Hostname()) {
		c.log.Warn().Str("url", cfg.URL).Msg("time4vps API URL is plain http: the password travels unencrypted")
	}

	dialer := &net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}
	transport := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialer.DialContext,
		TLSHandshakeTimeout:   cfg.ConnectTimeout,
		ResponseHeaderTimeout: cfg.Timeout,
		ExpectContinueTimeout: time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   4,
		ForceAttemptHTTP2:     true,
	}
	hc := &http.Client{Transport: &loggingTransport{base: transport, log: c.log, redact: c.redact}}

	c.rc = resty.NewWithClient(hc).
		SetBaseURL(cfg.URL).
		SetBasicAuth(cfg.Username, string(cfg.Password)).
		SetHeader("User-Agent", userAgent).
		SetHeader("Accept", "application/json").
		SetTimeout(cfg.Timeout).
		SetResponseBodyLimit(maxResponseBytes).
		SetRedirectPolicy(noDowngrade, resty.DomainCheckRedirectPolicy(base.Hostname()), resty.FlexibleRedirectPolicy(3)).
		SetLogger(restyLogger{log: c.log, redact: c.redact}).
		SetDisableWarn(true). // its only warning is about basic auth over http, handled above
		SetDebug(false).      // debug mode would log the Authorization header
		SetRetryCount(cfg.RetryMax).
		SetRetryWaitTime(cfg.RetryWaitMin).
		SetRetryMaxWaitTime(cfg.RetryWaitMax).
		SetRetryAfter(c.retryAfter).
		AddRetryCondition(retryable)
	return c, nil
}

// noDowngrade refuses a redirect from https to http: resty copies the
// Authorization header to same-host redirects.
var noDowngrade = resty.RedirectPolicyFunc(func(req *http.Request, via []*http.Request) error {
	if len(via) > 0 && via[len(via)-1].URL.Scheme == "https" && req.URL.Scheme != "https" {
		return errors.New("redirect from https to http refused")
	}
	return nil
})

// errRetryAfterTooLong ends the retries of a request whose Retry-After asks
// for more than RetryWaitMax or more than the context has left.
var errRetryAfterTooLong = errors.New("retry-after exceeds the allowed wait")

// retryable is the only retry condition (resty's conditions replace its
// default of retrying every error). GET only: reinstall and reboot are not
// idempotent, and a blind retry could reinstall a server twice.
func retryable(resp *resty.Response, err error) bool {
	if resp == nil || resp.Request == nil || resp.Request.Method != http.MethodGet {
		return false
	}
	if err != nil {
		// Network error or a per-attempt timeout. Cancellation of the
		// caller's context is checked by resty before this condition.
		return true
	}
	code := resp.StatusCode()
	return code == http.StatusTooManyRequests || code >= 500
}

// retryAfter tells resty how long to wait before the next attempt: the
// Retry-After header when present (0 means "use the jittered backoff").
func (c *Client) retryAfter(_ *resty.Client, resp *resty.Response) (time.Duration, error) {
	if resp == nil || resp.RawResponse == nil {
		return 0, nil
	}
	d := parseRetryAfter(resp.Header().Get("Retry-After"), time.Now())
	if d <= 0 {
		return 0, nil
	}
	if d > c.cfg.RetryWaitMax {
		return 0, errRetryAfterTooLong
	}
	if dl, ok := resp.Request.Context().Deadline(); ok && time.Until(dl) < d {
		return 0, errRetryAfterTooLong
	}
	return d, nil
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil {
		if secs < 0 {
			return 0
		}
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

// do sends one API call (with retries for GET) and decodes a successful JSON
// body into out (when non-nil).
func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	endpoint := method + " " + path
	req := c.rc.R().SetContext(withAttemptCounter(ctx))
	if body != nil {
		req.SetBody(body)
	}
	resp, err := req.Execute(method, path)
	if err != nil && !(errors.Is(err, errRetryAfterTooLong) && resp != nil && resp.RawResponse != nil) {
		return &TransportError{Endpoint: endpoint, Err: err, msg: c.redact(err.Error())}
	}
	return c.decode(endpoint, resp, out)
}

// decode turns a response into the value or an *APIError. The body is checked
// for an "error" field whatever the status: the API may report errors in a
// 200 body (the official PHP library checks the body, never the status).
func (c *Client) decode(endpoint string, resp *resty.Response, out any) error {
	status := resp.StatusCode()
	body := resp.Body()
	msgs, hasErr := parseErrorField(body)
	if hasErr || status < 200 || status > 299 {
		for i, m := range msgs {
			msgs[i] = c.redact(m)
		}
		return &APIError{
			StatusCode: status,
			Messages:   msgs,
			Endpoint:   endpoint,
			RetryAfter: parseRetryAfter(resp.Header().Get("Retry-After"), time.Now()),
		}
	}
	if out == nil {
		return nil
	}
	if err := decodeJSON(body, out); err != nil {
		// Never quote the body: task results can hold a root password.
		return fmt.Errorf("time4vps: %s: decode %d-byte response: %w", endpoint, len(body), err)
	}
	return nil
}

// newRedactor returns a function that replaces the password, and the basic
// auth token built from it, with [REDACTED].
func newRedactor(user string, pass Secret) func(string) string {
	p := string(pass)
	if p == "" {
		return func(s string) string { return s }
	}
	pairs := []string{
		base64.StdEncoding.EncodeToString([]byte(user + ":" + p)), redacted,
		base64.URLEncoding.EncodeToString([]byte(user + ":" + p)), redacted,
		p, redacted,
	}
	if q := url.QueryEscape(p); q != p {
		pairs = append(pairs, q, redacted)
	}
	if q := url.PathEscape(p); q != p {
		pairs = append(pairs, q, redacted)
	}
	return strings.NewReplacer(pairs...).Replace
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// attemptKey carries a per-call attempt counter from do to loggingTransport.
type attemptKey struct{}

func withAttemptCounter(ctx context.Context) context.Context {
	return context.WithValue(ctx, attemptKey{}, new(atomic.Int32))
}

func nextAttempt(ctx context.Context) int {
	if n, ok := ctx.Value(attemptKey{}).(*atomic.Int32); ok {
		return int(n.Add(1))
	}
	return 0
}

// loggingTransport logs every HTTP attempt: method, path (never the query),
// status, time to response headers and attempt number. It never logs headers.
type loggingTransport struct {
	base   http.RoundTripper
	log    zerolog.Logger
	redact func(string) string
}

// RoundTrip implements http.RoundTripper.
func (t *loggingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	attempt := nextAttempt(req.Context())
	start := time.Now()
	resp, err := t.base.RoundTrip(req)
	elapsed := time.Since(start)
	if err != nil {
		t.log.Warn().Str("method", req.Method).Str("path", req.URL.Path).Int("attempt", attempt).
			Dur("duration", elapsed).Str("error", t.redact(err.Error())).Msg("time4vps request failed")
		return nil, err
	}
	ev := t.log.Debug()
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
		ev = t.log.Warn()
	}
	ev.Str("method", req.Method).Str("path", req.URL.Path).Int("attempt", attempt).
		Int("status", resp.StatusCode).Dur("duration", elapsed).Msg("time4vps request")
	return resp, nil
}

// restyLogger sends resty's own messages to zerolog at debug level, redacted.
type restyLogger struct {
	log    zerolog.Logger
	redact func(string) string
}

func (l restyLogger) Errorf(format string, v ...any) { l.emit(format, v...) }
func (l restyLogger) Warnf(format string, v ...any)  { l.emit(format, v...) }
func (l restyLogger) Debugf(format string, v ...any) { l.emit(format, v...) }

func (l restyLogger) emit(format string, v ...any) {
	l.log.Debug().Str("source", "resty").Msg(l.redact(fmt.Sprintf(format, v...)))
}
