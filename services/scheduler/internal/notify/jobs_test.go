package notify_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/hmacsig"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets/vaulttest"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/notify"
	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/notify/notifytest"
)

const (
	projectA = "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f"
	projectB = "0c1d2e3f-4a5b-4c6d-8e7f-901a2b3c4d5e"
	// correlation is a job's correlation id that tries every markup
	// trick: a mention, a link, an entity, HTML.
	correlation = "<!channel>&<http://evil|x><b>"
	hookSecret  = "whsec_rule-secret"
	// smtpPassword is the SMTP password of project A's credential.
	smtpPassword = "smtp-s3cret-password"
)

// hookReceiver verifies each webhook's signature with the rule's secret
// and keeps the verified bodies.
type hookReceiver struct {
	mu     sync.Mutex
	bodies []notify.WebhookBody
	bad    []string
}

func (h *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := hmacsig.Verify(hookSecret, r.Header.Get(hmacsig.HeaderSignature), body, 5*time.Minute, time.Now()); err != nil {
		h.bad = append(h.bad, err.Error())
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	var b notify.WebhookBody
	if err := json.Unmarshal(body, &b); err != nil || r.Header.Get(hmacsig.HeaderEvent) != b.Event {
		h.bad = append(h.bad, "body or event header: "+string(body))
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	h.bodies = append(h.bodies, b)
	w.WriteHeader(http.StatusNoContent)
}

func (h *hookReceiver) got() ([]notify.WebhookBody, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]notify.WebhookBody(nil), h.bodies...), append([]string(nil), h.bad...)
}

// jobsEnv is a database with two projects' rules and credentials (in a
// Vault stand-in), and the channels' stand-ins.
type jobsEnv struct {
	db      *pgxpool.Pool
	slackA  *notifytest.Slack
	slackB  *notifytest.Slack
	tg      *notifytest.Telegram
	hooks   *hookReceiver
	smtp    *notifytest.SMTP
	cfg     notify.JobsConfig
	rules   map[string]string // name -> id
	project *secrets.Resolver
}

func setupJobs(t *testing.T) *jobsEnv {
	t.Helper()
	ctx := context.Background()
	e := &jobsEnv{db: testenv.Pool(t), slackA: notifytest.NewSlack("/services/A/hook"), slackB: notifytest.NewSlack("/services/B/hook"),
		tg: notifytest.NewTelegram(tgToken, "-1001234"), hooks: &hookReceiver{}, rules: map[string]string{}}
	e.slackA.MinInterval, e.slackB.MinInterval, e.tg.MinInterval = 0, 0, 0
	mux := http.NewServeMux()
	mux.Handle("/services/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/services/B/") {
			e.slackB.ServeHTTP(w, r)
			return
		}
		e.slackA.ServeHTTP(w, r)
	}))
	mux.Handle("/hook", e.hooks)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	tgSrv := httptest.NewServer(e.tg)
	t.Cleanup(tgSrv.Close)
	smtp, err := notifytest.NewSMTP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { smtp.Close() })
	e.smtp = smtp

	vault := vaulttest.New(t)
	vault.EnableKV("", "secret")
	vault.Put("", "secret", "projects/"+projectA+"/notify", map[string]any{"slack": srv.URL + "/services/A/hook", "bot": tgToken, "hook": hookSecret,
		"smtp": smtpPassword, "wrong": "not-the-password"})
	vault.Put("", "secret", "projects/"+projectB+"/notify", map[string]any{"slack": srv.URL + "/services/B/hook"})
	tok := vault.CreateToken("", vaulttest.TokenSpec{ReadPaths: []string{"secret/data/projects/*"}})
	red := secrets.NewRedactor()
	e.project, err = secrets.OpenProject(ctx, secrets.ProjectConfig{VaultPaths: []string{"secret/data/projects/*"},
		Vault: secrets.VaultConfig{Addr: vault.URL(), Token: secrets.ValueFromString(tok), Timeout: 5 * time.Second}},
		secrets.Config{}, secrets.Deps{Redactor: red})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.project.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.project.Stop(); _ = e.project.Close() })
	// The stand-ins listen on loopback, which the scheduler refuses but
	// for SPECIAL_ALLOW_NETWORKS, as it refuses a project's URL there.
	guard, err := authz.NewGuard(authz.SpecialConfig{AllowNetworks: []string{"127.0.0.0/8"}}, authz.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e.cfg = notify.JobsConfig{Resolve: e.project.Resolve, Redactor: red, Net: notify.NewNet(guard.Check, 5*time.Second),
		TelegramAPI: tgSrv.URL, Poll: 50 * time.Millisecond}

	for _, c := range []struct{ project, name, ref string }{
		{projectA, "slack-url", "vault:secret/projects/" + projectA + "/notify#slack"},
		{projectA, "bot-token", "vault:secret/projects/" + projectA + "/notify#bot"},
		{projectA, "hook-secret", "vault:secret/projects/" + projectA + "/notify#hook"},
		{projectA, "smtp-pass", "vault:secret/projects/" + projectA + "/notify#smtp"},
		{projectA, "smtp-wrong", "vault:secret/projects/" + projectA + "/notify#wrong"},
		{projectB, "slack-url", "vault:secret/projects/" + projectB + "/notify#slack"},
	} {
		if _, err := e.db.Exec(ctx, `INSERT INTO credentials (project_id, name, ref) VALUES ($1, $2, $3)`, c.project, c.name, c.ref); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []struct {
		project, name, channel, target, credential, email string
		events                                            []string
	}{
		{projectA, "team-slack", "slack", "", "slack-url", "{}", []string{"started", "succeeded", "failed"}},
		{projectA, "ops-telegram", "telegram", "-1001234", "bot-token", "{}", []string{"succeeded", "failed"}},
		{projectA, "ci-hook", "webhook", srv.URL + "/hook", "hook-secret", "{}", []string{"failed"}},
		{projectA, "oncall-mail", "email", "oncall@example.com, lead@example.com", "",
			`{"server": "` + smtp.Addr() + `", "from": "autoprov@example.com"}`, []string{"failed"}},
		{projectB, "team-slack", "slack", "", "slack-url", "{}", []string{"started", "succeeded", "failed"}},
	} {
		id := uuid.NewString()
		if _, err := e.db.Exec(ctx, `INSERT INTO notification_rules (id, project_id, name, channel, target, credential, email, events)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, id, r.project, r.name, r.channel, r.target, r.credential, r.email, r.events); err != nil {
			t.Fatal(err)
		}
		e.rules[r.project+"/"+r.name] = id
	}
	return e
}

// job makes a template-launched job of project start (infra's run row)
// and end with status, as infra and the deployer write them: the
// database queues the notifications.
func (e *jobsEnv) job(t *testing.T, project, status string) string {
	t.Helper()
	ctx := context.Background()
	id := uuid.NewString()
	req, _ := json.Marshal(map[string]any{"project_id": project, "template": map[string]any{"id": uuid.NewString(), "name": "site<&>", "version": 3}})
	if _, err := e.db.Exec(ctx, `INSERT INTO deployments (id, job_id, source, kind, project_id, correlation_id, job_request)
		VALUES ($1, $2, 'api', 'job', $3, $4, $5)`, id, id, project, correlation, req); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(ctx, `INSERT INTO runs (job_id, kind, stream, request_id, target) VALUES ($1, 'job', 'q', '1-0', 'job:x')`, id); err != nil {
		t.Fatal(err)
	}
	kind := ""
	if status != "succeeded" {
		kind = "playbook_failed"
	}
	if _, err := e.db.Exec(ctx, `UPDATE deployments SET status = $2, error_kind = NULLIF($3, '') WHERE id = $1`, id, status, kind); err != nil {
		t.Fatal(err)
	}
	return id
}

// run runs a dispatcher until the returned stop is called.
func (e *jobsEnv) run() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	j := notify.NewJobs(e.db, e.cfg)
	go func() { defer close(done); _ = j.Run(ctx) }()
	return func() { cancel(); <-done }
}

// pending counts the notifications not delivered yet.
func (e *jobsEnv) pending(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.db.QueryRow(context.Background(), `SELECT count(*) FROM job_notifications WHERE state <> 'delivered'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestJobNotifications: a template-launched job's events reach each rule's
// channel once, through real stand-ins (Slack, Telegram, a webhook
// receiver verifying the signature, an SMTP sink), with the job's values
// escaped for each markup; a dispatcher stopped and started again sends
// what came meanwhile and repeats nothing; another project's job reaches
// only its own rule, with its own credential.
func TestJobNotifications(t *testing.T) {
	t.Parallel()
	e := setupJobs(t)
	stop := e.run()
	ok := e.job(t, projectA, "succeeded")
	testenv.WaitFor(t, 20*time.Second, "the succeeded job's notifications", func() bool { return e.pending(t) == 0 })
	stop()

	slack := e.slackA.Messages()
	if len(slack) != 2 || !strings.Contains(slack[0].Text, "started") || !strings.Contains(slack[1].Text, "succeeded") {
		t.Fatalf("Slack: %+v (rejected %v)", slack, e.slackA.Rejected())
	}
	for _, m := range append(slack, e.tg.Messages()...) {
		if strings.Contains(m.Text, "<!channel>") || strings.Contains(m.Text, "<http") || strings.Contains(m.Text, "<b>") ||
			!strings.Contains(m.Text, "&lt;!channel&gt;&amp;&lt;http://evil|x&gt;&lt;b&gt;") || !strings.Contains(m.Text, "site&lt;&amp;&gt;") ||
			!strings.Contains(m.Text, ok) {
			t.Errorf("not escaped: %q", m.Text)
		}
	}
	if tg := e.tg.Messages(); len(tg) != 1 || tg[0].ParseMode != "HTML" || tg[0].Chat != "-1001234" {
		t.Errorf("Telegram: %+v (rejected %v)", tg, e.tg.Rejected())
	} else if _, err := notifytest.ParseHTML(tg[0].Text); err != nil {
		t.Errorf("Telegram's HTML: %v in %q", err, tg[0].Text)
	}
	if hooks, bad := e.hooks.got(); len(hooks) != 0 || len(bad) != 0 || len(e.smtp.Mail()) != 0 {
		t.Errorf("rules without succeeded: webhooks %v %v, mail %v", hooks, bad, e.smtp.Mail())
	}

	// While no dispatcher runs, a job fails; one started again sends its
	// notifications, and nothing of before.
	failed := e.job(t, projectA, "failed")
	jobB := e.job(t, projectB, "succeeded")
	stop = e.run()
	testenv.WaitFor(t, 20*time.Second, "the failed job's notifications", func() bool { return e.pending(t) == 0 })
	time.Sleep(300 * time.Millisecond) // several polls: nothing more may come
	stop()
	if slack := e.slackA.Messages(); len(slack) != 4 || !strings.Contains(slack[3].Text, failed) || !strings.Contains(slack[3].Text, "failed") {
		t.Errorf("Slack after the restart: %d messages %+v", len(slack), slack)
	}
	if tg := e.tg.Messages(); len(tg) != 2 {
		t.Errorf("Telegram after the restart: %+v", tg)
	}
	hooks, bad := e.hooks.got()
	if len(hooks) != 1 || len(bad) != 0 || hooks[0].Event != "job.failed" || hooks[0].JobID != failed || hooks[0].CorrelationID != correlation ||
		hooks[0].Template.Name != "site<&>" || hooks[0].Template.Version != 3 || hooks[0].Rule != "ci-hook" || hooks[0].ErrorKind != "playbook_failed" {
		t.Errorf("webhooks: %+v, refused %v", hooks, bad)
	}
	mail := e.smtp.Mail()
	if len(mail) != 1 || mail[0].From != "autoprov@example.com" || len(mail[0].To) != 2 || mail[0].To[1] != "lead@example.com" {
		t.Fatalf("mail: %+v", mail)
	}
	if d := mail[0].Data; !strings.Contains(d, "Subject: [autoprov] site<&> v3: job failed\r\n") || !strings.Contains(d, failed) ||
		!strings.Contains(d, "Content-Type: text/plain; charset=utf-8") || strings.Count(d, "\r\nSubject:") != 1 {
		t.Errorf("mail data:\n%s", d)
	}

	// Project B: its job went to its own rule and Slack webhook only.
	if b := e.slackB.Messages(); len(b) != 2 || !strings.Contains(b[1].Text, jobB) {
		t.Errorf("B's Slack: %+v", b)
	}
	for _, m := range e.slackA.Messages() {
		if strings.Contains(m.Text, jobB) {
			t.Errorf("B's job reached A's Slack: %q", m.Text)
		}
	}
	var wrong int
	if err := e.db.QueryRow(context.Background(), `SELECT count(*) FROM job_notifications n JOIN notification_rules r ON r.id = n.rule_id
		JOIN deployments d ON d.id = n.deployment_id WHERE r.project_id <> d.project_id`).Scan(&wrong); err != nil || wrong != 0 {
		t.Errorf("%d notifications of another project's rule (%v)", wrong, err)
	}
	var attempts int
	if err := e.db.QueryRow(context.Background(), `SELECT max(attempts) FROM job_notifications`).Scan(&attempts); err != nil || attempts != 1 {
		t.Errorf("attempts: %d (%v)", attempts, err)
	}
}

// TestJobNotificationRetries: a channel that fails is retried with
// backoff and delivered once it answers; one that never does ends
// failed after MaxAttempts with its error (no secret in it); a webhook to
// an address the guard refuses never gets a connection.
func TestJobNotificationRetries(t *testing.T) {
	t.Parallel()
	e := setupJobs(t)
	e.slackA.FailNext(2, http.StatusInternalServerError)
	e.cfg.MaxAttempts, e.cfg.MaxBackoff = 3, 50*time.Millisecond
	guard, err := authz.NewGuard(authz.SpecialConfig{}, authz.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Telegram and the webhook go through a guard without loopback.
	strict := e.cfg
	strict.Net = notify.NewNet(guard.Check, 5*time.Second)
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `UPDATE notification_rules SET events = CASE name WHEN 'team-slack' THEN '{succeeded}'::text[] ELSE '{failed}' END
		WHERE project_id = $1`, projectA); err != nil {
		t.Fatal(err)
	}
	e.job(t, projectA, "succeeded")
	// Slack's two failures, then its success.
	j := notify.NewJobs(e.db, e.cfg)
	testenv.WaitFor(t, 20*time.Second, "Slack's delivery after two failures", func() bool {
		_, _ = j.Once(ctx)
		return len(e.slackA.Messages()) == 1
	})
	var state string
	var attempts int
	if err := e.db.QueryRow(ctx, `SELECT state, attempts FROM job_notifications WHERE rule_id = $1`, e.rules[projectA+"/team-slack"]).Scan(&state, &attempts); err != nil ||
		state != "delivered" || attempts != 3 {
		t.Errorf("Slack's notification: %s after %d attempts (%v)", state, attempts, err)
	}
	// A failed job's Telegram, webhook and email through the strict
	// guard: refused at connect time, failed after three attempts each.
	e.job(t, projectA, "failed")
	js := notify.NewJobs(e.db, strict)
	testenv.WaitFor(t, 20*time.Second, "the failed job's notifications given up", func() bool {
		_, _ = js.Once(ctx)
		var n int
		err := e.db.QueryRow(ctx, `SELECT count(*) FROM job_notifications WHERE state = 'failed' AND attempts = 3`).Scan(&n)
		return err == nil && n == 3
	})
	rows, err := e.db.Query(ctx, `SELECT last_error FROM job_notifications WHERE state = 'failed'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var msg string
		if err := rows.Scan(&msg); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(msg, "loopback") || strings.Contains(msg, tgToken) || strings.Contains(msg, hookSecret) {
			t.Errorf("last error %q", msg)
		}
	}
	if hooks, _ := e.hooks.got(); len(e.tg.Messages()) != 0 || len(hooks) != 0 || len(e.smtp.Mail()) != 0 {
		t.Errorf("a refused address got %d Telegram messages, %d webhooks, %d mails", len(e.tg.Messages()), len(hooks), len(e.smtp.Mail()))
	}
}

// TestJobNotificationEmailTLS: an email rule with a user name sends after
// STARTTLS (the server's certificate verified) with AUTH PLAIN and the
// password of the project's credential; a wrong password is refused by
// the server and the notification fails without the password in its
// error.
func TestJobNotificationEmailTLS(t *testing.T) {
	t.Parallel()
	e := setupJobs(t)
	ctx := context.Background()
	srvTLS, roots, err := notifytest.SelfSigned("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	sink, err := notifytest.NewSMTP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	sink.TLS, sink.Users = srvTLS, map[string]string{"autoprov": smtpPassword}
	e.cfg.Net.TrustRoots(roots)
	e.cfg.MaxAttempts, e.cfg.MaxBackoff = 2, 10*time.Millisecond
	if _, err := e.db.Exec(ctx, `UPDATE notification_rules SET events = '{approval_needed}'`); err != nil {
		t.Fatal(err)
	}
	for name, cred := range map[string]string{"secure-mail": "smtp-pass", "wrong-mail": "smtp-wrong"} {
		email := `{"server": "` + sink.Addr() + `", "from": "autoprov@example.com", "username": "autoprov"}`
		if _, err := e.db.Exec(ctx, `INSERT INTO notification_rules (id, project_id, name, channel, target, credential, email, events)
			VALUES ($1, $2, $3, 'email', 'ops@example.com', $4, $5, '{failed}')`, uuid.NewString(), projectA, name, cred, email); err != nil {
			t.Fatal(err)
		}
	}
	job := e.job(t, projectA, "failed")
	j := notify.NewJobs(e.db, e.cfg)
	testenv.WaitFor(t, 20*time.Second, "both email notifications done", func() bool {
		_, _ = j.Once(ctx)
		var open int
		err := e.db.QueryRow(ctx, `SELECT count(*) FROM job_notifications WHERE state = 'pending'`).Scan(&open)
		return err == nil && open == 0
	})
	mail := sink.Mail()
	if len(mail) != 1 || !mail[0].TLS || mail[0].User != "autoprov" || !strings.Contains(mail[0].Data, job) {
		t.Fatalf("mail: %+v", mail)
	}
	var state, lastErr string
	if err := e.db.QueryRow(ctx, `SELECT n.state, n.last_error FROM job_notifications n JOIN notification_rules r ON r.id = n.rule_id
		WHERE r.name = 'wrong-mail'`).Scan(&state, &lastErr); err != nil || state != "failed" || !strings.Contains(lastErr, "535") ||
		strings.Contains(lastErr, "not-the-password") {
		t.Errorf("wrong password: %s %q (%v)", state, lastErr, err)
	}
}

// TestJobNotificationsTwoReplicas: two dispatchers over the same queue
// (two scheduler replicas) deliver each of many notifications once.
func TestJobNotificationsTwoReplicas(t *testing.T) {
	t.Parallel()
	e := setupJobs(t)
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `UPDATE notification_rules SET events = CASE name WHEN 'ci-hook' THEN '{succeeded}'::text[] ELSE '{approval_needed}' END`); err != nil {
		t.Fatal(err)
	}
	const jobs = 30
	want := map[string]bool{}
	for range jobs {
		want[e.job(t, projectA, "succeeded")] = true
	}
	stop1, stop2 := e.run(), e.run()
	testenv.WaitFor(t, 30*time.Second, "every notification delivered", func() bool { return e.pending(t) == 0 })
	time.Sleep(200 * time.Millisecond)
	stop1()
	stop2()
	hooks, bad := e.hooks.got()
	seen := map[string]int{}
	for _, h := range hooks {
		seen[h.JobID]++
	}
	if len(hooks) != jobs || len(bad) != 0 || len(seen) != jobs {
		t.Fatalf("%d webhooks for %d jobs (%d distinct), refused %v", len(hooks), jobs, len(seen), bad)
	}
	for id, n := range seen {
		if !want[id] || n != 1 {
			t.Errorf("job %s notified %d times", id, n)
		}
	}
}
