package webhooks_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/webhooks"
)

// TestErrorClass makes real attempts that fail each way (all on loopback)
// and checks the class API readers see; none names an address.
func TestErrorClass(t *testing.T) {
	ctx := context.Background()
	loopback, _ := webhooks.ParseCIDRs([]string{"127.0.0.1"})

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()

	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer tlsSrv.Close()
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	defer slow.Close()
	defer close(release)
	garbage, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer garbage.Close()
	go func() {
		for {
			c, err := garbage.Accept()
			if err != nil {
				return
			}
			// Read the request first: an answer before it would be an
			// unsolicited response, which the client reports otherwise.
			_, _ = http.ReadRequest(bufio.NewReader(c))
			_, _ = c.Write([]byte("not http at all\r\n\r\n"))
			c.Close()
		}
	}()
	toLoopback, _ := deployertest.DNSServer(t, netip.MustParseAddr("127.0.0.1"))
	noDNS := &net.Resolver{PreferGo: true, Dial: func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("no DNS server here")
	}}

	tests := []struct {
		name  string
		allow []netip.Prefix
		opts  webhooks.ClientOptions
		url   string
		want  string
	}{
		{"a name resolving to a refused address", nil, webhooks.ClientOptions{Resolver: toLoopback}, "http://ci.example.test:" + port(closedAddr) + "/hook", webhooks.ClassRefused},
		{"a name that does not resolve", nil, webhooks.ClientOptions{Resolver: noDNS}, "http://ci.example.test/hook", webhooks.ClassDNS},
		{"nothing listening", loopback, webhooks.ClientOptions{}, "http://" + closedAddr + "/hook", webhooks.ClassConnect},
		{"an untrusted certificate", loopback, webhooks.ClientOptions{}, tlsSrv.URL + "/hook", webhooks.ClassTLS},
		{"a receiver too slow", loopback, webhooks.ClientOptions{Timeout: 300 * time.Millisecond}, slow.URL + "/hook", webhooks.ClassTimeout},
		{"an answer that is not HTTP", loopback, webhooks.ClientOptions{}, "http://" + garbage.Addr().String() + "/hook", webhooks.ClassProtocol},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.opts.Timeout == 0 {
				tt.opts.Timeout = 5 * time.Second
			}
			req, _ := http.NewRequestWithContext(ctx, "POST", tt.url, strings.NewReader("{}"))
			resp, err := webhooks.NewGuard(tt.allow).NewClient(tt.opts).Do(req)
			if err == nil {
				resp.Body.Close()
				t.Fatalf("status %d, want an error", resp.StatusCode)
			}
			if got := webhooks.ErrorClass(err, 0); got != tt.want {
				t.Errorf("class %q of %v, want %q", got, err, tt.want)
			}
		})
	}

	for code, want := range map[int]string{301: webhooks.ClassHTTP3xx, 404: webhooks.ClassHTTP4xx, 410: webhooks.ClassGone,
		429: webhooks.ClassHTTP4xx, 500: webhooks.ClassHTTP5xx, 503: webhooks.ClassHTTP5xx, 100: webhooks.ClassOther} {
		if got := webhooks.ErrorClass(nil, code); got != want {
			t.Errorf("status %d: class %q, want %q", code, got, want)
		}
	}
	for stored, want := range map[string]string{"": "", "timeout": "timeout", "http_5xx": "http_5xx",
		"dial tcp 10.1.2.3:443: address 10.1.2.3 refused: private address": webhooks.ClassOther} {
		if got := webhooks.PublicError(stored); got != want {
			t.Errorf("PublicError(%q) = %q, want %q", stored, got, want)
		}
	}
}

func port(hostport string) string {
	_, p, _ := net.SplitHostPort(hostport)
	return p
}
