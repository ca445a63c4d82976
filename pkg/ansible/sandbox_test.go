package ansible

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/rs/zerolog"
)

// testUIDs are the job user ids of the sandbox tests (no account uses them).
var testUIDs = UIDRange{First: 47000, Count: 100}

// sandboxRunner is a runner over the repository's ansible/ with
// sandboxed runs (the fleet's as the play user), or without a sandbox.
func sandboxRunner(t *testing.T, sandboxed bool) *Runner {
	t.Helper()
	cred := playUserCredential(t)
	dir, err := filepath.Abs("../../ansible")
	if err != nil {
		t.Fatal(err)
	}
	base := shortTempDir(t, "aps") // holds the leases (autoprov-uids) too
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	r, _ := newTestRunner(t, func(c *Config) {
		c.AnsibleDir = dir
		c.RunRoot = filepath.Join(base, "r")
		c.RunAs = cred
		c.FactCacheDir = shortTempDir(t, "apf")
		if sandboxed {
			c.Sandbox = &Sandbox{Bwrap: "/usr/bin/bwrap", UIDs: testUIDs}
		}
	})
	return r
}

// jobDir is a job directory holding playbook text as site.yml and a file
// only this job should read.
func jobDir(t *testing.T, playbook, secret string) string {
	t.Helper()
	dir := shortTempDir(t, "apj")
	if err := os.WriteFile(filepath.Join(dir, "site.yml"), []byte(playbook), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "secret.txt"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func jobOn(s *testenv.SSHD, dir string) JobSpec {
	return JobSpec{
		Spec:         Spec{JobID: testenv.Unique("job-"), SSHKeys: [][]byte{s.ClientKey}},
		Dir:          dir,
		PlaybookPath: filepath.Join(dir, "site.yml"),
		Hosts:        []JobHost{{Host: hostOf(s)}},
	}
}

// TestSandboxKeepsJobsApart is the attack of issue 31: while job B runs
// (its vault password in its environment, its key in its agent, its
// checkout on disk), job A's playbook runs commands on infra's machine
// (pipe lookups) to read B's environment, list B's run directory, agent
// and control sockets, read B's checkout and a file of infra's own. In a
// sandbox each job runs as its own user id, sees no other process and
// none of those paths; without one (the play user for all) the same
// playbook reads them, which proves the attack works.
func TestSandboxKeepsJobsApart(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/usr/bin/bwrap"); err != nil {
		t.Fatalf("bubblewrap missing (%v): scripts/services.sh deps installs it", err)
	}
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	// A file of infra's own that plays must never read (like its SSH key).
	infraDir := shortTempDir(t, "api")
	if err := os.Chmod(infraDir, 0o755); err != nil { // readable to any user: only the sandbox hides it
		t.Fatal(err)
	}
	infraFile := filepath.Join(infraDir, "infra-key")
	if err := os.WriteFile(infraFile, []byte("INFRA-KEY-MATERIAL"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, sandboxed := range []bool{true, false} {
		t.Run(fmt.Sprintf("sandboxed=%v", sandboxed), func(t *testing.T) {
			r := sandboxRunner(t, sandboxed)
			sp := watchSpawn(r)
			// Job B: holds the host for a while.
			bDir := jobDir(t, "- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.command: sleep 60\n", "B-CHECKOUT-SECRET")
			bJob := jobOn(s, bDir)
			bJob.VaultPassword = "B-VAULT-PASSWORD"
			bCtx, stopB := context.WithCancel(context.Background())
			defer stopB()
			bDone := make(chan *Result, 1)
			go func() {
				res, err := r.RunJob(bCtx, bJob)
				if err != nil {
					t.Errorf("job B: %v", err)
				}
				bDone <- res
			}()
			select {
			case <-sp.ready:
			case <-time.After(time.Minute):
				t.Fatal("job B did not start")
			}
			bPgid, bRun := sp.get()
			r.hooks.onSpawn = nil // job A's start is not watched
			// ansible-playbook's own pid: the group's members (runguard,
			// bwrap, ansible-playbook) include it; any of them holds the
			// environment in the unsandboxed case.
			var bPids []string
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				bPids = groupPids(bPgid)
				if len(bPids) >= 2 && hasPlaybook(bPids) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			script := fmt.Sprintf(`echo "uid=$(id -u)"
echo "procs=$(ls /proc | grep -c '^[0-9]')"
for p in %s; do grep -qa B-VAULT-PASSWORD /proc/$p/environ 2>/dev/null && echo LEAK-environ; done
ls %[2]s >/dev/null 2>&1 && echo LEAK-rundir
SSH_AUTH_SOCK=%[2]s/agent.sock ssh-add -l >/dev/null 2>&1 && echo LEAK-agent
ls %[2]s/cp >/dev/null 2>&1 && echo LEAK-control
grep -q B-CHECKOUT-SECRET %[3]s/secret.txt 2>/dev/null && echo LEAK-checkout
grep -q INFRA-KEY-MATERIAL %[4]s 2>/dev/null && echo LEAK-infra
true
`, strings.Join(bPids, " "), bRun, bDir, infraFile)
			aDir := jobDir(t, "- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.debug:\n        msg: \"{{ lookup('ansible.builtin.pipe', 'sh ' ~ playbook_dir ~ '/attack.sh') }}\"\n", "A")
			if err := os.WriteFile(filepath.Join(aDir, "attack.sh"), []byte(script), 0o600); err != nil {
				t.Fatal(err)
			}
			res, err := r.RunJob(context.Background(), jobOn(s, aDir))
			if err != nil {
				t.Fatal(err)
			}
			stopB()
			bRes := <-bDone
			if res.Outcome != OutcomeSucceeded {
				t.Fatalf("job A: %s %v\n%s", res.Outcome, res.Err, res.OutputTail)
			}
			out := res.OutputTail
			leaks := regexp.MustCompile(`LEAK-[a-z]+`).FindAllString(out, -1)
			uid := regexp.MustCompile(`uid=(\d+)`).FindStringSubmatch(out)
			if uid == nil {
				t.Fatalf("job A printed no uid:\n%s", out)
			}
			id, _ := strconv.ParseUint(uid[1], 10, 32)
			if !sandboxed {
				// The attack's teeth: one shared user reads it all.
				for _, want := range []string{"LEAK-environ", "LEAK-rundir", "LEAK-agent", "LEAK-control", "LEAK-checkout", "LEAK-infra"} {
					if !strings.Contains(out, want) {
						t.Errorf("without a sandbox the attack should find %s; output:\n%s", want, out)
					}
				}
				return
			}
			if len(leaks) > 0 {
				t.Errorf("a sandboxed job reached another's: %v\n%s", leaks, out)
			}
			if !testUIDs.contains(uint32(id)) {
				t.Errorf("job A ran as uid %d, not one of %s", id, testUIDs)
			}
			if procs := regexp.MustCompile(`procs=(\d+)`).FindStringSubmatch(out); procs == nil || mustAtoi(procs[1]) > 12 {
				t.Errorf("job A sees other processes: %v\n%s", procs, out)
			}
			if bRes == nil || bRes.Outcome != OutcomeCancelled {
				t.Errorf("job B: %+v", bRes)
			}
		})
	}
}

func mustAtoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// groupPids lists the live members of process group pgid.
func groupPids(pgid int) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...
		rest := string(stat[strings.LastIndexByte(string(stat), ')')+2:])
		f := strings.Fields(rest)
		if len(f) > 2 && f[2] == strconv.Itoa(pgid) {
			out = append(out, strconv.Itoa(pid))
		}
	}
	return out
}

func hasPlaybook(pids []string) bool {
	for _, p := range pids {
		cmd, _ := os.ReadFile("/proc/" + p + "/cmdline")
		if strings.Contains(string(cmd), "ansible-playbook") && !strings.Contains(string(cmd), "bwrap") {
			return true
		}
	}
	return false
}

// TestSandboxProbeStopsStart: where bubblewrap cannot make a sandbox (here
// a stand-in that fails as bwrap does in a container with a masked /proc),
// New fails with bubblewrap's words and the way out, instead of a runner
// whose every run fails.
func TestSandboxProbeStopsStart(t *testing.T) {
	requirePlaybook(t)
	// Run as a job's user id: the stand-in lies where that user reaches it.
	standin := shortTempDir(t, "apb")
	if err := os.Chmod(standin, 0o755); err != nil {
		t.Fatal(err)
	}
	bwrap := filepath.Join(standin, "bwrap")
	script := "#!/bin/sh\necho 'bwrap: Can'\\''t mount proc on /newroot/proc: Operation not permitted' >&2\nexit 1\n"
	if err := os.WriteFile(bwrap, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		bwrap string
		ok    bool
	}{
		{"bubblewrap works", "/usr/bin/bwrap", true},
		{"bubblewrap refused", bwrap, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{AnsibleDir: testAnsibleDir(t), PlaybookBin: playbookBin, RunRoot: filepath.Join(shortTempDir(t, "app"), "r"),
				GuardPath: guardBin, FactCacheDir: t.TempDir(), Sandbox: &Sandbox{Bwrap: tc.bwrap},
				KillGrace: 3 * time.Second, Timeout: time.Hour, IdleTimeout: time.Minute}
			if os.Geteuid() == 0 {
				cfg.Sandbox.UIDs = testUIDs
				if err := os.Chmod(filepath.Dir(cfg.RunRoot), 0o711); err != nil {
					t.Fatal(err)
				}
			}
			_, err := New(cfg, zerolog.Nop())
			switch {
			case tc.ok && err != nil:
				t.Fatalf("New: %v", err)
			case !tc.ok && err == nil:
				t.Fatal("New accepted a sandbox bubblewrap cannot make")
			case !tc.ok:
				for _, want := range []string{"cannot make a sandbox", "Can't mount proc", "systempaths=unconfined", "PLAYBOOK_SANDBOX=off"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("New's error %q does not say %q", err, want)
					}
				}
			}
		})
	}
}
