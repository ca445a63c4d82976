package deployments

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/webhooks"
)

// jobMessage validates r (resolving its credential fields within its
// project) by the wire contract's rules and returns the message to
// publish; r is left as stored: normalised, credentials as references.
// A project outside v is ErrForbiddenProject, before anything else.
func (s *Service) jobMessage(ctx context.Context, r *JobRequest, v Visibility, jobID string, at time.Time) (*messages.AnsibleJobMessage, error) {
	var fields []FieldError
	project, validProject := messages.CanonicalProjectID(r.ProjectID)
	if validProject && !v.Holds(project) {
		return nil, ErrForbiddenProject
	}
	if validProject {
		r.ProjectID = project
		// A credential field (or secret variable) holding a credential's
		// name is given its reference; a refused one is a field problem.
		resolve := func(field, value string) (string, error) {
			if value == "" {
				return "", nil
			}
			ref, err := s.resolveCredential(ctx, project, field, value)
			var ie *InvalidError
			if errors.As(err, &ie) {
				fields = append(fields, ie.Fields...)
				return value, nil
			}
			return ref, err
		}
		for _, f := range r.credentialFields() {
			ref, err := resolve(f.field, *f.value)
			if err != nil {
				return nil, err
			}
			*f.value = ref
		}
		if len(r.Options.SecretVars) > 0 {
			resolved := make(map[string]string, len(r.Options.SecretVars)) // the map may be a template's
			for _, name := range slices.Sorted(maps.Keys(r.Options.SecretVars)) {
				ref, err := resolve("options.secret_vars["+name+"]", r.Options.SecretVars[name])
				if err != nil {
					return nil, err
				}
				resolved[name] = ref
			}
			r.Options.SecretVars = resolved
		}
	}
	m := JobMessage(r, jobID, at)
	data, err := messages.Encode(m)
	if err == nil {
		m, err = messages.DecodeAnsibleJobMessage(data)
	}
	if err != nil {
		wf, err := wireFields(err, jobAPIField)
		if err != nil {
			return nil, err
		}
		for _, f := range wf {
			fields = appendField(fields, f)
		}
	}
	for _, f := range s.specialHosts(r) {
		fields = appendField(fields, f)
	}
	if validProject && r.Inventory.Type == string(messages.InventoryInline) {
		// A registered server belongs to projects: another's (or the
		// fleet's) is refused before anything is stored; one named by a
		// handle the project cannot see answers as an unknown one.
		owned, err := s.jobOwnership(ctx, r, v, project)
		if err != nil {
			return nil, err
		}
		for _, f := range owned {
			fields = appendField(fields, f)
		}
	}
	if validProject && r.Options.Pool != "" {
		if err := s.cfg.Pools.Check(r.Options.Pool, project); err != nil {
			fields = appendField(fields, FieldError{Field: "options.pool", Message: err.Error()})
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

// appendField adds f unless a problem of its field is there already (a
// credential refused at resolution is also malformed for the wire).
func appendField(fields []FieldError, f FieldError) []FieldError {
	for _, g := range fields {
		if g.Field == f.Field {
			return fields
		}
	}
	return append(fields, f)
}

// resolveCredential resolves a job's credential field: with a
// CredentialResolver, a name or a reference; without, a reference checked
// against SecretRefs.
func (s *Service) resolveCredential(ctx context.Context, project, field, value string) (string, error) {
	if s.cfg.Credentials != nil {
		return s.cfg.Credentials.Resolve(ctx, project, field, value)
	}
	if s.cfg.SecretRefs != nil {
		if _, err := s.cfg.SecretRefs.Ref(project, field, value, nil); err != nil {
			msg := "this reference is not allowed"
			var re *authz.RefError
			if errors.As(err, &re) {
				msg = "refused: " + re.Reason
			}
			return "", &InvalidError{Fields: []FieldError{{Field: field, Message: msg}}}
		}
	}
	return value, nil
}

// jobAPIField maps a wire key path to the request's JSON path.
func jobAPIField(wire string) string {
	if rest, ok := strings.CutPrefix(wire, "options.timeout_seconds"); ok {
		return "options.timeout" + rest
	}
	return wire
}

// JobQueue returns the stream of pool's jobs.
func (s *Service) JobQueue(pool string) string { return jobQueue(s.cfg.Streams.JobQueue, pool) }

// Lines says where queued d waits for its targets, in the lines infra
// keeps per target (store.JobLines): none when it does not wait for one.
func (s *Service) Lines(ctx context.Context, d *Deployment) ([]store.LinePlace, error) {
	if d.Status != StatusQueued {
		return nil, nil
	}
	return store.JobLines(ctx, s.db, d.JobID)
}

// specialHosts refuses the inline inventory's hosts whose address (their
// ansible_host, else their name) is literally a special one: a literal
// address reveals nothing to the caller, so refusing it at submit is no
// oracle, unlike resolving names (infra's part, before any connection).
func (s *Service) specialHosts(r *JobRequest) []FieldError {
	if s.cfg.Special == nil {
		return nil
	}
	var out []FieldError
	for _, name := range r.HostNames() {
		field, addr := "inventory.hosts["+name+"]", name
		if h, ok := r.Inventory.Hosts[name]["ansible_host"].(string); ok {
			field, addr = field+"[ansible_host]", h
		}
		if err := s.cfg.Special.Check(addr); err != nil {
			msg := err.Error()
			var ae *authz.AddressError
			if errors.As(err, &ae) && ae.Class != authz.ClassMetadata && ae.Class != authz.ClassInvalid {
				msg += " (the operator's SPECIAL_ALLOW_NETWORKS lets test targets through)"
			}
			out = append(out, FieldError{Field: field, Message: msg})
		}
	}
	return out
}

// SubmitJob validates, stores and publishes an Ansible job made with the
// API key keyID, which sees v, as Submit does a deployment: a project
// outside v is ErrForbiddenProject, invalid fields *InvalidError, an
// Idempotency-Key replays the first job. Credential fields naming a stored
// credential are published (and stored) as its reference.
func (s *Service) SubmitJob(ctx context.Context, keyID string, v Visibility, r JobRequest, idempotencyKey string) (*Submission, error) {
	id, err := uuid.NewV7FromReader(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("new job id: %w", err)
	}
	now := s.now()
	msg, err := s.jobMessage(ctx, &r, v, id.String(), now)
	if err != nil {
		return nil, err
	}
	queue := s.JobQueue(msg.Options.Pool)
	sctx, span := tracing.StartPublish(ctx, s.cfg.Tracing, queue, attribute.String("autoprov.deployment_id", id.String()))
	defer span.End()
	msg.TraceContext = tracing.Inject(sctx)
	data, err := messages.Encode(msg)
	if err != nil {
		return nil, fmt.Errorf("encode job request: %w", err)
	}
	stored := r
	stored.Options.CallbackURL = "" // its own column
	row := Row{ID: id.String(), KeyID: keyID, ProjectID: r.ProjectID, CorrelationID: r.CorrelationID,
		TimeoutSeconds: r.Options.Timeout, CallbackURL: r.Options.CallbackURL, CreatedAt: now,
		Kind: KindJob, JobRequest: mustJSON(stored), Queue: queue}
	var existing string
	if idempotencyKey == "" {
		err = InsertRow(ctx, s.db, &row, "", 0)
	} else {
		existing, err = s.storeWithKey(ctx, &row, idempotencyKey, requestHash(jobHashed(r)))
	}
	if errors.Is(err, ErrIdempotencyMismatch) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("store job: %w", err)
	}
	if existing != "" {
		return s.replay(ctx, v, existing)
	}
	entry := s.publisher.PublishStoredTo(ctx, id.String(), queue, data)
	s.metrics.submitted.WithLabelValues("new").Inc()
	return &Submission{Deployment: newJob(id.String(), keyID, queue, entry, r, &stored, now)}, nil
}

// newJob is the Deployment of job id submitted with r (stored as stored,
// without its callback URL) and published as entry to queue.
func newJob(id, keyID, queue, entry string, r JobRequest, stored *JobRequest, now time.Time) *Deployment {
	d := &Deployment{ID: id, JobID: id, Kind: KindJob, Source: "api", Status: StatusQueued,
		Request: Request{ProjectID: r.ProjectID, CorrelationID: r.CorrelationID}, Job: stored, RequestID: entry,
		CreatedAt: now.UTC().Truncate(time.Microsecond), Links: linksFor(id, KindJob), apiKeyID: keyID, queue: queue}
	d.Request.Options.TimeoutSeconds = r.Options.Timeout
	if r.Options.CallbackURL != "" {
		d.Request.Options.CallbackURL = webhooks.RedactURL(r.Options.CallbackURL)
		d.Job = new(JobRequest)
		*d.Job = *stored
		d.Job.Options.CallbackURL = d.Request.Options.CallbackURL
	}
	return d
}

// jobHashed is r as its Idempotency-Key compares it: secret variables by
// name only, since a survey's secret answer is written to Vault under a
// new reference at every launch (and its value is never kept to compare).
func jobHashed(r JobRequest) *JobRequest {
	if len(r.Options.SecretVars) > 0 {
		names := make(map[string]string, len(r.Options.SecretVars))
		for name := range r.Options.SecretVars {
			names[name] = ""
		}
		r.Options.SecretVars = names
	}
	return &r
}
