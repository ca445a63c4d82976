package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// handleProvision handles a ProvisionerMessage.
func (h *Handler) handleProvision(ctx context.Context, msg *stream.Message) error {
	began := time.Now()
	m, err := messages.DecodeProvisionerMessage(msg.Data())
	res := messages.NewProvisionerResult(m, msg.ID)
	j := h.newJob(msg, kindProvision, res, &res.Outcome, messages.StreamProvisionerResults)
	defer j.close()
	var tc *messages.TraceContext
	if m != nil {
		tc = &m.TraceContext
	}
	ctx = j.startTrace(ctx, traceOf(tc), began, err)
	if err == nil {
		err = h.checkExtras(m)
	}
	at := j.steps.add(stepDecode, began)
	if err != nil {
		return j.reject(ctx, err)
	}
	j.log = j.log.With().Str("server", m.ServerHandle).Logger()
	srv, err := store.GetServer(ctx, h.DB, m.ServerHandle)
	at = j.steps.add(stepServerLookup, at)
	if errors.Is(err, store.ErrServerNotFound) {
		return j.end(ctx, fail(messages.StatusRejected, messages.KindServerNotFound,
			"no server with handle %q is registered", m.ServerHandle))
	}
	if err != nil {
		return j.infraError(ctx, fmt.Errorf("read server: %w", err))
	}
	j.server = srv
	// A registered server is authorized as a deploy target is: provider
	// listings and inventories are input, and a server at a special
	// address is refused before any lock, connection or secret.
	err = h.Authz.Target(ctx, srv.Address, true)
	j.steps.add(stepAuthorization, at)
	if err != nil {
		return j.rejectAs(ctx, reasonTargetRefused, fmt.Errorf("server %s: %w", srv.Handle, err))
	}
	return j.runLocked(ctx, "server:"+srv.Handle, h.provisionPlaybook(m), func(ctx context.Context) (*outcome, error) {
		defer j.skipRemainingExtras(m)
		return j.provision(ctx, m)
	})
}

// provisionPlaybook names the playbook a message asks for.
func (h *Handler) provisionPlaybook(m *messages.ProvisionerMessage) string {
	switch {
	case m.IsRecovery:
		return h.cfg.Playbooks.Recovery
	case m.ForceReinstall:
		return h.cfg.Playbooks.Setup + " (force_reinstall)"
	default:
		return h.cfg.Playbooks.Setup
	}
}

// provision runs under the job's locks and returns the outcome of its last
// play; earlier ends come as an *outcome error.
func (j *job) provision(ctx context.Context, m *messages.ProvisionerMessage) (*outcome, error) {
	// The transition reads the server afresh: it may have changed while
	// this job waited for its lock.
	at := time.Now()
	fsrv, err := j.h.fleet().StartProvisioning(ctx, j.server.Handle, j.id, fleetActor)
	if err != nil {
		return nil, fmt.Errorf("mark server provisioning: %w", err)
	}
	srv := &fsrv.Server
	j.server = srv
	j.refreshFromProvider(ctx)
	at = j.steps.add(stepRunRecord, at)
	// The stored address (maybe new from the provider) is checked again.
	err = j.h.Authz.Target(ctx, srv.Address, true)
	at = j.steps.add(stepAuthorization, at)
	if err != nil {
		j.log.Warn().Str("reason", err.Error()).Msg("provisioning target refused: nothing dialed")
		return nil, fail(messages.StatusRejected, messages.KindInvalidMessage, "server %s: %v", srv.Handle, err)
	}

	creds, err := j.sshCredentials(ctx)
	j.steps.add(stepSecrets, at)
	if err != nil {
		return nil, err
	}
	ep := endpoint{alias: hostAlias(srv.Handle, srv.Address), address: srv.Address, port: srv.SSHPort, user: srv.SSHUser}

	var hostKey string
	switch providerID, viaProvider := j.providerServer(); {
	case m.ForceReinstall && viaProvider:
		if err := j.reinstall(ctx, providerID, creds); err != nil {
			return nil, err
		}
		// Cached facts and a passed SSH check describe the old OS.
		j.h.Runner.ForgetHost(ep.alias)
		j.h.Runner.CloseWarm(ep.alias)
		j.h.checks.forget(ctx, keyOf(ep))
		if hostKey, err = j.waitForSSH(ctx, ep, creds); err != nil {
			return nil, err
		}
	default:
		if hostKey, err = j.checkSSH(ctx, ep, creds); err != nil {
			return nil, err
		}
	}

	env := map[string]string{"AUTOPROV_DEPLOY_SSH_PUBKEY": creds.publicKey}
	vars := map[string]any{"autoprov_deploy_user": j.h.cfg.DeploySSHUser}

	if m.ForceReinstall {
		if _, viaProvider := j.providerServer(); !viaProvider {
			if err := j.nuke(ctx, ep, hostKey, creds, env); err != nil {
				return nil, err
			}
		}
	}

	playbook := j.h.cfg.Playbooks.Setup
	if m.IsRecovery {
		playbook = j.h.cfg.Playbooks.Recovery
	}
	o, err := j.playbookStep(ctx, playbook, ep, hostKey, creds, vars, env)
	if err != nil {
		return nil, err
	}
	if o.succeeded() && playbook == j.h.cfg.Playbooks.Setup {
		if err := j.adoptDeployUser(ctx); err != nil {
			return nil, err
		}
		ep.user = j.h.cfg.DeploySSHUser // setup disabled root logins
	}
	return j.extras(ctx, m, o, ep, hostKey, creds, vars)
}

// nuke resets what setup and deploys created (force_reinstall on a server
// without a provider rebuild). It runs once per job: a run taken over after
// the nuke went through does not nuke again.
func (j *job) nuke(ctx context.Context, ep endpoint, hostKey string, creds *credentials, env map[string]string) error {
	if done, _ := j.run.Checkpoint[cpNukeDone].(bool); done {
		return nil
	}
	o, err := j.playbookStep(ctx, j.h.cfg.Playbooks.Nuke, ep, hostKey, creds, map[string]any{"autoprov_nuke_confirm": ep.alias}, env)
	if err != nil {
		return err
	}
	if !o.succeeded() {
		return o
	}
	j.h.Runner.ForgetHost(ep.alias)
	j.h.Runner.CloseWarm(ep.alias)
	return j.checkpoint(ctx, map[string]any{cpNukeDone: true})
}

// adoptDeployUser records that, after setup, the server is reached as the
// deploy user: setup_server.yml disables root login once that user works.
func (j *job) adoptDeployUser(ctx context.Context) error {
	if j.server.SSHUser == j.h.cfg.DeploySSHUser {
		return nil
	}
	if _, err := store.SetServerSSHUser(ctx, j.h.DB, j.server.Handle, j.h.cfg.DeploySSHUser); err != nil {
		return fmt.Errorf("record ssh user %s: %w", j.h.cfg.DeploySSHUser, err)
	}
	j.log.Info().Str("ssh_user", j.h.cfg.DeploySSHUser).Msg("server is reached as the deploy user from now on")
	return nil
}
