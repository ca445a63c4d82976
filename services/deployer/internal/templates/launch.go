package templates

import (
	"context"
	"crypto/rand"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// Launch is what a launch gives: overrides of what the template asks
// for on launch, survey answers, and the job's own settings.
type Launch struct {
	// Version launches a version other than the current one (0: current).
	Version   int                       `json:"version,omitempty"`
	Limit     *string                   `json:"limit,omitempty"`
	Tags      []string                  `json:"tags,omitempty"`
	SkipTags  []string                  `json:"skip_tags,omitempty"`
	ExtraVars map[string]any            `json:"extra_vars,omitempty"`
	Inventory *deployments.JobInventory `json:"inventory,omitempty"`
	Ref       string                    `json:"ref,omitempty"`
	Check     *bool                     `json:"check,omitempty"`
	Diff      *bool                     `json:"diff,omitempty"`
	Verbosity *int                      `json:"verbosity,omitempty"`
	// Survey holds the answers, by question variable.
	Survey map[string]any `json:"survey,omitempty"`
	// CorrelationID and CallbackURL are the job's, as on POST /jobs.
	CorrelationID string `json:"correlation_id,omitempty"`
	CallbackURL   string `json:"callback_url,omitempty"`
	// Passed are extra variables a workflow hands down (its launch's
	// extra vars, its earlier steps' artifacts): set whether or not the
	// template asks for extra vars (as AWX passes a workflow's), above the
	// launch's extra vars and below the survey's answers. Never stored.
	Passed map[string]any `json:"-"`
}

// Submitter submits a job (deployments.Service.SubmitJob).
type Submitter interface {
	SubmitJob(ctx context.Context, keyID string, v deployments.Visibility, r deployments.JobRequest, idempotencyKey string) (*deployments.Submission, error)
}

// BatchSubmitter submits jobs, and one job many times
// (deployments.Service.SubmitJobs).
type BatchSubmitter interface {
	Submitter
	SubmitJobs(ctx context.Context, keyID string, v deployments.Visibility, r deployments.JobRequest, idempotencyKeys []string) ([]deployments.Submitted, error)
}

// Request builds the job of launching t with l: the template's job with
// the overrides it asks for on launch and the survey's answers as extra
// variables (above the template's and the launch's), marked with the
// template's id, name and version; the secret questions' answers are
// returned apart, for Vault. An override the template does not ask for,
// and an invalid answer, are problems by field.
func Request(t *Template, l Launch) (deployments.JobRequest, map[string]secrets.Value, error) {
	r := t.Job
	r.ProjectID = t.ProjectID
	// The stored request is shared with t: copy what is changed.
	r.Options.ExtraVars = maps.Clone(r.Options.ExtraVars)
	var fields []deployments.FieldError
	refuse := func(field string) {
		fields = append(fields, deployments.FieldError{Field: field, Message: "the template does not ask for it on launch"})
	}
	ask := t.Ask
	if l.Limit != nil {
		if !ask.Limit {
			refuse("limit")
		}
		r.Options.Limit = *l.Limit
	}
	if l.Tags != nil || l.SkipTags != nil {
		if !ask.Tags {
			refuse("tags")
		}
		if l.Tags != nil {
			r.Options.Tags = l.Tags
		}
		if l.SkipTags != nil {
			r.Options.SkipTags = l.SkipTags
		}
	}
	if len(l.ExtraVars) > 0 {
		if !ask.ExtraVars {
			refuse("extra_vars")
		}
		if r.Options.ExtraVars == nil {
			r.Options.ExtraVars = map[string]any{}
		}
		maps.Copy(r.Options.ExtraVars, l.ExtraVars)
	}
	if l.Inventory != nil {
		if !ask.Inventory {
			refuse("inventory")
		}
		r.Inventory = *l.Inventory
	}
	if l.Ref != "" {
		if !ask.Ref {
			refuse("ref")
		}
		r.Source.Ref = l.Ref
	}
	if l.Check != nil || l.Diff != nil {
		if !ask.Check {
			refuse("check")
		}
		if l.Check != nil {
			r.Options.Check = *l.Check
		}
		if l.Diff != nil {
			r.Options.Diff = *l.Diff
		}
	}
	if l.Verbosity != nil {
		if !ask.Verbosity {
			refuse("verbosity")
		}
		r.Options.Verbosity = *l.Verbosity
	}
	if len(l.Passed) > 0 {
		if r.Options.ExtraVars == nil {
			r.Options.ExtraVars = map[string]any{}
		}
		maps.Copy(r.Options.ExtraVars, l.Passed)
	}
	answers, hidden, bad := Answers(t.Survey, l.Survey)
	fields = append(fields, bad...)
	if len(answers) > 0 {
		if r.Options.ExtraVars == nil {
			r.Options.ExtraVars = map[string]any{}
		}
		maps.Copy(r.Options.ExtraVars, answers)
	}
	for name := range hidden {
		if _, dup := r.Options.ExtraVars[name]; dup {
			// extra_vars given at launch may not shadow a secret answer.
			fields = append(fields, deployments.FieldError{Field: "extra_vars[" + name + "]", Message: "is a secret question of the survey"})
		}
	}
	if len(fields) > 0 {
		wipe(hidden)
		return r, nil, &deployments.InvalidError{Fields: fields}
	}
	r.CorrelationID, r.Options.CallbackURL = l.CorrelationID, l.CallbackURL
	r.Template = &deployments.TemplateRef{ID: t.ID, Name: t.Name, Version: t.Version}
	return r, hidden, nil
}

func wipe(m map[string]secrets.Value) {
	for _, v := range m {
		v.Wipe()
	}
}

// request reads template id (as v sees it) and builds the job of
// launching it with l (Request).
func (s *Service) request(ctx context.Context, v deployments.Visibility, id string, l Launch) (*Template, deployments.JobRequest, map[string]secrets.Value, error) {
	t, err := s.Get(ctx, v, id, l.Version)
	if err != nil {
		return nil, deployments.JobRequest{}, nil, err
	}
	r, hidden, err := Request(t, l)
	return t, r, hidden, err
}

// Launch submits template id (as v sees it) for the API key keyID with l,
// as a job submit does: idempotencyKey replays the first launch.
func (s *Service) Launch(ctx context.Context, sub Submitter, keyID string, v deployments.Visibility, id string, l Launch, idempotencyKey string) (*deployments.Submission, error) {
	t, r, hidden, err := s.request(ctx, v, id, l)
	if err != nil {
		return nil, err
	}
	defer wipe(hidden)
	if len(hidden) > 0 {
		// The answers go to Vault, and the job names them by reference:
		// no row, stream entry or log holds them.
		if s.cfg.Vault == nil {
			return nil, invalid("survey", "this deployer has no Vault for secret answers (CREDENTIALS_VAULT_ADDR)")
		}
		launch, err := uuid.NewV7FromReader(rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("new launch id: %w", err)
		}
		r.Options.SecretVars = maps.Clone(r.Options.SecretVars)
		if r.Options.SecretVars == nil {
			r.Options.SecretVars = map[string]string{}
		}
		for _, name := range slices.Sorted(maps.Keys(hidden)) {
			path := strings.NewReplacer("{project_id}", t.ProjectID, "{launch}", launch.String(), "{variable}", name).Replace(s.cfg.Path)
			ref, err := s.cfg.Vault.WriteKV(ctx, s.cfg.Mount, path, map[string]secrets.Value{"value": hidden[name]})
			if err != nil {
				return nil, fmt.Errorf("write the answer of survey.%s to Vault: %w", name, err)
			}
			r.Options.SecretVars[name] = ref.String()
		}
	}
	return sub.SubmitJob(ctx, keyID, v, r, idempotencyKey)
}

// LaunchMany launches template id (as v sees it) with l once per
// Idempotency-Key of idempotencyKeys, as Launch does each, but reads the
// template and checks the job once and stores and publishes the jobs
// together (the occurrences of schedules). A launch with secret answers
// is made one by one: each answer goes to Vault under a launch of its
// own. An error of the template or the launch is returned for all.
func (s *Service) LaunchMany(ctx context.Context, sub BatchSubmitter, keyID string, v deployments.Visibility, id string, l Launch, idempotencyKeys []string) ([]deployments.Submitted, error) {
	_, r, hidden, err := s.request(ctx, v, id, l)
	if err != nil {
		return nil, err
	}
	if len(hidden) > 0 {
		wipe(hidden)
		out := make([]deployments.Submitted, len(idempotencyKeys))
		for i, k := range idempotencyKeys {
			out[i].Submission, out[i].Err = s.Launch(ctx, sub, keyID, v, id, l, k)
		}
		return out, nil
	}
	return sub.SubmitJobs(ctx, keyID, v, r, idempotencyKeys)
}
