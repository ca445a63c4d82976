package notify

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
)

// JobNotification is a queued notification of a template-launched job
// (a row of job_notifications, written by the database in the
// transaction of the job's change; see the deployer's notification
// rules), with what its message says.
type JobNotification struct {
	ID int64
	// Event is started, succeeded, failed or approval_needed.
	Event     string
	Status    string
	ErrorKind string
	Attempts  int
	JobID     string
	ProjectID string
	// TemplateID, Template and Version name the template version the job
	// was launched from.
	TemplateID    string
	Template      string
	Version       int
	CorrelationID string
	// Workflow, WorkflowRunID, Node and Description name the approval of
	// an approval_needed notification (no job: JobID is "").
	Workflow, WorkflowRunID, Node, Description string
	Rule                                       JobRule
}

// JobRule is the rule a notification goes out by.
type JobRule struct {
	Name    string
	Channel string
	// Target is the Telegram chat, the email recipients or the webhook URL.
	Target string
	// Credential names the project's credential holding the channel's
	// secret ("" for an email rule without authentication).
	Credential string
	Email      EmailSettings
}

// EmailSettings are an email rule's SMTP server (host:port), sender and
// user name.
type EmailSettings struct {
	Server   string `json:"server"`
	From     string `json:"from"`
	Username string `json:"username,omitempty"`
}

// JobsConfig configures Jobs. Zero values take the defaults.
type JobsConfig struct {
	// Resolve reads a secret reference; only vault: references of the
	// projects' credentials are given to it (env: and file: would name
	// the scheduler's own environment and files).
	Resolve func(ctx context.Context, ref string) (secrets.Value, error)
	// Redactor masks the scheduler's secrets in errors; each delivery
	// adds its own to a child of it, released when the send ends.
	Redactor *secrets.Redactor
	// Net connects to the channels: every address checked before a
	// connection is made (NewNet).
	Net *Net
	// TelegramAPI is the Bot API's base URL (default DefaultTelegramAPI).
	TelegramAPI string
	// Poll is how often queued notifications are looked for (default 2s).
	Poll time.Duration
	// MaxAttempts is how many failed sends make a notification failed
	// for good (default 8); a 429 does not count.
	MaxAttempts int
	// MaxBackoff bounds the wait between failed sends (default 10m).
	MaxBackoff time.Duration
	Logger     zerolog.Logger
	// Metrics are the dispatchers' (NewMetrics); nil records none.
	Metrics *Metrics
}

// Jobs delivers the notifications of projects' template-launched jobs,
// each through the channel of its rule, with the rule's secret resolved
// from the project's credential at the time of sending. A notification
// is read and marked delivered in one transaction (FOR UPDATE SKIP
// LOCKED: replicas share the work, none sends one twice), so a restart
// neither repeats a delivered notification nor drops a queued one; as
// for the fleet's (Dispatcher), the one window for a repeat is a crash
// during the send itself. Each channel address has the rate its service
// documents; failures are retried with exponential backoff, then the
// notification is marked failed.
type Jobs struct {
	db  *pgxpool.Pool
	cfg JobsConfig
	log zerolog.Logger

	mu   sync.Mutex
	lims map[string]*rate.Limiter
}

// NewJobs returns the job notifications' dispatcher.
func NewJobs(db *pgxpool.Pool, cfg JobsConfig) *Jobs {
	if cfg.Poll <= 0 {
		cfg.Poll = 2 * time.Second
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 8
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 10 * time.Minute
	}
	if cfg.Redactor == nil {
		cfg.Redactor = secrets.NewRedactor()
	}
	if cfg.Net == nil {
		cfg.Net = NewNet(nil, 0)
	}
	return &Jobs{db: db, cfg: cfg, log: cfg.Logger.With().Str("component", "notify").Str("channel", "jobs").Logger(),
		lims: map[string]*rate.Limiter{}}
}

// Run delivers until ctx is done.
func (j *Jobs) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		did, err := j.Once(ctx)
		if err != nil && ctx.Err() == nil {
			j.log.Warn().Err(err).Msg("job notification not delivered: retrying later")
		}
		if did {
			continue // more may be due
		}
		select {
		case <-ctx.Done():
		case <-time.After(j.cfg.Poll):
		}
	}
	return nil
}

const jobNotificationQuery = `
	SELECT n.id, n.event, n.status, n.error_kind, n.attempts, COALESCE(d.job_id::text, ''), COALESCE(d.project_id, wr.project_id, ''),
		COALESCE(d.job_request -> 'template' ->> 'id', ''), COALESCE(d.job_request -> 'template' ->> 'name', ''),
		COALESCE((d.job_request -> 'template' ->> 'version')::int, 0), COALESCE(d.correlation_id, ''),
		COALESCE(w.name, ''), COALESCE(wr.id::text, ''), n.node,
		COALESCE((SELECT x -> 'approval' ->> 'description' FROM jsonb_array_elements(wr.graph -> 'nodes') x
			WHERE x ->> 'id' = n.node LIMIT 1), ''),
		r.name, r.channel, r.target, r.credential, r.email
	FROM job_notifications n
	JOIN notification_rules r ON r.id = n.rule_id
	LEFT JOIN deployments d ON d.id = n.deployment_id
	LEFT JOIN workflow_runs wr ON wr.id = n.workflow_run_id
	LEFT JOIN workflows w ON w.id = wr.workflow_id
	WHERE n.state = 'pending' AND n.next_attempt_at <= now()
	ORDER BY n.next_attempt_at, n.id
	LIMIT 1
	FOR UPDATE OF n SKIP LOCKED`

// Once sends the oldest notification due, if any, and records the
// outcome; it reports whether there was one, and the send's error.
func (j *Jobs) Once(ctx context.Context) (bool, error) {
	tx, err := j.db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("job notifications: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var n JobNotification
	var email []byte
	err = tx.QueryRow(ctx, jobNotificationQuery).Scan(&n.ID, &n.Event, &n.Status, &n.ErrorKind, &n.Attempts, &n.JobID,
		&n.ProjectID, &n.TemplateID, &n.Template, &n.Version, &n.CorrelationID,
		&n.Workflow, &n.WorkflowRunID, &n.Node, &n.Description,
		&n.Rule.Name, &n.Rule.Channel, &n.Rule.Target, &n.Rule.Credential, &email)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("job notifications: %w", err)
	}
	start := time.Now()
	var sendErr error
	if n.Rule.Channel == "email" && json.Unmarshal(email, &n.Rule.Email) != nil {
		// A row that cannot be sent is recorded as a failure like any
		// other, so it never holds up the queue.
		sendErr = fmt.Errorf("rule %s: unreadable email settings", n.Rule.Name)
	} else {
		// A send that started is not cut short by shutdown (see Dispatcher).
		sendErr = j.deliver(context.WithoutCancel(ctx), &n)
	}
	j.cfg.Metrics.sent("job:"+n.Rule.Channel, 1, sendErr, time.Since(start))
	rctx := context.WithoutCancel(ctx)
	if sendErr == nil {
		if _, err := tx.Exec(rctx, `UPDATE job_notifications SET state = 'delivered', delivered_at = now(),
			attempts = attempts + 1, last_error = '' WHERE id = $1`, n.ID); err != nil {
			return true, fmt.Errorf("record job notification %d: %w", n.ID, err)
		}
		if err := tx.Commit(rctx); err != nil {
			return true, fmt.Errorf("record job notification %d: %w", n.ID, err)
		}
		j.log.Info().Int64("notification", n.ID).Str("job_id", n.JobID).Str("workflow_run_id", n.WorkflowRunID).Str("event", n.Event).Str("rule", n.Rule.Name).
			Str("project_id", n.ProjectID).Msg("job notification delivered")
		return true, nil
	}
	attempts, wait := n.Attempts+1, j.backoff(n.Attempts)
	var ra *RetryAfterError
	if errors.As(sendErr, &ra) {
		attempts, wait = n.Attempts, ra.After // the channel working as documented
	}
	state := "pending"
	if attempts >= j.cfg.MaxAttempts {
		state = "failed"
	}
	msg := truncate(sendErr.Error(), 1000) // redacted by deliver
	if _, err := tx.Exec(rctx, `UPDATE job_notifications SET attempts = $2, next_attempt_at = now() + $3::interval,
		last_error = $4, state = $5 WHERE id = $1`, n.ID, attempts, wait, msg, state); err != nil {
		return true, fmt.Errorf("record job notification %d: %w", n.ID, err)
	}
	if err := tx.Commit(rctx); err != nil {
		return true, fmt.Errorf("record job notification %d: %w", n.ID, err)
	}
	return true, fmt.Errorf("job notification %d (rule %s, %s): %s", n.ID, n.Rule.Name, state, msg)
}

// backoff is the wait after the attempts-th failure: 1s doubling, up to
// MaxBackoff.
func (j *Jobs) backoff(attempts int) time.Duration {
	d := time.Second << min(attempts, 20)
	return min(d, j.cfg.MaxBackoff)
}

// deliver sends n through its rule's channel; its error is redacted of
// the rule's secret.
func (j *Jobs) deliver(ctx context.Context, n *JobNotification) error {
	red := j.cfg.Redactor.Child()
	defer red.Release()
	err := j.send(ctx, n, red)
	var ra *RetryAfterError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ra):
		return &RetryAfterError{After: ra.After, Err: errors.New(red.RedactString(ra.Err.Error()))}
	}
	return errors.New(red.RedactString(err.Error()))
}

// send resolves n's secret (into red) and sends n.
func (j *Jobs) send(ctx context.Context, n *JobNotification, red *secrets.Redactor) error {
	secret, err := j.secret(ctx, n)
	if err != nil {
		return err
	}
	defer secret.Wipe()
	red.AddValue(secret)
	timeout := j.cfg.Net.timeout
	switch n.Rule.Channel {
	case "slack":
		if err := CheckSlackURL(secret); err != nil {
			return fmt.Errorf("credential %s: %w", n.Rule.Credential, err)
		}
		return j.sendText(ctx, NewSlack(secret, red, timeout).use(j.cfg.Net), n)
	case "telegram":
		if err := CheckTelegramToken(secret); err != nil {
			return fmt.Errorf("credential %s: %w", n.Rule.Credential, err)
		}
		return j.sendText(ctx, NewTelegram(j.cfg.TelegramAPI, secret, n.Rule.Target, red, timeout).use(j.cfg.Net), n)
	case "email":
		e := &Email{Settings: n.Rule.Email, To: strings.Split(n.Rule.Target, ","), Password: secret, Net: j.cfg.Net}
		if err := j.wait(ctx, "email:"+e.Settings.Server, time.Second, 1); err != nil {
			return err
		}
		return e.Send(ctx, JobSubject(n), JobText(n, PlainText), fmt.Sprintf("%d.%s", n.ID, cmp.Or(n.JobID, n.WorkflowRunID)))
	case "webhook":
		w := &Webhook{URL: n.Rule.Target, Secret: secret, Net: j.cfg.Net, Redactor: red}
		if err := j.wait(ctx, "webhook:"+n.Rule.Target, 100*time.Millisecond, 10); err != nil {
			return err
		}
		return w.Send(ctx, n, n.Attempts+1)
	}
	return fmt.Errorf("rule %s: unknown channel %q", n.Rule.Name, n.Rule.Channel)
}

// sendText sends n's message in ch's markup, at ch's rate.
func (j *Jobs) sendText(ctx context.Context, ch Channel, n *JobNotification) error {
	every, burst := ch.Limit()
	if err := j.wait(ctx, ch.Name()+":"+n.Rule.Credential+":"+n.ProjectID, every, burst); err != nil {
		return err
	}
	return ch.Send(ctx, ch.Markup().Truncate(JobText(n, ch.Markup()), ch.MaxLen()))
}

// wait waits for the rate of the channel address key.
func (j *Jobs) wait(ctx context.Context, key string, every time.Duration, burst int) error {
	j.mu.Lock()
	lim := j.lims[key]
	if lim == nil {
		lim = rate.NewLimiter(rate.Every(every), max(burst, 1))
		j.lims[key] = lim
	}
	j.mu.Unlock()
	return lim.Wait(ctx)
}

// secret resolves the rule's credential: the project's, a vault:
// reference. An email rule without one has none (a zero Value).
func (j *Jobs) secret(ctx context.Context, n *JobNotification) (secrets.Value, error) {
	if n.Rule.Credential == "" {
		if n.Rule.Channel == "email" {
			return secrets.Value{}, nil
		}
		return secrets.Value{}, fmt.Errorf("rule %s names no credential", n.Rule.Name)
	}
	var ref string
	err := j.db.QueryRow(ctx, `SELECT ref FROM credentials WHERE project_id = $1 AND name = $2`, n.ProjectID, n.Rule.Credential).Scan(&ref)
	if errors.Is(err, pgx.ErrNoRows) {
		return secrets.Value{}, fmt.Errorf("credential %s is not in the project (deleted?)", n.Rule.Credential)
	}
	if err != nil {
		return secrets.Value{}, fmt.Errorf("read credential %s: %w", n.Rule.Credential, err)
	}
	if r, err := secrets.ParseRef(ref); err != nil || r.Scheme != secrets.SchemeVault {
		return secrets.Value{}, fmt.Errorf("credential %s is not a vault: reference: not resolved for a project", n.Rule.Credential)
	}
	if j.cfg.Resolve == nil {
		return secrets.Value{}, errors.New("the scheduler resolves no secrets")
	}
	v, err := j.cfg.Resolve(ctx, ref)
	if err != nil {
		return secrets.Value{}, fmt.Errorf("credential %s: %w", n.Rule.Credential, err)
	}
	return v, nil
}

var jobIcons = map[string]string{"started": "▶️", "succeeded": "✅", "failed": "❌", "approval_needed": "✋"}

// JobSubject is an email's subject for n: one line, from fixed text and
// values without line ends.
func JobSubject(n *JobNotification) string {
	s := fmt.Sprintf("[autoprov] %s v%d: job %s", n.Template, n.Version, n.Event)
	if n.WorkflowRunID != "" {
		s = fmt.Sprintf("[autoprov] %s: approval needed (%s)", n.Workflow, n.Node)
	}
	if n.Event == "failed" && n.Status != "" && n.Status != "failed" {
		s += " (" + n.Status + ")"
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}

// JobText is the message of n in markup m: the template and its version,
// the event, the job, its error, and what to do next. Everything that
// comes from outside (names, ids, the correlation id, the error) is
// escaped.
func JobText(n *JobNotification, m Markup) string {
	var b strings.Builder
	if n.WorkflowRunID != "" {
		run := "/api/v1/workflow-runs/" + m.Escape(n.WorkflowRunID)
		fmt.Fprintf(&b, "%s Workflow %s waits for an approval: step %s\n", jobIcons[n.Event], m.Escape(n.Workflow), m.Code(m.Escape(n.Node)))
		if n.Description != "" {
			fmt.Fprintf(&b, "%s\n", m.Escape(n.Description))
		}
		fmt.Fprintf(&b, "Run: %s\nProject: %s\n", m.Code(m.Escape(n.WorkflowRunID)), m.Escape(n.ProjectID))
		fmt.Fprintf(&b, "Next: approve or deny the step (%s, or %s).", m.Code("POST "+run+"/nodes/"+m.Escape(n.Node)+"/approve"),
			m.Code(".../deny"))
		return b.String()
	}
	what := n.Event
	switch n.Event {
	case "approval_needed":
		what = "waits for an approval"
	case "failed":
		if n.Status != "" && n.Status != "failed" {
			what = "failed (" + m.Escape(n.Status) + ")"
		}
	}
	fmt.Fprintf(&b, "%s Job of template %s (version %d) %s\n", jobIcons[n.Event], m.Escape(n.Template), n.Version, what)
	fmt.Fprintf(&b, "Job: %s", m.Code(m.Escape(n.JobID)))
	if n.CorrelationID != "" {
		fmt.Fprintf(&b, " (correlation id %s)", m.Escape(n.CorrelationID))
	}
	fmt.Fprintf(&b, "\nProject: %s\n", m.Escape(n.ProjectID))
	if n.ErrorKind != "" {
		fmt.Fprintf(&b, "Error: %s\n", m.Escape(n.ErrorKind))
	}
	job := "/api/v1/jobs/" + m.Escape(n.JobID)
	switch n.Event {
	case "started":
		fmt.Fprintf(&b, "Next: follow it with %s.", m.Code("GET "+job+"/stream"))
	case "succeeded":
		b.WriteString("Next: nothing to do.")
	case "failed":
		fmt.Fprintf(&b, "Next: read its log (%s), fix the cause, then relaunch it on the failed hosts (%s).",
			m.Code("GET "+job+"/logs"), m.Code("POST "+job+"/relaunch"))
	default:
		b.WriteString("Next: approve or deny the step.")
	}
	return b.String()
}
