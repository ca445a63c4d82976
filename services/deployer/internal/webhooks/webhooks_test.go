package webhooks_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/webhooks"
)

func TestGuardRefusesNonPublicAddresses(t *testing.T) {
	g := webhooks.NewGuard(nil)
	refused := []string{
		"127.0.0.1", "127.9.9.9", "::1", "0.0.0.0", "::", "10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1",
		"169.254.169.254", "169.254.0.1", "fe80::1", "fd00:ec2::254", "fc00::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254",
		"100.100.100.200", "100.64.0.1", "224.0.0.1", "ff02::1", "255.255.255.255", "192.0.2.1", "198.51.100.1",
		"64:ff9b::a9fe:a9fe", "2002:7f00:1::1", "240.0.0.1",
	}
	for _, s := range refused {
		var re *webhooks.RefusedError
		if err := g.Check(netip.MustParseAddr(s)); !errors.As(err, &re) {
			t.Errorf("%s: %v, want refused", s, err)
		}
	}
	for _, s := range []string{"93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "64:ff9b::808:808"} {
		if err := g.Check(netip.MustParseAddr(s)); err != nil {
			t.Errorf("%s: %v, want allowed", s, err)
		}
	}
	allow, err := webhooks.ParseCIDRs([]string{"127.0.0.1", "10.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	g = webhooks.NewGuard(allow)
	for _, s := range []string{"127.0.0.1", "10.200.0.1", "::ffff:10.0.0.1"} {
		if err := g.Check(netip.MustParseAddr(s)); err != nil {
			t.Errorf("allow-listed %s: %v", s, err)
		}
	}
	if err := g.Check(netip.MustParseAddr("127.0.0.2")); err == nil {
		t.Error("127.0.0.2 allowed by an allow-list of 127.0.0.1")
	}
	if _, err := webhooks.ParseCIDRs([]string{"nonsense"}); err == nil {
		t.Error("a bad CIDR was accepted")
	}
}

func TestCheckURL(t *testing.T) {
	g := webhooks.NewGuard(nil)
	for raw, ok := range map[string]bool{
		"https://ci.example.com/hooks/deploy?token=1":         true,
		"http://ci.example.com:8080/x":                        true,
		"http://127.0.0.1/x":                                  false,
		"http://localhost/x":                                  false,
		"http://[::1]:80/x":                                   false,
		"http://169.254.169.254/latest/meta-data/":            false,
		"http://[fe80::1%25eth0]/":                            false,
		"ftp://ci.example.com/":                               false,
		"https://user:pw@ci.example.com/":                     false,
		"https:///nohost":                                     false,
		"https://ci.example.com/#frag":                        false,
		"https://ci.example.com:99999/":                       false,
		"/relative":                                           false,
		"https://ci.example.com/" + strings.Repeat("a", 3000): false,
	} {
		if err := g.CheckURL(raw); (err == nil) != ok {
			t.Errorf("%.60s: %v, want ok=%v", raw, err, ok)
		}
	}
	// What is refused at submit says how to allow it, never the address;
	// localhost (and names under .localhost) count as loopback without a
	// DNS query, other names are left to each attempt.
	tests := []struct {
		allow []string
		url   string
		ok    bool
	}{
		{nil, "http://localhost:8080/hook", false},
		{nil, "http://LocalHost./hook", false},
		{nil, "http://hooks.localhost/hook", false},
		{nil, "http://10.0.0.5/hook", false},
		{nil, "http://receiver.internal.test/hook", true},
		{[]string{"127.0.0.1"}, "http://localhost:8080/hook", true},
		{[]string{"::1"}, "http://localhost:8080/hook", true},
		{[]string{"127.0.0.1"}, "http://[::1]:8080/hook", false},
		{[]string{"10.0.0.0/8"}, "http://10.0.0.5/hook", true},
		{[]string{"10.0.0.0/8"}, "http://localhost/hook", false},
	}
	for _, tt := range tests {
		allow, err := webhooks.ParseCIDRs(tt.allow)
		if err != nil {
			t.Fatal(err)
		}
		err = webhooks.NewGuard(allow).CheckURL(tt.url)
		if (err == nil) != tt.ok {
			t.Errorf("allow %v, %s: %v, want ok=%v", tt.allow, tt.url, err, tt.ok)
		}
		if err != nil && (!strings.Contains(err.Error(), "WEBHOOK_ALLOW_CIDRS") || strings.Contains(err.Error(), "10.0.0.5") ||
			strings.Contains(err.Error(), "8080")) {
			t.Errorf("%s: refusal %q does not name WEBHOOK_ALLOW_CIDRS, or repeats the URL", tt.url, err)
		}
	}
	if got := webhooks.RedactURL("https://hooks.example.com/services/T0/B0/secret?x=1"); got != "https://hooks.example.com/..." {
		t.Errorf("RedactURL: %q", got)
	}
}

// TestClientRefusesAtConnectTime checks that refused addresses never get a
// connection: the check runs on the resolved address right before
// connect(2), so names that resolve (or re-resolve) to them fail closed.
func TestClientRefusesAtConnectTime(t *testing.T) {
	var hits atomic.Int32
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits.Add(1) }))
	defer recv.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(recv.URL, "http://"))
	g := webhooks.NewGuard(nil)
	ctx := context.Background()

	tests := []struct {
		name string
		url  string
		to   netip.Addr // what the name resolves to (zero: no custom resolver)
	}{
		{"loopback literal", recv.URL, netip.Addr{}},
		{"metadata literal", "http://169.254.169.254/latest/meta-data/", netip.Addr{}},
		{"a name resolving to a private address", "http://build.internal.test:8080/hook", netip.MustParseAddr("10.11.12.13")},
		{"a name resolving to the loopback receiver (rebinding)", "http://rebind.test:" + port + "/hook", netip.MustParseAddr("127.0.0.1")},
		{"a name resolving to metadata", "http://metadata.test/computeMetadata/v1/", netip.MustParseAddr("169.254.169.254")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts webhooks.ClientOptions
			var queries *atomic.Int32
			if tt.to.IsValid() {
				opts.Resolver, queries = deployertest.DNSServer(t, tt.to)
			}
			opts.Timeout = 5 * time.Second
			req, _ := http.NewRequestWithContext(ctx, "POST", tt.url, strings.NewReader("{}"))
			_, err := g.NewClient(opts).Do(req)
			var re *webhooks.RefusedError
			if !errors.As(err, &re) {
				t.Fatalf("error %v, want a refusal", err)
			}
			if tt.to.IsValid() {
				if re.Addr != tt.to {
					t.Errorf("refused %s, want the resolved %s", re.Addr, tt.to)
				}
				if queries.Load() == 0 {
					t.Error("the name was not resolved through the resolver given")
				}
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the loopback receiver got %d requests", n)
	}

	// Allow-listed, the same receiver is reached; redirects are not followed.
	var redirected atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { redirected.Add(1) }))
	defer target.Close()
	redir := httptest.NewServer(http.RedirectHandler(target.URL, http.StatusFound))
	defer redir.Close()
	allow, _ := webhooks.ParseCIDRs([]string{"127.0.0.1"})
	c := webhooks.NewGuard(allow).NewClient(webhooks.ClientOptions{Timeout: 5 * time.Second})
	resp, err := c.Post(recv.URL, "application/json", strings.NewReader("{}"))
	if err != nil || resp.StatusCode != 200 || hits.Load() != 1 {
		t.Fatalf("allow-listed receiver: %v, hits %d", err, hits.Load())
	}
	resp.Body.Close()
	resp, err = c.Post(redir.URL, "application/json", strings.NewReader("{}"))
	if err != nil || resp.StatusCode != http.StatusFound || redirected.Load() != 0 {
		t.Errorf("redirect: %v, status %v, followed %d", err, resp, redirected.Load())
	}
	if resp != nil {
		resp.Body.Close()
	}
}

// TestDeriveSecret: a key's webhook secret is derived from the signing
// key and the key id and differs between keys (pkg/hmacsig tests the
// signatures).
func TestDeriveSecret(t *testing.T) {
	secret := webhooks.DeriveSecret([]byte("signing-key-0123456789-0123456789"), "key-1")
	if !strings.HasPrefix(secret, "whsec_") || secret == webhooks.DeriveSecret([]byte("signing-key-0123456789-0123456789"), "key-2") {
		t.Fatalf("derived secret %q", secret)
	}
}
