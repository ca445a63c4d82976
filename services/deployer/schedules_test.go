package main

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/templates"
)

// scheduleWorld is a database whose job template schedules the real
// scheduler binary materializes (schedulers start with startScheduler)
// and a deployer's Launcher launches: a template of dt.Project and the
// key (templates:write and templates:launch) its schedules launch as.
type scheduleWorld struct {
	dsn       string
	db        *pgxpool.Pool
	scheduler string // the binary
	redisURL  string // the schedulers'
	key       string
	keyID     string
	template  string
}

// newScheduleWorld builds the scheduler and creates the template through
// the API of the deployer at api (host:port) on the database dsn. The
// world reads the database through a pool of its own: a deployer that
// runs out of connections does not keep the test from seeing it.
func newScheduleWorld(tb testing.TB, dsn, api string) *scheduleWorld {
	tb.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(db.Close)
	w := &scheduleWorld{dsn: dsn, db: db, redisURL: testenv.RedisDB(tb), scheduler: filepath.Join(tb.TempDir(), "scheduler")}
	if err := testenv.GoBuild(w.scheduler, "github.com/autoprovisioner/autoprovisioner/services/scheduler", false); err != nil {
		tb.Fatalf("build the scheduler: %v", err)
	}
	k, secret, err := auth.NewStore(db).Create(ctx, auth.NewKey{Name: "schedules",
		Scopes: []auth.Scope{auth.ScopeTemplatesWrite, auth.ScopeTemplatesLaunch}, Projects: []string{dt.Project}})
	if err != nil {
		tb.Fatal(err)
	}
	w.key, w.keyID = secret, k.ID
	code, body := apiCall(tb, api, w.key, "POST", "/templates", `{"name": "nightly", "job": {
		"source": {"type": "playbook", "repository": "https://git.example.com/org/playbooks.git", "ref": "v1.0.0", "paths": ["site.yml"]},
		"inventory": {"type": "inline", "hosts": {"web-1": {"ansible_host": "198.51.100.7"}}}}}`)
	if code != 201 {
		tb.Fatalf("template: %d %s", code, body)
	}
	w.template = dt.JSON[templates.Template](tb, []byte(body)).ID
	return w
}

// addSchedules stores n schedules of the template on cron (named
// prefix-0...), as the key, their next occurrence at next, and returns
// their ids. Stored as the API stores them, n at once.
func (w *scheduleWorld) addSchedules(tb testing.TB, prefix, cron string, n int, next time.Time) []string {
	tb.Helper()
	var ids []string
	err := w.db.QueryRow(context.Background(), `WITH s AS (
			INSERT INTO job_schedules (id, project_id, template_id, name, cron, next_at, api_key_id)
			SELECT gen_random_uuid(), $1, $2, $3 || '-' || i, $4, $5, $6 FROM generate_series(0, $7 - 1) i
			RETURNING id)
		SELECT array_agg(id::text) FROM s`, dt.Project, w.template, prefix, cron, next, w.keyID, n).Scan(&ids)
	if err != nil {
		tb.Fatal(err)
	}
	return ids
}

// startScheduler starts a scheduler replica on the world's database with
// extra settings and waits until it is ready; it returns the process and
// its admin address.
func (w *scheduleWorld) startScheduler(tb testing.TB, extra ...string) (*testenv.Process, string) {
	tb.Helper()
	admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(tb))
	env := append([]string{"DATABASE_URL=" + w.dsn, "REDIS_URL=" + w.redisURL, "ADMIN_ADDR=" + admin, "LOG_FORMAT=json",
		"HEALTH_ENABLED=false", "SHUTDOWN_GRACE=5s"}, extra...)
	p := testenv.StartBinary(tb, w.scheduler, testenv.BinaryEnv(env...))
	p.WaitHTTP("http://"+admin+"/readyz", 200, time.Minute)
	return p, admin
}
