package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
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
	began := time.Now()
	m, err := messages.DecodeAnsibleDeployMessage(msg.Data())
	res := messages.NewAnsibleDeployResult(m, msg.ID)
	j := h.newJob(msg, kindDeploy, res, &res.Outcome, messages.StreamDeployResults)
	defer j.close()
	var tc *messages.TraceContext
	if m != nil {
		tc = &m.TraceContext
	}
	ctx = j.startTrace(ctx, traceOf(tc), began, err)
	at := j.steps.add(stepDecode, began)
	if err != nil {
		return j.reject(ctx, err)
	}
	// Every spelling of an address is one host: its canonical form finds
	// the registered server, its pinned key and its lock.
	addr, err := store.CanonicalAddress(m.ServerIP)
	if err != nil {
		return j.reject(ctx, fmt.Errorf("server_ip: %w", err))
	}
	j.log = j.log.With().Str("project_id", m.ProjectID).Str("server_ip", addr).Logger()
	j.timeoutCap = time.Duration(m.TimeoutSeconds) * time.Second
	// A deploy to a registered server uses its credentials and its lock.
	srv, err := store.FindServerByAddress(ctx, h.DB, addr)
	j.steps.add(stepServerLookup, at)
	var ambiguous *store.AmbiguousAddressError
	switch {
	case errors.Is(err, store.ErrServerNotFound):
	case errors.As(err, &ambiguous):
		return j.end(ctx, fail(messages.StatusRejected, messages.KindServerNotFound,
			"several registered servers have address %s", addr))
	case err != nil:
		return j.infraError(ctx, fmt.Errorf("find server: %w", err))
	default:
		j.server = srv
		j.log = j.log.With().Str("server", srv.Handle).Logger()
		if err := deployOwner(m, srv); err != nil {
			j.log.Warn().Msg("deploy target is another project's server: refused, nothing dialed")
			return j.reject(ctx, err)
		}
	}
	if err := checkPorts(m, j.server); err != nil {
		return j.reject(ctx, err)
	}
	var target string
	if j.server != nil {
		target = "server:" + j.server.Handle
	} else if target, err = store.AddressTarget(addr, m.SSHPort); err != nil {
		return j.reject(ctx, err)
	}
	return j.runLocked(ctx, target, h.cfg.Playbooks.Deploy, func(ctx context.Context) (*outcome, error) {
		return j.deploy(ctx, m, addr)
	})
}

// deployOwner refuses a deploy of a project to a registered server that
// other projects own (issue 31): the signed request carries the project,
// and infra checks it before any connection, whoever produced it. A
// fleet-only server (no owners) is left to the producers' checks: the
// deployer lets only fleet-wide keys deploy there.
func deployOwner(m *messages.AnsibleDeployMessage, srv *store.Server) error {
	if !srv.OwnedByOthers(m.ProjectID) {
		return nil
	}
	return &messages.ValidationError{Fields: []messages.FieldError{{Field: "server_ip",
		Message: "is a registered server this project does not own (an operator sets a server's projects)"}}}
}

// deploy runs under the job's locks and returns the outcome of its play;
// earlier ends come as an *outcome error. The order is the point: the
// target and the request's references are authorized before anything is
// resolved or dialed, and the request's secrets are resolved only once the
// target answered SSH.
func (j *job) deploy(ctx context.Context, m *messages.AnsibleDeployMessage, addr string) (*outcome, error) {
	ep := endpoint{address: addr, port: cmp.Or(m.SSHPort, messages.DefaultSSHPort), user: j.h.cfg.DeploySSHUser}
	at := time.Now()
	if j.server != nil {
		srv, err := store.GetServer(ctx, j.h.DB, j.server.Handle)
		if err != nil {
			return nil, fmt.Errorf("read server: %w", err)
		}
		j.server = srv
		if err := deployOwner(m, srv); err != nil { // its owners may have changed meanwhile
			return nil, fail(messages.StatusRejected, messages.KindInvalidMessage, "%v", err)
		}
		ep.address, ep.port, ep.user = srv.Address, srv.SSHPort, srv.SSHUser
		ep.alias = hostAlias(srv.Handle, srv.Address)
	} else {
		ep.alias = hostAlias("", addr)
	}

	at = j.steps.add(stepServerLookup, at)
	if err := j.h.Authz.Target(ctx, ep.address, j.server != nil); err != nil {
		// The requester hears what a silent host would say: infra is no
		// port scanner. The reason is for the operator.
		j.log.Warn().Str("reason", err.Error()).Msg("deploy target refused: nothing resolved, nothing dialed")
		return nil, fail(messages.StatusUnreachable, messages.KindSSHUnreachable, "%s", authz.UnreachableMessage(ep.address, ep.port))
	}
	refs := []struct{ env, field, ref string }{
		{envGitHubToken, "github_token_ref", m.GitHubTokenRef},
		{envProjectEnv, "secrets_ref", m.SecretsRef},
	}
	var own []string
	for _, r := range refs {
		if r.ref == "" {
			continue
		}
		if own == nil {
			var err error
			if own, err = j.ownRefs(ctx); err != nil {
				return nil, err
			}
		}
		if _, err := j.h.Authz.Ref(m.ProjectID, r.field, r.ref, own); err != nil {
			j.log.Warn().Str("field", r.field).Str("reason", err.Error()).Msg("secret reference refused: nothing resolved, nothing dialed")
			return nil, fail(messages.StatusFailed, messages.KindSecretUnavailable, "%v", err)
		}
	}

	at = j.steps.add(stepAuthorization, at)
	creds, err := j.sshCredentials(ctx)
	j.steps.add(stepSecrets, at)
	if err != nil {
		return nil, err
	}
	hostKey, err := j.checkSSH(ctx, ep, creds)
	if err != nil {
		return nil, err
	}

	at = time.Now()
	env := map[string]string{}
	for _, r := range refs {
		if r.ref == "" {
			continue
		}
		v, err := j.resolveWith(ctx, j.project, r.field, r.ref)
		if err != nil {
			return nil, err
		}
		env[r.env] = v.Reveal()
		v.Wipe()
	}
	j.steps.add(stepSecrets, at)
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

// checkPorts rejects a deploy whose ports cannot be right for its target,
// before anything is dialed: an ssh_port other than the registered server's
// own (a registered server is reached on the SSH port it is registered
// with), or an application port (port, what the deploy playbook publishes
// the project on) that is the SSH port the target is reached on. The second
// is also how a producer that followed the contract's old text, which
// called port the SSH port, is told apart: it sends 22, or the server's
// SSH port, and is refused with the fix instead of deploying its project
// onto the SSH port. srv is nil for an unregistered target.
func checkPorts(m *messages.AnsibleDeployMessage, srv *store.Server) error {
	var fields []messages.FieldError
	sshPort := cmp.Or(m.SSHPort, messages.DefaultSSHPort)
	if srv != nil {
		sshPort = cmp.Or(srv.SSHPort, messages.DefaultSSHPort)
		if m.SSHPort != 0 && m.SSHPort != sshPort {
			fields = append(fields, messages.FieldError{Field: "ssh_port", Message: fmt.Sprintf(
				"must be absent or %d: the target is registered server %s, reached on the SSH port it is registered with",
				sshPort, srv.Handle)})
		}
	}
	if m.Port == sshPort {
		where := "ssh_port, 22 when absent"
		if srv != nil {
			where = "registered server " + srv.Handle + "'s"
		}
		fields = append(fields, messages.FieldError{Field: "port", Message: fmt.Sprintf(
			"must not be the target's SSH port (%s): port is the application's port, "+
				"the one the deploy playbook publishes the project on", where)})
	}
	if fields == nil {
		return nil
	}
	return &messages.ValidationError{Fields: fields}
}

// ownRefs are the references of the service's own credentials, which no
// request may name: the default SSH key, every server's, the signing keys.
func (j *job) ownRefs(ctx context.Context) ([]string, error) {
	refs, err := store.SSHKeyRefs(ctx, j.h.DB)
	if err != nil {
		return nil, fmt.Errorf("read the servers' ssh key refs: %w", err)
	}
	own := append([]string{j.h.cfg.DefaultSSHKeyRef}, j.h.cfg.OwnRefs...)
	return append(own, refs...), nil
}
