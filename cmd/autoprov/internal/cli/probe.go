package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// probeCmd is a container health check without curl in the image.
type probeCmd struct {
	URL     string        `arg:"" help:"http URL to GET, e.g. http://127.0.0.1:9102/readyz"`
	Timeout time.Duration `default:"3s" help:"give up after this long"`
}

func (c *probeCmd) Run(g *globals) error {
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usageError{fmt.Errorf("probe: %q is not an http(s) URL", c.URL)}
	}
	ctx, cancel := context.WithTimeout(g.ctx, c.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("probe %s: %s: %s", u.Redacted(), resp.Status, body)
	}
	return nil
}
