package inventory

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
)

// guardedClient is the HTTP client of URL inventories: guard checks every
// address at connect time (after name resolution, before connect(2), so
// a refusal sends no packet), no proxy, no redirects.
func guardedClient(guard *authz.Guard, timeout time.Duration) *http.Client {
	dialer := &net.Dialer{
		Timeout: min(timeout, 10*time.Second),
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("inventory dial: unexpected address %q", address)
			}
			return guard.Check(ap.Addr().Unmap().String())
		},
	}
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:                 nil,
			DialContext:           dialer.DialContext,
			TLSHandshakeTimeout:   min(timeout, 10*time.Second),
			ResponseHeaderTimeout: timeout,
			MaxIdleConnsPerHost:   2,
			IdleConnTimeout:       30 * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// headerRe is what a credential's header name may be.
func validHeader(name string) bool {
	if name == "" || len(name) > 128 {
		return false
	}
	for _, c := range name {
		if !(c == '-' || c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z') {
			return false
		}
	}
	return true
}

// fetch GETs a URL inventory into the run directory.
func (r *Resolver) fetch(ctx context.Context, spec Spec, run Run) (string, error) {
	u, err := url.Parse(spec.URL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.Fragment != "" {
		return "", fmt.Errorf("%w: url must be an http or https URL without credentials", ErrInvalid)
	}
	if f := strings.ToLower(spec.Format); f != "" && f != "yaml" && f != "ini" && f != "json" {
		return "", fmt.Errorf("%w: format %q: want yaml, ini or json", ErrInvalid, spec.Format)
	}
	if spec.Header != "" && !validHeader(spec.Header) || strings.ContainsAny(spec.HeaderValue, "\r\n\x00") {
		return "", fmt.Errorf("%w: credential header", ErrInvalid)
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	req.Header.Set("Accept", "application/json, application/yaml, text/yaml, text/plain;q=0.5")
	if spec.Header != "" {
		req.Header.Set(spec.Header, spec.HeaderValue)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		// The URL (maybe holding a token in its query) stays out of it.
		var ae *authz.AddressError
		if errors.As(err, &ae) {
			return "", fmt.Errorf("inventory url: %w", ae)
		}
		if ctx.Err() != nil {
			return "", fmt.Errorf("%w: %w", ErrFetch, ctx.Err())
		}
		return "", fmt.Errorf("%w: %s", ErrFetch, scrub(err, spec.URL))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%w: status %s", ErrFetch, resp.Status)
	}
	if resp.ContentLength > r.cfg.MaxBytes {
		return "", fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, resp.ContentLength, r.cfg.MaxBytes)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, r.cfg.MaxBytes+1))
	if err != nil {
		return "", fmt.Errorf("%w: %s", ErrFetch, scrub(err, spec.URL))
	}
	if int64(len(body)) > r.cfg.MaxBytes {
		return "", fmt.Errorf("%w: over %d bytes", ErrTooLarge, r.cfg.MaxBytes)
	}
	ext := format(spec.Format, resp.Header.Get("Content-Type"))
	return writeFile(filepath.Join(run.Dir, "inventory."+ext), body)
}

// format is the inventory's format: the request's, else json for a JSON
// content type, else yaml (INI needs format: ini).
func format(requested, contentType string) string {
	if f := strings.ToLower(requested); f != "" {
		return f
	}
	mt, _, _ := mime.ParseMediaType(contentType)
	switch {
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		return "json"
	}
	return "yaml"
}

// scrub is err's text without the URL (a query may hold a token).
func scrub(err error, raw string) string {
	msg := err.Error()
	if raw != "" {
		msg = strings.ReplaceAll(msg, raw, "(url)")
		if u, e := url.Parse(raw); e == nil {
			msg = strings.ReplaceAll(msg, u.String(), "(url)")
		}
	}
	return msg
}
