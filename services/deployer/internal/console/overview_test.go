package console_test

import (
	"context"
	"strings"
	"testing"

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

	// The fleet list says why and how often: attempts and the last error,
	// cut short with the whole in its title.
	_, page = b.get("/ui/fleet?status=FAILED")
	for _, want := range []string{`<th>Attempts</th>`, `<td data-label="Attempts" class="num">3</td>`,
		`title="setup_server.yml: failed on bad-1 in task &#34;Install docker&#34;: xxx`, `xxx…</span>`} {
		if !strings.Contains(page, want) {
			t.Errorf("the fleet list lacks %s:\n%s", want, page)
		}
	}
}
