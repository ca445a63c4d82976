package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern"
)

// aliasRE is what an inventory host name may look like (ansible.Host).
var aliasRE = pattern.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`, 63)

// hostAlias names the endpoint in the inventory, and so its fact cache
// file: one name per server, never shared. A server's handle when it is a
// valid name, else "h-" and a hash of the handle; without a server, the
// address when it is a valid name, else "a-" and a hash of the address.
func hostAlias(handle, address string) string {
	name, prefix := address, "a-"
	if handle != "" {
		name, prefix = handle, "h-"
	}
	if aliasRE.MatchString(name) {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return prefix + hex.EncodeToString(sum[:12])
}

// play runs one playbook against the endpoint. It returns an error only when
// the run could not start, or when it found the server unreachable after an
// SSH check was skipped (see passedChecks) and the check it then makes
// fails: that check's outcome is the job's; otherwise how the run went is in
// the result (see playOutcome).
func (j *job) play(ctx context.Context, playbook string, ep endpoint, hostKey string, creds *credentials,
	vars map[string]any, env map[string]string) (*ansible.Result, error) {
	j.log.Info().Str("playbook", playbook).Str("host", ep.alias).Msg("starting playbook")
	limits := j.h.cfg.Limits[playbook]
	all := make(map[string]any, len(j.h.cfg.SiteVars)+len(vars))
	for k, v := range j.h.cfg.SiteVars {
		all[k] = v
	}
	for k, v := range vars {
		all[k] = v
	}
	pctx, span := j.startSpan(ctx, spanPlay, attribute.String("autoprov.playbook", playbook))
	res, err := j.h.Runner.Run(pctx, ansible.Spec{
		Timeout:     limits.Timeout,
		IdleTimeout: limits.Idle,
		JobID:       j.id,
		Playbook:    playbook,
		Host:        ansible.Host{Alias: ep.alias, Address: ep.address, Port: ep.port, User: ep.user, KnownHostsKey: hostKey},
		Vars:        all,
		SecretEnv:   env,
		SSHKeys:     creds.keys,
		Redact:      j.red.RedactString,
		TimeoutCap:  j.timeoutCap,
		OnOutput:    j.onOutput(),
		OnEvent:     j.prog.fromAnsible,
		OnStart:     j.onStart,
	})
	if err == nil && res.Outcome != ansible.OutcomeSucceeded {
		span.SetAttributes(attribute.String("autoprov.play_outcome", string(res.Outcome)))
		endSpan(span, errors.New(string(res.Outcome)))
	} else {
		endSpan(span, err)
	}
	if errors.Is(err, ansible.ErrInvalidSpec) {
		// Running it again cannot help: the job fails now, not after every
		// delivery.
		return nil, fail(messages.StatusFailed, messages.KindInternal, "%s cannot run: %v", playbook, err)
	}
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", playbook, err)
	}
	j.steps.addRun(res.Steps)
	j.reportRemote(res, "the server", func(ev *zerolog.Event) *zerolog.Event {
		if j.server == nil { // else the job's logger names the server
			ev = ev.Str("host", ep.alias).Str("address", ep.address)
		}
		return ev
	})
	// The finish overhead counts from ansible-playbook's exit: the runner's
	// clean-up after it is the service's own time.
	j.playEnded = res.ExitedAt
	if j.playEnded.IsZero() { // it never started
		j.playEnded = res.FinishedAt
	}
	switch res.Outcome {
	case ansible.OutcomeSucceeded:
		// ssh reached the server with this key, holding it to the pinned
		// key: as good as a check that passed now.
		j.h.checks.pass(ctx, keyOf(ep), hostKey, creds.clients, j.h.Now())
	case ansible.OutcomeUnreachable:
		j.h.checks.forget(ctx, keyOf(ep)) // the next run checks again
		if j.sshCheckReused {
			// The play went without a check of its own: check now, so that
			// the result says what the check would have said before the
			// play (down, host key changed, our key refused).
			if _, err := j.checkSSH(ctx, ep, creds); err != nil {
				return nil, err
			}
		}
	}
	return res, nil
}

// onStart notes when the job's first ansible-playbook started (the
// runner's Spec.OnStart).
func (j *job) onStart(int) {
	if j.playStarted.IsZero() {
		j.playStarted = j.h.Now()
	}
}

// reportRemote logs (and counts) what the run stopped on where (the server,
// or a job's hosts): work of earlier runs whose controller was gone (the
// takeover before the play), and its own tasks after its play was stopped
// (the cleanup). with, when set, adds fields to each line.
func (j *job) reportRemote(res *ansible.Result, where string, with func(*zerolog.Event) *zerolog.Event) {
	attempt := 0
	if j.run != nil {
		attempt = j.run.Attempt
	}
	for step, rep := range map[string]*ansible.RemoteReport{"takeover": res.Takeover, "cleanup": res.Cleanup} {
		if rep == nil || rep.Stopped == 0 {
			continue
		}
		j.h.Metrics.remoteStopped.WithLabelValues(step).Add(float64(rep.Stopped))
		ev := j.log.Warn()
		if step == "cleanup" {
			ev = j.log.Info()
		}
		if with != nil {
			ev = with(ev)
		}
		ev.Str("step", step).Int("attempt", attempt).Str("remote_run", res.RemoteRun).
			Strs("earlier_runs", rep.Runs).Int("stopped", rep.Stopped).Int("killed", rep.Killed).Int("dirs_removed", rep.Dirs).
			Msgf("%s stopped %d processes on %s", step, rep.Stopped, where)
	}
}
