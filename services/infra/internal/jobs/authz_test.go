package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/jobs"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sshcheck"
)

const authzProject = "3f1c9f2e-8a57-4d6b-9a0e-2b1f4c5d6e7f"

// TestDeployAuthorization sends deploys a hostile producer could send and
// checks that each is refused before anything is resolved or dialed (no env:
// read, no SSH check, no play), with one result recorded in the run row, and
// that the allowed ones go through. The policy is authzConfig: unregistered
// targets in 192.0.2.0/24 only, env:AUTOPROV_PROJECT_* and the project's
// vault paths only.
func TestDeployAuthorization(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	// A registered server at 192.0.2.10 (world.addServer), with its own
	// SSH key reference.
	// A template allows its key reference (authzConfig: an operator's
	// slip): the rule on the service's own credentials still refuses it.
	w.addServer(t, "web-1", "ssh_key_ref = 'env:AUTOPROV_SECRET_SERVERKEY'")
	if _, err := w.pool.Exec(context.Background(), `UPDATE servers SET host_key = $1 WHERE handle = 'web-1'`, w.hostKey); err != nil {
		t.Fatal(err)
	}
	w.env["AUTOPROV_SECRET_SERVERKEY"] = string(w.clientKey)
	down := &sshcheck.UnreachableError{Address: "192.0.2.20", Port: 22, Attempts: 3, Class: sshcheck.ClassRefused,
		Err: errors.New("dial tcp 192.0.2.20:22: connect: connection refused")}
	tests := []struct {
		name     string
		ip       string
		gh, env  string // github_token_ref, secrets_ref
		sshFails bool

		wantStatus messages.Status
		wantKind   messages.ErrorKind
		wantMsg    string // exact when wantExact
		wantExact  bool
		wantChecks int
		wantPlays  int
		wantAlias  string // the play's inventory name
	}{
		{name: "unregistered outside the allow-list", ip: "198.51.100.7", gh: "env:AUTOPROV_PROJECT_GH",
			wantStatus: messages.StatusUnreachable, wantKind: messages.KindSSHUnreachable, wantMsg: "198.51.100.7:22 did not answer SSH", wantExact: true},
		{name: "cloud metadata address", ip: "169.254.169.254", gh: "env:AUTOPROV_PROJECT_GH",
			wantStatus: messages.StatusUnreachable, wantKind: messages.KindSSHUnreachable, wantMsg: "169.254.169.254:22 did not answer SSH", wantExact: true},
		{name: "metadata address mapped into IPv6", ip: "::ffff:169.254.169.254", env: "env:AUTOPROV_PROJECT_ENV",
			wantStatus: messages.StatusUnreachable, wantKind: messages.KindSSHUnreachable, wantMsg: "169.254.169.254:22 did not answer SSH", wantExact: true},
		{name: "loopback", ip: "127.0.0.1",
			wantStatus: messages.StatusUnreachable, wantKind: messages.KindSSHUnreachable, wantMsg: "127.0.0.1:22 did not answer SSH", wantExact: true},
		{name: "unspecified", ip: "::",
			wantStatus: messages.StatusUnreachable, wantKind: messages.KindSSHUnreachable, wantMsg: "[::]:22 did not answer SSH", wantExact: true},
		{name: "allowed unregistered target that is down", ip: "192.0.2.20", gh: "env:AUTOPROV_PROJECT_GH", sshFails: true,
			wantStatus: messages.StatusUnreachable, wantKind: messages.KindSSHUnreachable, wantMsg: "192.0.2.20:22 did not answer SSH", wantExact: true,
			wantChecks: 1},
		{name: "the default SSH key as secrets_ref", ip: "192.0.2.10", env: "env:AUTOPROV_SECRET_SSH_KEY",
			wantStatus: messages.StatusFailed, wantKind: messages.KindSecretUnavailable, wantMsg: "may not use it"},
		{name: "a server's SSH key as github_token_ref", ip: "192.0.2.20", gh: "env:AUTOPROV_SECRET_SERVERKEY",
			wantStatus: messages.StatusFailed, wantKind: messages.KindSecretUnavailable, wantMsg: "credential of the service itself"},
		{name: "another project's vault path", ip: "192.0.2.10", env: "vault:secret/projects/0b8f7c1e-6a4e-4c1b-9d7a-2f1e5c3b9a10/env",
			wantStatus: messages.StatusFailed, wantKind: messages.KindSecretUnavailable, wantMsg: "may not use it"},
		{name: "the service's vault ssh path", ip: "192.0.2.10", env: "vault:secret/infra/ssh#private_key",
			wantStatus: messages.StatusFailed, wantKind: messages.KindSecretUnavailable, wantMsg: "may not use it"},
		{name: "a file reference", ip: "192.0.2.10", env: "file:etc/shadow",
			wantStatus: messages.StatusFailed, wantKind: messages.KindSecretUnavailable, wantMsg: "may not use it"},
		{name: "registered server", ip: "192.0.2.10", gh: "env:AUTOPROV_PROJECT_GH", env: "env:AUTOPROV_PROJECT_ENV",
			wantStatus: messages.StatusSucceeded, wantChecks: 1, wantPlays: 1, wantAlias: "web-1"},
		{name: "registered server mapped into IPv6", ip: "::ffff:192.0.2.10", gh: "env:AUTOPROV_PROJECT_GH",
			wantStatus: messages.StatusSucceeded, wantChecks: 1, wantPlays: 1, wantAlias: "web-1"},
		{name: "allowed unregistered target", ip: "192.0.2.21", env: "env:AUTOPROV_PROJECT_ENV",
			wantStatus: messages.StatusSucceeded, wantChecks: 1, wantPlays: 1, wantAlias: "192.0.2.21"},
	}
	// Each case has variables of its own, so that it can tell what it read:
	// its default SSH key, its GH token and project env.
	perCase := func(i int, ref string) string {
		if ref == "env:AUTOPROV_PROJECT_GH" || ref == "env:AUTOPROV_PROJECT_ENV" {
			return fmt.Sprintf("%s_%d", ref, i)
		}
		return ref
	}
	for i := range tests {
		w.env[fmt.Sprintf("AUTOPROV_SECRET_KEY_%d", i)] = string(w.clientKey)
		w.env[fmt.Sprintf("AUTOPROV_PROJECT_GH_%d", i)] = ghToken
		w.env[fmt.Sprintf("AUTOPROV_PROJECT_ENV_%d", i)] = projectEv
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			jobID := "deploy-" + strings.ReplaceAll(tt.name, " ", "-")
			keyVar := fmt.Sprintf("AUTOPROV_SECRET_KEY_%d", i)
			ghVar, envVar := fmt.Sprintf("AUTOPROV_PROJECT_GH_%d", i), fmt.Sprintf("AUTOPROV_PROJECT_ENV_%d", i)
			tt.gh, tt.env = perCase(i, tt.gh), perCase(i, tt.env)
			f := w.newFakes()
			var checked []sshcheck.Target
			if tt.sshFails {
				f.ssh = newFakeSSH(fails(down))
			} else {
				pass := passes(w.hostKey)
				f.ssh = newFakeSSH(func(ctx context.Context, target sshcheck.Target, s []ssh.Signer) (*sshcheck.Result, error) {
					checked = append(checked, target)
					return pass(ctx, target, s)
				})
			}
			h := w.handler(t, f, func(c *jobs.Config) { c.DefaultSSHKeyRef = "env:" + keyVar })
			msg := w.message(t, messages.StreamAnsibleDeployQueue, &messages.AnsibleDeployMessage{
				RequestMeta: messages.RequestMeta{JobID: jobID}, ProjectID: authzProject, RepoFullName: "acme/shop",
				Branch: "main", ServerIP: tt.ip, Port: 8080, GitHubTokenRef: tt.gh, SecretsRef: tt.env,
			}, 1)
			// Two cases deploy to web-1 at once: the one that finds it busy
			// is released for redelivery (stream.Later), as the consumer
			// would, and handled again once the other is done.
			err := handle(t, h, nil, msg, nil)
			for try := 0; errors.Is(err, store.ErrTargetBusy) && try < 600; try++ {
				time.Sleep(50 * time.Millisecond)
				err = handle(t, h, nil, msg, nil)
			}
			if err != nil {
				t.Fatalf("Handle = %v (a refusal is an outcome, not an error)", err)
			}
			rs := w.deployResults(t, jobID)
			if len(rs) != 1 {
				t.Fatalf("%d results, want 1", len(rs))
			}
			checkResult(t, &rs[0].Outcome, tt.wantStatus, tt.wantKind, tt.wantMsg)
			if tt.wantExact && rs[0].Error.Message != tt.wantMsg {
				t.Errorf("message %q, want exactly %q (no reason, no connection error)", rs[0].Error.Message, tt.wantMsg)
			}
			row := w.run(t, jobID)
			if row.State != store.RunDone || row.Status != string(tt.wantStatus) || row.Kind != "deploy" {
				t.Errorf("run row %s %s %s", row.State, row.Status, row.Kind)
			}
			// A refusal reads nothing: neither the service's key nor the
			// request's secrets. An allowed deploy reads each once, after
			// the SSH check.
			read := func(name string, want bool) {
				if n := w.looked(name); (n > 0) != want {
					t.Errorf("%s read %d times, want read: %v", name, n, want)
				}
			}
			allowed := tt.wantStatus == messages.StatusSucceeded
			read(keyVar, tt.wantChecks > 0 && tt.wantAlias != "web-1")
			read(ghVar, allowed && strings.HasSuffix(tt.gh, ghVar))
			read(envVar, allowed && strings.HasSuffix(tt.env, envVar))
			if got := f.ssh.calls(); got != tt.wantChecks {
				t.Errorf("%d SSH checks, want %d", got, tt.wantChecks)
			}
			plays := f.runner.calls()
			if len(plays) != tt.wantPlays {
				t.Fatalf("%d plays, want %d", len(plays), tt.wantPlays)
			}
			if tt.wantPlays > 0 {
				sp := plays[0]
				if sp.Host.Alias != tt.wantAlias {
					t.Errorf("play alias %q, want %q", sp.Host.Alias, tt.wantAlias)
				}
				if tt.wantAlias == "web-1" && (sp.Host.KnownHostsKey != w.hostKey || sp.Host.Address != "192.0.2.10") {
					t.Errorf("registered server played as %+v: its pinned key and address not used", sp.Host)
				}
				if len(checked) == 1 && checked[0].PinnedKey == "" && tt.wantAlias == "web-1" {
					t.Error("the registered server's pinned key was not used by the SSH check")
				}
			}
		})
	}
}
