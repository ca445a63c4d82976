package console_test

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
)

// TestProvisionRunLiveOutputAndLog follows a provisioning run's events
// published on its stream through the console, resumes after
// Last-Event-ID, shows the stored log once the run ended, and keeps all
// of it from a project-bound key.
func TestProvisionRunLiveOutputAndLog(t *testing.T) {
	ctx := context.Background()
	e := deployertest.Start(t, deployertest.Options{NoInfra: true})
	id := fmt.Sprintf("prov-live-%d", time.Now().UnixNano()) // streams outlive a test's Redis DB
	if _, err := e.DB.Exec(ctx, `INSERT INTO runs (job_id, kind, stream, request_id, target, state)
		VALUES ($1, 'provision', 'provisioner:queue', '1-0', 'server:web-1', 'running')`, id); err != nil {
		t.Fatal(err)
	}
	publish := func(seq int64, typ messages.EventType) {
		t.Helper()
		ev := &messages.ProgressEvent{JobID: id, Seq: seq, Time: messages.FormatTime(time.Now()), Type: typ,
			Message: fmt.Sprintf("step %d", seq)}
		if typ == messages.EventRunFinished {
			ev.Status = messages.StatusSucceeded
		}
		data, err := messages.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Redis.XAdd(ctx, &redis.XAddArgs{Stream: messages.ProgressStream(messages.JobKindProvision, id),
			Values: map[string]any{messages.DataField: data}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	b := newBrowser(t, e.URL)
	b.signIn(e.Admin)
	res, page := b.get("/ui/runs/provision/" + id)
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `data-events="/ui/runs/provision/`+id+`/events"`) {
		t.Fatalf("running provisioning page without live output: %d\n%s", res.StatusCode, page)
	}

	publish(1, messages.EventRunStarted)
	publish(2, messages.EventTaskStarted)
	publish(3, messages.EventRunFinished)
	events := func(last string) (int, string) { return b.events("/ui/runs/provision/"+id+"/events", last) }
	status, all := events("")
	if status != http.StatusOK || !strings.Contains(all, "event: run_started") || !strings.Contains(all, "event: run_finished") {
		t.Fatalf("events: %d\n%s", status, all)
	}
	ids := regexp.MustCompile(`(?m)^id: (\S+)$`).FindAllStringSubmatch(all, -1)
	if len(ids) != 3 {
		t.Fatalf("want 3 events with ids:\n%s", all)
	}
	status, rest := events(ids[0][1])
	if status != http.StatusOK || strings.Contains(rest, "id: "+ids[0][1]+"\n") || !strings.Contains(rest, "id: "+ids[1][1]+"\n") {
		t.Fatalf("resume after %s: %d\n%s", ids[0][1], status, rest)
	}
	// infra records the end as the run_finished goes out, with the result
	// and its recap per host (the page showing it answered 500 once).
	result := &messages.ProvisionerResult{Outcome: messages.Outcome{JobID: id, RequestID: "1-0", Status: messages.StatusSucceeded,
		Hosts: map[string]messages.HostRecap{"web-1": {Ok: 17, Changed: 4, Skipped: 3}}}}
	encoded, err := messages.Encode(result)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.DB.Exec(ctx, `UPDATE runs SET state = 'done', status = 'succeeded', finished_at = now(), result = $2
		WHERE job_id = $1`, id, encoded); err != nil {
		t.Fatal(err)
	}
	if status, body := events(ids[2][1]); status != http.StatusNoContent {
		t.Fatalf("resume after the end: %d, want 204\n%s", status, body)
	}

	// The run ended, its log stored: the page shows it.
	if _, err := e.Parts.Logs.Put(ctx, id, strings.NewReader("TASK [base : users] ok\n")); err != nil {
		t.Fatal(err)
	}
	if res, page := b.get("/ui/runs/provision/" + id); res.StatusCode != http.StatusOK || !strings.Contains(page, `id="full-log"`) ||
		!strings.Contains(page, "TASK [base : users] ok") {
		t.Fatalf("ended provisioning page without its log: %d\n%s", res.StatusCode, page)
	} else if !regexp.MustCompile(`web-1</td><td data-label="ok" class="num">17</td><td data-label="changed" class="num">4</td>`).MatchString(page) {
		t.Errorf("ended provisioning page without the recap per host (web-1: ok 17, changed 4):\n%s", page)
	}
	if res, body := b.get("/ui/runs/provision/" + id + "/log"); res.StatusCode != http.StatusOK || body != "TASK [base : users] ok\n" {
		t.Fatalf("log download: %d %q", res.StatusCode, body)
	}

	// A project-bound key (it cannot hold servers:read) sees none of it.
	other := e.Key("project", []auth.Scope{auth.ScopeDeploymentsRead}, "22222222-3333-4444-5555-666666666666")
	ob := newBrowser(t, e.URL)
	ob.signIn(other)
	for _, path := range []string{"", "/events", "/log"} {
		if status, _ := ob.events("/ui/runs/provision/"+id+path, ""); status != http.StatusForbidden && status != http.StatusNotFound {
			t.Errorf("project-bound key on %q: %d, want 403 or 404", path, status)
		}
	}
}
