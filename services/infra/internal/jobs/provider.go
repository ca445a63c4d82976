package jobs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps"
)

// SourceTime4VPS is servers.source for servers synced from the Time4VPS API.
const SourceTime4VPS = "time4vps"

// Provider is the hosting provider's API (Time4VPS).
type Provider interface {
	Server(ctx context.Context, serverID int64) (*time4vps.Server, error)
	Reinstall(ctx context.Context, serverID int64, req time4vps.ReinstallRequest) (int64, error)
	WaitTask(ctx context.Context, serverID, taskID int64) (*time4vps.Task, error)
}

// Checkpoint keys of a run (runs.checkpoint).
const (
	cpReinstallTask = "reinstall_task_id"
	cpReinstallDone = "reinstall_done"
	cpNukeDone      = "nuke_done"
)

// providerServer reports whether the job's server is managed through the
// provider API, and its provider id.
func (j *job) providerServer() (int64, bool) {
	if j.h.Provider == nil || j.server == nil || j.server.Source != SourceTime4VPS || j.server.ProviderID == "" {
		return 0, false
	}
	id, err := strconv.ParseInt(j.server.ProviderID, 10, 64)
	if err != nil {
		return 0, false
	}
	return id, true
}

// refreshFromProvider updates the server's address from the provider. The
// refresh is best effort: when the API fails, the stored address is used.
func (j *job) refreshFromProvider(ctx context.Context) {
	id, ok := j.providerServer()
	if !ok {
		return
	}
	s, err := j.h.Provider.Server(ctx, id)
	if err != nil {
		j.log.Warn().Err(err).Msg("provider refresh failed: using the stored address")
		return
	}
	if s.IP == "" || s.IP == j.server.Address {
		return
	}
	j.log.Info().Str("old_address", j.server.Address).Str("address", s.IP).Msg("provider reports a new address")
	if _, err := store.SetServerAddress(ctx, j.h.DB, j.server.Handle, s.IP); err != nil {
		j.log.Warn().Err(err).Msg("could not store the new address")
	}
	j.server.Address = s.IP
}

// reinstall rebuilds the server's OS through the provider and waits for
// the task. Its progress is checkpointed in the run, so that an instance
// taking the run over waits for the same task instead of starting another.
func (j *job) reinstall(ctx context.Context, id int64, creds *credentials) error {
	cp := j.run.Checkpoint
	if done, _ := cp[cpReinstallDone].(bool); done {
		return nil
	}
	taskID := checkpointInt(cp, cpReinstallTask)
	if taskID == 0 {
		osName := j.h.cfg.ReinstallOS
		if v := j.server.Labels["os"]; v != "" {
			osName = v
		}
		j.prog.emit(messages.ProgressEvent{Type: messages.EventTaskStarted, Task: "provider reinstall (" + osName + ")"})
		var err error
		taskID, err = j.h.Provider.Reinstall(ctx, id, time4vps.ReinstallRequest{OS: osName, SSHKey: creds.publicKey})
		if errors.Is(err, time4vps.ErrOutcomeUnknown) {
			// The request may have reached the provider: adopt a running
			// reinstall task rather than starting a second one.
			taskID, err = j.adoptReinstallTask(ctx, id, err)
		}
		if err != nil {
			return fail(messages.StatusFailed, messages.KindProviderError, "reinstall: %v", err)
		}
		if err := j.checkpoint(ctx, map[string]any{cpReinstallTask: taskID}); err != nil {
			return err
		}
		// A new OS has a new host key: pin the one it comes back with.
		if err := store.ClearServerHostKey(ctx, j.h.DB, j.server.Handle); err != nil {
			return fmt.Errorf("clear pinned host key: %w", err)
		}
		j.server.HostKey = ""
	}
	j.log.Info().Int64("task_id", taskID).Msg("waiting for the provider's reinstall task")
	task, err := j.h.Provider.WaitTask(ctx, id, taskID)
	if err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return fail(messages.StatusFailed, messages.KindProviderError, "reinstall task %d: %v", taskID, err)
	}
	j.log.Info().Int64("task_id", taskID).Str("state", task.State()).Msg("reinstall task finished")
	return j.checkpoint(ctx, map[string]any{cpReinstallDone: true})
}

// adoptReinstallTask finds the reinstall task a request of unknown outcome
// may have started.
func (j *job) adoptReinstallTask(ctx context.Context, id int64, cause error) (int64, error) {
	s, err := j.h.Provider.Server(ctx, id)
	if err != nil {
		return 0, errors.Join(cause, err)
	}
	if t := s.ActiveTask; t != nil && strings.Contains(strings.ToLower(t.Name), "reinstall") {
		return t.ID, nil
	}
	return 0, fmt.Errorf("%w (no reinstall task is running)", cause)
}

// waitForSSH waits until the endpoint answers SSH again after a reinstall,
// checking repeatedly until ReinstallSSHWait has passed.
func (j *job) waitForSSH(ctx context.Context, ep endpoint, creds *credentials) (string, error) {
	wctx, cancel := context.WithTimeout(ctx, j.h.cfg.ReinstallSSHWait)
	defer cancel()
	gaveUp := func() error {
		return fail(messages.StatusUnreachable, messages.KindSSHUnreachable,
			"%s did not answer SSH within %v of its reinstall", ep.address, j.h.cfg.ReinstallSSHWait)
	}
	for {
		key, err := j.checkSSH(wctx, ep, creds)
		o, ended := asOutcome(err)
		switch {
		case err == nil:
			return key, nil
		case ctx.Err() != nil:
			return "", context.Cause(ctx)
		case wctx.Err() != nil:
			return "", gaveUp()
		case !ended || o.status != messages.StatusUnreachable:
			return "", err
		}
		// Not up yet: try again.
		if err := clock.Sleep(wctx, j.h.Clock, 5*time.Second); err != nil {
			if ctx.Err() != nil {
				return "", context.Cause(ctx)
			}
			return "", gaveUp()
		}
	}
}

// checkpoint merges values into the run's checkpoint.
func (j *job) checkpoint(ctx context.Context, values map[string]any) error {
	if err := store.SaveCheckpoint(ctx, j.h.DB, j.id, j.run.Attempt, values); err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	if j.run.Checkpoint == nil {
		j.run.Checkpoint = map[string]any{}
	}
	for k, v := range values {
		j.run.Checkpoint[k] = v
	}
	return nil
}

func checkpointInt(cp map[string]any, key string) int64 {
	switch v := cp[key].(type) {
	case float64:
		return int64(v)
	case int64:
		return v
	case int:
		return int64(v)
	}
	return 0
}
