package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/notify/notifytest"
)

// TestSlackSecretFileAndFailingChannel walks an operator's path with the
// real binary: the webhook URL is a file written with `echo URL > file`
// (trailing newline); --check-secrets passes it and refuses a URL that
// is not one, naming the variable and never the value; a notification is
// delivered; then Slack answers 500 and /readyz shows the channel
// degraded (the scheduler stays ready) and /metrics its streak.
func TestSlackSecretFileAndFailingChannel(t *testing.T) {
	t.Parallel()
	slack := notifytest.NewSlack("/services/T1/B1/canarySecretPart")
	hs := httptest.NewServer(slack)
	t.Cleanup(hs.Close)
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "slack.url"), []byte(hs.URL+slack.Path+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := schedulerBinary(t)
	w := newWorld(t, bin, "RETRY_LIMIT=1", "SECRETS_FILE_ROOT="+root, "SLACK_WEBHOOK_URL_REF=file:slack.url")

	results := func(env ...string) ([]service.SecretResult, string, int) {
		t.Helper()
		stdout, stderr, code := testenv.RunBinary(t, bin, testenv.BinaryEnv(append(append([]string{}, w.env...), env...)...), "--check-secrets")
		var out []service.SecretResult
		for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
			if !strings.HasPrefix(line, "{") { // "scheduler: configuration valid"
				continue
			}
			var r service.SecretResult
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("--check-secrets line %q: %v (stderr %s)", line, err, stderr)
			}
			out = append(out, r)
		}
		return out, stdout + stderr, code
	}
	if res, out, code := results(); code != 0 || len(res) != 1 || !res[0].OK || res[0].Source != "SLACK_WEBHOOK_URL_REF" {
		t.Fatalf("--check-secrets of the file with a newline: %d %+v\n%s", code, res, out)
	}
	for _, bad := range []string{"hooks.example/canarySecretPart", hs.URL + "/canary SecretPart"} {
		res, out, code := results("SLACK_WEBHOOK_URL_REF=env:AUTOPROV_SECRET_SLACK", "AUTOPROV_SECRET_SLACK="+bad)
		if code != 1 || len(res) != 1 || res[0].OK || res[0].Source != "SLACK_WEBHOOK_URL_REF" || res[0].Kind != "unusable" {
			t.Errorf("--check-secrets of %q: %d %+v", bad, code, res)
		}
		if strings.Contains(out, "canary") {
			t.Errorf("--check-secrets quotes the value:\n%s", out)
		}
	}

	admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	p := testenv.StartBinary(t, bin, testenv.BinaryEnv(append([]string{"ADMIN_ADDR=" + admin}, w.env...)...))
	p.WaitHTTP("http://"+admin+"/readyz", 200, time.Minute)
	ready := w.addServers("ok", 1)
	w.waitStatus(ready, fleet.StatusProvisioning, time.Minute)
	w.answer(ready, messages.StatusSucceeded, "")
	testenv.WaitFor(t, time.Minute, "the notification", func() bool { return len(slack.Messages()) == 1 })
	if strings.Contains(p.Stderr(), "invalid control character") {
		t.Errorf("the URL kept its newline:\n%s", p.Stderr())
	}

	slack.FailNext(1_000_000, 500)
	bad := w.addServers("bad", 1)
	w.waitStatus(bad, fleet.StatusProvisioning, time.Minute)
	w.answer(bad, messages.StatusFailed, "task Install packages failed")
	var body service.Readiness
	testenv.WaitFor(t, time.Minute, "the channel reported degraded", func() bool {
		code, b := get(t, "http://"+admin+"/readyz")
		body = service.Readiness{}
		_ = json.Unmarshal([]byte(b), &body)
		return code == http.StatusOK && len(body.Degraded) == 1
	})
	c := body.Checks["notify:slack"]
	if body.Status != "ready" || body.Degraded[0] != "notify:slack" || c.OK || !c.Advisory || !strings.Contains(c.Error, "status 500") {
		t.Errorf("readyz: %+v", body)
	}
	if strings.Contains(c.Error, "canarySecretPart") {
		t.Errorf("readyz names the webhook URL: %s", c.Error)
	}
	_, metrics := get(t, "http://"+admin+"/metrics")
	if !strings.Contains(metrics, `autoprov_scheduler_notify_consecutive_failures{channel="slack"} 3`) &&
		!strings.Contains(metrics, `autoprov_scheduler_notify_consecutive_failures{channel="slack"} 4`) {
		t.Errorf("metrics lack the failure streak:\n%s", grepLines(metrics, "autoprov_scheduler_notify_"))
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
