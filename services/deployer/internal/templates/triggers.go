package templates

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// Trigger launches a template when git hosting calls its URL on a push of
// a branch or a tag that its filters match, with the pushed commit as the
// job's ref, as the API key that made it.
type Trigger struct {
	ID         string   `json:"id"`
	ProjectID  string   `json:"project_id"`
	TemplateID string   `json:"template_id"`
	Name       string   `json:"name"`
	Provider   Provider `json:"provider"`
	// Branches and Tags are the glob patterns (path.Match) of the pushes
	// that launch; both empty: a push of any branch, no tag.
	Branches []string `json:"branches"`
	Tags     []string `json:"tags"`
	// Launch is what each delivery launches with (its ref is the commit).
	Launch Launch `json:"launch"`
	// URL is the path git hosting posts its webhooks to, below the API's
	// address.
	URL string `json:"url"`
	// Secret is the webhook secret to give git hosting: shown only when
	// the trigger is made and when its secret is rotated.
	Secret    string    `json:"secret,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// Recent are the latest deliveries, newest first (GET of one).
	Recent []TriggerDelivery `json:"recent,omitempty"`

	keyID         string
	secretVersion int
}

// TriggerDelivery is one verified webhook a trigger received, and what
// came of it.
type TriggerDelivery struct {
	// Delivery is the provider's delivery id.
	Delivery   string    `json:"delivery,omitempty"`
	Event      string    `json:"event"`
	Ref        string    `json:"ref,omitempty"`
	Commit     string    `json:"commit,omitempty"`
	Outcome    string    `json:"outcome"`
	JobID      string    `json:"job_id,omitempty"`
	Reason     string    `json:"reason,omitempty"`
	ReceivedAt time.Time `json:"received_at"`
}

// The outcomes of a delivery.
const (
	DeliveryLaunched = "launched"
	DeliveryIgnored  = "ignored"
	DeliveryRefused  = "refused"
	deliveryPending  = "pending"
)

// NewTrigger is a trigger to create.
type NewTrigger struct {
	Name     string   `json:"name"`
	Provider Provider `json:"provider"`
	Branches []string `json:"branches,omitempty"`
	Tags     []string `json:"tags,omitempty"`
	Launch   Launch   `json:"launch"`
}

// The errors of the Triggers.
var (
	ErrTriggerExists = errors.New("a trigger of this name exists in the project")
	// ErrNoTriggers: the deployer has no signing key to derive secrets.
	ErrNoTriggers = errors.New("this deployer has no WEBHOOK_SIGNING_KEY: triggers' secrets are derived from it")
	// ErrReplay: the body was delivered before.
	ErrReplay = errors.New("this delivery was received before: a replay is refused")
)

// RefusedError: a verified delivery that cannot launch (the key revoked,
// the launch no longer valid); recorded as refused.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return e.Reason }

// Triggers stores templates' triggers and launches their deliveries.
type Triggers struct {
	svc        *Service
	sub        Submitter
	keys       Keys
	signingKey []byte
	// stale is how long a delivery may stay pending (its launch cut short)
	// before a redelivery of it launches again.
	stale time.Duration
}

// NewTriggers returns the Triggers of svc's templates, launching with sub
// as keys' keys; a trigger's secret is derived from signingKey (nil:
// triggers are refused, ErrNoTriggers).
func NewTriggers(svc *Service, sub Submitter, keys Keys, signingKey []byte) *Triggers {
	return &Triggers{svc: svc, sub: sub, keys: keys, signingKey: signingKey, stale: time.Minute}
}

// secret is trigger id's webhook secret at version: derived, never stored.
func (t *Triggers) secret(id string, version int) string {
	m := hmac.New(sha256.New, t.signingKey)
	m.Write([]byte("autoprov-trigger-secret:" + id + ":" + strconv.Itoa(version)))
	return "trg_" + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func hookURL(id string) string { return "/api/v1/hooks/" + id }

// checkPatterns adds a problem for each bad glob of field.
func checkPatterns(field string, list []string, add func(field, msg string)) {
	if len(list) > 20 {
		add(field, "at most 20 patterns")
	}
	for i, p := range list {
		if _, err := path.Match(p, ""); err != nil || p == "" || len(p) > 200 {
			add(fmt.Sprintf("%s[%d]", field, i), "must be a glob pattern (path.Match) of 1-200 characters")
		}
	}
}

// CreateTrigger stores a trigger of template templateID (as v sees it)
// that launches as the API key keyID, and returns it with its secret. The
// template must ask for the ref on launch: the trigger passes the pushed
// commit.
func (t *Triggers) CreateTrigger(ctx context.Context, keyID string, v deployments.Visibility, templateID string, n NewTrigger) (*Trigger, error) {
	if t.signingKey == nil {
		return nil, ErrNoTriggers
	}
	tpl, err := t.svc.Get(ctx, v, templateID, n.Launch.Version)
	if err != nil {
		return nil, err
	}
	var fields []deployments.FieldError
	add := func(field, msg string) { fields = append(fields, deployments.FieldError{Field: field, Message: msg}) }
	if !NameRE.MatchString(n.Name) {
		add("name", "must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
	}
	if !n.Provider.Valid() {
		add("provider", "must be github, gitlab or gitea")
	}
	checkPatterns("branches", n.Branches, add)
	checkPatterns("tags", n.Tags, add)
	if !tpl.Ask.Ref {
		add("template", "the template must ask for the ref on launch (ask_on_launch.ref): a trigger launches the pushed commit")
	}
	if n.Launch.Ref != "" {
		add("launch.ref", "is the pushed commit: a trigger cannot fix it")
	}
	if err := checkStoredLaunch(tpl, n.Launch, "trigger", add); err != nil {
		return nil, err
	}
	if len(fields) > 0 {
		return nil, &deployments.InvalidError{Fields: fields}
	}
	id, launch, err := newStored(n.Launch)
	if err != nil {
		return nil, err
	}
	_, err = t.svc.db.Exec(ctx, `INSERT INTO job_triggers (id, project_id, template_id, name, provider, branches, tags, launch, api_key_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		id, tpl.ProjectID, tpl.ID, n.Name, string(n.Provider), orNone(n.Branches), orNone(n.Tags), launch, nullUUID(keyID))
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" {
		return nil, ErrTriggerExists
	}
	if err != nil {
		return nil, fmt.Errorf("store trigger: %w", err)
	}
	tr, err := t.GetTrigger(ctx, v, id.String())
	if err != nil {
		return nil, err
	}
	tr.Secret = t.secret(tr.ID, tr.secretVersion)
	return tr, nil
}

// checkStoredLaunch adds the problems of l, a launch a schedule or a
// trigger (owner) stores, against template t: what the launch refuses,
// and any secret answer (it would be stored).
func checkStoredLaunch(t *Template, l Launch, owner string, add func(field, msg string)) error {
	_, hidden, err := Request(t, l)
	wipe(hidden)
	var ie *deployments.InvalidError
	switch {
	case errors.As(err, &ie):
		for _, f := range ie.Fields {
			add("launch."+f.Field, f.Message)
		}
	case err != nil:
		return err
	case len(hidden) > 0:
		add("launch.survey", "a "+owner+" cannot hold a secret answer: it would be stored")
	}
	return nil
}

// newStored returns a new id and l encoded, for a schedule or a trigger.
func newStored(l Launch) (uuid.UUID, []byte, error) {
	id, err := uuid.NewV7FromReader(rand.Reader)
	if err != nil {
		return id, nil, fmt.Errorf("new id: %w", err)
	}
	launch, err := json.Marshal(l)
	if err != nil {
		return id, nil, fmt.Errorf("encode the launch: %w", err)
	}
	return id, launch, nil
}

func orNone(list []string) []string {
	if list == nil {
		return []string{}
	}
	return list
}

const triggerColumns = `id::text, project_id, template_id::text, name, provider, branches, tags, launch, secret_version,
	COALESCE(api_key_id::text, ''), created_at`

func scanTrigger(row pgx.Row) (*Trigger, error) {
	var tr Trigger
	var launch []byte
	if err := row.Scan(&tr.ID, &tr.ProjectID, &tr.TemplateID, &tr.Name, &tr.Provider, &tr.Branches, &tr.Tags, &launch,
		&tr.secretVersion, &tr.keyID, &tr.CreatedAt); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(launch, &tr.Launch); err != nil {
		return nil, fmt.Errorf("trigger %s: %w", tr.ID, err)
	}
	tr.URL = hookURL(tr.ID)
	return &tr, nil
}

// trigger reads trigger id, whoever holds it.
func (t *Triggers) trigger(ctx context.Context, id string) (*Trigger, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, ErrNotFound
	}
	tr, err := scanTrigger(t.svc.db.QueryRow(ctx, `SELECT `+triggerColumns+` FROM job_triggers WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read trigger: %w", err)
	}
	return tr, nil
}

// GetTrigger returns trigger id with its recent deliveries; one v does
// not see is ErrNotFound.
func (t *Triggers) GetTrigger(ctx context.Context, v deployments.Visibility, id string) (*Trigger, error) {
	tr, err := t.trigger(ctx, id)
	if err != nil {
		return nil, err
	}
	if !v.Holds(tr.ProjectID) {
		return nil, ErrNotFound
	}
	rows, err := t.svc.db.Query(ctx, `SELECT delivery_id, event, ref, commit, outcome, COALESCE(job_id::text, ''), reason, received_at
		FROM trigger_deliveries WHERE trigger_id = $1 ORDER BY received_at DESC LIMIT 20`, id)
	if err != nil {
		return nil, fmt.Errorf("read deliveries: %w", err)
	}
	tr.Recent, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (TriggerDelivery, error) {
		var d TriggerDelivery
		return d, r.Scan(&d.Delivery, &d.Event, &d.Ref, &d.Commit, &d.Outcome, &d.JobID, &d.Reason, &d.ReceivedAt)
	})
	if err != nil {
		return nil, fmt.Errorf("read deliveries: %w", err)
	}
	return tr, nil
}

// ListTriggers returns the triggers of template templateID.
func (t *Triggers) ListTriggers(ctx context.Context, v deployments.Visibility, templateID string) ([]*Trigger, error) {
	if _, err := t.svc.Get(ctx, v, templateID, 0); err != nil {
		return nil, err
	}
	rows, err := t.svc.db.Query(ctx, `SELECT `+triggerColumns+` FROM job_triggers WHERE template_id = $1 ORDER BY name LIMIT 1000`, templateID)
	if err != nil {
		return nil, fmt.Errorf("list triggers: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Trigger, error) { return scanTrigger(r) })
	if err != nil {
		return nil, fmt.Errorf("list triggers: %w", err)
	}
	return out, nil
}

// RotateSecret gives trigger id a new secret (the old one stops
// verifying at once) and returns the trigger with it.
func (t *Triggers) RotateSecret(ctx context.Context, v deployments.Visibility, id string) (*Trigger, error) {
	if t.signingKey == nil {
		return nil, ErrNoTriggers
	}
	tr, err := t.GetTrigger(ctx, v, id)
	if err != nil {
		return nil, err
	}
	if err := t.svc.db.QueryRow(ctx, `UPDATE job_triggers SET secret_version = secret_version + 1 WHERE id = $1
		RETURNING secret_version`, tr.ID).Scan(&tr.secretVersion); err != nil {
		return nil, fmt.Errorf("rotate the trigger's secret: %w", err)
	}
	tr.Secret = t.secret(tr.ID, tr.secretVersion)
	return tr, nil
}

// DeleteTrigger removes trigger id and its deliveries (the jobs they
// launched stay).
func (t *Triggers) DeleteTrigger(ctx context.Context, v deployments.Visibility, id string) error {
	tr, err := t.GetTrigger(ctx, v, id)
	if err != nil {
		return err
	}
	if _, err := t.svc.db.Exec(ctx, `DELETE FROM job_triggers WHERE id = $1`, tr.ID); err != nil {
		return fmt.Errorf("delete trigger: %w", err)
	}
	return nil
}

// matches reports whether push is one tr launches for, or why not.
func (tr *Trigger) matches(push Push) (bool, string) {
	match := func(patterns []string, name string) bool {
		for _, p := range patterns {
			if ok, _ := path.Match(p, name); ok {
				return true
			}
		}
		return false
	}
	switch {
	case push.Commit == "":
		return false, "the ref " + push.Ref + " was deleted"
	case push.Tag != "" && !match(tr.Tags, push.Tag):
		return false, "the tag " + push.Tag + " matches no pattern of tags"
	case push.Branch != "" && len(tr.Branches) == 0 && len(tr.Tags) > 0:
		return false, "the trigger launches on tags only"
	case push.Branch != "" && len(tr.Branches) > 0 && !match(tr.Branches, push.Branch):
		return false, "the branch " + push.Branch + " matches no pattern of branches"
	}
	return true, ""
}

// Deliver handles a webhook posted to trigger id: it verifies it with the
// trigger's secret as its provider signs, and launches the template on
// the pushed commit when the filters match. The first delivery of a body
// launches once: its job's Idempotency-Key names the body, and the body
// seen again is ErrReplay. Errors: ErrNotFound, ErrNoTriggers,
// ErrBadSignature, ErrReplay, a *RefusedError (recorded), an error saying
// why the body is not a push, or one that passes (nothing recorded: the
// provider's retry launches).
func (t *Triggers) Deliver(ctx context.Context, id string, h http.Header, body []byte) (*TriggerDelivery, error) {
	if t.signingKey == nil {
		return nil, ErrNoTriggers
	}
	tr, err := t.trigger(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := verify(tr.Provider, t.secret(tr.ID, tr.secretVersion), h, body); err != nil {
		return nil, err
	}
	push, err := parsePush(tr.Provider, h, body)
	if err != nil {
		return nil, &BadPushError{err}
	}
	d := &TriggerDelivery{Delivery: push.Delivery, Event: push.Event, Ref: push.Ref, Commit: push.Commit, ReceivedAt: time.Now()}
	if push.Ping {
		d.Outcome, d.Reason = DeliveryIgnored, "a ping: the trigger is reachable and its secret matches"
		return d, nil
	}
	digest := sha256.Sum256(body)
	ok, why := tr.matches(push)
	if !ok {
		d.Outcome, d.Reason = DeliveryIgnored, why
		return d, t.ignore(ctx, tr.ID, digest[:], d)
	}
	d.Outcome = deliveryPending
	claimed, err := t.claim(ctx, tr.ID, digest[:], d)
	if err != nil || !claimed {
		return nil, err
	}
	jobID, refusal, err := t.launch(ctx, tr, push, digest[:])
	switch {
	case err != nil:
		// Passing: forget the claim, so that the provider's retry launches.
		if _, derr := t.svc.db.Exec(context.WithoutCancel(ctx), `DELETE FROM trigger_deliveries
			WHERE trigger_id = $1 AND digest = $2 AND outcome = 'pending'`, tr.ID, digest[:]); derr != nil {
			return nil, errors.Join(err, derr)
		}
		return nil, err
	case refusal != "":
		d.Outcome, d.Reason = DeliveryRefused, refusal
	default:
		d.Outcome, d.JobID = DeliveryLaunched, jobID
	}
	if err := t.finish(ctx, tr.ID, digest[:], d); err != nil {
		return nil, err
	}
	if refusal != "" {
		return d, &RefusedError{Reason: refusal}
	}
	return d, nil
}

// BadPushError: a verified webhook that is not a push (another event, a
// body that does not parse).
type BadPushError struct{ Err error }

func (e *BadPushError) Error() string { return e.Err.Error() }

func (e *BadPushError) Unwrap() error { return e.Err }

// claim records d as pending; false with ErrReplay when the body was
// delivered before, unless its launch was cut short long ago (then the
// claim is taken over and launches again, under the same Idempotency-Key).
func (t *Triggers) claim(ctx context.Context, triggerID string, digest []byte, d *TriggerDelivery) (bool, error) {
	tag, err := t.svc.db.Exec(ctx, `INSERT INTO trigger_deliveries (trigger_id, digest, delivery_id, event, ref, commit, outcome)
		VALUES ($1, $2, $3, $4, $5, $6, 'pending') ON CONFLICT DO NOTHING`,
		triggerID, digest, d.Delivery, d.Event, d.Ref, d.Commit)
	if err != nil {
		return false, fmt.Errorf("record the delivery: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return true, nil
	}
	tag, err = t.svc.db.Exec(ctx, `UPDATE trigger_deliveries SET received_at = now()
		WHERE trigger_id = $1 AND digest = $2 AND outcome = 'pending' AND received_at < now() - $3::interval`,
		triggerID, digest, t.stale.String())
	if err != nil {
		return false, fmt.Errorf("record the delivery: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return true, nil
	}
	return false, ErrReplay
}

// ignore records d, a delivery that launches nothing; a body seen
// before keeps its first record.
func (t *Triggers) ignore(ctx context.Context, triggerID string, digest []byte, d *TriggerDelivery) error {
	if _, err := t.svc.db.Exec(ctx, `INSERT INTO trigger_deliveries (trigger_id, digest, delivery_id, event, ref, commit, outcome, reason)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING`,
		triggerID, digest, d.Delivery, d.Event, d.Ref, d.Commit, d.Outcome, truncate(d.Reason, 1000)); err != nil {
		return fmt.Errorf("record the delivery: %w", err)
	}
	return nil
}

// finish records the outcome of d, a claimed delivery.
func (t *Triggers) finish(ctx context.Context, triggerID string, digest []byte, d *TriggerDelivery) error {
	if _, err := t.svc.db.Exec(ctx, `UPDATE trigger_deliveries SET outcome = $3, job_id = NULLIF($4, '')::uuid, reason = $5
		WHERE trigger_id = $1 AND digest = $2`, triggerID, digest, d.Outcome, d.JobID, truncate(d.Reason, 1000)); err != nil {
		return fmt.Errorf("record the delivery: %w", err)
	}
	return nil
}

// launch launches tr's template on push's commit as tr's key: the job's
// id, or why it is refused for good, or an error that passes.
func (t *Triggers) launch(ctx context.Context, tr *Trigger, push Push, digest []byte) (string, string, error) {
	key, refusal, err := launchKey(ctx, t.keys, nil, tr.keyID, tr.ProjectID, "trigger")
	if refusal != "" || err != nil {
		return "", refusal, err
	}
	l := tr.Launch
	l.Ref = push.Commit
	// From the body only: a redelivery under another delivery id is the
	// same request to the Idempotency-Key.
	l.CorrelationID = "trigger:" + tr.Name + ":" + push.Commit[:12]
	idem := "trigger:" + tr.ID + ":" + hex.EncodeToString(digest)
	sub, err := t.svc.Launch(ctx, t.sub, key.ID, deployments.Visibility{Projects: []string{tr.ProjectID}}, tr.TemplateID, l, idem)
	if refusal, err := launchRefusal(err); refusal != "" || err != nil {
		return "", refusal, err
	}
	return sub.Deployment.ID, "", nil
}
