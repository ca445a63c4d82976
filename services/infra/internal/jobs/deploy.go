package jobs

import (
	"context"
	"errors"
	"fmt"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// Environment variables through which deploy secrets reach the playbook.
const (
	envGitHubToken = "GITHUB_TOKEN"
	envProjectEnv  = "PROJECT_ENV"
)

// handleDeploy handles an AnsibleDeployMessage.
func (h *Handler) handleDeploy(ctx context.Context, msg *stream.Message) error {
	m, err := messages.DecodeAnsibleDeployMessage(msg.Data())
	res := messages.NewAnsibleDeployResult(m, msg.ID)
	j := h.newJob(msg, kindDeploy, res, &res.Outcome, messages.StreamDeployResults)
	defer j.close()
	if err != nil {
		return j.reject(ctx, err)
	}
	j.log = j.log.With().Str("project_id", m.ProjectID).Str("server_ip", m.ServerIP).Logger()
	// A deploy to a registered server uses its credentials and its lock.
	srv, err := store.FindServerByAddress(ctx, h.DB, m.ServerIP)
	var ambiguous *store.AmbiguousAddressError
	switch {
	case errors.Is(err, store.ErrServerNotFound):
	case errors.As(err, &ambiguous):
		return j.end(ctx, fail(messages.StatusRejected, messages.KindServerNotFound,
			"several registered servers have address %s", m.ServerIP))
	case err != nil:
		return j.infraError(ctx, fmt.Errorf("find server: %w", err))
	default:
		j.server = srv
		j.log = j.log.With().Str("server", srv.Handle).Logger()
	}
	target := "address:" + m.ServerIP
	if j.server != nil {
		target = "server:" + j.server.Handle
	}
	return j.runLocked(ctx, target, h.cfg.Playbooks.Deploy, func(ctx context.Context) (*outcome, error) {
		return j.deploy(ctx, m)
	})
}

// deploy runs under the job's locks and returns the outcome of its play;
// earlier ends come as an *outcome error.
func (j *job) deploy(ctx context.Context, m *messages.AnsibleDeployMessage) (*outcome, error) {
	ep := endpoint{address: m.ServerIP, port: 22, user: j.h.cfg.DeploySSHUser}
	if j.server != nil {
		srv, err := store.GetServer(ctx, j.h.DB, j.server.Handle)
		if err != nil {
			return nil, fmt.Errorf("read server: %w", err)
		}
		j.server = srv
		ep.port, ep.user = srv.SSHPort, srv.SSHUser
		ep.alias = hostAlias(srv.Handle, m.ServerIP)
	} else {
		ep.alias = hostAlias("", m.ServerIP)
	}

	creds, err := j.sshCredentials(ctx)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	for _, s := range []struct{ name, what, ref string }{
		{envGitHubToken, "github_token_ref", m.GitHubTokenRef},
		{envProjectEnv, "secrets_ref", m.SecretsRef},
	} {
		if s.ref == "" {
			continue
		}
		v, err := j.resolve(ctx, s.what, s.ref)
		if err != nil {
			return nil, err
		}
		env[s.name] = v.Reveal()
		v.Wipe()
	}

	hostKey, err := j.checkSSH(ctx, ep, creds)
	if err != nil {
		return nil, err
	}
	modules := m.Modules
	if modules == nil {
		modules = []string{}
	}
	vars := map[string]any{
		"repo":       m.RepoFullName,
		"branch":     m.Branch,
		"port":       m.Port,
		"modules":    modules,
		"project_id": m.ProjectID,
	}
	res, err := j.play(ctx, j.h.cfg.Playbooks.Deploy, ep, hostKey, creds, vars, env)
	if err != nil {
		return nil, err
	}
	return playOutcome(j.h.cfg.Playbooks.Deploy, res), nil
}
