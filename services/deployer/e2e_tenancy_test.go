package main

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// tenantAttack is the setting of tenantAttacks: the API as A's and B's
// keys, and the request bodies.
type tenantAttack struct {
	callA, callB func(method, path, body string) (int, string)
	conn         *pgx.Conn
	redisURL     string
	// forB is a request of project B to A's server with B's references;
	// bRefsInA is A's request naming B's references; bElsewhere is B's
	// own request to an address infra refuses (no packet leaves).
	forB, bRefsInA, bElsewhere string
}

// tenantAttacks runs A's attempts on B's secrets and deployments against
// the real deployer and infra (issue 19), before any deployment exists, and
// returns what A's reads of B's deployment answered.
func tenantAttacks(t *testing.T, a tenantAttack) string {
	t.Helper()
	ctx := context.Background()
	opts, err := redis.ParseURL(a.redisURL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	nothingStored := func(what string) {
		t.Helper()
		var n int
		if err := a.conn.QueryRow(ctx, `SELECT count(*) FROM deployments`).Scan(&n); err != nil || n != 0 {
			t.Errorf("%s: %d deployments stored (%v)", what, n, err)
		}
		if l, err := rdb.XLen(ctx, messages.StreamAnsibleDeployQueue).Result(); err != nil || l != 0 {
			t.Errorf("%s: %d requests published (%v)", what, l, err)
		}
	}
	type problem struct {
		Errors []struct{ Field string } `json:"errors"`
	}
	fieldOf := func(body string) string { // the fields named, comma-separated
		var p problem
		_ = json.Unmarshal([]byte(body), &p)
		var f []string
		for _, e := range p.Errors {
			f = append(f, e.Field)
		}
		return strings.Join(f, ",")
	}

	// A's key, B's project, B's secrets, A's server: refused before
	// anything is stored or published.
	if code, body := a.callA("POST", "/deployments", a.forB); code != 403 || fieldOf(body) != "project_id" {
		t.Errorf("A submits for B: %d %s, want 403 naming project_id", code, body)
	}
	nothingStored("A submits for B")
	// A's own project naming B's secret: refused by the templates at
	// submit (infra would refuse it too, but it must not get there).
	if code, body := a.callA("POST", "/deployments", a.bRefsInA); code != 422 || fieldOf(body) != "github_token_ref,secrets_ref" {
		t.Errorf("A names B's secrets: %d %s, want 422 naming the reference", code, body)
	}
	nothingStored("A names B's secrets")

	// B's own deployment, elsewhere: A cannot see it through any route.
	code, body := a.callB("POST", "/deployments", a.bElsewhere)
	var dB struct{ ID string }
	if err := json.Unmarshal([]byte(body), &dB); code != 202 || err != nil || dB.ID == "" {
		t.Fatalf("B's deployment: %d %s", code, body)
	}
	testenv.WaitFor(t, 2*time.Minute, "B's deployment to end", func() bool {
		_, body := a.callB("GET", "/deployments/"+dB.ID, "")
		return !strings.Contains(body, `"status":"queued"`) && !strings.Contains(body, `"status":"running"`)
	})
	var read strings.Builder
	const unknown = "01a20000-0000-7000-8000-000000000000"
	for _, r := range []struct{ method, suffix string }{
		{"GET", ""}, {"GET", "/events"}, {"GET", "/log"}, {"GET", "/webhooks"}, {"DELETE", ""},
	} {
		code, body := a.callA(r.method, "/deployments/"+dB.ID+r.suffix, "")
		ucode, ubody := a.callA(r.method, "/deployments/"+unknown+r.suffix, "")
		read.WriteString(body)
		if code != 404 || ucode != 404 || detail(body) != detail(ubody) {
			t.Errorf("A: %s B's deployment%s: %d %s; an unknown one: %d %s", r.method, r.suffix, code, body, ucode, ubody)
		}
	}
	_, list := a.callA("GET", "/deployments?limit=100", "")
	read.WriteString(list)
	if strings.Contains(list, dB.ID) {
		t.Errorf("A's list shows B's deployment: %s", list)
	}
	if code, body := a.callB("GET", "/deployments/"+dB.ID+"/log", ""); code != 200 && code != 404 {
		t.Errorf("B reads its own log: %d %s", code, body)
	}
	return read.String()
}

// detail is a problem's type and detail: what two 404s must share.
func detail(body string) string {
	var p struct{ Type, Title, Detail string }
	_ = json.Unmarshal([]byte(body), &p)
	return p.Type + "|" + p.Title + "|" + p.Detail
}

// targetFiles returns the contents of the regular files under the given
// directories of a target's root.
func targetFiles(t *testing.T, root string, dirs ...string) string {
	t.Helper()
	var all strings.Builder
	for _, d := range dirs {
		_ = filepath.WalkDir(filepath.Join(root, d), func(path string, e fs.DirEntry, err error) error {
			if err != nil || !e.Type().IsRegular() {
				return nil
			}
			if info, err := e.Info(); err != nil || info.Size() > 1<<20 {
				return nil
			}
			if b, err := os.ReadFile(path); err == nil {
				all.Write(b)
			}
			return nil
		})
	}
	return all.String()
}
