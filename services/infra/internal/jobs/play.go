package jobs

import (
	"context"
	"fmt"
	"regexp"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// aliasRE is what an inventory host name may look like.
var aliasRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// hostAlias names the endpoint in the inventory: the server's handle, or
// the address when it fits, or "target".
func hostAlias(handle, address string) string {
	for _, s := range []string{handle, address} {
		if aliasRE.MatchString(s) {
			return s
		}
	}
	return "target"
}

// play runs one playbook against the endpoint. It returns an error only when
// the run could not start; the run's own outcome is in the result.
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
	res, err := j.h.Runner.Run(ctx, ansible.Spec{
		Timeout:     limits.Timeout,
		IdleTimeout: limits.Idle,
		JobID:       j.id,
		Playbook:    playbook,
		Host:        ansible.Host{Alias: ep.alias, Address: ep.address, Port: ep.port, User: ep.user, KnownHostsKey: hostKey},
		Vars:        all,
		SecretEnv:   env,
		SSHKeys:     creds.keys,
		Redact:      j.red.RedactString,
		OnEvent:     j.prog.fromAnsible,
		OnStart: func(int) {
			if j.playStarted.IsZero() {
				j.playStarted = j.h.Now()
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", playbook, err)
	}
	j.playEnded = res.FinishedAt
	return res, nil
}

// applyPlay records a playbook result in the outcome: hosts, failed task,
// output tail, and the status its outcome implies. It reports whether the
// playbook succeeded.
func (j *job) applyPlay(playbook string, res *ansible.Result) bool {
	j.out.Playbook = playbook
	if len(res.Hosts) > 0 {
		j.out.Hosts = make(map[string]messages.HostRecap, len(res.Hosts))
		for h, r := range res.Hosts {
			j.out.Hosts[h] = messages.HostRecap{Ok: r.OK, Changed: r.Changed, Failed: r.Failed,
				Unreachable: r.Unreachable, Skipped: r.Skipped, Rescued: r.Rescued, Ignored: r.Ignored}
		}
	}
	j.out.FailedTask = nil
	if ft := res.FailedTask; ft != nil {
		j.out.FailedTask = &messages.FailedTask{Name: ft.Name, Host: ft.Host, Play: ft.Play, Message: j.red.RedactString(ft.Message)}
	}
	j.out.SetOutputTail(res.OutputTail)
	why := playbook
	if res.Err != nil {
		why = fmt.Sprintf("%s: %v", playbook, res.Err)
	}
	switch res.Outcome {
	case ansible.OutcomeSucceeded:
		j.out.Succeed()
		return true
	case ansible.OutcomeUnreachable:
		j.out.Fail(messages.StatusUnreachable, messages.KindHostsUnreachable, j.red.RedactString(why))
	case ansible.OutcomeTimeout:
		j.out.Fail(messages.StatusFailed, messages.KindTimeout, j.red.RedactString(why))
	case ansible.OutcomeIdleTimeout:
		j.out.Fail(messages.StatusFailed, messages.KindIdleTimeout, j.red.RedactString(why))
	case ansible.OutcomeCancelled:
		j.out.Fail(messages.StatusCancelled, messages.KindCancelled, j.red.RedactString(why))
	case ansible.OutcomeFailed:
		j.out.Fail(messages.StatusFailed, messages.KindPlaybookFailed, j.red.RedactString(why))
	default:
		j.out.Fail(messages.StatusFailed, messages.KindInternal, j.red.RedactString(why))
	}
	return false
}
