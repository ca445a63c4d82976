package jobs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/jobs"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sshcheck"
)

// TestProvisionOutcomes runs one provisioning request per case through a
// Handler with fake Runner and SSH checker, real Postgres and Redis, and
// checks what the case must leave: Handle's error (which decides whether
// the stream runtime acknowledges, retries or dead-letters the entry), the
// published result, the server's state, the run row, and which ports were
// called.
func TestProvisionOutcomes(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	tests := []struct {
		name       string
		sets       []string // SQL assignments for the case's server
		noServer   bool     // the request names an unregistered server
		mod        func(*jobs.Config)
		garbage    bool // the request is not a message at all
		ssh        func(w *world) *fakeSSH
		run        func(context.Context, ansible.Spec) (*ansible.Result, error)
		deliveries int64
		// interrupt, when set, is called once the play started (run must
		// block until its context ends), or the SSH check when duringCheck.
		interrupt   func(t *testing.T, w *world, jobID string, cancel context.CancelCauseFunc)
		duringCheck bool

		wantErr    func(error) bool // nil: Handle returns nil
		wantStatus messages.Status  // "": no result is published
		wantKind   messages.ErrorKind
		wantMsg    string // the result's error message holds it
		wantServer string // the server's state afterwards ("": unchanged NEW)
		wantRuns   int    // plays started
		wantClosed bool   // the server's warm SSH connections are closed (a failed check)
		wantChecks int    // SSH checks made
		wantRow    string // the run row's state ("": none)
	}{
		{
			name: "success", wantStatus: messages.StatusSucceeded, wantServer: store.ServerReady,
			wantRuns: 1, wantChecks: 1, wantRow: store.RunDone,
		},
		{
			name: "failed play", run: plays(ansible.OutcomeFailed),
			wantStatus: messages.StatusFailed, wantKind: messages.KindPlaybookFailed, wantMsg: "setup_server.yml: failed on",
			wantServer: store.ServerFailed, wantRuns: 1, wantChecks: 1, wantRow: store.RunDone,
		},
		{
			name: "play finds the server unreachable", run: plays(ansible.OutcomeUnreachable),
			wantStatus: messages.StatusUnreachable, wantKind: messages.KindHostsUnreachable, wantMsg: "unreachable",
			wantServer: store.ServerUnreachable, wantRuns: 1, wantChecks: 1, wantRow: store.RunDone,
		},
		{
			name: "play timed out", run: plays(ansible.OutcomeTimeout),
			wantStatus: messages.StatusFailed, wantKind: messages.KindTimeout,
			wantServer: store.ServerFailed, wantRuns: 1, wantChecks: 1, wantRow: store.RunDone,
		},
		{
			name: "play went idle", run: plays(ansible.OutcomeIdleTimeout),
			wantStatus: messages.StatusFailed, wantKind: messages.KindIdleTimeout,
			wantServer: store.ServerFailed, wantRuns: 1, wantChecks: 1, wantRow: store.RunDone,
		},
		{
			name: "ansible-playbook broke", run: plays(ansible.OutcomeError),
			wantStatus: messages.StatusFailed, wantKind: messages.KindInternal,
			wantServer: store.ServerFailed, wantRuns: 1, wantChecks: 1, wantRow: store.RunDone,
		},
		{
			name: "ssh unreachable",
			ssh: func(w *world) *fakeSSH {
				return newFakeSSH(fails(&sshcheck.UnreachableError{Address: "192.0.2.10", Port: 22, Attempts: 3,
					Class: sshcheck.ClassRefused, Err: errors.New("connection refused")}))
			},
			wantStatus: messages.StatusUnreachable, wantKind: messages.KindSSHUnreachable, wantMsg: "did not answer SSH",
			wantClosed: true, wantServer: store.ServerUnreachable, wantChecks: 1, wantRow: store.RunDone,
		},
		{
			name: "host key mismatch",
			sets: []string{"host_key = 'PINNED'"}, // replaced by the world's host key below
			ssh: func(w *world) *fakeSSH {
				return newFakeSSH(fails(&sshcheck.HostKeyMismatchError{Address: "192.0.2.10", Port: 22,
					Expected: w.hostKey, Got: w.otherHostKey}))
			},
			wantStatus: messages.StatusFailed, wantKind: messages.KindHostKeyMismatch, wantMsg: "host key mismatch",
			wantClosed: true, wantServer: store.ServerFailed, wantChecks: 1, wantRow: store.RunDone,
		},
		{
			name: "ssh key refused",
			ssh: func(w *world) *fakeSSH {
				return newFakeSSH(fails(&sshcheck.AuthError{Address: "192.0.2.10", Port: 22, User: "root",
					Err: errors.New("no supported methods remain")}))
			},
			wantStatus: messages.StatusFailed, wantKind: messages.KindSSHAuthFailed, wantMsg: "rejected our SSH key",
			wantClosed: true, wantServer: store.ServerFailed, wantChecks: 1, wantRow: store.RunDone,
		},
		{
			name: "ssh key reference unusable", sets: []string{"ssh_key_ref = 'env:AUTOPROV_SECRET_NOT_KEY'"},
			wantStatus: messages.StatusFailed, wantKind: messages.KindSecretUnavailable, wantMsg: "not a usable SSH private key",
			wantServer: store.ServerFailed, wantRow: store.RunDone,
		},
		{
			// A server key naming a request signing key is refused before
			// anything is resolved (the key is a valid reference that
			// resolves, but to a secret that is no SSH key).
			name: "ssh key reference names a signing key", sets: []string{"ssh_key_ref = 'env:AUTOPROV_SECRET_NOT_KEY'"},
			mod:        func(c *jobs.Config) { c.OwnRefs = []string{"env:AUTOPROV_SECRET_NOT_KEY"} },
			wantStatus: messages.StatusFailed, wantKind: messages.KindSecretUnavailable, wantMsg: "names a request signing key",
			wantServer: store.ServerFailed, wantRow: store.RunDone,
		},
		{
			name: "ssh key reference missing", sets: []string{"ssh_key_ref = 'env:AUTOPROV_SECRET_NOWHERE'"},
			wantStatus: messages.StatusFailed, wantKind: messages.KindSecretUnavailable, wantMsg: "ssh key",
			wantServer: store.ServerFailed, wantRow: store.RunDone,
		},
		{
			name: "cancelled on request", run: blocks(),
			interrupt: func(t *testing.T, w *world, jobID string, _ context.CancelCauseFunc) {
				if err := w.rdb.Set(context.Background(), messages.CancelKey(messages.JobKindProvision, jobID), "1", time.Hour).Err(); err != nil {
					t.Fatal(err)
				}
			},
			wantStatus: messages.StatusCancelled, wantKind: messages.KindCancelled, wantMsg: "cancelled on request",
			wantServer: store.ServerFailed, wantRuns: 1, wantChecks: 1, wantRow: store.RunDone,
		},
		{
			name: "cancelled on request during the SSH check", duringCheck: true,
			ssh: func(*world) *fakeSSH { return newFakeSSH(hangs()) },
			interrupt: func(t *testing.T, w *world, jobID string, _ context.CancelCauseFunc) {
				if err := w.rdb.Set(context.Background(), messages.CancelKey(messages.JobKindProvision, jobID), "1", time.Hour).Err(); err != nil {
					t.Fatal(err)
				}
			},
			wantStatus: messages.StatusCancelled, wantKind: messages.KindCancelled, wantMsg: "cancelled on request",
			wantServer: store.ServerFailed, wantChecks: 1, wantRow: store.RunDone,
		},
		{
			name: "shutdown during the SSH check hands the run over", duringCheck: true,
			ssh: func(*world) *fakeSSH { return newFakeSSH(hangs()) },
			interrupt: func(_ *testing.T, _ *world, _ string, cancel context.CancelCauseFunc) {
				cancel(stream.ErrShutdown)
			},
			wantErr:    func(err error) bool { return errors.Is(err, stream.ErrShutdown) },
			wantServer: store.ServerProvisioning, wantChecks: 1, wantRow: store.RunRunning,
		},
		{
			name: "shutdown hands the run over", run: blocks(),
			interrupt: func(_ *testing.T, _ *world, _ string, cancel context.CancelCauseFunc) {
				cancel(stream.ErrShutdown)
			},
			wantErr:    func(err error) bool { return errors.Is(err, stream.ErrShutdown) },
			wantServer: store.ServerProvisioning, wantRuns: 1, wantChecks: 1, wantRow: store.RunRunning,
		},
		{
			name: "lease lost", run: blocks(),
			interrupt: func(_ *testing.T, _ *world, _ string, cancel context.CancelCauseFunc) {
				cancel(stream.ErrLeaseLost)
			},
			wantErr:    func(err error) bool { return errors.Is(err, stream.ErrLeaseLost) },
			wantServer: store.ServerProvisioning, wantRuns: 1, wantChecks: 1, wantRow: store.RunRunning,
		},
		{
			name: "lock lost", run: blocks(),
			interrupt: func(t *testing.T, w *world, jobID string, _ context.CancelCauseFunc) {
				w.takeLocks(t, jobID)
			},
			wantErr: func(err error) bool {
				return err != nil && strings.Contains(err.Error(), "run locks lost") && !stream.IsPermanent(err)
			},
			wantServer: store.ServerProvisioning, wantRuns: 1, wantChecks: 1, wantRow: store.RunRunning,
		},
		{
			name: "infrastructure error is retried",
			run: func(context.Context, ansible.Spec) (*ansible.Result, error) {
				return nil, errors.New("start runguard: no such file")
			},
			wantErr: func(err error) bool {
				return err != nil && strings.Contains(err.Error(), "no such file") && !stream.IsPermanent(err)
			},
			wantServer: store.ServerProvisioning, wantRuns: 1, wantChecks: 1, wantRow: store.RunRunning,
		},
		{
			name: "infrastructure error on the last delivery fails the job", deliveries: 3,
			run: func(context.Context, ansible.Spec) (*ansible.Result, error) {
				return nil, errors.New("start runguard: no such file")
			},
			wantStatus: messages.StatusFailed, wantKind: messages.KindInternal, wantMsg: "gave up after 3 deliveries",
			wantServer: store.ServerFailed, wantRuns: 1, wantChecks: 1, wantRow: store.RunDone,
		},
		{
			name: "spec refused by the runner",
			run: func(context.Context, ansible.Spec) (*ansible.Result, error) {
				return nil, fmt.Errorf("%w: spec: host alias too long", ansible.ErrInvalidSpec)
			},
			// Failed on the first delivery: running it again cannot help.
			wantStatus: messages.StatusFailed, wantKind: messages.KindInternal, wantMsg: "cannot run",
			wantServer: store.ServerFailed, wantRuns: 1, wantChecks: 1, wantRow: store.RunDone,
		},
		{
			name: "unknown server", noServer: true,
			wantStatus: messages.StatusRejected, wantKind: messages.KindServerNotFound, wantMsg: "no server with handle",
		},
		{
			name: "not a message", garbage: true,
			wantErr:    stream.IsPermanent,
			wantStatus: messages.StatusRejected, wantKind: messages.KindInvalidMessage,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := "srv-" + strings.ReplaceAll(tt.name, " ", "-")
			jobID := "job-" + strings.ReplaceAll(tt.name, " ", "-")
			if !tt.noServer && !tt.garbage {
				var sets []string
				for _, s := range tt.sets {
					sets = append(sets, strings.ReplaceAll(s, "'PINNED'", "'"+w.hostKey+"'"))
				}
				w.addServer(t, srv, sets...)
			}
			f := w.newFakes()
			if tt.ssh != nil {
				f.ssh = tt.ssh(w)
			}
			if tt.run != nil {
				f.runner = newFakeRunner(tt.run)
			}
			h := w.handler(t, f, tt.mod)
			msg := w.provision(t, jobID, srv, tt.deliveries)
			if tt.garbage {
				msg.Values[stream.DataField] = "\xc1 not msgpack"
				jobID = msg.ID // a request without a job id is known by its entry id
			}
			var interrupt func(context.CancelCauseFunc)
			if tt.interrupt != nil {
				interrupt = func(cancel context.CancelCauseFunc) { tt.interrupt(t, w, jobID, cancel) }
			}

			started := f.runner.started
			if tt.duringCheck {
				started = f.ssh.started
			}
			err := handle(t, h, started, msg, interrupt)

			if tt.wantErr == nil && err != nil || tt.wantErr != nil && !tt.wantErr(err) {
				t.Fatalf("Handle = %v", err)
			}
			results := w.provisionResults(t, jobID)
			if tt.wantStatus == "" {
				if len(results) != 0 {
					t.Fatalf("published %d results (%s %+v), want none", len(results), results[0].Status, results[0].Error)
				}
			} else {
				if len(results) != 1 {
					t.Fatalf("published %d results, want 1", len(results))
				}
				checkResult(t, &results[0].Outcome, tt.wantStatus, tt.wantKind, tt.wantMsg)
			}
			if !tt.noServer && !tt.garbage {
				want := cmpOr(tt.wantServer, store.ServerNew)
				if s := w.server(t, srv); s.Status != want {
					t.Errorf("server %s, want %s", s.Status, want)
				}
			}
			if got := len(f.runner.calls()); got != tt.wantRuns {
				t.Errorf("%d plays, want %d", got, tt.wantRuns)
			}
			if got := f.ssh.calls(); got != tt.wantChecks {
				t.Errorf("%d SSH checks, want %d", got, tt.wantChecks)
			}
			if closed := slices.Contains(f.runner.warmClosed(), srv); closed != tt.wantClosed {
				t.Errorf("warm connections of %s closed: %v, want %v", srv, closed, tt.wantClosed)
			}
			if tt.wantRow != "" {
				r := w.run(t, jobID)
				if r.State != tt.wantRow {
					t.Errorf("run row %s, want %s", r.State, tt.wantRow)
				}
				if r.State == store.RunDone && r.Status != string(tt.wantStatus) {
					t.Errorf("run row status %s, want %s", r.Status, tt.wantStatus)
				}
			}
			// A finished run's progress ends with run_finished; a run handed
			// over or retried leaves its stream open for the next attempt.
			if tt.wantRow != "" {
				types := w.progressTypes(t, messages.JobKindProvision, jobID)
				finished := len(types) > 0 && types[len(types)-1] == messages.EventRunFinished
				if len(types) == 0 || types[0] != messages.EventRunStarted || finished != (tt.wantRow == store.RunDone) {
					t.Errorf("progress events %v", types)
				}
			}
		})
	}
}

// checkResult checks a result's status, error kind and message.
func checkResult(t *testing.T, out *messages.Outcome, status messages.Status, kind messages.ErrorKind, msg string) {
	t.Helper()
	if out.Status != status {
		t.Fatalf("result %s %+v, want %s", out.Status, out.Error, status)
	}
	switch {
	case status == messages.StatusSucceeded:
		if out.Error != nil {
			t.Errorf("succeeded with an error: %+v", out.Error)
		}
	case out.Error == nil || out.Error.Kind != kind || !strings.Contains(out.Error.Message, msg):
		t.Errorf("result error %+v, want kind %s with %q", out.Error, kind, msg)
	}
	if out.StartedAt == "" || out.FinishedAt == "" {
		t.Errorf("result times %q %q", out.StartedAt, out.FinishedAt)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestProvisionSuccessDetails checks what a successful provisioning leaves
// beyond its status: the spec the play got, the pinned host key, the
// adopted deploy user, the recap in the result, the attempts reset.
func TestProvisionSuccessDetails(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.addServer(t, "web-1", "attempts = 2", "status = 'FAILED'")
	f := w.newFakes()
	h := w.handler(t, f, nil)
	if err := handle(t, h, nil, w.provision(t, "job-1", "web-1", 1), nil); err != nil {
		t.Fatal(err)
	}
	specs := f.runner.calls()
	if len(specs) != 1 {
		t.Fatalf("%d plays", len(specs))
	}
	sp := specs[0]
	wantHost := ansible.Host{Alias: "web-1", Address: "192.0.2.10", Port: 22, User: "root", KnownHostsKey: w.hostKey}
	if sp.Playbook != "setup_server.yml" || sp.JobID != "job-1" || sp.Host != wantHost {
		t.Errorf("spec %s %s %+v, want setup_server.yml job-1 %+v", sp.Playbook, sp.JobID, sp.Host, wantHost)
	}
	if sp.SecretEnv["AUTOPROV_DEPLOY_SSH_PUBKEY"] != w.clientPub || sp.Vars["autoprov_deploy_user"] != "deploy" {
		t.Errorf("spec env %v vars %v", sp.SecretEnv, sp.Vars)
	}
	if len(sp.SSHKeys) != 1 || !bytes.Equal(sp.SSHKeys[0], w.clientKey) {
		t.Error("the play did not get the resolved SSH key")
	}
	s := w.server(t, "web-1")
	if s.Status != store.ServerReady || s.Attempts != 0 || s.SSHUser != "deploy" || s.HostKey != w.hostKey {
		t.Errorf("server %s attempts %d user %s host key %q", s.Status, s.Attempts, s.SSHUser, s.HostKey)
	}
	r := w.provisionResults(t, "job-1")[0]
	if r.Playbook != "setup_server.yml" || r.Attempt != 1 || r.Hosts["web-1"] != (messages.HostRecap{Ok: 3, Changed: 1}) ||
		!strings.Contains(r.OutputTail, "PLAY RECAP") || r.FailedTask != nil {
		t.Errorf("result %+v", r.Outcome)
	}
	if types := w.progressTypes(t, messages.JobKindProvision, "job-1"); !slices.Equal(types, []messages.EventType{messages.EventRunStarted,
		messages.EventPlayStarted, messages.EventTaskStarted, messages.EventRunFinished}) {
		t.Errorf("progress %v", types)
	}
}

// TestFailedPlayResultIsRedacted checks that a secret a failing play prints
// reaches neither the result nor the run row.
func TestFailedPlayResultIsRedacted(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	f := w.newFakes()
	f.runner = newFakeRunner(func(_ context.Context, spec ansible.Spec) (*ansible.Result, error) {
		r := playResult(ansible.OutcomeFailed, spec.Host.Alias)
		r.FailedTask.Message = "git said: token " + ghToken + " refused"
		r.Err = errors.New("failed with token " + ghToken)
		r.OutputTail = "fatal: " + ghToken + "\n"
		return r, nil
	})
	h := w.handler(t, f, nil)
	msg := w.message(t, messages.StreamAnsibleDeployQueue, &messages.AnsibleDeployMessage{
		RequestMeta: messages.RequestMeta{JobID: "deploy-1"}, ProjectID: "3f1c9f2e-8a57-4d6b-9a0e-2b1f4c5d6e7f",
		RepoFullName: "acme/shop", Branch: "main", ServerIP: "192.0.2.20", Port: 8080,
		GitHubTokenRef: "env:AUTOPROV_PROJECT_GH", SecretsRef: "env:AUTOPROV_PROJECT_ENV",
	}, 1)
	if err := handle(t, h, nil, msg, nil); err != nil {
		t.Fatal(err)
	}
	sp := f.runner.calls()[0]
	if sp.SecretEnv["GITHUB_TOKEN"] != ghToken || sp.SecretEnv["PROJECT_ENV"] != projectEv || sp.Host.User != "deploy" {
		t.Errorf("deploy spec env/user: %d vars, user %s", len(sp.SecretEnv), sp.Host.User)
	}
	rs := w.deployResults(t, "deploy-1")
	if len(rs) != 1 {
		t.Fatalf("%d results", len(rs))
	}
	checkResult(t, &rs[0].Outcome, messages.StatusFailed, messages.KindPlaybookFailed, "deploy_project.yml")
	row := w.run(t, "deploy-1")
	for what, text := range map[string]string{
		"message": rs[0].Error.Message, "failed task": rs[0].FailedTask.Message, "output tail": rs[0].OutputTail,
		"run row": string(row.Result),
	} {
		if strings.Contains(text, ghToken) {
			t.Errorf("the token leaks into the %s", what)
		}
	}
	if !strings.Contains(rs[0].FailedTask.Message, "refused") {
		t.Errorf("failed task message lost its text: %q", rs[0].FailedTask.Message)
	}
}

// TestStoredResultIsPublishedAgain delivers a finished job again: its
// stored result is published again, and nothing runs twice.
func TestStoredResultIsPublishedAgain(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.addServer(t, "web-1")
	f := w.newFakes()
	h := w.handler(t, f, nil)
	if err := handle(t, h, nil, w.provision(t, "job-1", "web-1", 1), nil); err != nil {
		t.Fatal(err)
	}
	if err := handle(t, h, nil, w.provision(t, "job-1", "web-1", 2), nil); err != nil {
		t.Fatal(err)
	}
	data := w.entries(t, messages.StreamProvisionerResults)
	if len(data) != 2 || !bytes.Equal(data[0], data[1]) {
		t.Fatalf("%d results, want the same one twice", len(data))
	}
	if n := len(f.runner.calls()); n != 1 || f.ssh.calls() != 1 {
		t.Errorf("%d plays, %d SSH checks: the job ran again", n, f.ssh.calls())
	}
}

// TestRetriedRunIsTakenOver fails a run with an infrastructure error, then
// delivers it again: the next attempt takes the run over and finishes it.
func TestRetriedRunIsTakenOver(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.addServer(t, "web-1")
	f := w.newFakes()
	broken := true
	f.runner = newFakeRunner(func(ctx context.Context, spec ansible.Spec) (*ansible.Result, error) {
		if broken {
			return nil, errors.New("exec: runguard missing")
		}
		return plays(ansible.OutcomeSucceeded)(ctx, spec)
	})
	h := w.handler(t, f, nil)
	if err := handle(t, h, nil, w.provision(t, "job-1", "web-1", 1), nil); err == nil {
		t.Fatal("first delivery: no error to retry")
	}
	broken = false
	if err := handle(t, h, nil, w.provision(t, "job-1", "web-1", 2), nil); err != nil {
		t.Fatal(err)
	}
	rs := w.provisionResults(t, "job-1")
	if len(rs) != 1 || rs[0].Status != messages.StatusSucceeded || rs[0].Attempt != 2 {
		t.Fatalf("results %+v", rs)
	}
	if r := w.run(t, "job-1"); r.Attempt != 2 || r.State != store.RunDone {
		t.Errorf("run row attempt %d state %s", r.Attempt, r.State)
	}
}

// TestForceReinstallThroughProvider rebuilds a Time4VPS server: the
// reinstall is requested once, the host key re-pinned, cached facts
// dropped; a provider that refuses ends the job with provider_error.
func TestForceReinstallThroughProvider(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	reinstall := func(m *messages.ProvisionerMessage) { m.ForceReinstall = true }
	provider := func(refuse bool) *fakeProvider {
		return &fakeProvider{
			ServerFn: func(_ context.Context, id int64) (*time4vps.Server, error) {
				return &time4vps.Server{ID: id, IP: "192.0.2.10"}, nil
			},
			ReinstallFn: func(context.Context, int64, time4vps.ReinstallRequest) (int64, error) {
				if refuse {
					return 0, errors.New("the provider says no")
				}
				return 77, nil
			},
			WaitTaskFn: func(_ context.Context, _, taskID int64) (*time4vps.Task, error) {
				return &time4vps.Task{ID: taskID, Name: "server_reinstall"}, nil
			},
		}
	}
	t.Run("rebuilt", func(t *testing.T) {
		t.Parallel()
		w.addServer(t, "t4v-1", "source = 'time4vps'", "provider_id = '41'", "host_key = '"+w.otherHostKey+"'")
		f := w.newFakes()
		f.provider = provider(false)
		h := w.handler(t, f, nil)
		if err := handle(t, h, nil, w.provision(t, "job-t4v-1", "t4v-1", 1, reinstall), nil); err != nil {
			t.Fatal(err)
		}
		rs := w.provisionResults(t, "job-t4v-1")
		if len(rs) != 1 || rs[0].Status != messages.StatusSucceeded {
			t.Fatalf("results %+v", rs)
		}
		if n := f.provider.reinstalls.Load(); n != 1 {
			t.Errorf("%d reinstalls", n)
		}
		if s := w.server(t, "t4v-1"); s.HostKey != w.hostKey {
			t.Errorf("host key %q, want the new OS's", s.HostKey)
		}
		if forgot := f.runner.forgotten(); !slices.Contains(forgot, "t4v-1") {
			t.Errorf("cached facts kept: forgot %v", forgot)
		}
	})
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		w.addServer(t, "t4v-2", "source = 'time4vps'", "provider_id = '42'")
		f := w.newFakes()
		f.provider = provider(true)
		h := w.handler(t, f, nil)
		if err := handle(t, h, nil, w.provision(t, "job-t4v-2", "t4v-2", 1, reinstall), nil); err != nil {
			t.Fatal(err)
		}
		rs := w.provisionResults(t, "job-t4v-2")
		if len(rs) != 1 {
			t.Fatalf("%d results", len(rs))
		}
		checkResult(t, &rs[0].Outcome, messages.StatusFailed, messages.KindProviderError, "the provider says no")
		if n := len(f.runner.calls()); n != 0 {
			t.Errorf("%d plays after a refused reinstall", n)
		}
	})
}

// TestConfigIsValidated checks that New refuses an incomplete
// configuration instead of filling in defaults of its own.
func TestConfigIsValidated(t *testing.T) {
	t.Parallel()
	if err := config().Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	err := jobs.Config{}.Validate()
	if err == nil {
		t.Fatal("the zero Config is valid")
	}
	for _, want := range []string{"playbooks", "deploy ssh user", "max deliveries", "reinstall os", "cancel poll", "progress ttl", "reinstall ssh wait"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	bad := config()
	bad.SSHCheckReuse = -time.Second
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "ssh check reuse") {
		t.Errorf("negative reuse window: %v", err)
	}
}
