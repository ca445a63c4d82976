package jobs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// Extra playbooks of a provisioning request (ProvisionerMessage.Playbooks):
// after the base playbook, each runs only when every playbook before it
// succeeded; the first that does not succeed ends the job, and the result
// lists every playbook with its outcome, so that a partial success shows.

// checkExtras checks the extra playbooks m asks for against the playbooks
// that exist: each must be a regular file in cfg.PlaybookDir and none may
// be one of the service's own playbooks. The *messages.ValidationError it
// returns rejects the request before anything runs.
func (h *Handler) checkExtras(m *messages.ProvisionerMessage) error {
	own := []string{h.cfg.Playbooks.Setup, h.cfg.Playbooks.Recovery, h.cfg.Playbooks.Nuke, h.cfg.Playbooks.Deploy}
	var fields []messages.FieldError
	for i, name := range m.Playbooks {
		field := fmt.Sprintf("playbooks[%d]", i)
		switch {
		case slices.Contains(own, name):
			fields = append(fields, messages.FieldError{Field: field, Message: "is run by the service itself and cannot be an extra playbook"})
		case h.cfg.PlaybookDir == "":
			fields = append(fields, messages.FieldError{Field: field, Message: "extra playbooks are not enabled (no playbook directory configured)"})
		default:
			// The contract allows file names only (no separator, no
			// leading dot), so the name cannot leave the directory.
			st, err := os.Stat(filepath.Join(h.cfg.PlaybookDir, name))
			if err != nil || !st.Mode().IsRegular() {
				fields = append(fields, messages.FieldError{Field: field, Message: "no such playbook in playbooks/"})
			}
		}
	}
	if len(fields) > 0 {
		return &messages.ValidationError{Fields: fields}
	}
	return nil
}

// extras runs the extra playbooks of m after the base playbook ended with
// base, as the user ep names (the deploy user once setup adopted it), with
// vars. It returns the outcome of the last playbook that ran.
func (j *job) extras(ctx context.Context, m *messages.ProvisionerMessage, base *outcome, ep endpoint, hostKey string,
	creds *credentials, vars map[string]any) (*outcome, error) {
	o := base
	for _, playbook := range m.Playbooks {
		if !o.succeeded() {
			break
		}
		var err error
		// Extra playbooks get no secret environment: what they need they
		// read from the site's vars.
		if o, err = j.playbookStep(ctx, playbook, ep, hostKey, creds, vars, nil); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// playbookStep runs one playbook of a provisioning job and notes its
// outcome in the result's playbooks.
func (j *job) playbookStep(ctx context.Context, playbook string, ep endpoint, hostKey string, creds *credentials,
	vars map[string]any, env map[string]string) (*outcome, error) {
	res, err := j.play(ctx, playbook, ep, hostKey, creds, vars, env)
	if err != nil {
		return nil, err
	}
	o := playOutcome(playbook, res)
	if pr, ok := j.result.(*messages.ProvisionerResult); ok {
		step := messages.PlaybookOutcome{Playbook: playbook, Status: messages.PlaybookStatus(o.status), ErrorKind: o.kind}
		if !res.StartedAt.IsZero() && res.FinishedAt.After(res.StartedAt) {
			step.DurationMS = res.FinishedAt.Sub(res.StartedAt).Milliseconds()
		}
		pr.Playbooks = append(pr.Playbooks, step)
	}
	return o, nil
}

// skipRemainingExtras lists the extra playbooks of m that did not run as
// skipped, once some playbook ran: the result then shows the whole plan.
func (j *job) skipRemainingExtras(m *messages.ProvisionerMessage) {
	pr, ok := j.result.(*messages.ProvisionerResult)
	if !ok || len(pr.Playbooks) == 0 {
		return
	}
	for _, name := range m.Playbooks {
		if !slices.ContainsFunc(pr.Playbooks, func(p messages.PlaybookOutcome) bool { return p.Playbook == name }) {
			pr.Playbooks = append(pr.Playbooks, messages.PlaybookOutcome{Playbook: name, Status: messages.PlaybookSkipped})
		}
	}
}
