package ansible

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// BenchmarkRunOverhead runs a trivial playbook (one ping) against a
// loopback sshd and reports what the runner adds around ansible-playbook,
// per run (p50/p99 over b.N runs, in milliseconds):
//
//   - start_*: from the Run call to ansible-playbook's exec (guarded: the
//     time runguard reports; direct: when exec.Cmd.Start returned);
//   - prep_p50: Run call to starting the process (validation, run dir and
//     files, agent, the takeover);
//   - takeover_p50: the takeover of earlier runs' remote work (one SSH
//     session and reap.py on the target), part of prep;
//   - guard_start_p50: starting runguard until its main runs (fork/exec, Go
//     runtime start); guard_exec_p50: runguard's main to the program's exec;
//   - exit_*: from ansible-playbook's exit (guarded: as runguard saw it;
//     direct: when it was reaped) to Run returning (leftover cleanup, pipe
//     drain, classification, run dir removal); exit_reap_p50 (guarded):
//     the part until runguard was reaped (it ends what the play left, ssh
//     ControlPersist masters included, and exits).
//
// The "sandboxed" mode is "guarded" in a sandbox (sandbox.go): its run_p50
// against guarded's is what the sandbox costs a run (bubblewrap's setup
// happens between runguard's exec of bwrap and ansible-playbook's).
//
// Run with: go test -run '^$' -bench RunOverhead -benchtime 20x
func BenchmarkRunOverhead(b *testing.B) {
	requirePlaybook(b)
	s := testenv.StartSSHD(b, testenv.SSHDOptions{})
	for _, mode := range []string{"guarded", "sandboxed", "direct"} {
		b.Run(mode, func(b *testing.B) {
			r, _ := newTestRunner(b, func(c *Config) {
				switch mode {
				case "direct":
					c.GuardPath = "/nonexistent/runguard"
				case "sandboxed":
					c.Sandbox = &Sandbox{Bwrap: "/usr/bin/bwrap", UIDs: testUIDs}
					base := shortTempDir(b, "aps")
					c.RunRoot = base + "/r"
				}
			})
			r.log = zerolog.Nop()
			var start, prep, takeover, guardStart, guardExec, exit, exitReap []time.Duration
			r.hooks.onTimings = func(t timings) {
				ms := func(from, to int64) time.Duration { return time.Duration(to - from) }
				prep = append(prep, ms(t.runCalled, t.spawning))
				takeover = append(takeover, time.Duration(t.takeover))
				if mode != "direct" {
					start = append(start, ms(t.runCalled, t.childStarted))
					guardStart = append(guardStart, ms(t.spawning, t.guardMain))
					guardExec = append(guardExec, ms(t.guardMain, t.childStarted))
					exit = append(exit, ms(t.childExited, t.returned))
					exitReap = append(exitReap, ms(t.childExited, t.reaped))
				} else {
					start = append(start, ms(t.runCalled, t.spawned))
					exit = append(exit, ms(t.reaped, t.returned))
				}
			}
			spec := specFor(s, "ping.yml", nil)
			var wall []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				at := time.Now()
				res, err := r.Run(context.Background(), spec)
				wall = append(wall, time.Since(at))
				if err != nil {
					b.Fatal(err)
				}
				if res.Outcome != OutcomeSucceeded {
					b.Fatalf("outcome %s: %v\n%s", res.Outcome, res.Err, res.OutputTail)
				}
			}
			b.StopTimer()
			report(b, "run", wall, false)
			report(b, "start", start, true)
			report(b, "exit", exit, true)
			report(b, "prep", prep, false)
			report(b, "takeover", takeover, false)
			if mode != "direct" {
				report(b, "guard_start", guardStart, false)
				report(b, "guard_exec", guardExec, false)
				report(b, "exit_reap", exitReap, false)
			}
		})
	}
}

// report adds name_p50_ms (and name_p99_ms) metrics.
func report(b *testing.B, name string, d []time.Duration, p99 bool) {
	if len(d) == 0 {
		return
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	ms := func(x time.Duration) float64 { return float64(x) / float64(time.Millisecond) }
	b.ReportMetric(ms(d[len(d)/2]), name+"_p50_ms")
	if p99 {
		b.ReportMetric(ms(d[min(len(d)-1, len(d)*99/100)]), name+"_p99_ms")
	}
}
