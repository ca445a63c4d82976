package publishing

import (
	"context"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// queueEntries returns the queue's entry ids by the data they carry.
func queueEntries(t *testing.T, rdb *redis.Client, queue string) map[string]string {
	t.Helper()
	entries, err := rdb.XRange(context.Background(), queue, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	byData := map[string]string{}
	for _, e := range entries {
		data, _ := e.Values[stream.DataField].(string)
		if _, dup := byData[data]; dup {
			t.Errorf("%q published twice", data)
		}
		byData[data] = e.ID
	}
	return byData
}

// TestCommitGroups stores and publishes submits in groups against real
// Postgres and Redis: a group with a row Postgres refuses (an API key that
// does not exist) stores every other row and fails only that submit; every
// stored deployment is on the queue once and shows its own entry id as its
// request id, marked published by its group's one row (the deployments'
// rows are not updated); concurrent submits all end stored, published once
// and marked.
func TestCommitGroups(t *testing.T) {
	t.Parallel()
	s, db, rdb, streams := newTestService(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.marker.run(ctx) }()

	item := func(keyID string) *commitItem {
		row := testRow(s, keyID, 0)
		return &commitItem{row: row, data: []byte("request " + row.ID), done: make(chan struct{})}
	}
	stored := func(id string) bool {
		var n int
		if err := db.QueryRow(context.Background(), `SELECT count(*) FROM deployments WHERE id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}

	// One group, one bad row in the middle.
	group := []*commitItem{item(""), item(""), item(uuid.NewString()), item(""), item("")}
	gctx, gcancel := context.WithTimeout(context.Background(), commitTimeout)
	s.committer.store(gctx, group)
	s.committer.publish(gctx, group)
	gcancel()
	for i, it := range group {
		<-it.done
		bad := i == 2
		if (it.err != nil) != bad || stored(it.row.ID) == bad {
			t.Errorf("item %d (bad %v): err %v, stored %v", i, bad, it.err, stored(it.row.ID))
		}
	}
	if n, _ := rdb.XLen(ctx, streams.Queue).Result(); n != 4 {
		t.Errorf("%d entries on the queue, want 4", n)
	}

	// Concurrent submits through commit.
	const submits = 200
	items := make([]*commitItem, submits)
	var wg sync.WaitGroup
	for i := range items {
		items[i] = item("")
		wg.Go(func() {
			if err := s.committer.commit(items[i]); err != nil {
				t.Errorf("commit: %v", err)
			}
		})
	}
	wg.Wait()
	cancel()
	<-done // the marker wrote what was left
	entries := queueEntries(t, rdb, streams.Queue)
	if len(entries) != 4+submits {
		t.Errorf("%d entries on the queue, want %d", len(entries), 4+submits)
	}
	for _, it := range append(slices.Delete(group, 2, 3), items...) {
		d, err := s.Get(context.Background(), it.row.ID)
		if err != nil {
			t.Fatal(err)
		}
		if want := entries[string(it.data)]; d.RequestID != want || want == "" || d.PublishedAt() == nil {
			t.Errorf("deployment %s: request id %q, published at %v; want entry %q", d.ID, d.RequestID, d.PublishedAt(), want)
		}
	}
	var rowMarks, groups int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE published_at IS NOT NULL OR request_id IS NOT NULL),
		(SELECT count(*) FROM deployment_publish_groups) FROM deployments`).Scan(&rowMarks, &groups); err != nil {
		t.Fatal(err)
	}
	if rowMarks != 0 || groups == 0 || groups > 1+submits {
		t.Errorf("%d deployments rows marked, %d group marks; want 0 rows and one mark per group", rowMarks, groups)
	}
	// One inserter: the submits that arrive while a group is being stored
	// wait for the next group, so 200 at once make a few groups, not 200.
	if groups-1 > submits/4 {
		t.Errorf("%d concurrent submits were stored in %d groups; want far fewer groups", submits, groups-1)
	}
	s.committer.mu.Lock()
	defer s.committer.mu.Unlock()
	if s.committer.running || len(s.committer.queue) != 0 || len(s.committer.publishing) != 0 {
		t.Errorf("committer left: inserter running %v, %d queued, %d groups publishing",
			s.committer.running, len(s.committer.queue), len(s.committer.publishing))
	}
}

// TestGroupInsertStoresWhatSingleInsertStores: a deployment stored by the
// multi-row INSERT of a group reads back exactly as one stored on its own
// (NULLs for empty fields, modules nil, empty or listed, timeouts, refs).
func TestGroupInsertStoresWhatSingleInsertStores(t *testing.T) {
	t.Parallel()
	s, db, _, _ := newTestService(t)
	ctx := context.Background()
	full := testRow(s, "", 0)
	full.Modules, full.GitHubTokenRef, full.SecretsRef = []string{"app", "nginx"}, "env:GH_TOKEN", "vault:secret/data/shop"
	full.CorrelationID, full.TimeoutSeconds, full.CallbackURL = "ci-42", 600, "https://hooks.example.org/x?token=t"
	empty := testRow(s, "", 0)
	empty.Modules = []string{}
	rows := []*deployments.Row{testRow(s, "", 0), full, empty}

	if err := deployments.InsertGroup(ctx, db, rows[0].ID, rows); err != nil {
		t.Fatal(err)
	}
	columns := `SELECT source, status, api_key_id, project_id, repo_full_name, branch, server_ip, port, modules,
		github_token_ref, secrets_ref, correlation_id, timeout_seconds, callback_url, created_at, job_id = id::text
		FROM deployments WHERE id = $1`
	for i, r := range rows {
		single := *r
		single.ID = uuid.Must(uuid.NewV7()).String()
		if err := deployments.InsertRow(ctx, db, &single, "", 0); err != nil {
			t.Fatal(err)
		}
		var a, b [16]any
		pa, pb := make([]any, 16), make([]any, 16)
		for j := range a {
			pa[j], pb[j] = &a[j], &b[j]
		}
		if err := db.QueryRow(ctx, columns, r.ID).Scan(pa...); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow(ctx, columns, single.ID).Scan(pb...); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Errorf("row %d stored by the group: %v\nstored on its own: %v", i, a, b)
		}
		var group string
		var pos int
		if err := db.QueryRow(ctx, `SELECT publish_group::text, publish_pos FROM deployments WHERE id = $1`, r.ID).Scan(&group, &pos); err != nil {
			t.Fatal(err)
		}
		if group != rows[0].ID || pos != i+1 {
			t.Errorf("row %d: group %s position %d; want %s, %d", i, group, pos, rows[0].ID, i+1)
		}
	}
}

// TestSubmitFailedCommitIsNotAccepted: when the group cannot be stored,
// Submit returns the error (the API answers 500, never 202) and nothing is
// published.
func TestSubmitFailedCommitIsNotAccepted(t *testing.T) {
	t.Parallel()
	s, db, rdb, streams := newTestService(t)
	db.Close() // every statement now fails
	r := deployments.Request{ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "acme/shop", ServerIP: "198.51.100.7", Port: 22}
	var wg sync.WaitGroup
	for range 20 { // concurrent: they fail as groups, and each submit on its own
		wg.Go(func() {
			sub, err := s.Submit(context.Background(), "", deployments.AllProjects, r, "")
			if err == nil || sub != nil {
				t.Errorf("submit with the database gone: %+v, %v; want an error", sub, err)
			}
		})
	}
	wg.Wait()
	if n, _ := rdb.XLen(context.Background(), streams.Queue).Result(); n != 0 {
		t.Errorf("%d entries published for submits that were not stored", n)
	}
}
