package api_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/hmacsig"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/webhooks"
)

// receiver is a webhook endpoint that fails while failing is set.
type receiver struct {
	srv     *httptest.Server
	failing atomic.Bool
	mu      sync.Mutex
	got     []*http.Request
	bodies  [][]byte
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.got = append(r.got, req)
		r.bodies = append(r.bodies, body)
		r.mu.Unlock()
		if r.failing.Load() {
			http.Error(w, "not now", http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

type deliveries struct {
	Items []webhooks.Delivery `json:"items"`
}

func TestWebhooks(t *testing.T) {
	t.Parallel()
	recv := newReceiver(t)
	recv.failing.Store(true)
	env := map[string]string{"WEBHOOK_ALLOW_CIDRS": "127.0.0.1/32"}
	e := dt.Start(t, dt.Options{Env: env})
	req := dt.Request()
	req["options"] = map[string]any{"callback_url": recv.srv.URL + "/hooks/deploy?token=receiver-secret-123"}
	_, body := e.Do("POST", "/api/v1/deployments", e.CI, req)
	d := dt.JSON[deployments.Deployment](t, body)
	if strings.Contains(string(body), "receiver-secret-123") || !strings.HasSuffix(d.Request.Options.CallbackURL, "/...") {
		t.Errorf("the callback URL's path and query are shown: %q", d.Request.Options.CallbackURL)
	}

	// Two failed attempts, then the deployer restarts in the middle of the
	// retries, and the receiver recovers.
	testenv.WaitFor(t, 30*time.Second, "two failed attempts", func() bool { return recv.count() >= 2 })
	e.Stop()
	recv.failing.Store(false)
	e2 := dt.Start(t, dt.Options{Env: env, DB: e.DB, Redis: e.Redis, Streams: e.Streams, NoInfra: true})
	var list deliveries
	testenv.WaitFor(t, 30*time.Second, "the delivery after the restart", func() bool {
		_, body := e2.Do("GET", d.Links.Webhooks, e.CI, nil)
		list = dt.JSON[deliveries](t, body)
		return len(list.Items) == 1 && list.Items[0].State == webhooks.StateDelivered
	})
	_, listBody := e2.Do("GET", d.Links.Webhooks, e.CI, nil)
	dt.CheckSchema(t, "DeliveryList", listBody)
	w := list.Items[0]
	if w.Attempts < 3 || len(w.History) != w.Attempts || w.Event != "deployment.finished" {
		t.Fatalf("delivery %+v", w)
	}
	for i, a := range w.History[:len(w.History)-1] {
		if a.StatusCode != 503 || a.Attempt != i+1 || a.Error != webhooks.ClassHTTP5xx {
			t.Errorf("attempt %d: %+v", i+1, a)
		}
	}
	if last := w.History[len(w.History)-1]; last.StatusCode != 200 {
		t.Errorf("last attempt %+v", last)
	}
	if strings.Contains(w.URL, "receiver-secret-123") {
		t.Error("the webhook list shows the callback's token")
	}

	// Every request is signed with the key's webhook secret.
	secret := webhooks.DeriveSecret([]byte(dt.SigningKey), e.CIID)
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if len(recv.got) != w.Attempts {
		t.Errorf("receiver got %d requests, %d attempts recorded", len(recv.got), w.Attempts)
	}
	for i, r := range recv.got {
		if err := hmacsig.Verify(secret, r.Header.Get(hmacsig.HeaderSignature), recv.bodies[i], 5*time.Minute, time.Now()); err != nil {
			t.Errorf("request %d: signature: %v", i, err)
		}
		if r.Header.Get(hmacsig.HeaderID) != w.ID || r.Header.Get(hmacsig.HeaderEvent) != "deployment.finished" {
			t.Errorf("request %d headers: %v", i, r.Header)
		}
		if r.URL.Query().Get("token") != "receiver-secret-123" {
			t.Errorf("request %d went to %s", i, r.URL)
		}
	}
	dt.CheckSchema(t, "WebhookBody", recv.bodies[len(recv.bodies)-1])
	payload := dt.JSON[deployments.WebhookBody](t, recv.bodies[len(recv.bodies)-1])
	if payload.Deployment == nil || payload.Deployment.ID != d.ID || payload.Deployment.Status != deployments.StatusSucceeded {
		t.Errorf("payload %s", recv.bodies[len(recv.bodies)-1])
	}
	for _, l := range []string{e.Logs.String(), e2.Logs.String()} {
		if strings.Contains(l, "receiver-secret-123") {
			t.Error("the callback URL's token is in the logs")
		}
	}
}

func TestWebhookRefusedAtDelivery(t *testing.T) {
	t.Parallel()
	// Without an allow-list, a callback whose name resolves to loopback is
	// accepted at submit (names are checked when dialled) and every attempt
	// is refused before connecting.
	recv := newReceiver(t)
	resolver, queries := dt.DNSServer(t, netip.MustParseAddr("127.0.0.1"))
	e := dt.Start(t, dt.Options{Env: map[string]string{"WEBHOOK_RETRY_FOR": "1s"}, Resolver: resolver})
	req := dt.Request()
	req["options"] = map[string]any{"callback_url": strings.Replace(recv.srv.URL, "127.0.0.1", "ci.example.test", 1) + "/hook"}
	resp, body := e.Do("POST", "/api/v1/deployments", e.CI, req)
	if resp.StatusCode != 202 {
		t.Fatalf("submit: %d %s", resp.StatusCode, body)
	}
	d := dt.JSON[deployments.Deployment](t, body)
	var list deliveries
	var listBody []byte
	testenv.WaitFor(t, 30*time.Second, "the delivery to give up", func() bool {
		_, listBody = e.Do("GET", d.Links.Webhooks, e.CI, nil)
		list = dt.JSON[deliveries](t, listBody)
		return len(list.Items) == 1 && list.Items[0].State == webhooks.StateFailed
	})
	dt.CheckSchema(t, "DeliveryList", listBody)
	// API readers see the class only, never the address the name resolved
	// to; the logs keep the detail.
	h := list.Items[0].History
	if len(h) == 0 || list.Items[0].LastError != webhooks.ClassRefused {
		t.Errorf("delivery %+v", list.Items[0])
	}
	for _, a := range h {
		if a.Error != webhooks.ClassRefused {
			t.Errorf("attempt %d error %q, want %q", a.Attempt, a.Error, webhooks.ClassRefused)
		}
	}
	if strings.Contains(string(listBody), "127.0.0.1") || strings.Contains(string(listBody), "loopback") {
		t.Errorf("the webhook list shows the resolved address: %s", listBody)
	}
	if logs := e.Logs.String(); !strings.Contains(logs, `"error_class":"refused"`) || !strings.Contains(logs, "address 127.0.0.1 refused") {
		t.Errorf("the logs lack the attempt's detail:\n%s", logs)
	}
	if queries.Load() == 0 {
		t.Error("the callback's name was never resolved")
	}
	if recv.count() != 0 {
		t.Errorf("the loopback receiver got %d requests", recv.count())
	}
}

// TestWebhookLocalhost: docs/webhooks.md's rules for localhost, walked
// through the API. Without an allow-list a callback to localhost is
// refused at submit with a 422 naming options.callback_url and
// WEBHOOK_ALLOW_CIDRS; allowed, the name is resolved at the attempt and
// the local receiver gets the webhook.
func TestWebhookLocalhost(t *testing.T) {
	t.Parallel()
	recv := newReceiver(t)
	callback := strings.Replace(recv.srv.URL, "127.0.0.1", "localhost", 1) + "/hook"
	req := dt.Request()
	req["options"] = map[string]any{"callback_url": callback}

	e := dt.Start(t, dt.Options{NoInfra: true})
	resp, body := e.Do("POST", "/api/v1/deployments", e.CI, req)
	p := dt.JSON[api.Problem](t, body)
	if resp.StatusCode != 422 || len(p.Errors) != 1 || p.Errors[0].Field != "options.callback_url" ||
		!strings.Contains(p.Errors[0].Message, "WEBHOOK_ALLOW_CIDRS") || strings.Contains(string(body), "localhost:") {
		t.Fatalf("localhost callback without an allow-list: %d %s", resp.StatusCode, body)
	}
	e.Stop()

	e = dt.Start(t, dt.Options{Env: map[string]string{"WEBHOOK_ALLOW_CIDRS": "127.0.0.1,::1"}})
	resp, body = e.Do("POST", "/api/v1/deployments", e.CI, req)
	if resp.StatusCode != 202 {
		t.Fatalf("localhost callback allowed by WEBHOOK_ALLOW_CIDRS: %d %s", resp.StatusCode, body)
	}
	d := dt.JSON[deployments.Deployment](t, body)
	testenv.WaitFor(t, 30*time.Second, "the webhook at the localhost receiver", func() bool {
		_, body := e.Do("GET", d.Links.Webhooks, e.CI, nil)
		l := dt.JSON[deliveries](t, body)
		return len(l.Items) == 1 && l.Items[0].State == webhooks.StateDelivered
	})
	if recv.count() != 1 {
		t.Errorf("the receiver got %d requests, want 1", recv.count())
	}
}
