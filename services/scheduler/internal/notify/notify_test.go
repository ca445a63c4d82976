package notify_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/notify"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/notify/notifytest"
)

const (
	slackPath = "/services/T000/B000/s3cretWebhookPart"
	tgToken   = "123456:AAF-s3cretBotToken"
)

type env struct {
	fleet *fleet.Store
	db    *pgxpool.Pool
	slack *notifytest.Slack
	tg    *notifytest.Telegram
	sURL  string
	tURL  string
	logs  *bytes.Buffer
	mu    sync.Mutex
}

func setup(t *testing.T) *env {
	t.Helper()
	db := testenv.Pool(t)
	e := &env{fleet: fleet.New(db, fleet.Options{}), db: db, slack: notifytest.NewSlack(slackPath),
		tg: notifytest.NewTelegram(tgToken, "4242"), logs: &bytes.Buffer{}}
	ss := httptest.NewServer(e.slack)
	ts := httptest.NewServer(e.tg)
	t.Cleanup(ss.Close)
	t.Cleanup(ts.Close)
	e.sURL, e.tURL = ss.URL, ts.URL
	return e
}

func (e *env) logger() zerolog.Logger {
	return zerolog.New(zerolog.SyncWriter(lockedWriter{e})).With().Timestamp().Logger()
}

type lockedWriter struct{ e *env }

// logText is what was logged so far (the dispatchers may still be logging).
func (e *env) logText() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.logs.String()
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.e.mu.Lock()
	defer w.e.mu.Unlock()
	return w.e.logs.Write(p)
}

func (e *env) slackCh() *notify.Slack {
	return notify.NewSlack(secrets.ValueFromString(e.sURL+slackPath), secrets.NewRedactor(), 5*time.Second)
}

func (e *env) tgCh(token string) *notify.Telegram {
	return notify.NewTelegram(e.tURL, secrets.ValueFromString(token), "4242", secrets.NewRedactor(), 5*time.Second)
}

// change makes n servers reach status, each writing one notification.
func (e *env) change(t *testing.T, prefix, status string, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		h := fmt.Sprintf("%s-%03d", prefix, i)
		if _, err := e.db.Exec(ctx, `INSERT INTO servers (handle, address) VALUES ($1, '192.0.2.1') ON CONFLICT DO NOTHING`, h); err != nil {
			t.Fatal(err)
		}
		if _, err := e.fleet.Transition(ctx, fleet.TransitionRequest{Handle: h, To: status, Actor: "test", Error: errFor(status), JobID: "job-" + h}); err != nil {
			t.Fatal(err)
		}
	}
}

func errFor(status string) string {
	if status == fleet.StatusReady {
		return ""
	}
	return "ssh: connection refused"
}

func run(t *testing.T, d *notify.Dispatcher) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	return func() { cancel(); <-done }
}

func TestSlackSingleMessagesAndDigest(t *testing.T) {
	t.Parallel()
	e := setup(t)
	d := notify.NewDispatcher(e.fleet, e.slackCh(), notify.Config{Poll: 50 * time.Millisecond, Logger: e.logger(),
		Hints: notify.Hints{UnreachableCooldown: 10 * time.Minute}})
	if err := e.fleet.EnsureChannel(context.Background(), "slack"); err != nil {
		t.Fatal(err)
	}
	stop := run(t, d)
	defer stop()
	e.change(t, "ok", fleet.StatusReady, 1)
	e.change(t, "down", fleet.StatusUnreachable, 1)
	testenv.WaitFor(t, 30*time.Second, "two messages", func() bool { return len(e.slack.Messages()) == 2 })
	msgs := e.slack.Messages()
	if !strings.Contains(msgs[0].Text, "ok-000 is READY") || !strings.Contains(msgs[0].Text, "job-ok-000") {
		t.Errorf("ready text: %q", msgs[0].Text)
	}
	if !strings.Contains(msgs[1].Text, "down-000 is UNREACHABLE") || !strings.Contains(msgs[1].Text, "connection refused") ||
		!strings.Contains(msgs[1].Text, "Next: check that the machine runs") || !strings.Contains(msgs[1].Text, "every 10m0s") {
		t.Errorf("unreachable text: %q", msgs[1].Text)
	}
	if gap := msgs[1].At.Sub(msgs[0].At); gap < 900*time.Millisecond {
		t.Errorf("two messages %v apart: faster than Slack's one a second", gap)
	}

	// 500 servers failing at once: one digest, not 500 messages.
	stop()
	e.change(t, "bad", fleet.StatusUnreachable, 500)
	stop2 := run(t, d)
	defer stop2()
	testenv.WaitFor(t, 30*time.Second, "the digest", func() bool { return len(e.slack.Messages()) == 3 })
	digest := e.slack.Messages()[2].Text
	if !strings.HasPrefix(digest, "500 servers changed state: 500 UNREACHABLE") || !strings.Contains(digest, "and 490 more") ||
		!strings.Contains(digest, "servers list --status FAILED,UNREACHABLE") {
		t.Errorf("digest: %q", digest)
	}
	testenv.WaitFor(t, 10*time.Second, "the digest's delivery recorded", func() bool {
		n, err := e.fleet.PendingNotifications(context.Background(), "slack")
		return err == nil && n == 0
	})
	if n := len(e.slack.Messages()); n != 3 {
		t.Errorf("%d messages, want 3", n)
	}
	if r := e.slack.Rejected(); len(r) != 0 {
		t.Errorf("the receiver refused requests: %v", r)
	}
}

func TestRetriesRateLimitsAndNoRepeatAfterRestart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ch := e.slackCh()
	d := notify.NewDispatcher(e.fleet, ch, notify.Config{Poll: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Logger: e.logger()})
	if err := e.fleet.EnsureChannel(context.Background(), ch.Name()); err != nil {
		t.Fatal(err)
	}
	e.change(t, "a", fleet.StatusReady, 3)
	// Slack is down for three attempts, then rate-limits once.
	e.slack.FailNext(3, 500)
	stop := run(t, d)
	testenv.WaitFor(t, 30*time.Second, "the first message", func() bool { return len(e.slack.Messages()) >= 1 })
	stop() // a restart in the middle
	d2 := notify.NewDispatcher(e.fleet, e.slackCh(), notify.Config{Poll: 50 * time.Millisecond, Logger: e.logger()})
	stop = run(t, d2)
	defer stop()
	testenv.WaitFor(t, 30*time.Second, "all three", func() bool {
		n, _ := e.fleet.PendingNotifications(context.Background(), "slack")
		return n == 0
	})
	seen := map[string]int{}
	for _, m := range e.slack.Messages() {
		for _, h := range []string{"a-000", "a-001", "a-002"} {
			if strings.Contains(m.Text, h) {
				seen[h]++
			}
		}
	}
	for _, h := range []string{"a-000", "a-001", "a-002"} {
		if seen[h] != 1 {
			t.Errorf("%s notified %d times, want exactly once", h, seen[h])
		}
	}
	if !strings.Contains(e.logText(), "notification not delivered: retrying") {
		t.Error("the failures were not logged")
	}
	if strings.Contains(e.logText(), "s3cretWebhookPart") {
		t.Error("the webhook URL (a secret) is in the logs")
	}
}

func TestTelegram(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	// A wrong token: refused, and the error does not show the token.
	err := e.tgCh("999:wrongTOKEN").Send(ctx, "hi")
	if err == nil || strings.Contains(err.Error(), "wrongTOKEN") || !strings.Contains(err.Error(), "Unauthorized") {
		t.Errorf("wrong token: %v", err)
	}
	ch := e.tgCh(tgToken)
	if ch.Name() != "telegram:4242" {
		t.Errorf("name %s", ch.Name())
	}
	if err := ch.Send(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	// Faster than one a second: 429 with retry_after, as a RetryAfterError.
	err = ch.Send(ctx, "two")
	var ra *notify.RetryAfterError
	if !asRetry(err, &ra) || ra.After != time.Second {
		t.Errorf("second message at once: %v", err)
	}
	// A long text is cut to Telegram's 4096 characters by the dispatcher.
	d := notify.NewDispatcher(e.fleet, ch, notify.Config{Poll: 50 * time.Millisecond, Logger: e.logger()})
	if err := e.fleet.EnsureChannel(ctx, ch.Name()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(ctx, `INSERT INTO servers (handle, address) VALUES ('long', '192.0.2.1')`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.fleet.Transition(ctx, fleet.TransitionRequest{Handle: "long", To: fleet.StatusUnreachable, Actor: "t", Error: strings.Repeat("x", 5000)}); err != nil {
		t.Fatal(err)
	}
	stop := run(t, d)
	defer stop()
	testenv.WaitFor(t, 30*time.Second, "the long message", func() bool { return len(e.tg.Messages()) == 2 })
	if m := e.tg.Messages()[1]; len([]rune(m.Text)) != 4096 || m.Chat != "4242" {
		t.Errorf("long message: %d characters to %s", len([]rune(m.Text)), m.Chat)
	}
	if r := e.tg.Rejected(); len(r) != 1 || r[0] != "bad token" {
		t.Errorf("rejected: %v", r)
	}
}

func asRetry(err error, target **notify.RetryAfterError) bool {
	ra, ok := err.(*notify.RetryAfterError)
	if ok {
		*target = ra
	}
	return ok
}

// markup is text from outside (a play's or a provider's error, a job id)
// that Slack's mrkdwn would turn into a mention of everyone and a disguised
// link, and that Telegram's HTML parse mode would refuse or format.
const markup = "<!channel> <http://evil.example|click> *bold* _x_ & [a](b)"

// TestMarkupFromOutsideIsEscaped: an error and a job id holding markup
// reach Slack and Telegram escaped, exactly, in single messages and in a
// digest, while the messages' own formatting (code) stays. Server handles
// cannot hold markup (Postgres checks their pattern), but are escaped too.
func TestMarkupFromOutsideIsEscaped(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	slack, tg := e.slackCh(), e.tgCh(tgToken)
	var stops []func()
	for _, ch := range []notify.Channel{slack, tg} {
		if err := e.fleet.EnsureChannel(ctx, ch.Name()); err != nil {
			t.Fatal(err)
		}
		d := notify.NewDispatcher(e.fleet, ch, notify.Config{Poll: 50 * time.Millisecond, Logger: e.logger(),
			Hints: notify.Hints{UnreachableCooldown: 10 * time.Minute}})
		stops = append(stops, run(t, d))
	}
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	fail := func(h, jobID string) {
		t.Helper()
		if _, err := e.db.Exec(ctx, `INSERT INTO servers (handle, address) VALUES ($1, '192.0.2.1')`, h); err != nil {
			t.Fatal(err)
		}
		if _, err := e.fleet.Transition(ctx, fleet.TransitionRequest{Handle: h, To: fleet.StatusUnreachable, Actor: "t",
			Error: markup, JobID: jobID}); err != nil {
			t.Fatal(err)
		}
	}
	fail("mk-1", "job-<!here>")
	testenv.WaitFor(t, 30*time.Second, "one message on each channel", func() bool {
		return len(e.slack.Messages()) == 1 && len(e.tg.Messages()) == 1
	})
	const escaped = "&lt;!channel&gt; &lt;http://evil.example|click&gt; *bold* _x_ &amp; [a](b)"
	head := "⚠️ mk-1 is UNREACHABLE (job job-&lt;!here&gt;)\nError: " + escaped + "\n" +
		"Next: check that the machine runs and its SSH port answers; it is checked again every 10m0s "
	if got, want := e.slack.Messages()[0].Text, head+"(`scheduler servers show mk-1`)."; got != want {
		t.Errorf("slack text\n got %q\nwant %q", got, want)
	}
	m := e.tg.Messages()[0]
	if want := head + "(<code>scheduler servers show mk-1</code>)."; m.Text != want || m.ParseMode != "HTML" {
		t.Errorf("telegram text (%s)\n got %q\nwant %q", m.ParseMode, m.Text, want)
	}

	// A digest: the errors are escaped there too, and the commands stay code.
	for _, st := range stops {
		st()
	}
	stops = nil
	for i := range 6 {
		fail(fmt.Sprintf("mk-d%d", i), "")
	}
	for _, ch := range []notify.Channel{slack, tg} {
		stops = append(stops, run(t, notify.NewDispatcher(e.fleet, ch, notify.Config{Poll: 50 * time.Millisecond, Logger: e.logger()})))
	}
	testenv.WaitFor(t, 30*time.Second, "the digests", func() bool {
		return len(e.slack.Messages()) == 2 && len(e.tg.Messages()) == 2
	})
	for name, c := range map[string]struct{ text, code string }{
		"slack":    {e.slack.Messages()[1].Text, "`scheduler servers list --status FAILED,UNREACHABLE`"},
		"telegram": {e.tg.Messages()[1].Text, "<code>scheduler servers list --status FAILED,UNREACHABLE</code>"},
	} {
		if !strings.Contains(c.text, "mk-d0 ("+escaped+")") || !strings.Contains(c.text, c.code) ||
			strings.Contains(c.text, "<!") || strings.Contains(c.text, "<http") {
			t.Errorf("%s digest: %q", name, c.text)
		}
	}
	if r := append(e.slack.Rejected(), e.tg.Rejected()...); len(r) != 0 {
		t.Errorf("the receivers refused requests: %v", r)
	}
}

func TestMarkupEscape(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"plain text", "plain text"},
		{"<!channel>", "&lt;!channel&gt;"},
		{"<!here> <@U123>", "&lt;!here&gt; &lt;@U123&gt;"},
		{"<http://evil.example|click>", "&lt;http://evil.example|click&gt;"},
		{"a & b &amp; c", "a &amp; b &amp;amp; c"},
		{"*bold* _x_ ~s~ `c` [a](b)", "*bold* _x_ ~s~ `c` [a](b)"},
		{"<b>bold</b>", "&lt;b&gt;bold&lt;/b&gt;"},
	} {
		for _, m := range []notify.Markup{notify.SlackMrkdwn, notify.TelegramHTML} {
			if got := m.Escape(tc.in); got != tc.want {
				t.Errorf("markup %d: Escape(%q) = %q, want %q", m, tc.in, got, tc.want)
			}
		}
		// Telegram reads the escaped text back as it was written.
		if plain, err := notifytest.ParseHTML(notify.TelegramHTML.Escape(tc.in)); err != nil || plain != tc.in {
			t.Errorf("telegram reads %q as %q, %v", tc.in, plain, err)
		}
	}
	if got := notify.SlackMrkdwn.Code("a &lt; b"); got != "`a &lt; b`" {
		t.Errorf("slack code: %q", got)
	}
	if got := notify.TelegramHTML.Code("a &lt; b"); got != "<code>a &lt; b</code>" {
		t.Errorf("telegram code: %q", got)
	}
}

// TestMarkupTruncate: a cut never splits an entity or a tag, closes the
// code element it cuts, and keeps to the length.
func TestMarkupTruncate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		m    notify.Markup
		in   string
		n    int
		want string
	}{
		{notify.SlackMrkdwn, "short", 10, "short"},
		{notify.SlackMrkdwn, "abc &amp; def", 7, "abc …"},
		{notify.SlackMrkdwn, "abc &amp; def", 10, "abc &amp;…"},
		{notify.TelegramHTML, "abc &lt;x&gt; def", 8, "abc …"},
		{notify.TelegramHTML, "run <code>scheduler servers show x</code>.", 12, "run …"},
		{notify.TelegramHTML, "run <code>scheduler servers show x</code>.", 30, "run <code>scheduler se…</code>"},
		{notify.TelegramHTML, "run <code>a &amp; b</code> now", 24, "run <code>a …</code>"},
		{notify.TelegramHTML, "run <code>ab</code> now and later", 22, "run <code>ab</code> n…"},
	} {
		got := tc.m.Truncate(tc.in, tc.n)
		if got != tc.want || len([]rune(got)) > tc.n {
			t.Errorf("markup %d: Truncate(%q, %d) = %q, want %q", tc.m, tc.in, tc.n, got, tc.want)
		}
		if tc.m == notify.TelegramHTML {
			if _, err := notifytest.ParseHTML(got); err != nil {
				t.Errorf("Truncate(%q, %d) = %q: Telegram cannot parse it: %v", tc.in, tc.n, got, err)
			}
		}
	}
}
