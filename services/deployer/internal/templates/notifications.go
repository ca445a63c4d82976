package templates

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/mail"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/credentials"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// The channels a notification rule sends through.
const (
	ChannelSlack    = "slack"
	ChannelTelegram = "telegram"
	ChannelEmail    = "email"
	ChannelWebhook  = "webhook"
)

// The events a rule can name. EventApprovalNeeded belongs to workflows'
// approval steps: it is accepted, and fires once workflows exist.
const (
	EventStarted        = "started"
	EventSucceeded      = "succeeded"
	EventFailed         = "failed"
	EventApprovalNeeded = "approval_needed"
)

// Events returns every event, in the order they happen.
func Events() []string {
	return []string{EventStarted, EventSucceeded, EventFailed, EventApprovalNeeded}
}

// Email is an email rule's sending: the SMTP server (host:port), the
// sender, and the user name to authenticate with (the password is the
// rule's credential; none: no authentication).
type Email struct {
	Server   string `json:"server"`
	From     string `json:"from"`
	Username string `json:"username,omitempty"`
}

// Rule notifies people of a project's template-launched jobs: of one
// template (TemplateID) or of all of them, on the events it names,
// through a channel. Its secret part is Credential, a credential of the
// project: the rule holds its name, never a value.
type Rule struct {
	ID string `json:"id"`
	NewRule
	CreatedAt time.Time `json:"created_at"`
	// Recent are the latest notifications, newest first (GET of one).
	Recent []RuleDelivery `json:"recent,omitempty"`
}

// RuleDelivery is one notification of a rule and what came of it.
type RuleDelivery struct {
	JobID       string     `json:"job_id"`
	Event       string     `json:"event"`
	Status      string     `json:"status"`
	State       string     `json:"state"`
	Attempts    int        `json:"attempts"`
	LastError   string     `json:"last_error,omitempty"`
	CreatedAt   time.Time  `json:"created_at"`
	DeliveredAt *time.Time `json:"delivered_at,omitempty"`
}

// NewRule is a rule to create, or what replaces one (and a Rule's
// settings).
type NewRule struct {
	ProjectID  string `json:"project_id,omitempty"`
	TemplateID string `json:"template_id,omitempty"`
	Name       string `json:"name"`
	Channel    string `json:"channel"`
	// Target is the Telegram chat, the email recipients (comma-separated)
	// or the webhook URL; "" for Slack (its URL is the credential).
	Target     string   `json:"target,omitempty"`
	Credential string   `json:"credential,omitempty"`
	Email      *Email   `json:"email,omitempty"`
	Events     []string `json:"events"`
}

// ErrRuleExists: a rule of this name exists in the project.
var ErrRuleExists = errors.New("a notification rule of this name exists in the project")

// Notifications stores projects' notification rules; the database
// queues their notifications (migration 00076's triggers) and the
// scheduler delivers them.
type Notifications struct {
	svc   *Service
	creds *credentials.Service
	// checkURL validates a webhook URL (webhooks.Guard.CheckURL); nil
	// refuses webhook rules.
	checkURL func(string) error
}

// NewNotifications returns the Notifications of svc's projects: a rule's
// credential must be one of creds (a Vault reference), a webhook URL
// pass checkURL (nil: webhook rules are refused).
func NewNotifications(svc *Service, creds *credentials.Service, checkURL func(string) error) *Notifications {
	return &Notifications{svc: svc, creds: creds, checkURL: checkURL}
}

// telegramChatRE: a chat's numeric id (negative for groups) or a public
// channel's @username.
var telegramChatRE = regexp.MustCompile(`^(-?[0-9]{1,20}|@[A-Za-z][A-Za-z0-9_]{4,31})$`)

// maxRecipients bounds an email rule's recipients, maxTarget a target.
const (
	maxRecipients = 10
	maxTarget     = 2048
)

// validate checks n for the key that sees v and returns the rule's
// project and template ("" for every template).
func (ns *Notifications) validate(ctx context.Context, v deployments.Visibility, n *NewRule) (project, template string, err error) {
	var fields []deployments.FieldError
	add := func(field, msg string) { // the first problem of a field says it
		if !slices.ContainsFunc(fields, func(f deployments.FieldError) bool { return f.Field == field }) {
			fields = append(fields, deployments.FieldError{Field: field, Message: msg})
		}
	}
	if n.TemplateID != "" {
		t, err := ns.svc.Get(ctx, v, n.TemplateID, 0)
		if err != nil {
			return "", "", err
		}
		project, template = t.ProjectID, t.ID
		if n.ProjectID != "" {
			if p, _ := messages.CanonicalProjectID(n.ProjectID); p != project {
				add("project_id", "is not the template's project")
			}
		}
	} else if n.ProjectID == "" {
		add("project_id", "give the project (or a template_id)")
	} else {
		var ie *deployments.InvalidError
		project, err = credentials.HeldProject(v, n.ProjectID)
		switch {
		case errors.As(err, &ie):
			fields = append(fields, ie.Fields...)
		case err != nil:
			return "", "", err
		}
	}
	if !NameRE.MatchString(n.Name) {
		add("name", "must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
	}
	switch {
	case len(n.Events) == 0:
		add("events", "name one or more of started, succeeded, failed, approval_needed")
	default:
		for i, e := range n.Events {
			switch {
			case !slices.Contains(Events(), e):
				add(fmt.Sprintf("events[%d]", i), "must be started, succeeded, failed or approval_needed")
			case slices.Index(n.Events, e) != i:
				add(fmt.Sprintf("events[%d]", i), "is named twice")
			}
		}
	}
	needsCredential := true
	if len(n.Target) > maxTarget {
		add("target", fmt.Sprintf("must be at most %d bytes", maxTarget))
	}
	switch n.Channel {
	case ChannelSlack:
		if n.Target != "" {
			add("target", "a Slack rule has none: the incoming webhook's URL is its credential")
		}
	case ChannelTelegram:
		if !telegramChatRE.MatchString(n.Target) {
			add("target", "must be a Telegram chat id (a number, negative for groups) or a channel's @username")
		}
	case ChannelEmail:
		needsCredential = false // an SMTP server may take mail without authentication
		if msg := checkRecipients(n.Target); msg != "" {
			add("target", msg)
		}
		checkEmail(n.Email, n.Credential, add)
	case ChannelWebhook:
		switch {
		case ns.checkURL == nil:
			add("channel", "this deployer takes no webhook rules")
		default:
			if err := ns.checkURL(n.Target); err != nil {
				add("target", err.Error())
			}
		}
	default:
		add("channel", "must be slack, telegram, email or webhook")
	}
	if n.Channel != ChannelEmail && n.Email != nil {
		add("email", "only an email rule has one")
	}
	switch {
	case n.Credential == "" && needsCredential:
		add("credential", "name the project's credential holding the "+secretOf(n.Channel))
	case n.Credential != "" && project != "":
		if msg := ns.checkCredential(ctx, project, n.Credential); msg != "" {
			add("credential", msg)
		}
	}
	if len(fields) > 0 {
		return "", "", &deployments.InvalidError{Fields: fields}
	}
	return project, template, nil
}

// secretOf says what a channel's credential holds.
func secretOf(channel string) string {
	switch channel {
	case ChannelSlack:
		return "Slack incoming webhook's URL"
	case ChannelTelegram:
		return "Telegram bot token"
	case ChannelEmail:
		return "SMTP password"
	case ChannelWebhook:
		return "webhook signing secret"
	}
	return "channel's secret"
}

// checkCredential returns what is wrong with credential name of project
// for a rule ("" when nothing): it must exist and be a Vault reference,
// the one kind the scheduler resolves for projects (env: and file: name
// the scheduler's own environment and files).
func (ns *Notifications) checkCredential(ctx context.Context, project, name string) string {
	if ns.creds == nil {
		return "this deployer has no credentials"
	}
	c, err := ns.creds.Get(ctx, deployments.AllProjects, project, name)
	if err != nil {
		return "no credential of this name in the project (GET /api/v1/credentials lists them)"
	}
	if ref, err := secrets.ParseRef(c.Ref); err != nil || ref.Scheme != secrets.SchemeVault {
		return "must be a credential with a vault: reference (the scheduler resolves no other kind for a project)"
	}
	return ""
}

// checkRecipients returns what is wrong with an email rule's target, a
// comma-separated list of bare addresses ("" when nothing).
func checkRecipients(target string) string {
	list, err := mail.ParseAddressList(target)
	switch {
	case strings.TrimSpace(target) == "":
		return "give the recipients' addresses, comma-separated"
	case err != nil || hasControl(target):
		return "must be email addresses, comma-separated"
	case len(list) > maxRecipients:
		return fmt.Sprintf("at most %d recipients", maxRecipients)
	}
	for _, a := range list {
		if a.Name != "" {
			return "must be bare addresses (no display names)"
		}
	}
	return ""
}

// checkEmail checks an email rule's sending settings.
func checkEmail(e *Email, credential string, add func(field, msg string)) {
	if e == nil {
		add("email", "give the SMTP server and sender: {\"server\": \"host:port\", \"from\": \"...\"}")
		return
	}
	host, port, err := net.SplitHostPort(e.Server)
	if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 || hasControl(e.Server) || len(e.Server) > 300 {
		add("email.server", "must be host:port")
	}
	if a, err := mail.ParseAddress(e.From); err != nil || a.Name != "" || hasControl(e.From) || len(e.From) > 254 {
		add("email.from", "must be one bare email address")
	}
	switch {
	case len(e.Username) > 200 || hasControl(e.Username):
		add("email.username", "must be at most 200 characters, without control characters")
	case e.Username != "" && credential == "":
		add("credential", "name the credential holding the SMTP password of email.username")
	case e.Username == "" && credential != "":
		add("email.username", "give the user name the password (credential) is for")
	}
}

func hasControl(s string) bool { return strings.ContainsFunc(s, unicode.IsControl) }

const ruleColumns = `id::text, project_id, COALESCE(template_id::text, ''), name, channel, target, credential, email, events, created_at`

func scanRule(row pgx.Row) (*Rule, error) {
	var r Rule
	var email []byte
	if err := row.Scan(&r.ID, &r.ProjectID, &r.TemplateID, &r.Name, &r.Channel, &r.Target, &r.Credential, &email, &r.Events, &r.CreatedAt); err != nil {
		return nil, err
	}
	if r.Channel == ChannelEmail {
		r.Email = new(Email)
		if err := json.Unmarshal(email, r.Email); err != nil {
			return nil, fmt.Errorf("rule %s: %w", r.ID, err)
		}
	}
	return &r, nil
}

// emailJSON is the email column of n.
func emailJSON(n *NewRule) []byte {
	if n.Channel != ChannelEmail || n.Email == nil {
		return []byte(`{}`)
	}
	b, _ := json.Marshal(n.Email)
	return b
}

// CreateRule stores rule n for the API key keyID, which sees v: a
// template's (n.TemplateID, which must be visible) or a project's.
func (ns *Notifications) CreateRule(ctx context.Context, keyID string, v deployments.Visibility, n NewRule) (*Rule, error) {
	project, template, err := ns.validate(ctx, v, &n)
	if err != nil {
		return nil, err
	}
	id, err := uuid.NewV7FromReader(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("new rule id: %w", err)
	}
	_, err = ns.svc.db.Exec(ctx, `INSERT INTO notification_rules (id, project_id, template_id, name, channel, target, credential, email, events, api_key_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		id, project, nullUUID(template), n.Name, n.Channel, n.Target, n.Credential, emailJSON(&n), n.Events, nullUUID(keyID))
	if err := ruleWriteError(err); err != nil {
		return nil, err
	}
	return ns.GetRule(ctx, v, id.String())
}

// UpdateRule replaces rule id (as v sees it) with n; the rule keeps its
// project (and its template unless n names another of the project).
func (ns *Notifications) UpdateRule(ctx context.Context, v deployments.Visibility, id string, n NewRule) (*Rule, error) {
	old, err := ns.GetRule(ctx, v, id)
	if err != nil {
		return nil, err
	}
	if n.TemplateID == "" && n.ProjectID == "" {
		n.ProjectID = old.ProjectID
	}
	project, template, err := ns.validate(ctx, v, &n)
	if err != nil {
		return nil, err
	}
	if project != old.ProjectID {
		return nil, invalid("project_id", "a rule stays in its project")
	}
	_, err = ns.svc.db.Exec(ctx, `UPDATE notification_rules SET template_id = $2, name = $3, channel = $4, target = $5,
		credential = $6, email = $7, events = $8 WHERE id = $1`,
		old.ID, nullUUID(template), n.Name, n.Channel, n.Target, n.Credential, emailJSON(&n), n.Events)
	if err := ruleWriteError(err); err != nil {
		return nil, err
	}
	return ns.GetRule(ctx, v, id)
}

func ruleWriteError(err error) error {
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && pe.Code == "23505":
		return ErrRuleExists
	case err != nil:
		return fmt.Errorf("store notification rule: %w", err)
	}
	return nil
}

// GetRule returns rule id with its recent notifications; one v does not
// see is ErrNotFound.
func (ns *Notifications) GetRule(ctx context.Context, v deployments.Visibility, id string) (*Rule, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, ErrNotFound
	}
	r, err := scanRule(ns.svc.db.QueryRow(ctx, `SELECT `+ruleColumns+` FROM notification_rules WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) || err == nil && !v.Holds(r.ProjectID) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read notification rule: %w", err)
	}
	r.Recent, err = queryAll(ctx, ns.svc.db, `SELECT d.job_id, n.event, n.status, n.state, n.attempts, n.last_error, n.created_at, n.delivered_at
		FROM job_notifications n JOIN deployments d ON d.id = n.deployment_id
		WHERE n.rule_id = $1 ORDER BY n.id DESC LIMIT 20`, []any{r.ID},
		func(row pgx.CollectableRow) (RuleDelivery, error) {
			var d RuleDelivery
			return d, row.Scan(&d.JobID, &d.Event, &d.Status, &d.State, &d.Attempts, &d.LastError, &d.CreatedAt, &d.DeliveredAt)
		})
	if err != nil {
		return nil, fmt.Errorf("read notifications: %w", err)
	}
	return r, nil
}

// ListRules returns the rules v sees: of project, of template (its rules
// and its project's), or all, by project and name.
func (ns *Notifications) ListRules(ctx context.Context, v deployments.Visibility, projectID, templateID string) ([]*Rule, error) {
	q := `SELECT ` + ruleColumns + ` FROM notification_rules WHERE ($1::text IS NULL OR project_id = $1)`
	args := []any{nil}
	switch {
	case templateID != "":
		t, err := ns.svc.Get(ctx, v, templateID, 0)
		if err != nil {
			return nil, err
		}
		args[0] = t.ProjectID
		q += ` AND (template_id IS NULL OR template_id = $2)`
		args = append(args, t.ID)
	case projectID != "":
		p, err := credentials.HeldProject(v, projectID)
		if err != nil {
			return nil, err
		}
		args[0] = p
	}
	if !v.All {
		args = append(args, v.Projects)
		q += fmt.Sprintf(` AND project_id = ANY($%d)`, len(args))
	}
	out, err := queryAll(ctx, ns.svc.db, q+` ORDER BY project_id, name LIMIT 1000`, args,
		func(r pgx.CollectableRow) (*Rule, error) { return scanRule(r) })
	if err != nil {
		return nil, fmt.Errorf("list notification rules: %w", err)
	}
	return out, nil
}

// queryAll runs q and collects its rows with scan.
func queryAll[T any](ctx context.Context, db *pgxpool.Pool, q string, args []any, scan pgx.RowToFunc[T]) ([]T, error) {
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scan)
}

// DeleteRule removes rule id; its notifications not delivered yet are
// dropped with it.
func (ns *Notifications) DeleteRule(ctx context.Context, v deployments.Visibility, id string) error {
	r, err := ns.GetRule(ctx, v, id)
	if err != nil {
		return err
	}
	if _, err := ns.svc.db.Exec(ctx, `DELETE FROM notification_rules WHERE id = $1`, r.ID); err != nil {
		return fmt.Errorf("delete notification rule: %w", err)
	}
	return nil
}
