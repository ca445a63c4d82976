package jobs_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/jobs"
)

// playsBy is a run whose outcome depends on the playbook: outcomes[name],
// or success; a playbook mapped to OutcomeCancelled blocks until its
// context ends, as a play stopped on request does.
func playsBy(outcomes map[string]ansible.Outcome) func(context.Context, ansible.Spec) (*ansible.Result, error) {
	return func(ctx context.Context, spec ansible.Spec) (*ansible.Result, error) {
		o, ok := outcomes[spec.Playbook]
		switch {
		case !ok:
			return plays(ansible.OutcomeSucceeded)(ctx, spec)
		case o == ansible.OutcomeCancelled:
			return blocks()(ctx, spec)
		}
		return plays(o)(ctx, spec)
	}
}

// TestExtraPlaybooks runs provisioning requests with extra playbooks through
// a Handler with fakes (real Postgres and Redis): the extra playbooks run
// in order after the base playbook, as the deploy user once setup adopted
// it, stop at the first that does not succeed, and the result lists each
// playbook's outcome; names that are not playbooks of the directory, or
// that are the service's own, reject the request before anything runs.
func TestExtraPlaybooks(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	dir := t.TempDir()
	for _, name := range []string{"a.yml", "b.yml", "c.yaml"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("- hosts: all\n  tasks: []\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "d.yml"), 0o755); err != nil {
		t.Fatal(err)
	}

	type step = messages.PlaybookOutcome
	ok := func(name string) step { return step{Playbook: name, Status: messages.PlaybookSucceeded} }
	tests := []struct {
		name      string
		extras    []string
		recovery  bool
		noDir     bool // the handler has no playbook directory
		outcomes  map[string]ansible.Outcome
		cancelAt  string // set the cancel key once this playbook started
		sets      []string
		wantErr   func(error) bool
		want      messages.Status
		wantKind  messages.ErrorKind
		wantMsg   string
		wantPlay  string   // the result's playbook
		wantSteps []step   // durations are not compared
		wantRuns  []string // playbooks run, in order
		wantUsers []string // the SSH user of each run
		wantField []messages.FieldError
		wantSrv   string
	}{
		{
			name: "every extra playbook succeeds", extras: []string{"a.yml", "b.yml", "c.yaml"},
			want: messages.StatusSucceeded, wantPlay: "c.yaml",
			wantSteps: []step{ok("setup_server.yml"), ok("a.yml"), ok("b.yml"), ok("c.yaml")},
			wantRuns:  []string{"setup_server.yml", "a.yml", "b.yml", "c.yaml"},
			wantUsers: []string{"root", "deploy", "deploy", "deploy"},
			wantSrv:   store.ServerReady,
		},
		{
			name: "a failed extra playbook stops the rest", extras: []string{"a.yml", "b.yml", "c.yaml"},
			outcomes: map[string]ansible.Outcome{"b.yml": ansible.OutcomeFailed},
			want:     messages.StatusFailed, wantKind: messages.KindPlaybookFailed, wantMsg: "b.yml: failed on", wantPlay: "b.yml",
			wantSteps: []step{ok("setup_server.yml"), ok("a.yml"),
				{Playbook: "b.yml", Status: messages.PlaybookFailed, ErrorKind: messages.KindPlaybookFailed},
				{Playbook: "c.yaml", Status: messages.PlaybookSkipped}},
			wantRuns: []string{"setup_server.yml", "a.yml", "b.yml"},
			wantSrv:  store.ServerFailed,
		},
		{
			name: "a failed setup runs no extra playbook", extras: []string{"a.yml", "b.yml"},
			outcomes: map[string]ansible.Outcome{"setup_server.yml": ansible.OutcomeFailed},
			want:     messages.StatusFailed, wantKind: messages.KindPlaybookFailed, wantMsg: "setup_server.yml: failed on",
			wantPlay: "setup_server.yml",
			wantSteps: []step{{Playbook: "setup_server.yml", Status: messages.PlaybookFailed, ErrorKind: messages.KindPlaybookFailed},
				{Playbook: "a.yml", Status: messages.PlaybookSkipped}, {Playbook: "b.yml", Status: messages.PlaybookSkipped}},
			wantRuns: []string{"setup_server.yml"},
			wantSrv:  store.ServerFailed,
		},
		{
			name: "an extra playbook finds the server unreachable", extras: []string{"a.yml", "b.yml"},
			outcomes: map[string]ansible.Outcome{"a.yml": ansible.OutcomeUnreachable},
			want:     messages.StatusUnreachable, wantKind: messages.KindHostsUnreachable, wantPlay: "a.yml",
			wantSteps: []step{ok("setup_server.yml"),
				{Playbook: "a.yml", Status: messages.PlaybookUnreachable, ErrorKind: messages.KindHostsUnreachable},
				{Playbook: "b.yml", Status: messages.PlaybookSkipped}},
			wantRuns: []string{"setup_server.yml", "a.yml"},
			wantSrv:  store.ServerUnreachable,
		},
		{
			name: "an extra playbook cancelled on request", extras: []string{"a.yml", "b.yml"},
			outcomes: map[string]ansible.Outcome{"a.yml": ansible.OutcomeCancelled}, cancelAt: "a.yml",
			want: messages.StatusCancelled, wantKind: messages.KindCancelled, wantMsg: "cancelled on request", wantPlay: "a.yml",
			wantSteps: []step{ok("setup_server.yml"),
				{Playbook: "a.yml", Status: messages.PlaybookCancelled, ErrorKind: messages.KindCancelled},
				{Playbook: "b.yml", Status: messages.PlaybookSkipped}},
			wantRuns: []string{"setup_server.yml", "a.yml"},
			wantSrv:  store.ServerFailed,
		},
		{
			name: "recovery then extra playbooks", extras: []string{"b.yml", "a.yml"}, recovery: true,
			sets: []string{"ssh_user = 'deploy'", "status = 'FAILED'"},
			want: messages.StatusSucceeded, wantPlay: "a.yml",
			wantSteps: []step{ok("recovery.yml"), ok("b.yml"), ok("a.yml")},
			wantRuns:  []string{"recovery.yml", "b.yml", "a.yml"},
			wantUsers: []string{"deploy", "deploy", "deploy"},
			wantSrv:   store.ServerReady,
		},
		{
			name: "no extra playbooks: the result lists the base playbook",
			want: messages.StatusSucceeded, wantPlay: "setup_server.yml",
			wantSteps: []step{ok("setup_server.yml")}, wantRuns: []string{"setup_server.yml"}, wantSrv: store.ServerReady,
		},
		{
			name: "unknown extra playbooks are rejected", extras: []string{"a.yml", "zz.yml", "d.yml"},
			wantErr: stream.IsPermanent, want: messages.StatusRejected, wantKind: messages.KindInvalidMessage,
			wantField: []messages.FieldError{
				{Field: "playbooks[1]", Message: "no such playbook in playbooks/"},
				{Field: "playbooks[2]", Message: "no such playbook in playbooks/"},
			},
		},
		{
			name: "the service's own playbooks are not extra playbooks", extras: []string{"nuke.yml", "setup_server.yml"},
			wantErr: stream.IsPermanent, want: messages.StatusRejected, wantKind: messages.KindInvalidMessage,
			wantField: []messages.FieldError{
				{Field: "playbooks[0]", Message: "is run by the service itself and cannot be an extra playbook"},
				{Field: "playbooks[1]", Message: "is run by the service itself and cannot be an extra playbook"},
			},
		},
		{
			name: "extra playbooks without a playbook directory are rejected", extras: []string{"a.yml"}, noDir: true,
			wantErr: stream.IsPermanent, want: messages.StatusRejected, wantKind: messages.KindInvalidMessage,
			wantField: []messages.FieldError{
				{Field: "playbooks[0]", Message: "extra playbooks are not enabled (no playbook directory configured)"},
			},
		},
		{
			name: "a path is not a playbook name", extras: []string{"../../../etc/passwd.yml"},
			wantErr: stream.IsPermanent, want: messages.StatusRejected, wantKind: messages.KindInvalidMessage,
			wantField: []messages.FieldError{
				{Field: "playbooks[0]", Message: "must be a file name in playbooks/ matching " + messages.PlaybookNamePattern},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			slug := strings.NewReplacer(" ", "-", ":", "", "'", "").Replace(tt.name)
			srv, jobID := "srv-x-"+slug, "job-x-"+slug
			w.addServer(t, srv, tt.sets...)
			f := w.newFakes()
			f.runner = newFakeRunner(playsBy(tt.outcomes))
			h := w.handler(t, f, func(c *jobs.Config) {
				if !tt.noDir {
					c.PlaybookDir = dir
				}
			})
			msg := w.provision(t, jobID, srv, 1, func(m *messages.ProvisionerMessage) {
				m.Playbooks = tt.extras
				m.IsRecovery = tt.recovery
			})
			var started <-chan struct{}
			var interrupt func(context.CancelCauseFunc)
			if tt.cancelAt != "" {
				at := make(chan struct{})
				run := f.runner.RunFn
				f.runner.RunFn = func(ctx context.Context, spec ansible.Spec) (*ansible.Result, error) {
					if spec.Playbook == tt.cancelAt {
						close(at)
					}
					return run(ctx, spec)
				}
				started = at
				interrupt = func(context.CancelCauseFunc) {
					if err := w.rdb.Set(context.Background(), messages.CancelKey(messages.JobKindProvision, jobID), "1", time.Hour).Err(); err != nil {
						t.Error(err)
					}
				}
			}

			err := handle(t, h, started, msg, interrupt)
			if tt.wantErr == nil && err != nil || tt.wantErr != nil && !tt.wantErr(err) {
				t.Fatalf("Handle = %v", err)
			}
			results := w.provisionResults(t, jobID)
			if len(results) != 1 {
				t.Fatalf("published %d results, want 1", len(results))
			}
			res := results[0]
			checkResult(t, &res.Outcome, tt.want, tt.wantKind, tt.wantMsg)
			if res.Playbook != tt.wantPlay {
				t.Errorf("result playbook %q, want %q", res.Playbook, tt.wantPlay)
			}
			got := slices.Clone(res.Playbooks)
			for i := range got {
				if got[i].DurationMS < 0 || got[i].Status == messages.PlaybookSkipped && got[i].DurationMS != 0 {
					t.Errorf("playbook %s duration %d ms", got[i].Playbook, got[i].DurationMS)
				}
				got[i].DurationMS = 0
			}
			if !slices.Equal(got, tt.wantSteps) {
				t.Errorf("result playbooks\n got %+v\nwant %+v", got, tt.wantSteps)
			}
			var fields []messages.FieldError
			if res.Error != nil {
				fields = res.Error.Fields
			}
			if !slices.Equal(fields, tt.wantField) {
				t.Errorf("field errors\n got %+v\nwant %+v", fields, tt.wantField)
			}
			var runs, users []string
			for _, sp := range f.runner.calls() {
				runs = append(runs, sp.Playbook)
				users = append(users, sp.Host.User)
				if sp.Playbook != "setup_server.yml" && sp.Playbook != "recovery.yml" && len(sp.SecretEnv) != 0 {
					t.Errorf("extra playbook %s got a secret environment %v", sp.Playbook, sp.SecretEnv)
				}
			}
			if !slices.Equal(runs, tt.wantRuns) {
				t.Errorf("plays %v, want %v", runs, tt.wantRuns)
			}
			if tt.wantUsers != nil && !slices.Equal(users, tt.wantUsers) {
				t.Errorf("SSH users %v, want %v", users, tt.wantUsers)
			}
			if tt.wantRuns == nil && f.ssh.calls() != 0 {
				t.Errorf("a rejected request made %d SSH checks", f.ssh.calls())
			}
			wantSrv := cmpOr(tt.wantSrv, store.ServerNew)
			if tt.recovery && tt.wantSrv == "" {
				wantSrv = store.ServerFailed
			}
			if s := w.server(t, srv); s.Status != wantSrv {
				t.Errorf("server %s, want %s", s.Status, wantSrv)
			}
			if tt.wantSrv != "" {
				if r := w.run(t, jobID); r.State != store.RunDone || r.Status != string(tt.want) {
					t.Errorf("run row %s %s", r.State, r.Status)
				}
			} else if _, err := store.GetRun(context.Background(), w.pool, jobID); !errors.Is(err, store.ErrRunNotFound) {
				t.Errorf("a rejected request left a run row (%v)", err)
			}
		})
	}
}
