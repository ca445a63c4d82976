package console_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
)

// TestOverviewNeedsAttention: the overview lists first what is in
// trouble, each a link to where to look; with nothing, it says so.
func TestOverviewNeedsAttention(t *testing.T) {
	t.Parallel()
	e := deployertest.Start(t, deployertest.Options{NoInfra: true})
	b := newBrowser(t, e.URL)
	b.signIn(e.Admin)
	if _, page := b.get("/ui/"); !strings.Contains(page, `id="all-well"`) {
		t.Errorf("an empty fleet's overview does not say all is well:\n%s", page)
	}
	if _, err := e.DB.Exec(context.Background(), `INSERT INTO servers (handle, address, source, status, attempts, last_error)
		VALUES ('bad-1', '192.0.2.20', 'manual', 'FAILED', 3, 'setup_server.yml: failed on bad-1 in task "Install docker": '
		           || repeat('x', 100)),
		       ('bad-2', '192.0.2.21', 'manual', 'FAILED', 1, NULL),
		       ('gone-1', '192.0.2.22', 'manual', 'UNREACHABLE', 0, NULL), ('ok-1', '192.0.2.23', 'manual', 'READY', 0, NULL)`); err != nil {
		t.Fatal(err)
	}
	_, page := b.get("/ui/")
	attention := page[strings.Index(page, `id="attention"`):]
	attention = attention[:strings.Index(attention, "</section>")]
	for _, want := range []string{`<a href="/ui/fleet?status=FAILED">2 servers FAILED</a>`,
		`<a href="/ui/fleet?status=UNREACHABLE">1 server UNREACHABLE</a>`} {
		if !strings.Contains(attention, want) {
			t.Errorf("needs attention lacks %s:\n%s", want, attention)
		}
	}
	if strings.Contains(attention, "READY") || strings.Contains(attention, `id="all-well"`) {
		t.Errorf("needs attention lists what is well:\n%s", attention)
	}
	if strings.Index(page, `id="attention"`) > strings.Index(page, `id="server-counts"`) {
		t.Error("needs attention is not first on the overview")
	}
	// Each status card shows its status in the status's colour.
	for _, want := range []string{`<span class="n">2</span><span class="badge st-FAILED">FAILED</span>`,
		`<span class="n">1</span><span class="badge st-UNREACHABLE">UNREACHABLE</span>`} {
		if !strings.Contains(page, want) {
			t.Errorf("the status cards lack %s", want)
		}
	}

	// The fleet list says why and how often: attempts and the last error,
	// cut short with the whole in its title.
	_, page = b.get("/ui/fleet?status=FAILED")
	for _, want := range []string{`id="sort-attempts">Attempts</a></th>`, `<td data-label="Attempts" class="num">3</td>`,
		`title="setup_server.yml: failed on bad-1 in task &#34;Install docker&#34;: xxx`, `xxx…</span>`} {
		if !strings.Contains(page, want) {
			t.Errorf("the fleet list lacks %s:\n%s", want, page)
		}
	}

	// Sorted for triage: most attempts first, the filter kept by the
	// headers' links; the page says which order it is in.
	_, page = b.get("/ui/fleet?sort=attempts")
	if i, j, k := strings.Index(page, `href="/ui/fleet/bad-1"`), strings.Index(page, `href="/ui/fleet/bad-2"`), strings.Index(page, `href="/ui/fleet/ok-1"`); i < 0 || j < i || k < j {
		t.Errorf("by attempts: bad-1 (3), bad-2 (1), then ok-1 (0); positions %d %d %d", i, j, k)
	}
	if !strings.Contains(page, `aria-sort="descending"><a href="/ui/fleet?sort=attempts" id="sort-attempts"`) {
		t.Errorf("the attempts header does not say it orders the list:\n%s", page)
	}
	if _, page = b.get("/ui/fleet?status=FAILED&sort=handle"); !strings.Contains(page, `href="/ui/fleet?sort=changed&amp;status=FAILED" id="sort-changed"`) {
		t.Errorf("a sort link drops the filter:\n%s", page)
	}
	if res, page := b.get("/ui/fleet?sort=bogus"); res.StatusCode != http.StatusOK || !strings.Contains(page, "must be one of handle, status, attempts, changed") {
		t.Errorf("an unknown order: %d, want the API's refusal shown\n%s", res.StatusCode, page)
	}
}

// TestFleetBulkActions: servers picked in the fleet list are paused at
// once after one confirmation naming them all; a server the API refuses is
// named with its reason; a key that may not write the fleet gets no such
// form.
func TestFleetBulkActions(t *testing.T) {
	t.Parallel()
	e := deployertest.Start(t, deployertest.Options{NoInfra: true})
	if _, err := e.DB.Exec(context.Background(), `INSERT INTO servers (handle, address, source, status)
		VALUES ('bulk-1', '192.0.2.31', 'manual', 'READY'), ('bulk-2', '192.0.2.32', 'manual', 'FAILED'),
		       ('bulk-3', '192.0.2.33', 'manual', 'READY')`); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, e.URL)
	csrf := b.signIn(e.Admin)
	if _, page := b.get("/ui/fleet"); !strings.Contains(page, `id="bulk"`) || !strings.Contains(page, `value="bulk-2" form="bulk"`) {
		t.Fatalf("no bulk form for an operator:\n%s", page)
	}
	pick := url.Values{"csrf": {csrf}, "op": {"pause"}, "reason": {"maintenance"}, "handle": {"bulk-2", "bulk-1", "no-such-1"}}
	res, page := b.post("/ui/fleet/bulk", pick)
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `id="confirm-bulk"`) || !strings.Contains(page, "bulk-1, bulk-2, no-such-1") ||
		!strings.Contains(page, `value="maintenance"`) {
		t.Fatalf("bulk pause without one confirmation naming the servers: %d\n%s", res.StatusCode, page)
	}
	if paused := pausedServers(t, e); len(paused) != 0 {
		t.Fatalf("servers paused before the confirmation: %v", paused)
	}
	res, _ = b.post("/ui/fleet/bulk", url.Values{"csrf": {csrf}, "op": {"pause"}, "reason": {"maintenance"},
		"handles": {"bulk-1,bulk-2,no-such-1"}, "confirm": {"yes"}})
	done, _ := url.QueryUnescape(res.Header.Get("Location"))
	if res.StatusCode != http.StatusSeeOther || !strings.Contains(done, "pause requested for 2 of 3 servers") || !strings.Contains(done, "refused: no-such-1") {
		t.Fatalf("bulk pause: %d %s", res.StatusCode, done)
	}
	if paused := pausedServers(t, e); strings.Join(paused, " ") != "bulk-1 bulk-2" {
		t.Errorf("paused servers %v, want bulk-1 and bulk-2", paused)
	}
	if _, page := b.get(res.Header.Get("Location")); !strings.Contains(page, `id="bulk-done"`) {
		t.Errorf("the fleet does not say what the bulk action did:\n%s", page)
	}

	reader := newBrowser(t, e.URL)
	rcsrf := reader.signIn(e.Key("fleet-reader", []auth.Scope{auth.ScopeServersRead}))
	if _, page := reader.get("/ui/fleet"); strings.Contains(page, `id="bulk"`) {
		t.Errorf("a key without servers:write gets the bulk form")
	}
	res, _ = reader.post("/ui/fleet/bulk", url.Values{"csrf": {rcsrf}, "op": {"resume"}, "handles": {"bulk-1"}, "confirm": {"yes"}})
	if done, _ := url.QueryUnescape(res.Header.Get("Location")); !strings.Contains(done, "resume requested for 0 of 1 servers") {
		t.Errorf("a key without servers:write resumed a server: %s", done)
	}
	if paused := pausedServers(t, e); len(paused) != 2 {
		t.Errorf("paused servers %v after a refused resume", paused)
	}
}

// pausedServers are the handles of the paused servers, sorted.
func pausedServers(t *testing.T, e *deployertest.Env) []string {
	t.Helper()
	rows, err := e.DB.Query(context.Background(), `SELECT handle FROM servers WHERE paused ORDER BY handle`)
	if err != nil {
		t.Fatal(err)
	}
	handles, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return handles
}
