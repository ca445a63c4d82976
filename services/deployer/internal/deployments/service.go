package deployments

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/webhooks"
)

// Streams names the streams the deployer uses; tests give their own.
type Streams struct {
	Queue   string // AnsibleDeployMessage requests
	Results string // AnsibleDeployResult results
	// JobQueue is the default pool's stream of AnsibleJobMessage requests
	// (pool p: JobQueue + ":" + p); JobResults the AnsibleJobResult
	// results. Empty: the wire contract's.
	JobQueue   string
	JobResults string
}

// DefaultStreams are the wire contract's streams.
func DefaultStreams() Streams {
	return Streams{Queue: messages.StreamAnsibleDeployQueue, Results: messages.StreamDeployResults,
		JobQueue: messages.StreamAnsibleJobQueue, JobResults: messages.StreamJobResults}
}

// Config configures a Service.
type Config struct {
	Streams Streams
	// CancelTTL is the expiry of a cancel key. Default 24h.
	CancelTTL time.Duration
	// WebhookRetryFor bounds how long a webhook is retried. Default 24h.
	WebhookRetryFor time.Duration
	// CheckCallback validates a callback URL (webhooks.Guard.CheckURL);
	// nil means webhooks are disabled and callback_url is refused.
	CheckCallback func(string) error
	// OnWebhook is called after a webhook was queued (to wake the
	// deliverer).
	OnWebhook func()
	// PollInterval is how often waiters re-check the database besides
	// notifications. Default 2s.
	PollInterval time.Duration
	// IdempotencyTTL is how long an Idempotency-Key is remembered: a
	// request repeating a key after it makes a new deployment (and Prune
	// deletes the key). 0: as long as the key's deployment is kept.
	IdempotencyTTL time.Duration
	// Tracing makes a producer span per submitted deployment, whose
	// context its request carries (package tracing); nil: none.
	Tracing trace.TracerProvider
	// SecretRefs checks the secret references of a submitted request
	// against the project's templates (DEPLOY_SECRET_REFS, as infra does),
	// so that a refused reference never reaches the queue; nil leaves the
	// check to infra alone.
	SecretRefs *authz.Authorizer
	// Pools grants the named job pools to projects (JOB_POOL_PROJECTS, as
	// infra reads it): a job naming a pool its project may not use is
	// refused at submit. The zero value grants no named pool.
	Pools authz.Pools
	// Special refuses an inline inventory's host at a literal special
	// address (loopback, link-local, metadata, ...; SPECIAL_ALLOW_NETWORKS
	// as infra reads it) at submit, naming the field; infra refuses it
	// anyway, but only as "did not answer SSH". nil: infra alone.
	Special interface{ Check(address string) error }
	// Credentials resolves the credential fields of a job (a stored
	// credential's name, or a reference checked against the project's
	// templates); nil: references only, checked with SecretRefs.
	Credentials CredentialResolver
}

// CredentialResolver turns a credential field's name or reference into
// the reference to publish; field problems are *InvalidError.
type CredentialResolver interface {
	Resolve(ctx context.Context, projectID, field, nameOrRef string) (string, error)
}

// Service is the deployments' domain logic.
type Service struct {
	db       *pgxpool.Pool
	jobs     *stream.Jobs // the jobs' progress streams and cancel keys
	notifier *Notifier
	cfg      Config
	log      zerolog.Logger
	now      func() time.Time
	metrics  *metrics
	// publisher stores (in groups) and publishes submits (package
	// publishing).
	publisher Publisher
}

// Publisher puts submitted deployments on the request queue; the package
// publishing implements it (group commit, publish marks, republisher).
type Publisher interface {
	// Commit stores row and publishes data, its encoded request, and
	// returns the queue entry id ("" when publishing failed: the
	// republisher publishes it later). An error is the store's: the
	// deployment was not stored.
	Commit(row *Row, data []byte) (entry string, err error)
	// PublishStored publishes the request of deployment id, stored
	// already, and returns its entry id, recorded as published; "" when
	// publishing failed (logged: the republisher publishes it later).
	PublishStored(ctx context.Context, id string, msg *messages.AnsibleDeployMessage) string
	// PublishStoredTo is PublishStored of an encoded request to queue.
	PublishStoredTo(ctx context.Context, id, queue string, data []byte) string
	// PublishStoredBatch is PublishStoredTo of many in one round trip:
	// the entry ids in order, all "" when publishing failed.
	PublishStoredBatch(ctx context.Context, ids []string, queue string, data [][]byte) []string
}

// New returns a Service.
func New(db *pgxpool.Pool, jobs *stream.Jobs, publisher Publisher, notifier *Notifier,
	cfg Config, log zerolog.Logger, reg prometheus.Registerer) (*Service, error) {
	if cfg.Streams == (Streams{}) {
		cfg.Streams = DefaultStreams()
	}
	if cfg.Streams.JobQueue == "" {
		cfg.Streams.JobQueue = messages.StreamAnsibleJobQueue
	}
	if cfg.Streams.JobResults == "" {
		cfg.Streams.JobResults = messages.StreamJobResults
	}
	if cfg.CancelTTL <= 0 {
		cfg.CancelTTL = 24 * time.Hour
	}
	if cfg.WebhookRetryFor <= 0 {
		cfg.WebhookRetryFor = 24 * time.Hour
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 2 * time.Second
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Service{db: db, jobs: jobs, publisher: publisher, notifier: notifier, cfg: cfg,
		log: log.With().Str("component", "deployments").Logger(), now: time.Now, metrics: m}, nil
}

// Notifier returns the service's notifier.
func (s *Service) Notifier() *Notifier { return s.notifier }

// InvalidError lists the problems of a request.
type InvalidError struct {
	Fields []FieldError
}

func (e *InvalidError) Error() string {
	if len(e.Fields) == 1 {
		return "invalid request: " + e.Fields[0].Field + ": " + e.Fields[0].Message
	}
	return fmt.Sprintf("invalid request: %d problems", len(e.Fields))
}

// ErrForbiddenProject: the request is for a project its API key does not
// hold.
var ErrForbiddenProject = errors.New("the API key does not hold the request's project")

// ErrIdempotencyMismatch: an Idempotency-Key was used before with another
// request.
var ErrIdempotencyMismatch = errors.New("this Idempotency-Key was used with a different request")

// toMessage validates r by the wire contract's rules (through the wire
// decoder itself, which also normalises: lower-case project id, canonical
// address, default branch), refuses a project outside v
// (ErrForbiddenProject) and secret references outside the project's
// templates, and returns the message to publish.
func (s *Service) toMessage(ctx context.Context, r *Request, v Visibility, jobID string, at time.Time) (*messages.AnsibleDeployMessage, error) {
	m := DeployMessage(r, jobID, at)
	var fields []FieldError
	data, err := messages.Encode(m)
	if err == nil {
		m, err = messages.DecodeAnsibleDeployMessage(data)
	}
	if err != nil {
		wf, err := wireFields(err, apiField)
		if err != nil {
			return nil, err
		}
		fields = append(fields, wf...)
	}
	// A valid project id is checked before anything else is said about
	// the request: a project the key does not hold is refused as such.
	project, validProject := messages.CanonicalProjectID(r.ProjectID)
	if validProject && !v.Holds(project) {
		return nil, ErrForbiddenProject
	}
	if validProject && s.cfg.SecretRefs != nil {
		for _, ref := range []struct{ field, value string }{
			{"github_token_ref", r.GitHubTokenRef}, {"secrets_ref", r.SecretsRef},
		} {
			if ref.value == "" || slices.ContainsFunc(fields, func(f FieldError) bool { return f.Field == ref.field }) {
				continue
			}
			// The service's own credentials are infra's to guard (it
			// knows them); the templates are the same on both sides.
			if _, err := s.cfg.SecretRefs.Ref(project, ref.field, ref.value, nil); err != nil {
				var re *authz.RefError
				msg := "this reference is not allowed"
				if errors.As(err, &re) {
					msg = "refused: " + re.Reason
				}
				fields = append(fields, FieldError{Field: ref.field, Message: msg})
			}
		}
	}
	if validProject && !slices.ContainsFunc(fields, func(f FieldError) bool { return f.Field == "server_ip" }) {
		// A registered server belongs to projects: another's (or the
		// fleet's) is refused before anything is stored.
		f, err := s.deployOwnership(ctx, v, project, r.ServerIP)
		if err != nil {
			return nil, err
		}
		if f != nil {
			fields = append(fields, *f)
		}
	}
	if r.Options.CallbackURL != "" {
		switch {
		case s.cfg.CheckCallback == nil:
			fields = append(fields, FieldError{Field: "options.callback_url",
				Message: "webhooks are disabled on this deployer (WEBHOOK_SIGNING_KEY is not set)"})
		default:
			if err := s.cfg.CheckCallback(r.Options.CallbackURL); err != nil {
				fields = append(fields, FieldError{Field: "options.callback_url", Message: err.Error()})
			}
		}
	}
	if len(fields) > 0 {
		return nil, &InvalidError{Fields: fields}
	}
	return m, nil
}

// apiField maps a wire key to the request's JSON path.
func apiField(wire string) string {
	if wire == "timeout_seconds" {
		return "options.timeout_seconds"
	}
	return wire
}

// Submission is what Submit did.
type Submission struct {
	Deployment *Deployment
	// Replayed is true when an Idempotency-Key matched an earlier request:
	// nothing new was stored or published.
	Replayed bool
}

// Submit validates, stores and publishes a deployment made with the API
// key keyID, which sees v: a request for another project is
// ErrForbiddenProject, refused before anything is stored or published. With an idempotencyKey, a request repeated with the same key
// (also concurrently) returns the first one's deployment and publishes
// nothing; the same key with a different request is ErrIdempotencyMismatch.
func (s *Service) Submit(ctx context.Context, keyID string, v Visibility, r Request, idempotencyKey string) (*Submission, error) {
	id, err := uuid.NewV7FromReader(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("new deployment id: %w", err)
	}
	now := s.now()
	msg, err := s.toMessage(ctx, &r, v, id.String(), now)
	if err != nil {
		return nil, err
	}
	// Store what the wire carries: normalised values.
	r.ProjectID, r.Branch, r.ServerIP, r.Modules = msg.ProjectID, msg.Branch, msg.ServerIP, msg.Modules
	// The request carries the context of its producer span, a child of the
	// HTTP request's trace context when the client sent one; the span ends
	// once the request is stored and published (or left to the
	// republisher, whose copy carries a trace of its own: see
	// the package publishing).
	sctx, span := tracing.StartPublish(ctx, s.cfg.Tracing, s.cfg.Streams.Queue,
		attribute.String("autoprov.deployment_id", id.String()))
	defer span.End()
	msg.TraceContext = tracing.Inject(sctx)

	row := Row{ID: id.String(), KeyID: keyID, ProjectID: r.ProjectID, RepoFullName: r.RepoFullName,
		Branch: r.Branch, ServerIP: r.ServerIP, Port: r.Port, Modules: r.Modules, GitHubTokenRef: r.GitHubTokenRef,
		SecretsRef: r.SecretsRef, CorrelationID: r.CorrelationID, TimeoutSeconds: r.Options.TimeoutSeconds,
		CallbackURL: r.Options.CallbackURL, CreatedAt: now}
	var existing, entry string
	published := false
	if idempotencyKey == "" {
		// The common case: stored and published with the submits of the
		// same moment (see the package publishing's committer).
		data, eerr := messages.Encode(msg)
		if eerr != nil {
			return nil, fmt.Errorf("encode deployment request: %w", eerr)
		}
		entry, err = s.publisher.Commit(&row, data)
		published = true
	} else {
		existing, err = s.storeWithKey(ctx, &row, idempotencyKey, requestHash(&r))
	}
	if errors.Is(err, ErrIdempotencyMismatch) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("store deployment: %w", err)
	}
	if existing != "" {
		return s.replay(ctx, v, existing)
	}
	if !published {
		entry = s.publisher.PublishStored(ctx, id.String(), msg)
	}
	s.metrics.submitted.WithLabelValues("new").Inc()
	// request_id is the queue entry, as a later GET (or a replay of the
	// Idempotency-Key) shows it; "" when publishing waits for the
	// republisher.
	d := &Deployment{ID: id.String(), JobID: id.String(), Source: "api", Status: StatusQueued, Request: r, RequestID: entry,
		CreatedAt: now.UTC().Truncate(time.Microsecond), Links: linksFor(id.String(), KindDeploy), Kind: KindDeploy, apiKeyID: keyID}
	if r.Options.CallbackURL != "" {
		d.Request.Options.CallbackURL = webhooks.RedactURL(r.Options.CallbackURL)
	}
	return &Submission{Deployment: d}, nil
}

// replay answers a request whose Idempotency-Key found deployment id.
func (s *Service) replay(ctx context.Context, v Visibility, id string) (*Submission, error) {
	// The request, whose project v holds, equals the first one (same
	// hash): the deployment found is of that project too. GetFor keeps it
	// so should the key have been narrowed since.
	d, err := s.GetFor(ctx, v, id)
	if err != nil {
		return nil, err
	}
	s.metrics.submitted.WithLabelValues("replayed").Inc()
	return &Submission{Deployment: d, Replayed: true}, nil
}

// storeWithKey stores row with the Idempotency-Key idempotencyKey of its
// API key, unless the key was used before: then it returns the id of the
// deployment it made (ErrIdempotencyMismatch when with another request,
// whose hash differs).
func (s *Service) storeWithKey(ctx context.Context, row *Row, idempotencyKey string, hash []byte) (string, error) {
	keyID, id := row.KeyID, row.ID
	var existing string
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		// Concurrent retries with one key queue up on this lock; the
		// first stores the deployment, the others find it.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, idemLockKey(keyID, idempotencyKey)); err != nil {
			return err
		}
		// A key older than IdempotencyTTL counts as unused (Prune
		// deletes it in time; the INSERT below replaces it).
		var prevHash []byte
		err := tx.QueryRow(ctx, `SELECT request_hash, deployment_id::text FROM idempotency_keys
				WHERE api_key_id = $1 AND key = $2 AND ($3::interval IS NULL OR created_at >= now() - $3::interval)`,
			keyID, idempotencyKey, s.idempotencyTTL()).Scan(&prevHash, &existing)
		switch {
		case err == nil:
			if string(prevHash) != string(hash) {
				return ErrIdempotencyMismatch
			}
			return nil
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		if err := InsertRow(ctx, tx, row, "", 0); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO idempotency_keys (api_key_id, key, request_hash, deployment_id) VALUES ($1, $2, $3, $4)
				ON CONFLICT (api_key_id, key) DO UPDATE
				SET request_hash = EXCLUDED.request_hash, deployment_id = EXCLUDED.deployment_id, created_at = now()`,
			keyID, idempotencyKey, hash, id)
		return err
	})
	return existing, err
}

// idempotencyTTL is IdempotencyTTL as a query argument: nil when keys do
// not expire.
func (s *Service) idempotencyTTL() any {
	if s.cfg.IdempotencyTTL <= 0 {
		return nil
	}
	return s.cfg.IdempotencyTTL
}

// requestHash is the hash of a request (a Request or a JobRequest) that
// tells an Idempotency-Key's retry from another request.
func requestHash(r any) []byte {
	sum := sha256.Sum256(mustJSON(r))
	return sum[:]
}

func idemLockKey(keyID, idemKey string) int64 {
	return store.AdvisoryKey("idempotency:" + keyID + ":" + idemKey)
}

func nullUUID(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// Get returns the deployment with id: its UUID, or else its job id (so
// that a producer that knows only the job id it put on the queue finds it).
// It sees every project: callers acting for an API key use GetFor.
func (s *Service) Get(ctx context.Context, id string) (*Deployment, error) {
	return s.GetFor(ctx, AllProjects, id)
}

// GetFor is Get limited to v: a deployment of another project is
// ErrNotFound, exactly as an unknown id.
func (s *Service) GetFor(ctx context.Context, v Visibility, id string) (*Deployment, error) {
	cond, arg := v.clause()
	args := []any{id}
	if arg != nil {
		args = append(args, arg)
	}
	switch {
	case arg != nil:
		cond = " AND " + strings.Replace(cond, "?", "$2", 1)
	case cond != "":
		cond = " AND " + cond
	}
	if _, err := uuid.Parse(id); err == nil {
		d, err := getDeployment(ctx, s.db, "d.id = $1"+cond, args...)
		if !errors.Is(err, ErrNotFound) {
			return d, err
		}
	}
	if !jobIDRE.MatchString(id) {
		return nil, ErrNotFound
	}
	return getDeployment(ctx, s.db, "d.job_id = $1"+cond, args...)
}

// jobIDRE is the wire contract's shape of a job id.
var jobIDRE = regexp.MustCompile(`^[!-~]{1,255}$`)

// GetWithProgress returns the deployment (within v) with its progress from
// the job's event stream.
func (s *Service) GetWithProgress(ctx context.Context, v Visibility, id string) (*Deployment, error) {
	d, err := s.GetFor(ctx, v, id)
	if err != nil {
		return nil, err
	}
	p, err := readProgress(ctx, s.jobs, d.ProgressKind(), d.JobID)
	if err != nil {
		s.log.Warn().Err(err).Str("deployment_id", id).Msg("read progress")
	}
	d.Progress = p
	if d.StartedAt == nil && p != nil && p.Events > 0 && d.Status == StatusQueued {
		d.Status = StatusRunning
	}
	return d, nil
}

// List returns a page of deployments, newest first.
func (s *Service) List(ctx context.Context, f Filter) (*Page, error) {
	return list(ctx, s.db, f)
}

// Wait waits until the deployment is final or ctx is done, and returns its
// latest state (final or not).
func (s *Service) Wait(ctx context.Context, id string) (*Deployment, error) {
	d, err := s.Get(ctx, id)
	if err != nil || d.Status.Terminal() {
		return d, err
	}
	ch, stop := s.notifier.Watch(d.JobID)
	defer stop()
	// It may have ended between the first read and the Watch, whose
	// notification is then gone: read once more.
	if d, err = s.Get(ctx, id); err != nil || d.Status.Terminal() {
		return d, err
	}
	t := time.NewTicker(s.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			latest, err := s.Get(context.WithoutCancel(ctx), id)
			if err != nil {
				return d, nil
			}
			return latest, nil
		case <-ch:
		case <-t.C:
		}
		latest, err := s.Get(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			return nil, err
		}
		d = latest
		if d.Status.Terminal() {
			return d, nil
		}
	}
}

// ErrFinished: the deployment has already ended.
var ErrFinished = errors.New("deployment already finished")

// CancelOutcome says what Cancel did.
type CancelOutcome int

// The outcomes of Cancel.
const (
	// CancelledBeforeStart: the job had not started and never will.
	CancelledBeforeStart CancelOutcome = iota + 1
	// CancelRequested: the job runs; it was asked to stop and will end
	// cancelled (or with the outcome it reached first).
	CancelRequested
)

// Cancel cancels a deployment. A job that has not started is marked
// cancelled at once, atomically with infra's run record (a done run with
// a cancelled result, so infra publishes that result instead of running
// it); a running job gets its cancel key set. A finished one is
// ErrFinished, returned with the deployment. A deployment outside v is
// ErrNotFound.
func (s *Service) Cancel(ctx context.Context, v Visibility, id string) (*Deployment, CancelOutcome, error) {
	d, err := s.GetFor(ctx, v, id)
	if err != nil {
		return nil, 0, err
	}
	// From here on the deployment found is named by its own id: a job id
	// given as id could name another deployment's id too.
	id = d.ID
	if d.Status.Terminal() {
		return d, 0, ErrFinished
	}
	o := messages.Outcome{
		SchemaVersion: messages.SchemaVersion, JobID: d.JobID, RequestID: d.RequestID,
		CorrelationID: d.Request.CorrelationID, Attempt: 1,
	}
	if o.RequestID == "" {
		o.RequestID = "0-0" // never published: there is no entry
	}
	o.Fail(messages.StatusCancelled, messages.KindCancelled, "cancelled before it started")
	now := s.now()
	o.SetTimes(now, now)
	// The run record holds the result infra publishes instead of running
	// the job: of the job's kind.
	rec := outcome{kind: KindDeploy, o: &o, res: resultFrom(&o), projectID: d.Request.ProjectID,
		serverIP: d.Request.ServerIP, port: d.Request.Port}
	var wire any = &messages.AnsibleDeployResult{Outcome: o, ProjectID: d.Request.ProjectID, ServerIP: d.Request.ServerIP, Port: d.Request.Port}
	runKind, queue, target := messages.JobKindDeploy, s.cfg.Streams.Queue, "address:"+d.Request.ServerIP
	if d.Kind == KindJob {
		rec = outcome{kind: KindJob, o: &o, res: resultFrom(&o), projectID: d.Request.ProjectID}
		wire = &messages.AnsibleJobResult{Outcome: o, ProjectID: d.Request.ProjectID}
		runKind, queue, target = messages.JobKindJob, cmp.Or(d.queue, s.cfg.Streams.JobQueue), "job:"+d.JobID
	}
	data, err := messages.Encode(wire)
	if err != nil {
		return nil, 0, fmt.Errorf("encode cancelled result: %w", err)
	}
	var inserted bool
	var runState string
	var runResult []byte
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `
			INSERT INTO runs (job_id, kind, stream, request_id, target, state, status, error_kind, result, started_at, finished_at)
			VALUES ($1, $6, $2, $3, $4, 'done', 'cancelled', 'cancelled', $5, now(), now())
			ON CONFLICT (job_id) DO NOTHING`,
			d.JobID, queue, o.RequestID, target, data, string(runKind))
		if err != nil {
			return err
		}
		if inserted = tag.RowsAffected() == 1; inserted {
			// A job waiting for busy servers leaves their lines now,
			// not when its place goes stale: the runs behind it go on.
			if err := store.LeaveLines(ctx, tx, d.JobID); err != nil {
				return err
			}
			_, err := s.recordResult(ctx, tx, rec)
			return err
		}
		return tx.QueryRow(ctx, `SELECT state, result FROM runs WHERE job_id = $1`, d.JobID).Scan(&runState, &runResult)
	})
	if err != nil {
		return nil, 0, fmt.Errorf("cancel deployment: %w", err)
	}
	switch {
	case inserted:
		s.afterRecord(ctx, d.JobID)
		s.metrics.cancelled.WithLabelValues("before_start").Inc()
		d, err = s.Get(ctx, id)
		return d, CancelledBeforeStart, err
	case runState == store.RunDone:
		// Finished, but its result is not in yet: take it from the run.
		if d.Kind == KindJob {
			if r, err := messages.DecodeAnsibleJobResult(runResult); err == nil {
				if err := s.RecordJob(ctx, r); err != nil {
					return nil, 0, err
				}
			}
		} else if r, err := messages.DecodeAnsibleDeployResult(runResult); err == nil {
			if err := s.Record(ctx, r); err != nil {
				return nil, 0, err
			}
		}
		d, err = s.Get(ctx, id)
		if err != nil {
			return nil, 0, err
		}
		return d, 0, ErrFinished
	}
	if _, err := s.jobs.Cancel(ctx, runKind, d.JobID, "deployer", s.cfg.CancelTTL); err != nil {
		return nil, 0, fmt.Errorf("request cancel: %w", err)
	}
	// Only a deployment still without its result records the request: one
	// that finished meanwhile answers as finished.
	tag, err := s.db.Exec(ctx, `UPDATE deployments SET cancel_requested_at = COALESCE(cancel_requested_at, now()), updated_at = now()
		WHERE id = $1 AND status = 'queued'`, id)
	if err != nil {
		return nil, 0, fmt.Errorf("record cancel request: %w", err)
	}
	if tag.RowsAffected() == 0 {
		if d, err = s.Get(ctx, id); err != nil {
			return nil, 0, err
		}
		if d.Status != StatusCancelled {
			return d, 0, ErrFinished
		}
		// Cancelled in the meantime: infra saw the key just set and
		// stopped the job before the request was recorded. The cancel
		// worked; it is no conflict.
	}
	s.metrics.cancelled.WithLabelValues("requested").Inc()
	d, err = s.Get(ctx, id)
	return d, CancelRequested, err
}

// OutputTail returns the output tail of the deployment's result ("" when
// none), the fallback when no full log is stored.
func (s *Service) OutputTail(ctx context.Context, id string) (string, error) {
	var tail string
	err := s.db.QueryRow(ctx, `SELECT COALESCE(result->>'output_tail', '') FROM deployments WHERE id = $1`, id).Scan(&tail)
	if err != nil {
		return "", fmt.Errorf("read output tail: %w", err)
	}
	return tail, nil
}

// wireFields turns the wire contract's refusal of a message (its
// validation or decoding field errors) into the API's field errors, each
// field named by apiName; any other error is an InvalidError of its own.
func wireFields(err error, apiName func(string) string) ([]FieldError, error) {
	var ve *messages.ValidationError
	var de *messages.DecodeError
	var wire []messages.FieldError
	switch {
	case errors.As(err, &ve):
		wire = ve.Fields
	case errors.As(err, &de) && len(de.Fields) > 0:
		wire = de.Fields
	default:
		return nil, &InvalidError{Fields: []FieldError{{Field: "", Message: "the request cannot be encoded as a wire message"}}}
	}
	fields := make([]FieldError, 0, len(wire))
	for _, f := range wire {
		fields = append(fields, FieldError{Field: apiName(f.Field), Message: f.Message})
	}
	return fields, nil
}
