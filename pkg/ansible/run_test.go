package ansible

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible/internal/proc"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// targetDir is a directory on the target (this machine, over loopback
// sshd) for files a playbook writes.
func targetDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "aptarget")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func readTarget(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("file on target: %v", err)
	}
	return string(b)
}

// checkTimes checks that a run's times are set and in order.
func checkTimes(t *testing.T, res *Result) {
	t.Helper()
	if res.StartedAt.IsZero() || res.ExitedAt.Before(res.StartedAt) || res.FinishedAt.Before(res.ExitedAt) {
		t.Errorf("times out of order: started %s, exited %s, finished %s", res.StartedAt, res.ExitedAt, res.FinishedAt)
	}
}

func TestRunSucceeds(t *testing.T) {
	t.Parallel()
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	r, logs := newTestRunner(t, nil)
	sp := watchSpawn(r)
	dir := targetDir(t)
	literal := `{{ lookup('env','HOME') }}`
	nested := map[string]any{
		"list":  []string{"a", "{{ 7 * 6 }}"},
		"map":   map[string]any{"{{ key }}": "{% raw %}x", "n": 42, "ok": true, "f": 1.5},
		"quote": "it's \"quoted\"\n\ttabbed \u00e9\U0001F600 \x7f",
	}
	var events eventLog
	var startedPID atomic.Int64
	spec := specFor(s, "write_files.yml", map[string]any{
		"target_dir": dir, "marker": "hello", "literal": literal, "nested": nested,
	})
	spec.SecretEnv = map[string]string{"CANARY": "not-secret-here"}
	spec.OnEvent = events.add
	spec.OnStart = func(pid int) { startedPID.Store(int64(pid)) }

	res, err := r.Run(context.Background(), spec)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Outcome != OutcomeSucceeded || res.ExitCode != 0 || res.Err != nil || res.FailedTask != nil {
		t.Fatalf("result = %+v\ntail:\n%s", res, res.OutputTail)
	}
	want := Recap{OK: 4, Changed: 4}
	if got := res.Hosts["target-1"]; got != want || len(res.Hosts) != 1 {
		t.Errorf("recap = %+v, want target-1: %+v", res.Hosts, want)
	}
	if got := readTarget(t, filepath.Join(dir, "marker.txt")); got != "hello" {
		t.Errorf("marker.txt = %q", got)
	}
	if got := readTarget(t, filepath.Join(dir, "literal.txt")); got != literal {
		t.Errorf("literal.txt = %q, want the template text unrendered", got)
	}
	var gotNested map[string]any
	if err := json.Unmarshal([]byte(readTarget(t, filepath.Join(dir, "nested.json"))), &gotNested); err != nil {
		t.Fatal(err)
	}
	wantJSON, _ := json.Marshal(nested)
	var wantNested map[string]any
	_ = json.Unmarshal(wantJSON, &wantNested)
	if a, b := mustJSON(t, gotNested), mustJSON(t, wantNested); a != b {
		t.Errorf("nested arrived as %s, want %s", a, b)
	}

	types := events.types()
	if len(types) < 2 || types[0] != EventPlaybookStart || types[len(types)-1] != EventStats {
		t.Errorf("event types = %v", types)
	}
	for i, ev := range events.all() {
		if ev.Seq != i+1 || ev.Time.IsZero() || ev.Playbook != "write_files.yml" {
			t.Errorf("event %d = %+v", i, ev)
		}
	}
	if startedPID.Load() <= 0 {
		t.Error("OnStart not called")
	}
	checkTimes(t, res)
	if evs := events.all(); len(evs) > 0 && res.ExitedAt.Before(evs[len(evs)-1].Time) {
		t.Errorf("ExitedAt %s before the last event (%s)", res.ExitedAt, evs[len(evs)-1].Time)
	}
	if !strings.Contains(res.OutputTail, "PLAY RECAP") {
		t.Errorf("tail lacks the recap:\n%s", res.OutputTail)
	}
	if !strings.Contains(logs.String(), `"job_id":"`+spec.JobID+`"`) || !strings.Contains(logs.String(), `"host":"target-1"`) {
		t.Errorf("logs lack job_id/host:\n%s", logs.String())
	}
	pgid, runDir := sp.get()
	assertNothingLeft(t, pgid, runDir)
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRunSecretsAndKeysStayOffDisk samples, while a run goes, every
// process command line (for the secret) and every file in the run
// directory (for the secret and the private key); afterwards it searches
// the logs, the result, the events and RunRoot.
//
// With warm connections on (Config.WarmIdle), the same holds for the warm
// master's command line, environment and directory.
func TestRunSecretsAndKeysStayOffDisk(t *testing.T) {
	t.Parallel()
	for _, warm := range []bool{false, true} {
		t.Run(fmt.Sprintf("warm=%v", warm), func(t *testing.T) {
			t.Parallel()
			testSecretsStayOffDisk(t, warm)
		})
	}
}

func testSecretsStayOffDisk(t *testing.T, warm bool) {
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	r, logs := newTestRunner(t, func(c *Config) {
		if warm {
			c.WarmIdle = time.Minute
		}
	})
	sp := watchSpawn(r)
	dir := targetDir(t)
	canary := testenv.Unique("canary-")
	keyBody := keyMaterial(t, s.ClientKey)

	var events eventLog
	spec := specFor(s, "write_files.yml", map[string]any{
		"target_dir": dir, "marker": "m", "literal": "l", "nested": map[string]any{},
	})
	spec.SecretEnv = map[string]string{"CANARY": canary}
	spec.Redact = func(s string) string { return strings.ReplaceAll(s, canary, "[REDACTED]") }
	spec.OnEvent = events.add

	var (
		stop     = make(chan struct{})
		sampler  sync.WaitGroup
		mu       sync.Mutex
		findings []string
		samples  int
	)
	seen := map[string]bool{}
	note := func(finding string) {
		mu.Lock()
		if !seen[finding] {
			seen[finding] = true
			findings = append(findings, finding)
		}
		mu.Unlock()
	}
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		<-sp.ready
		for {
			select {
			case <-stop:
				return
			default:
			}
			proc.Each(func(pid int) {
				cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
				if bytes.Contains(cmd, []byte(canary)) {
					note("canary in cmdline of " + strconv.Itoa(pid))
				}
				if bytes.Contains(cmd, []byte(r.cfg.RunRoot+"/"+warmDirPrefix)) && bytes.Contains(cmd, []byte("ControlMaster=yes")) {
					env, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
					if bytes.Contains(env, []byte(canary)) {
						note("canary in the environment of the warm master " + strconv.Itoa(pid))
					}
				}
			})
			// The run dir and, with warm connections, the master's.
			_ = filepath.Walk(r.cfg.RunRoot, func(path string, info os.FileInfo, err error) error {
				if err != nil || !info.Mode().IsRegular() {
					return nil
				}
				b, _ := os.ReadFile(path)
				if bytes.Contains(b, []byte(canary)) {
					note("canary in " + path)
				}
				for _, k := range keyBody {
					if bytes.Contains(b, k) {
						note("private key in " + path)
					}
				}
				if info.Mode().Perm()&0o077 != 0 {
					note("file not private: " + path)
				}
				return nil
			})
			mu.Lock()
			samples++
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	res, err := r.Run(context.Background(), spec)
	close(stop)
	sampler.Wait()
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Outcome != OutcomeSucceeded {
		t.Fatalf("outcome %s: %v\n%s", res.Outcome, res.Err, res.OutputTail)
	}
	if got := readTarget(t, filepath.Join(dir, "secret.txt")); got != canary {
		t.Fatalf("secret.txt = %q, want the env secret", got)
	}
	t.Logf("%d samples of /proc and the run dir", samples)
	if samples < 3 {
		t.Errorf("only %d samples taken during the run", samples)
	}
	for _, f := range findings {
		t.Error(f)
	}
	evJSON, _ := json.Marshal(events.all())
	for what, text := range map[string]string{
		"logs": logs.String(), "output tail": res.OutputTail, "events": string(evJSON),
	} {
		if strings.Contains(text, canary) {
			t.Errorf("canary in %s", what)
		}
	}
	_ = filepath.Walk(r.cfg.RunRoot, func(path string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			if b, _ := os.ReadFile(path); bytes.Contains(b, []byte(canary)) {
				t.Errorf("canary in %s after the run", path)
			}
		}
		return nil
	})
	pgid, runDir := sp.get()
	assertNothingLeft(t, pgid, runDir)
	if warm {
		if m := warmMasters(r); len(m) != 1 {
			t.Errorf("warm masters after the run: %v, want one", m)
		}
		r.Close()
	}
	if ents, _ := os.ReadDir(r.cfg.RunRoot); len(ents) != 0 {
		t.Errorf("RunRoot not empty after the run: %v", ents)
	}
}

// keyMaterial returns distinctive pieces of a private key: a base64 line
// of the PEM body and the raw ed25519 seed.
func keyMaterial(t *testing.T, pemKey []byte) [][]byte {
	t.Helper()
	lines := bytes.Split(bytes.TrimSpace(pemKey), []byte("\n"))
	if len(lines) < 4 {
		t.Fatalf("unexpected key format")
	}
	raw, err := ssh.ParseRawPrivateKey(pemKey)
	if err != nil {
		t.Fatal(err)
	}
	k, ok := raw.(*ed25519.PrivateKey)
	if !ok {
		t.Fatalf("key type %T", raw)
	}
	return [][]byte{lines[2], k.Seed()}
}

func TestRunFailures(t *testing.T) {
	t.Parallel()
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	tests := []struct {
		name, playbook string
		vars           map[string]any
		outcome        Outcome
		exit           int
		recap          Recap
		task, msg      string
	}{
		{name: "failed task", playbook: "fail.yml", vars: map[string]any{"reason": "disk on fire"},
			outcome: OutcomeFailed, exit: 2, recap: Recap{OK: 2, Failed: 1, Ignored: 1},
			task: "Intentional failure", msg: "boom: disk on fire"},
		{name: "rescued failure", playbook: "rescue.yml",
			outcome: OutcomeSucceeded, exit: 0, recap: Recap{OK: 1, Rescued: 1}},
		{name: "syntax error", playbook: "syntax_error.yml", outcome: OutcomeError, exit: 4},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, _ := newTestRunner(t, nil)
			sp := watchSpawn(r)
			// The subtests share one sshd: each is a server of its own
			// (a takeover stops the tasks of other runs of its server).
			spec := specFor(s, tt.playbook, tt.vars)
			spec.Host.Alias = fmt.Sprintf("target-%d", i+1)
			res, err := r.Run(context.Background(), spec)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if res.Outcome != tt.outcome || res.ExitCode != tt.exit {
				t.Fatalf("outcome %s exit %d (want %s, %d): %v\n%s", res.Outcome, res.ExitCode, tt.outcome, tt.exit, res.Err, res.OutputTail)
			}
			if tt.outcome == OutcomeError {
				if res.Err == nil || !strings.Contains(res.Err.Error(), "ERROR!") {
					t.Errorf("err = %v, want Ansible's error line", res.Err)
				}
			} else if got := res.Hosts[spec.Host.Alias]; got != tt.recap {
				t.Errorf("recap = %+v, want %+v", got, tt.recap)
			}
			if tt.task == "" {
				if res.FailedTask != nil && tt.outcome == OutcomeSucceeded {
					t.Errorf("FailedTask = %+v on success", res.FailedTask)
				}
			} else {
				ft := res.FailedTask
				if ft == nil || ft.Name != tt.task || ft.Host != spec.Host.Alias || ft.Play != "Failing play" || ft.Message != tt.msg {
					t.Errorf("FailedTask = %+v, want %s: %s", ft, tt.task, tt.msg)
				}
				if res.Err == nil || !strings.Contains(res.Err.Error(), tt.task) {
					t.Errorf("Err = %v", res.Err)
				}
			}
			pgid, runDir := sp.get()
			assertNothingLeft(t, pgid, runDir)
		})
	}
}

// lostPipeRE is how Ansible reports any ssh failure when ssh exited before
// Ansible wrote the module to its stdin (pipelining; likelier on a loaded
// machine): the broken pipe hides ssh's own message.
const lostPipeRE = `Data could not be sent to remote host .*Broken pipe`

func TestRunUnreachable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		setup func(t *testing.T) Spec
		msg   string // the failed task's message holds it (or lostPipeRE)
	}{
		{"closed port", func(t *testing.T) Spec {
			s := testenv.StartSSHD(t, testenv.SSHDOptions{})
			sp := specFor(s, "ping.yml", nil)
			sp.Host.Port = testenv.ClosedPort(t)
			return sp
		}, "Connection refused"},
		{"paused sshd", func(t *testing.T) Spec {
			s := testenv.StartSSHD(t, testenv.SSHDOptions{})
			s.Pause()
			return specFor(s, "ping.yml", nil)
		}, "timed out"},
		{"host key changed", func(t *testing.T) Spec {
			s := testenv.StartSSHD(t, testenv.SSHDOptions{})
			sp := specFor(s, "ping.yml", nil)
			s.RotateHostKey() // the spec still pins the old key
			return sp
		}, "Host key verification failed"},
		{"wrong client key", func(t *testing.T) Spec {
			s := testenv.StartSSHD(t, testenv.SSHDOptions{})
			other := testenv.StartSSHD(t, testenv.SSHDOptions{})
			sp := specFor(s, "ping.yml", nil)
			sp.SSHKeys = [][]byte{other.ClientKey}
			return sp
		}, "Permission denied"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			spec := tt.setup(t)
			// One attempt: Ansible's reconnections (ansible.cfg's retries,
			// with backoff) would only repeat the failure.
			spec.Vars = map[string]any{"ansible_ssh_retries": 0}
			r, _ := newTestRunner(t, nil)
			sp := watchSpawn(r)
			res, err := r.Run(context.Background(), spec)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if res.Outcome != OutcomeUnreachable {
				t.Fatalf("outcome %s exit %d: %v\n%s", res.Outcome, res.ExitCode, res.Err, res.OutputTail)
			}
			if got := res.Hosts["target-1"]; got.Unreachable != 1 {
				t.Errorf("recap = %+v", res.Hosts)
			}
			ft := res.FailedTask
			if ft == nil || ft.Host != "target-1" || ft.Name != "Ping" || !regexp.MustCompile(tt.msg+"|"+lostPipeRE).MatchString(ft.Message) {
				t.Errorf("FailedTask = %+v, want Ping on target-1 with %q", ft, tt.msg)
			}
			t.Logf("exit %d, err %v", res.ExitCode, res.Err)
			pgid, runDir := sp.get()
			assertNothingLeft(t, pgid, runDir)
		})
	}
}

// TestRunStops cancels or times out a run in a silent sleep task and checks
// the whole group (ansible-playbook, workers, ssh) and the ssh master are
// gone when Run returns, with and without runguard.
func TestRunStops(t *testing.T) {
	t.Parallel()
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	tests := []struct {
		name    string
		noGuard bool
		timeout time.Duration
		idle    time.Duration
		cancel  bool
		outcome Outcome
	}{
		{name: "cancel", cancel: true, outcome: OutcomeCancelled},
		{name: "cancel without guard", noGuard: true, cancel: true, outcome: OutcomeCancelled},
		// The limits leave ansible-playbook time to reach the Sleep task and
		// its ssh master on a loaded machine (Python starts slowly there).
		{name: "wall-clock timeout", timeout: 30 * time.Second, idle: 2 * time.Minute, outcome: OutcomeTimeout},
		{name: "idle timeout", timeout: 2 * time.Minute, idle: 15 * time.Second, outcome: OutcomeIdleTimeout},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, _ := newTestRunner(t, func(c *Config) {
				if tt.noGuard {
					c.GuardPath = "/nonexistent/runguard"
				}
			})
			if r.Guarded() == tt.noGuard {
				t.Fatalf("Guarded() = %v", r.Guarded())
			}
			sp := watchSpawn(r)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			targetTmp := targetDir(t)
			spec := specFor(s, "sleep.yml", map[string]any{"sleep_seconds": 300, "target_tmp": targetTmp})
			spec.Timeout, spec.IdleTimeout = tt.timeout, tt.idle
			spec.Host.Alias = fmt.Sprintf("target-%d", i+1) // one server per subtest (one sshd)
			var sawMaster atomic.Bool
			var events eventLog
			spec.OnEvent = events.add
			events.notify = func(ev Event) {
				if ev.Type != EventTaskStart || ev.Task != "Sleep" {
					return
				}
				go func() {
					pgid, runDir := sp.get()
					deadline := time.Now().Add(time.Minute)
					for time.Now().Before(deadline) {
						if masterOutsideGroup(pgid, runDir) {
							sawMaster.Store(true)
							break
						}
						time.Sleep(20 * time.Millisecond)
					}
					if tt.cancel {
						// Cancel once the module runs on the target.
						for !moduleRunning(targetTmp) && time.Now().Before(deadline) {
							time.Sleep(20 * time.Millisecond)
						}
						cancel()
					}
				}()
			}
			start := time.Now()
			res, err := r.Run(ctx, spec)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if !sawMaster.Load() {
				t.Fatalf("the run ended before the ssh master was up (%s: %v)\n%s", res.Outcome, res.Err, res.OutputTail)
			}
			if res.Outcome != tt.outcome {
				t.Fatalf("outcome %s (want %s) exit %d: %v\n%s", res.Outcome, tt.outcome, res.ExitCode, res.Err, res.OutputTail)
			}
			if ft := res.FailedTask; ft == nil || ft.Name != "Sleep" {
				t.Errorf("FailedTask = %+v, want the running Sleep task", ft)
			}
			if tt.cancel && (res.Err == nil || !strings.Contains(res.Err.Error(), "context canceled")) {
				t.Errorf("Err = %v", res.Err)
			}
			checkTimes(t, res)
			t.Logf("%s after %s, exit %d: %v", res.Outcome, time.Since(start).Round(time.Millisecond), res.ExitCode, res.Err)
			pgid, runDir := sp.get()
			assertNothingLeft(t, pgid, runDir)
			// The task's command on the target was stopped with the play,
			// not left running.
			if moduleRunning(targetTmp) {
				t.Errorf("the Sleep task's command still runs on the target after Run returned")
			}
			if c := res.Cleanup; c == nil || c.Stopped < 1 || c.Left != 0 {
				t.Errorf("Cleanup = %+v, want the task's processes stopped", c)
			}
		})
	}
}

// TestRunConcurrent runs several playbooks at once through one Runner:
// private run dirs, sockets and control paths never collide.
func TestRunConcurrent(t *testing.T) {
	t.Parallel()
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	r, _ := newTestRunner(t, nil)
	var wg sync.WaitGroup
	results := make([]*Result, 3)
	errs := make([]error, 3)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			spec := specFor(s, "ping.yml", nil)
			spec.Host.Alias = fmt.Sprintf("target-%d", i+1) // servers of their own
			results[i], errs[i] = r.Run(context.Background(), spec)
		}()
	}
	wg.Wait()
	for i, res := range results {
		if errs[i] != nil || res.Outcome != OutcomeSucceeded {
			t.Errorf("run %d: %v %+v", i, errs[i], res)
		}
	}
	if ents, _ := os.ReadDir(r.cfg.RunRoot); len(ents) != 0 {
		t.Errorf("RunRoot not empty: %v", ents)
	}
}

// TestRunOnEventPanic: a panic in OnEvent stops the run and is re-raised
// from Run after the process group is gone and the run dir removed.
func TestRunOnEventPanic(t *testing.T) {
	t.Parallel()
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	r, _ := newTestRunner(t, nil)
	sp := watchSpawn(r)
	spec := specFor(s, "sleep.yml", map[string]any{"sleep_seconds": 300, "target_tmp": targetDir(t)})
	spec.OnEvent = func(ev Event) {
		if ev.Type == EventTaskStart {
			panic("consumer bug")
		}
	}
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		_, _ = r.Run(context.Background(), spec)
	}()
	if recovered != "consumer bug" {
		t.Fatalf("recovered %v, want the OnEvent panic", recovered)
	}
	pgid, runDir := sp.get()
	assertNothingLeft(t, pgid, runDir)
}

func TestRunCancelledBeforeStart(t *testing.T) {
	t.Parallel()
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	r, _ := newTestRunner(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := r.Run(ctx, specFor(s, "ping.yml", nil))
	if err != nil || res.Outcome != OutcomeCancelled {
		t.Fatalf("Run = %+v, %v", res, err)
	}
	if ents, _ := os.ReadDir(r.cfg.RunRoot); len(ents) != 0 {
		t.Errorf("RunRoot not empty: %v", ents)
	}
}

// TestRunStartFailure: an ansible-playbook that cannot be executed makes Run
// return an error (with and without runguard) and leaves nothing behind.
func TestRunStartFailure(t *testing.T) {
	t.Parallel()
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	bin := filepath.Join(t.TempDir(), "ansible-playbook")
	if err := os.WriteFile(bin, []byte("#!/nonexistent/python3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, guarded := range []bool{true, false} {
		r, _ := newTestRunner(t, func(c *Config) {
			c.PlaybookBin = bin
			if !guarded {
				c.GuardPath = "/nonexistent/runguard"
			}
		})
		res, err := r.Run(context.Background(), specFor(s, "ping.yml", nil))
		if err == nil || res != nil {
			t.Errorf("guarded=%v: Run = %+v, %v; want an error", guarded, res, err)
		} else {
			t.Logf("guarded=%v: %v", guarded, err)
		}
		if ents, _ := os.ReadDir(r.cfg.RunRoot); len(ents) != 0 {
			t.Errorf("guarded=%v: RunRoot not empty: %v", guarded, ents)
		}
	}
}

// TestRunKillGrace: a process that ignores SIGTERM is SIGKILLed after
// KillGrace, with and without runguard.
func TestRunKillGrace(t *testing.T) {
	t.Parallel()
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	bin := filepath.Join(t.TempDir(), "stubborn-playbook")
	script := "#!/bin/sh\ntrap '' TERM\necho started\nsleep 300\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, guarded := range []bool{true, false} {
		r, _ := newTestRunner(t, func(c *Config) {
			c.PlaybookBin = bin
			c.KillGrace = 500 * time.Millisecond
			if !guarded {
				c.GuardPath = "/nonexistent/runguard"
			}
		})
		sp := watchSpawn(r)
		// Cancelled a second after the process started (the takeover before
		// it takes its own time on a loaded machine).
		ctx, cancel := context.WithCancel(context.Background())
		spec := specFor(s, "ping.yml", nil)
		spec.OnStart = func(int) { time.AfterFunc(time.Second, cancel) }
		res, err := r.Run(ctx, spec)
		cancel()
		if err != nil {
			t.Fatalf("guarded=%v: %v", guarded, err)
		}
		if res.Outcome != OutcomeCancelled || res.ExitCode != 137 || !strings.Contains(res.OutputTail, "started") {
			t.Errorf("guarded=%v: outcome %s exit %d tail %q", guarded, res.Outcome, res.ExitCode, res.OutputTail)
		}
		pgid, runDir := sp.get()
		assertNothingLeft(t, pgid, runDir)
	}
}

// TestRunRedactsEscapedMultiLineSecret: a multi-line secret printed by a
// real play inside a JSON string (debug var=) and inside a Python repr in
// a JSON string (a list in a message), its line breaks escaped, is masked
// whole in the output tail, the events and the logs: no line of it, raw or
// escaped, is left.
func TestRunRedactsEscapedMultiLineSecret(t *testing.T) {
	t.Parallel()
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	r, logs := newTestRunner(t, nil)
	// Quotes and a backslash (escaped differently by JSON and repr) and a
	// line shorter than secrets.MinSecretLength.
	u1, u2 := testenv.Unique("x"), testenv.Unique("line2-")
	secret := "it's \"pw\"\\" + u1 + "\n" + u2 + "\nQ7~"
	red := secrets.NewRedactor()
	red.AddString(secret)
	var events eventLog
	var out testenv.SafeBuffer
	spec := specFor(s, "print_secret.yml", nil)
	spec.SecretEnv = map[string]string{"CANARY": secret}
	spec.Redact = red.RedactString
	spec.OnEvent = events.add
	spec.OnOutput = func(line string) { fmt.Fprintln(&out, line) }
	res, err := r.Run(context.Background(), spec)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Outcome != OutcomeSucceeded {
		t.Fatalf("outcome %s: %v\n%s", res.Outcome, res.Err, res.OutputTail)
	}
	// The two prints are there, each value one mask.
	for _, want := range []string{`"pw": "` + secrets.Redacted + `"`, `creds ['` + secrets.Redacted + `']`} {
		if !strings.Contains(res.OutputTail, want) {
			t.Errorf("output tail lacks %s:\n%s", want, res.OutputTail)
		}
	}
	pieces := []string{u1, u2}
	for _, line := range strings.Split(secret, "\n") {
		js, _ := json.Marshal(line)
		pieces = append(pieces, line, strings.Trim(string(js), `"`), strings.ReplaceAll(line, `'`, `\'`))
	}
	evJSON, _ := json.Marshal(events.all())
	for what, text := range map[string]string{
		"logs": logs.String(), "output tail": res.OutputTail, "output": out.String(), "events": string(evJSON),
	} {
		for _, p := range pieces {
			if strings.Contains(text, p) {
				t.Errorf("%s holds %q of the secret:\n%s", what, p, text)
			}
		}
	}
}

// TestRunTakeoverOverlapsStartup: the takeover runs while ansible-playbook
// starts up, and the play's first task waits for it (gate.go). With a
// takeover held until the playbook has started (its playbook_start event,
// however long Python takes to start on a loaded machine), ansible-playbook
// is started within it, and no task starts before it is done.
func TestRunTakeoverOverlapsStartup(t *testing.T) {
	t.Parallel()
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	r, _ := newTestRunner(t, nil)
	playbookStarted := make(chan struct{})
	var sawStart atomic.Bool
	var takeoverDone, held atomic.Int64
	r.hooks.onTakeover = func() {
		began := time.Now()
		select {
		case <-playbookStarted:
			sawStart.Store(true)
		case <-time.After(time.Minute):
		}
		held.Store(int64(time.Since(began)))
		takeoverDone.Store(time.Now().UnixNano())
	}
	var startedAt, firstTask atomic.Int64
	spec := specFor(s, "ping.yml", nil)
	spec.OnStart = func(int) { startedAt.Store(time.Now().UnixNano()) }
	spec.OnEvent = func(ev Event) {
		switch ev.Type {
		case EventPlaybookStart:
			close(playbookStarted)
		case EventTaskStart:
			firstTask.CompareAndSwap(0, time.Now().UnixNano())
		}
	}
	res, err := r.Run(context.Background(), spec)
	if err != nil || res.Outcome != OutcomeSucceeded {
		t.Fatalf("Run: %v %+v", err, res)
	}
	if !sawStart.Load() || startedAt.Load() == 0 || startedAt.Load() > takeoverDone.Load() {
		t.Errorf("ansible-playbook did not start its playbook during the takeover (held %v): after it, not during it", time.Duration(held.Load()))
	}
	if firstTask.Load() == 0 || firstTask.Load() < takeoverDone.Load() {
		t.Errorf("the first task started before the takeover was done (task %d, takeover done %d)", firstTask.Load(), takeoverDone.Load())
	}
	if res.Takeover == nil || res.Steps.Takeover < time.Duration(held.Load()) || res.Steps.TakeoverWait <= 0 || res.Steps.TakeoverWait > res.Steps.Takeover {
		t.Errorf("Takeover %+v, steps %+v: want the takeover reported, its wait part of it", res.Takeover, res.Steps)
	}
	// The play's step leaves out its wait at the gate.
	if ran := res.ExitedAt.Sub(res.StartedAt); res.Steps.Play <= 0 || res.Steps.Play > ran-res.Steps.TakeoverWait {
		t.Errorf("play step %v, want in (0, %v]: from exec to exit less the wait at the gate", res.Steps.Play, ran-res.Steps.TakeoverWait)
	}
}

// TestRunStopsTaskBeforeGate: a playbook that reports a task while the
// takeover is still running (a callback plugin that does not wait at the
// gate) is stopped with an error, and nothing of it is left.
func TestRunStopsTaskBeforeGate(t *testing.T) {
	t.Parallel()
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	bin := filepath.Join(t.TempDir(), "ansible-playbook")
	script := "#!/bin/sh\n" +
		`echo '{"v":1,"seq":1,"event":"task_start","task":"Sneaky"}' >&3` + "\n" +
		"exec sleep 30\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	r, _ := newTestRunner(t, func(c *Config) {
		c.PlaybookBin = bin
		c.KillGrace = 500 * time.Millisecond
	})
	r.hooks.onTakeover = func() { time.Sleep(2 * time.Second) } // the task comes first
	sp := watchSpawn(r)
	res, err := r.Run(context.Background(), specFor(s, "ping.yml", nil))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Outcome != OutcomeError || res.Err == nil || !strings.Contains(res.Err.Error(), "before the takeover") {
		t.Errorf("outcome %s, err %v: want error, a task before the takeover", res.Outcome, res.Err)
	}
	pgid, runDir := sp.get()
	assertNothingLeft(t, pgid, runDir)
}
