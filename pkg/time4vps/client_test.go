package time4vps_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps"
	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps/time4vpstest"
)

func TestListServers(t *testing.T) {
	t.Parallel()
	h := setup(t, time4vpstest.Config{}, nil)
	h.api.AddServer(time4vpstest.VPS{ID: 102, Domain: "db1.example.net", IP: "203.0.113.20", Label: "db", Type: "OpenVZ"})
	h.api.AddServer(time4vpstest.VPS{ID: 103, Domain: "old.example.net", IP: "203.0.113.30", Status: "Suspended"})

	got, err := h.client.ListServers(context.Background())
	if err != nil {
		t.Fatalf("ListServers: %v", err)
	}
	// Only active servers are listed (docs: "Lists all active servers").
	type brief struct {
		ID                   int64
		Domain, IP, Label, T string
	}
	var gotBrief []brief
	for _, s := range got {
		if s.DateCreated == "" || s.SynchDate == "" {
			t.Errorf("server %d: empty dates %+v", s.ID, s)
		}
		gotBrief = append(gotBrief, brief{int64(s.ID), s.Domain, s.IP, s.Label, s.Type})
	}
	want := []brief{
		{testServerID, "web1.example.net", "203.0.113.10", "web", "KVM"},
		{102, "db1.example.net", "203.0.113.20", "db", "OpenVZ"},
	}
	if d := cmp.Diff(want, gotBrief); d != "" {
		t.Errorf("ListServers (-want +got):\n%s", d)
	}
	if n := h.api.Count(time4vpstest.EndpointListServers); n != 1 {
		t.Errorf("GET /server sent %d times, want 1", n)
	}
}

func TestServerDetails(t *testing.T) {
	t.Parallel()
	h := setup(t, time4vpstest.Config{}, nil)
	ctx := context.Background()

	s, err := h.client.Server(ctx, testServerID)
	if err != nil {
		t.Fatalf("Server: %v", err)
	}
	if s.ID != testServerID || s.Domain != "web1.example.net" || s.Status != "Active" ||
		s.OS != "kvm-debian-12-x86_64" || s.PackageID != 11 || s.CPUCores != 1 || s.RAMLimit != 2048 {
		t.Errorf("unexpected details: %+v", s)
	}
	if d := cmp.Diff([]string{"203.0.113.10", "203.0.113.11"}, s.Addresses()); d != "" {
		t.Errorf("Addresses (-want +got):\n%s", d)
	}
	if s.Busy() || s.ActiveTask != nil || s.LastTasks != nil {
		t.Errorf("idle server shows tasks: active=%v last=%v", s.ActiveTask, s.LastTasks)
	}
	if len(s.Components) != 1 || s.Components[0].Name == "" {
		t.Errorf("components = %+v", s.Components)
	}

	// The address may change between runs: a fresh read shows the new one.
	h.api.UpdateServer(testServerID, func(v *time4vpstest.VPS) { v.IP = "198.51.100.7"; v.AdditionalIPs = nil })
	s, err = h.client.Server(ctx, testServerID)
	if err != nil {
		t.Fatalf("Server: %v", err)
	}
	if d := cmp.Diff([]string{"198.51.100.7"}, s.Addresses()); d != "" {
		t.Errorf("Addresses after change (-want +got):\n%s", d)
	}
}

func TestServerNotFound(t *testing.T) {
	t.Parallel()
	h := setup(t, time4vpstest.Config{}, nil)
	_, err := h.client.Server(context.Background(), 999)
	h.errNoSecret(t, err)
	if !errors.Is(err, time4vps.ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
	var ae *time4vps.APIError
	if !errors.As(err, &ae) {
		t.Fatalf("err %T is not an *APIError", err)
	}
	want := &time4vps.APIError{StatusCode: 404, Messages: []string{time4vpstest.MsgServerNotFound}, Endpoint: "GET /server/999"}
	if d := cmp.Diff(want, ae); d != "" {
		t.Errorf("APIError (-want +got):\n%s", d)
	}
	// 404 is not retried.
	if n := h.api.Count(time4vpstest.EndpointServer); n != 1 {
		t.Errorf("GET /server/{id} sent %d times, want 1", n)
	}
}

func TestOSesAndCheckOS(t *testing.T) {
	t.Parallel()
	h := setup(t, time4vpstest.Config{}, nil)
	ctx := context.Background()

	oses, err := h.client.OSes(ctx, testServerID)
	if err != nil {
		t.Fatalf("OSes: %v", err)
	}
	var want []time4vps.OS
	for _, o := range time4vpstest.DefaultOSes {
		want = append(want, time4vps.OS{OS: o.OS, Title: o.Title})
	}
	if d := cmp.Diff(want, oses); d != "" {
		t.Errorf("OSes (-want +got):\n%s", d)
	}
	if err := h.client.CheckOS(ctx, testServerID, "kvm-ubuntu-24.04-gpt-x86_64"); err != nil {
		t.Errorf("CheckOS(known): %v", err)
	}
	err = h.client.CheckOS(ctx, testServerID, "windows-3.11")
	if !errors.Is(err, time4vps.ErrUnknownOS) {
		t.Errorf("CheckOS(unknown) = %v, want ErrUnknownOS", err)
	}
}

func TestReinstall(t *testing.T) {
	t.Parallel()
	h := setup(t, time4vpstest.Config{TaskPolls: 3}, nil)
	ctx := context.Background()
	const osName = "kvm-ubuntu-24.04-gpt-x86_64"
	sshKey := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKey deploy@autoprovisioner"

	taskID, err := h.client.Reinstall(ctx, testServerID, time4vps.ReinstallRequest{OS: osName, SSHKey: sshKey, ScriptID: 403})
	if err != nil {
		t.Fatalf("Reinstall: %v", err)
	}
	if d := cmp.Diff([]time4vpstest.ReinstallCall{{ServerID: testServerID, OS: osName, SSHKey: sshKey, Script: 403}}, h.api.Reinstalls()); d != "" {
		t.Errorf("reinstall calls (-want +got):\n%s", d)
	}

	// While the task runs, the server reports it as its active task.
	s, err := h.client.Server(ctx, testServerID)
	if err != nil {
		t.Fatalf("Server: %v", err)
	}
	if !s.Busy() || s.ActiveTask.Name != time4vpstest.TaskReinstall || s.ActiveTask.Activated == "" || s.ActiveTask.Done() {
		t.Fatalf("active task while reinstalling = %+v", s.ActiveTask)
	}

	task, err := h.client.WaitTask(ctx, testServerID, taskID)
	if err != nil {
		t.Fatalf("WaitTask: %v", err)
	}
	if task.ID != taskID || !task.Done() || task.Name != time4vpstest.TaskReinstall || !strings.Contains(task.Results, "Password: ") {
		t.Errorf("final task = %+v", task)
	}
	if _, ok := task.CompletedAt(); !ok {
		t.Errorf("completed %q does not parse", task.Completed)
	}

	s, err = h.client.Server(ctx, testServerID)
	if err != nil {
		t.Fatalf("Server: %v", err)
	}
	if s.OS != osName || s.Busy() || len(s.LastTasks) != 1 || s.LastTasks[0].Name != time4vpstest.TaskReinstall {
		t.Errorf("after reinstall: os=%q busy=%v last=%+v", s.OS, s.Busy(), s.LastTasks)
	}
	// The root password in the task result never reaches the logs (the
	// cleanup check scans for it); make the point explicit here too.
	if m := rootPassword.FindStringSubmatch(task.Results); m == nil || strings.Contains(h.logs.String(), m[1]) {
		t.Errorf("root password missing from results or present in logs")
	}
}

func TestReboot(t *testing.T) {
	t.Parallel()
	h := setup(t, time4vpstest.Config{}, nil)
	ctx := context.Background()
	taskID, err := h.client.Reboot(ctx, testServerID)
	if err != nil {
		t.Fatalf("Reboot: %v", err)
	}
	task, err := h.client.WaitTask(ctx, testServerID, taskID)
	if err != nil {
		t.Fatalf("WaitTask: %v", err)
	}
	if task.Name != time4vpstest.TaskReboot || task.Results != "VM rebooted successfully" {
		t.Errorf("task = %+v", task)
	}
	if n := h.api.Count(time4vpstest.EndpointReboot); n != 1 {
		t.Errorf("POST reboot sent %d times, want 1", n)
	}
}

// Application errors come as {"error": [...]} bodies; the stand-in sends them
// with 200 by default (what the official PHP library is written for) or with
// any status configured.
func TestReinstallRejected(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusOK, http.StatusUnprocessableEntity} {
		for _, tc := range []struct {
			name    string
			os      string
			prepare func(*testing.T, *harness)
			want    string
		}{
			{name: "unknown OS", os: "plan9-4", want: time4vpstest.MsgInvalidOS},
			{name: "busy server", os: "centos-7-x86_64", want: time4vpstest.MsgServerBusy, prepare: func(t *testing.T, h *harness) {
				if _, err := h.client.Reboot(context.Background(), testServerID); err != nil {
					t.Fatalf("Reboot: %v", err)
				}
			}},
		} {
			t.Run(http.StatusText(status)+"/"+tc.name, func(t *testing.T) {
				h := setup(t, time4vpstest.Config{AppErrorStatus: status}, nil)
				if tc.prepare != nil {
					tc.prepare(t, h)
				}
				_, err := h.client.Reinstall(context.Background(), testServerID, time4vps.ReinstallRequest{OS: tc.os})
				h.errNoSecret(t, err)
				var ae *time4vps.APIError
				if !errors.As(err, &ae) {
					t.Fatalf("err = %v, want *APIError", err)
				}
				want := &time4vps.APIError{StatusCode: status, Messages: []string{tc.want}, Endpoint: "POST /server/101/reinstall"}
				if d := cmp.Diff(want, ae); d != "" {
					t.Errorf("APIError (-want +got):\n%s", d)
				}
				if errors.Is(err, time4vps.ErrOutcomeUnknown) {
					t.Errorf("a rejected request must not be 'outcome unknown'")
				}
				if n := h.api.Count(time4vpstest.EndpointReinstall); n != 1 {
					t.Errorf("POST reinstall sent %d times, want 1", n)
				}
				if got := h.api.Reinstalls(); len(got) != 0 {
					t.Errorf("stand-in accepted %v", got)
				}
			})
		}
	}
}

func TestReinstallValidatesLocally(t *testing.T) {
	t.Parallel()
	h := setup(t, time4vpstest.Config{}, nil)
	ctx := context.Background()
	if _, err := h.client.Reinstall(ctx, testServerID, time4vps.ReinstallRequest{OS: "  "}); err == nil {
		t.Error("Reinstall without OS succeeded")
	}
	if _, err := h.client.Reinstall(ctx, 0, time4vps.ReinstallRequest{OS: "centos-7-x86_64"}); err == nil {
		t.Error("Reinstall of server 0 succeeded")
	}
	if n := h.api.TotalRequests(); n != 0 {
		t.Errorf("%d requests sent for invalid calls", n)
	}
}

func TestTaskInvalidID(t *testing.T) {
	t.Parallel()
	h := setup(t, time4vpstest.Config{}, nil)
	_, err := h.client.Task(context.Background(), testServerID, 424242)
	h.errNoSecret(t, err)
	// The stand-in answers 200 {"error":["Invalid task ID"]}, the message the
	// official PHP library maps to InvalidTaskException.
	if !errors.Is(err, time4vps.ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
	var ae *time4vps.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusOK {
		t.Errorf("err = %#v, want APIError with status 200", err)
	}
}

func TestAuthFailure(t *testing.T) {
	t.Parallel()
	const wrong = "Wrong-Passw0rd-9d1e"
	h := setup(t, time4vpstest.Config{}, func(c *time4vps.Config) { c.Password = wrong })
	ctx := context.Background()

	calls := map[string]func() error{
		time4vpstest.EndpointListServers: func() error { _, err := h.client.ListServers(ctx); return err },
		time4vpstest.EndpointServer:      func() error { _, err := h.client.Server(ctx, testServerID); return err },
		time4vpstest.EndpointOSes:        func() error { _, err := h.client.OSes(ctx, testServerID); return err },
		time4vpstest.EndpointTask:        func() error { _, err := h.client.Task(ctx, testServerID, 1); return err },
		time4vpstest.EndpointReinstall: func() error {
			_, err := h.client.Reinstall(ctx, testServerID, time4vps.ReinstallRequest{OS: "centos-7-x86_64"})
			return err
		},
		time4vpstest.EndpointReboot: func() error { _, err := h.client.Reboot(ctx, testServerID); return err },
	}
	for endpoint, call := range calls {
		t.Run(endpoint, func(t *testing.T) {
			err := h.errNoSecret(t, call())
			if !errors.Is(err, time4vps.ErrUnauthorized) {
				t.Fatalf("err = %v, want ErrUnauthorized", err)
			}
			var ae *time4vps.APIError
			if !errors.As(err, &ae) || ae.StatusCode != http.StatusUnauthorized ||
				!cmp.Equal(ae.Messages, []string{time4vpstest.MsgWrongLogin}) {
				t.Errorf("err = %#v, want 401 [wronglogin]", err)
			}
			if n := h.api.Count(endpoint); n != 1 {
				t.Errorf("%s sent %d times, want 1 (auth errors are not retried)", endpoint, n)
			}
		})
	}
	if len(h.api.Tasks()) != 0 {
		t.Errorf("unauthorized calls created tasks")
	}
}

func TestErrorBodies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		status   int
		body     string
		wantMsgs []string
		is       error
		ok       bool // the body is a success, not an error
	}{
		{name: "error in a 200 body", status: 200, body: `{"error":["Service is not active"]}`, wantMsgs: []string{"Service is not active"}},
		{name: "wronglogin in a 200 body", status: 200, body: `{"error":["wronglogin"]}`, wantMsgs: []string{"wronglogin"}, is: time4vps.ErrUnauthorized},
		{name: "mixed items", status: 400, body: `{"error":["bad request",{"field":"os"},3]}`, wantMsgs: []string{"bad request", `{"field":"os"}`, "3"}},
		{name: "error as a string", status: 422, body: `{"error":"single message"}`, wantMsgs: []string{"single message"}},
		{name: "HostBill error hash", status: 200, body: `{"success":false,"error":{"b":"second","a":"first"}}`, wantMsgs: []string{"first", "second"}},
		{name: "403", status: 403, body: `{"error":["Access denied"]}`, wantMsgs: []string{"Access denied"}, is: time4vps.ErrUnauthorized},
		{name: "404 without JSON", status: 404, body: "<html>Not Found</html>", is: time4vps.ErrNotFound},
		{name: "empty error list is success", status: 200, body: `{"error":[],"domain":"x.example"}`, ok: true},
		{name: "null error is success", status: 200, body: `{"error":null,"domain":"x.example"}`, ok: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := setup(t, time4vpstest.Config{}, nil)
			h.api.InjectFault(time4vpstest.Fault{Endpoint: time4vpstest.EndpointServer, Status: tc.status, Body: tc.body})
			s, err := h.client.Server(context.Background(), testServerID)
			h.errNoSecret(t, err)
			if tc.ok {
				if err != nil || s.Domain != "x.example" {
					t.Fatalf("Server = %+v, %v; want success", s, err)
				}
				return
			}
			var ae *time4vps.APIError
			if !errors.As(err, &ae) {
				t.Fatalf("err = %v, want *APIError", err)
			}
			want := &time4vps.APIError{StatusCode: tc.status, Messages: tc.wantMsgs, Endpoint: "GET /server/101"}
			if d := cmp.Diff(want, ae); d != "" {
				t.Errorf("APIError (-want +got):\n%s", d)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("errors.Is(%v, %v) = false", err, tc.is)
			}
		})
	}
}

func TestGETRetried(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fault  time4vpstest.Fault
		mutate func(*time4vps.Config)
		sent   int
	}{
		{name: "503 twice", fault: time4vpstest.Fault{Status: 503, Times: 2}, sent: 3},
		{name: "500 up to the retry limit", fault: time4vpstest.Fault{Status: 500, Times: 3}, sent: 4},
		{name: "502 with an HTML body", fault: time4vpstest.Fault{Status: 502, Body: "<html>Bad Gateway</html>"}, sent: 2},
		{name: "429 with Retry-After 0", fault: time4vpstest.Fault{Status: 429, RetryAfter: "0", Times: 2}, sent: 3},
		{name: "429 without Retry-After", fault: time4vpstest.Fault{Status: 429}, sent: 2},
		{name: "dropped connection", fault: time4vpstest.Fault{Drop: time4vpstest.DropBeforeHandling, Times: 2}, sent: 3},
		{
			name:   "response slower than the timeout",
			fault:  time4vpstest.Fault{Delay: time.Minute},
			mutate: func(c *time4vps.Config) { c.Timeout = time.Second },
			sent:   2,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := setup(t, time4vpstest.Config{}, tc.mutate)
			tc.fault.Endpoint = time4vpstest.EndpointListServers
			h.api.InjectFault(tc.fault)
			got, err := h.client.ListServers(context.Background())
			if err != nil {
				t.Fatalf("ListServers: %v", h.errNoSecret(t, err))
			}
			if len(got) != 1 {
				t.Errorf("got %d servers, want 1", len(got))
			}
			if n := h.api.Count(time4vpstest.EndpointListServers); n != tc.sent {
				t.Errorf("GET /server sent %d times, want %d", n, tc.sent)
			}
			if want := `"attempt":` + strconv.Itoa(tc.sent); !strings.Contains(h.logs.String(), want) {
				t.Errorf("logs lack %s:\n%s", want, h.logs.String())
			}
		})
	}
}

func TestGETRetriesExhausted(t *testing.T) {
	t.Parallel()
	h := setup(t, time4vpstest.Config{}, nil)
	h.api.FailNext(time4vpstest.EndpointServer, 10, http.StatusServiceUnavailable)
	_, err := h.client.Server(context.Background(), testServerID)
	h.errNoSecret(t, err)
	var ae *time4vps.APIError
	if !errors.As(err, &ae) || ae.StatusCode != 503 || !errors.Is(err, time4vps.ErrUnavailable) {
		t.Fatalf("err = %v, want APIError 503", err)
	}
	if n := h.api.Count(time4vpstest.EndpointServer); n != h.cfg.RetryMax+1 {
		t.Errorf("sent %d times, want %d", n, h.cfg.RetryMax+1)
	}
}

func TestRetriesDisabled(t *testing.T) {
	t.Parallel()
	h := setup(t, time4vpstest.Config{}, func(c *time4vps.Config) { c.RetryMax = -1 })
	h.api.FailNext(time4vpstest.EndpointServer, 1, http.StatusBadGateway)
	if _, err := h.client.Server(context.Background(), testServerID); !errors.Is(err, time4vps.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
	if n := h.api.Count(time4vpstest.EndpointServer); n != 1 {
		t.Errorf("sent %d times, want 1", n)
	}
}

// The waits grow: with a 100ms base the three waits are at least 100, 100 and
// 200ms (equal jitter over 100, 200, 400ms, never below the base). A linear or
// constant backoff would stay under 400ms. Only a lower bound is checked.
func TestGETBackoffIsExponential(t *testing.T) {
	h := setup(t, time4vpstest.Config{}, func(c *time4vps.Config) {
		c.RetryWaitMin = 100 * time.Millisecond
		c.RetryWaitMax = 5 * time.Second
	})
	h.api.FailNext(time4vpstest.EndpointListServers, 3, http.StatusServiceUnavailable)
	start := time.Now()
	if _, err := h.client.ListServers(context.Background()); err != nil {
		t.Fatalf("ListServers: %v", err)
	}
	if el := time.Since(start); el < 400*time.Millisecond {
		t.Errorf("three retries took %s, want at least 400ms", el)
	}
}

func TestRetryAfterHonoured(t *testing.T) {
	h := setup(t, time4vpstest.Config{}, func(c *time4vps.Config) { c.RetryWaitMax = 5 * time.Second })
	h.api.RateLimitNext(time4vpstest.EndpointListServers, 1, "1")
	start := time.Now()
	if _, err := h.client.ListServers(context.Background()); err != nil {
		t.Fatalf("ListServers: %v", err)
	}
	if el := time.Since(start); el < time.Second {
		t.Errorf("retried after %s, want at least the 1s Retry-After", el)
	}
	if n := h.api.Count(time4vpstest.EndpointListServers); n != 2 {
		t.Errorf("sent %d times, want 2", n)
	}
}

func TestRetryAfterTooLongStopsRetrying(t *testing.T) {
	for _, tc := range []struct {
		name       string
		retryAfter string
		ctxTimeout time.Duration
	}{
		{name: "beyond RetryWaitMax", retryAfter: "120"},
		{name: "beyond the context deadline", retryAfter: "4", ctxTimeout: 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := setup(t, time4vpstest.Config{}, func(c *time4vps.Config) { c.RetryWaitMax = 5 * time.Second })
			h.api.RateLimitNext(time4vpstest.EndpointListServers, 5, tc.retryAfter)
			ctx := context.Background()
			if tc.ctxTimeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctxTimeout)
				defer cancel()
			}
			_, err := h.client.ListServers(ctx)
			var ae *time4vps.APIError
			if !errors.As(err, &ae) || !errors.Is(err, time4vps.ErrRateLimited) {
				t.Fatalf("err = %v, want APIError 429", err)
			}
			if ae.RetryAfter <= 0 {
				t.Errorf("RetryAfter = %s, want the header's value", ae.RetryAfter)
			}
			if n := h.api.Count(time4vpstest.EndpointListServers); n != 1 {
				t.Errorf("sent %d times, want 1", n)
			}
		})
	}
}

func TestPOSTNeverRetried(t *testing.T) {
	type post struct {
		name     string
		endpoint string
		call     func(*harness) error
	}
	posts := []post{
		{"reinstall", time4vpstest.EndpointReinstall, func(h *harness) error {
			_, err := h.client.Reinstall(context.Background(), testServerID, time4vps.ReinstallRequest{OS: "centos-7-x86_64"})
			return err
		}},
		{"reboot", time4vpstest.EndpointReboot, func(h *harness) error {
			_, err := h.client.Reboot(context.Background(), testServerID)
			return err
		}},
	}
	for _, p := range posts {
		for _, tc := range []struct {
			name           string
			fault          time4vpstest.Fault
			mutate         func(*time4vps.Config)
			outcomeUnknown bool
			tasks          int // tasks the stand-in created
		}{
			{name: "500", fault: time4vpstest.Fault{Status: 500}, outcomeUnknown: true},
			{name: "503", fault: time4vpstest.Fault{Status: 503, RetryAfter: "0"}, outcomeUnknown: true},
			{name: "429", fault: time4vpstest.Fault{Status: 429, RetryAfter: "0"}},
			{name: "dropped before handling", fault: time4vpstest.Fault{Drop: time4vpstest.DropBeforeHandling}, outcomeUnknown: true},
			{name: "dropped after handling", fault: time4vpstest.Fault{Drop: time4vpstest.DropAfterHandling}, outcomeUnknown: true, tasks: 1},
			{
				name:           "timeout",
				fault:          time4vpstest.Fault{Delay: 10 * time.Second},
				mutate:         func(c *time4vps.Config) { c.Timeout = 300 * time.Millisecond },
				outcomeUnknown: true,
			},
		} {
			t.Run(p.name+"/"+tc.name, func(t *testing.T) {
				h := setup(t, time4vpstest.Config{}, tc.mutate)
				tc.fault.Endpoint = p.endpoint
				tc.fault.Times = 5 // would fail any retry too
				h.api.InjectFault(tc.fault)
				err := h.errNoSecret(t, p.call(h))
				if err == nil {
					t.Fatal("call succeeded, want an error")
				}
				if n := h.api.Count(p.endpoint); n != 1 {
					t.Errorf("%s sent %d times, want exactly 1", p.endpoint, n)
				}
				if got := errors.Is(err, time4vps.ErrOutcomeUnknown); got != tc.outcomeUnknown {
					t.Errorf("errors.Is(%v, ErrOutcomeUnknown) = %v, want %v", err, got, tc.outcomeUnknown)
				}
				if n := len(h.api.Tasks()); n != tc.tasks {
					t.Errorf("stand-in created %d tasks, want %d", n, tc.tasks)
				}
			})
		}
	}
}

func TestContextCancelled(t *testing.T) {
	h := setup(t, time4vpstest.Config{}, nil)
	h.api.DelayNext(time4vpstest.EndpointListServers, 1, 10*time.Second)
	// Cancelled once the API holds the request (not on a timer, which a
	// loaded machine may pass before the request is even sent).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for h.api.Count(time4vpstest.EndpointListServers) == 0 && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}()
	_, err := h.client.ListServers(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	time.Sleep(300 * time.Millisecond) // a retry would have been sent by now
	if n := h.api.Count(time4vpstest.EndpointListServers); n != 1 {
		t.Errorf("sent %d times, want 1: no retry once the context is cancelled", n)
	}
}

func TestLogsHaveRequestFields(t *testing.T) {
	t.Parallel()
	h := setup(t, time4vpstest.Config{}, func(c *time4vps.Config) { c.URL += "/" })
	if _, err := h.client.Server(context.Background(), testServerID); err != nil {
		t.Fatalf("Server: %v", err)
	}
	logs := h.logs.String()
	for _, want := range []string{`"method":"GET"`, `"path":"/api/server/101"`, `"status":200`, `"attempt":1`, `"duration":`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s:\n%s", want, logs)
		}
	}
	if strings.Contains(strings.ToLower(logs), "authorization") || strings.Contains(logs, "Basic ") {
		t.Errorf("logs mention the auth header:\n%s", logs)
	}
}
