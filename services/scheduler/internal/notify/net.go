package notify

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/go-resty/resty/v2"
)

// Net is how the job notifications reach their channels, whose
// addresses come from projects (a webhook URL, a Slack URL, an SMTP
// server): every connection's address is checked after name resolution,
// right before connect(2), so a name that resolves (or re-resolves) to
// this host, a private network or cloud metadata never gets a packet
// unless check lets it through; no proxy is used and redirects are not
// followed.
type Net struct {
	check   func(address string) error
	timeout time.Duration
	dialer  *net.Dialer
	client  *http.Client
	tr      *http.Transport
	roots   *x509.CertPool // nil: the system's
}

// NewNet returns a Net whose connections check lets through (the
// scheduler's authz.Guard.Check, which honours SPECIAL_ALLOW_NETWORKS;
// nil: every address) and whose requests time out after timeout
// (default 15s).
func NewNet(check func(address string) error, timeout time.Duration) *Net {
	if timeout <= 0 {
		timeout = 15 * time.Second
	}
	n := &Net{check: check, timeout: timeout}
	n.dialer = &net.Dialer{Timeout: min(timeout, 10*time.Second), Control: n.control}
	n.tr = &http.Transport{Proxy: nil, DialContext: n.dialer.DialContext, TLSHandshakeTimeout: min(timeout, 10*time.Second),
		ResponseHeaderTimeout: timeout, MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute, ForceAttemptHTTP2: true}
	n.client = &http.Client{
		Timeout:       timeout,
		Transport:     n.tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return n
}

// TrustRoots makes n verify TLS servers (HTTPS, SMTP's STARTTLS) against
// roots instead of the system's pool, and returns n.
func (n *Net) TrustRoots(roots *x509.CertPool) *Net {
	n.roots = roots
	n.tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	return n
}

// control checks the address about to be dialled.
func (n *Net) control(_, address string, _ syscall.RawConn) error {
	if n.check == nil {
		return nil
	}
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("dial: unexpected address %q", address)
	}
	return n.check(host)
}

// Dial connects to address (host:port) over TCP.
func (n *Net) Dial(ctx context.Context, address string) (net.Conn, error) {
	return n.dialer.DialContext(ctx, "tcp", address)
}

// resty returns a resty client over the Net, quiet as newClient's.
func (n *Net) resty() *resty.Client {
	c := resty.NewWithClient(n.client).SetRetryCount(0).SetDebug(false).SetRedirectPolicy(resty.NoRedirectPolicy())
	c.SetLogger(quietLogger{})
	return c
}

// use makes s post through n.
func (s *Slack) use(n *Net) *Slack {
	s.client = n.resty()
	return s
}

// use makes t post through n.
func (t *Telegram) use(n *Net) *Telegram {
	t.client = n.resty()
	return t
}
