package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

const (
	benchRuns    = 50
	benchTargets = 8
	benchConc    = 8
)

// trivialPlaybook is what every variant runs: one module round trip.
const trivialPlaybook = `---
- name: Trivial
  hosts: all
  gather_facts: false
  tasks:
    - name: Ping
      ansible.builtin.ping:
`

// BenchmarkServiceVsPlainVsRunner runs 50 runs of a trivial playbook
// against 8 loopback sshd targets at concurrency 8 three ways, one after
// the other in one process, and reports them side by side: through the
// service (a ProvisionerMessage each, one infra instance with
// STREAM_CONCURRENCY=8), a plain shell loop of ansible-playbook (xargs -P
// 8), and ansible-runner (Debian's python3-ansible-runner, xargs -P 8). All
// three use the project's ansible.cfg. It also reports the service's own
// overhead per run from its logs (request read to ansible-playbook started,
// with the SSH check shown on its own, and play end to result published),
// and the infra process's idle RSS. Run with -benchtime=1x.
func BenchmarkServiceVsPlainVsRunner(b *testing.B) {
	for range b.N {
		var sshds []*testenv.SSHD
		for range benchTargets {
			sshds = append(sshds, testenv.StartSSHD(b, testenv.SSHDOptions{}))
		}
		e := newE2E(b, sshds[0])
		if err := os.WriteFile(filepath.Join(e.ansibleDir, "playbooks", "setup_server.yml"), []byte(trivialPlaybook), 0o644); err != nil {
			b.Fatal(err)
		}
		keyFile := filepath.Join(b.TempDir(), "id_ed25519")
		if err := os.WriteFile(keyFile, sshds[0].ClientKey, 0o600); err != nil {
			b.Fatal(err)
		}
		// Every sshd authorizes its own generated client key: give each
		// target the first one's key too, so one key serves all.
		for _, s := range sshds[1:] {
			f, err := os.OpenFile(filepath.Join(s.Dir, "authorized_keys"), os.O_APPEND|os.O_WRONLY, 0o600)
			if err != nil {
				b.Fatal(err)
			}
			fmt.Fprintln(f, sshds[0].ClientPublicKey)
			f.Close()
		}

		b.ResetTimer()
		plainWall := runPlainLoop(b, e, sshds, keyFile)
		runnerWall := runAnsibleRunner(b, e, sshds, keyFile)
		serviceWall, overhead, rss := runThroughService(b, e, sshds)
		b.StopTimer()

		b.ReportMetric(serviceWall.Seconds(), "service-s")
		b.ReportMetric(plainWall.Seconds(), "plain-loop-s")
		b.ReportMetric(runnerWall.Seconds(), "ansible-runner-s")
		b.ReportMetric(serviceWall.Seconds()/plainWall.Seconds(), "service/plain")
		b.ReportMetric(runnerWall.Seconds()/plainWall.Seconds(), "runner/plain")
		for _, o := range overhead[:5] {
			b.ReportMetric(o.p50, o.name+"-p50-ms")
			b.ReportMetric(o.p99, o.name+"-p99-ms")
		}
		b.ReportMetric(float64(rss)/1024, "idle-rss-MB")
	}
}

func runPlainLoop(b *testing.B, e *e2e, sshds []*testenv.SSHD, keyFile string) time.Duration {
	dir := b.TempDir()
	var invs []string
	for i, s := range sshds {
		invs = append(invs, s.WriteInventory(b, dir, fmt.Sprintf("target%d", i), keyFile))
	}
	var list strings.Builder
	for i := range benchRuns {
		list.WriteString(invs[i%len(invs)] + "\n")
	}
	cp := shortDir(b)
	script := fmt.Sprintf(`xargs -P %d -I{} /usr/bin/ansible-playbook -i {} playbooks/setup_server.yml >/dev/null`, benchConc)
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = e.ansibleDir
	cmd.Stdin = strings.NewReader(list.String())
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir, "LANG=C.UTF-8",
		"ANSIBLE_CONFIG=" + filepath.Join(e.ansibleDir, "ansible.cfg"), "ANSIBLE_SSH_CONTROL_PATH_DIR=" + cp,
		"ANSIBLE_CACHE_PLUGIN_CONNECTION=" + filepath.Join(dir, "facts")}
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("plain loop: %v\n%s", err, out)
	}
	return time.Since(start)
}

func runAnsibleRunner(b *testing.B, e *e2e, sshds []*testenv.SSHD, keyFile string) time.Duration {
	dir := b.TempDir()
	cp := shortDir(b)
	book, err := os.ReadFile(filepath.Join(e.ansibleDir, "playbooks", "setup_server.yml"))
	if err != nil {
		b.Fatal(err)
	}
	var pdds []string
	for i, s := range sshds {
		pdd := filepath.Join(dir, fmt.Sprintf("pdd%d", i))
		for _, sub := range []string{"project", "inventory", "env"} {
			if err := os.MkdirAll(filepath.Join(pdd, sub), 0o700); err != nil {
				b.Fatal(err)
			}
		}
		inv := s.WriteInventory(b, dir, fmt.Sprintf("target%d", i), keyFile)
		must(b, copyFile(inv, filepath.Join(pdd, "inventory", "hosts.yml")))
		must(b, os.WriteFile(filepath.Join(pdd, "project", "setup_server.yml"), book, 0o600))
		envvars, _ := json.Marshal(map[string]string{
			"ANSIBLE_CONFIG":                  filepath.Join(e.ansibleDir, "ansible.cfg"),
			"ANSIBLE_SSH_CONTROL_PATH_DIR":    cp,
			"ANSIBLE_CACHE_PLUGIN_CONNECTION": filepath.Join(dir, "facts"),
		})
		must(b, os.WriteFile(filepath.Join(pdd, "env", "envvars"), envvars, 0o600))
		pdds = append(pdds, pdd)
	}
	var list strings.Builder
	for i := range benchRuns {
		fmt.Fprintf(&list, "%s run%d\n", pdds[i%len(pdds)], i)
	}
	script := fmt.Sprintf(`xargs -P %d -L1 sh -c '/usr/bin/ansible-runner run "$0" -p setup_server.yml --ident "$1" >/dev/null'`, benchConc)
	cmd := exec.Command("bash", "-c", script)
	cmd.Stdin = strings.NewReader(list.String())
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir, "LANG=C.UTF-8"}
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("ansible-runner: %v\n%s", err, out)
	}
	wall := time.Since(start)
	// ansible-runner reports failures in its artifacts, not its exit code.
	for i := range benchRuns {
		rc, err := os.ReadFile(filepath.Join(pdds[i%len(pdds)], "artifacts", fmt.Sprintf("run%d", i), "rc"))
		if err != nil || strings.TrimSpace(string(rc)) != "0" {
			b.Fatalf("ansible-runner run %d: rc %q %v", i, rc, err)
		}
	}
	return wall
}

type quantiles struct {
	name     string
	p50, p99 float64
}

func runThroughService(b *testing.B, e *e2e, sshds []*testenv.SSHD) (time.Duration, []quantiles, int) {
	for i, s := range sshds {
		e.addServer(fmt.Sprintf("bench-%d", i), s)
	}
	p := e.infra(fmt.Sprintf("STREAM_CONCURRENCY=%d", benchConc), "LOG_LEVEL=info")
	time.Sleep(2 * time.Second) // settle: idle
	rss := vmRSS(b, p.Pid())

	start := time.Now()
	for i := range benchRuns {
		e.provision(fmt.Sprintf("bench-job-%d", i), fmt.Sprintf("bench-%d", i%len(sshds)))
	}
	testenv.WaitFor(b, 10*time.Minute, "all results", func() bool {
		return len(e.results(messages.StreamProvisionerResults)) >= benchRuns
	})
	wall := time.Since(start)
	for _, m := range e.results(messages.StreamProvisionerResults) {
		r, err := messages.DecodeProvisionerResult([]byte(m.Values["data"].(string)))
		if err != nil || r.Status != messages.StatusSucceeded {
			b.Fatalf("service run %v: %v %+v", err, r.Status, r.Error)
		}
	}

	return wall, overheadQuantiles(b, p.Stderr()), rss
}

// overheadQuantiles reads the per-job overhead fields of the "job
// finished" log lines: the start overhead in all, the SSH check and the lock
// wait within it, what remains (the service's own work: decoding, Postgres,
// run directory, agent, runguard and exec), the finish overhead, each
// step of the breakdown (step_<name>_ms, see internal/jobs/steps.go) and
// the job's Postgres round trips (pg_round_trips).
func overheadQuantiles(b *testing.B, logs string) []quantiles {
	fields := map[string][]float64{}
	var stepNames []string
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, `"message":"job finished"`) {
			continue
		}
		var rec struct {
			Start  *float64 `json:"overhead_start_ms"`
			SSH    float64  `json:"ssh_check_ms"`
			Lock   float64  `json:"lock_wait_ms"`
			Finish float64  `json:"overhead_finish_ms"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Start == nil {
			continue // no playbook ran for that job
		}
		fields["overhead_start_ms"] = append(fields["overhead_start_ms"], *rec.Start)
		fields["ssh_check_ms"] = append(fields["ssh_check_ms"], rec.SSH)
		fields["lock_wait_ms"] = append(fields["lock_wait_ms"], rec.Lock)
		fields["overhead_finish_ms"] = append(fields["overhead_finish_ms"], rec.Finish)
		fields["overhead_own_ms"] = append(fields["overhead_own_ms"], *rec.Start-rec.SSH-rec.Lock)
		var all map[string]any
		_ = json.Unmarshal([]byte(line), &all)
		for k, v := range all {
			f, ok := v.(float64)
			if !ok || !strings.HasPrefix(k, "step_") && k != "pg_round_trips" {
				continue
			}
			if _, known := fields[k]; !known {
				stepNames = append(stepNames, k)
			}
			fields[k] = append(fields[k], f)
		}
	}
	slices.Sort(stepNames)
	var out []quantiles
	for _, k := range append([]string{"overhead_start_ms", "ssh_check_ms", "lock_wait_ms", "overhead_own_ms", "overhead_finish_ms"}, stepNames...) {
		v := fields[k]
		if len(v) == 0 {
			b.Fatalf("no %s in the logs", k)
		}
		slices.Sort(v)
		q := func(p float64) float64 { return v[int(p*float64(len(v)-1))] }
		out = append(out, quantiles{strings.TrimSuffix(k, "_ms"), q(0.5), q(0.99)})
	}
	return out
}

// printSteps prints the p50/p99 of each quantile, one per line, so that the
// breakdown reads as a table under the benchmark's line.
func printSteps(b *testing.B, title string, qs []quantiles) {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s (ms)\n  %-22s %9s %9s\n", title, "step", "p50", "p99")
	for _, q := range qs {
		fmt.Fprintf(&sb, "  %-22s %9.1f %9.1f\n", q.name, q.p50, q.p99)
	}
	b.Log(sb.String())
	fmt.Print(sb.String())
}

// BenchmarkServiceOverhead measures the service's own time around a play
// when nothing competes for the machine: 40 runs of a trivial playbook one
// after the other on one loopback target. Run with -benchtime=1x.
func BenchmarkServiceOverhead(b *testing.B) {
	runs := benchEnvInt("BENCH_OVERHEAD_RUNS", 40)
	for range b.N {
		sshd := testenv.StartSSHD(b, testenv.SSHDOptions{})
		e := newE2E(b, sshd)
		if err := os.WriteFile(filepath.Join(e.ansibleDir, "playbooks", "setup_server.yml"), []byte(trivialPlaybook), 0o644); err != nil {
			b.Fatal(err)
		}
		e.addServer("bench-1", sshd)
		p := e.infra("STREAM_CONCURRENCY=1", "LOG_LEVEL=info")
		results := e.followResults(b)
		time.Sleep(2 * time.Second)
		rss := vmRSS(b, p.Pid())
		b.ResetTimer()
		for i := range runs {
			id := fmt.Sprintf("overhead-%d", i)
			e.provision(id, "bench-1")
			r, err := results.wait(id, time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			if r.Status != messages.StatusSucceeded {
				b.Fatalf("run %d: %s %+v", i, r.Status, r.Error)
			}
		}
		b.StopTimer()
		qs := overheadQuantiles(b, p.Stderr())
		for _, o := range qs[:5] {
			b.ReportMetric(o.p50, o.name+"-p50-ms")
			b.ReportMetric(o.p99, o.name+"-p99-ms")
		}
		printSteps(b, fmt.Sprintf("ServiceOverhead: %d runs, concurrency 1", runs), qs)
		b.ReportMetric(float64(rss)/1024, "idle-rss-MB")
	}
}

// benchEnvInt reads a positive integer setting of a benchmark from the
// environment; def when unset or invalid.
func benchEnvInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// vmRSS returns a process's resident set in KiB.
func vmRSS(b *testing.B, pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	b.Fatal("no VmRSS")
	return 0
}

// shortDir returns a short directory for ssh control sockets.
func shortDir(b *testing.B) string {
	d, err := os.MkdirTemp("/tmp", "cp")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o600)
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

// roleTasks is the number of tasks of the role workload's role.
const roleTasks = 10

// writeBenchRole writes a role of roleTasks command tasks under dir and
// returns a playbook that applies it (by absolute path).
func writeBenchRole(b *testing.B, dir string) string {
	role := filepath.Join(dir, "benchroles", "bench10")
	must(b, os.MkdirAll(filepath.Join(role, "tasks"), 0o755))
	var tasks strings.Builder
	tasks.WriteString("---\n")
	for i := range roleTasks {
		fmt.Fprintf(&tasks, "- name: Step %d\n  ansible.builtin.command: /bin/true\n  changed_when: false\n", i+1)
	}
	must(b, os.WriteFile(filepath.Join(role, "tasks", "main.yml"), []byte(tasks.String()), 0o644))
	return fmt.Sprintf("---\n- name: Role\n  hosts: all\n  gather_facts: false\n  roles:\n    - role: %s\n", role)
}

// runBare runs n plays of setup_server.yml with a bare ansible-playbook
// loop (xargs -P conc), round robin over the inventories, with the same
// ansible.cfg as infra, and returns the wall time. Warm, the runs share
// one ssh ControlPath directory, so with ControlPersist a run finds the
// master connection an earlier run to the same target left; cold, each
// run has its own (as each of infra's runs has).
//
// extraEnv adds settings to the bare runs (ANSIBLE_STRATEGY=mitogen_linear).
func runBare(b *testing.B, e *e2e, invs []string, n, conc int, cold bool, extraEnv ...string) time.Duration {
	var list strings.Builder
	for i := range n {
		list.WriteString(invs[i%len(invs)] + "\n")
	}
	dir := b.TempDir()
	cp := shortDir(b)
	play := `/usr/bin/ansible-playbook -i {} playbooks/setup_server.yml >/dev/null`
	if cold {
		play = `sh -c 'd=$(mktemp -d ` + cp + `/rXXXXXX) && ANSIBLE_SSH_CONTROL_PATH_DIR=$d /usr/bin/ansible-playbook -i {} playbooks/setup_server.yml >/dev/null'`
	}
	cmd := exec.Command("bash", "-c", fmt.Sprintf(`xargs -P %d -I{} %s`, conc, play))
	cmd.Dir = e.ansibleDir
	cmd.Stdin = strings.NewReader(list.String())
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir, "LANG=C.UTF-8",
		"ANSIBLE_CONFIG=" + filepath.Join(e.ansibleDir, "ansible.cfg"), "ANSIBLE_SSH_CONTROL_PATH_DIR=" + cp,
		"ANSIBLE_CACHE_PLUGIN_CONNECTION=" + filepath.Join(dir, "facts")}
	cmd.Env = append(cmd.Env, extraEnv...)
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("bare loop: %v\n%s", err, out)
	}
	return time.Since(start)
}

// runInfra submits n provisioning jobs (ids prefix-0..), round robin over
// the servers, conc at a time (each waits for a result before the next of
// its lane goes), and returns the wall time until every result is in.
func runInfra(b *testing.B, e *e2e, results *resultFollower, handles []string, prefix string, n, conc int) time.Duration {
	start := time.Now()
	if conc >= n {
		for i := range n {
			e.provision(fmt.Sprintf("%s-%d", prefix, i), handles[i%len(handles)])
		}
		for i := range n {
			r, err := results.wait(fmt.Sprintf("%s-%d", prefix, i), 10*time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			if r.Status != messages.StatusSucceeded {
				b.Fatalf("%s-%d: %s %+v", prefix, i, r.Status, r.Error)
			}
		}
		return time.Since(start)
	}
	// conc lanes, lane k serving servers k, k+conc, ...: no two of a lane's
	// jobs overlap, as in the bare loop.
	done := make(chan error, conc)
	for lane := range conc {
		go func() {
			for i := lane; i < n; i += conc {
				id := fmt.Sprintf("%s-%d", prefix, i)
				e.provision(id, handles[i%len(handles)])
				r, err := results.wait(id, 10*time.Minute)
				if err != nil {
					done <- err
					return
				}
				if r.Status != messages.StatusSucceeded {
					done <- fmt.Errorf("%s: %s %+v", id, r.Status, r.Error)
					return
				}
			}
			done <- nil
		}()
	}
	for range conc {
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

// jobLines keeps the log lines of the jobs whose ids start with prefix.
func jobLines(logs, prefix string) string {
	var sb strings.Builder
	for line := range strings.Lines(logs) {
		if strings.Contains(line, `"job_id":"`+prefix+`-`) {
			sb.WriteString(line)
		}
	}
	return sb.String()
}

// BenchmarkServiceVsBare compares infra with a bare ansible-playbook loop
// (same ansible.cfg) and with itself without its sandbox
// (PLAYBOOK_SANDBOX=off, the "/unsandboxed" column; BENCH_VS_BARE_SANDBOX=0
// skips it) on 4 loopback targets: BENCH_VS_BARE_RUNS (default 12)
// trivial plays and as many plays of a 10-task role, at concurrency 1 and
// 4, the bare loop and infra alternated in one run, in BENCH_VS_BARE_ROUNDS
// (default 3) rounds whose order rotates; it prints each ratio
// with infra's step breakdown beside it. Then the makespan of
// BENCH_MAKESPAN_JOBS (default 50) trivial jobs over 8 targets with 1, 2
// and 4 infra replicas of STREAM_CONCURRENCY=2 each (the curve; 0 skips
// it). Each bare figure has a cold twin (each run its own ssh ControlPath,
// as infra's runs; see runBare). BENCH_VS_BARE_WORKLOADS ("trivial",
// "role10", both by default) selects workloads; BENCH_BARE_MITOGEN=1
// adds the bare loop with Mitogen's strategy. Extra
// infra settings (BENCH_INFRA_ENV, space-separated NAME=value) apply to
// every replica. Beside each ratio it prints the machine's CPU time per run
// of each side (testenv.MachineCPU: the service, ssh, the targets' sshd and
// Python, Redis, Postgres): once the CPU is the limit, the makespan follows
// it. Run with -benchtime=1x.
func BenchmarkServiceVsBare(b *testing.B) {
	n := benchEnvInt("BENCH_VS_BARE_RUNS", 12)
	rounds := benchEnvInt("BENCH_VS_BARE_ROUNDS", 3)
	jobs := benchEnvInt("BENCH_MAKESPAN_JOBS", 50)
	if os.Getenv("BENCH_MAKESPAN_JOBS") == "0" {
		jobs = 0 // no makespan curve
	}
	extra := strings.Fields(os.Getenv("BENCH_INFRA_ENV"))
	for range b.N {
		var sshds []*testenv.SSHD
		for range 8 {
			sshds = append(sshds, testenv.StartSSHD(b, testenv.SSHDOptions{}))
		}
		e := newE2E(b, sshds[0])
		results := e.followResults(b)
		keyFile := testenv.ShareClientKey(b, b.TempDir(), sshds)
		roleBook := writeBenchRole(b, e.ansibleDir)
		book := filepath.Join(e.ansibleDir, "playbooks", "setup_server.yml")
		var invs, handles []string
		dir := b.TempDir()
		for i, s := range sshds {
			invs = append(invs, s.WriteInventory(b, dir, fmt.Sprintf("target%d", i), keyFile))
			handles = append(handles, fmt.Sprintf("bench-%d", i))
			e.addServer(handles[i], s)
		}
		base := append([]string{"STREAM_CONCURRENCY=4", "LOG_LEVEL=info"}, extra...)
		p := e.infra(base...)
		// The fourth side: infra without its sandbox (PLAYBOOK_SANDBOX=off),
		// a replica swapped in for the round (BENCH_VS_BARE_SANDBOX=0: none).
		sides := 3
		if os.Getenv("BENCH_VS_BARE_SANDBOX") != "0" && !slices.Contains(extra, "PLAYBOOK_SANDBOX=off") {
			sides = 4
		}
		var earlier strings.Builder // the logs of replaced replicas
		time.Sleep(2 * time.Second) // settle: idle
		rss := vmRSS(b, p.Pid())    // reported below: ResetTimer drops metrics
		// Warm both (fact cache, page cache, first pins).
		must(b, os.WriteFile(book, []byte(trivialPlaybook), 0o644))
		runBare(b, e, invs[:4], 4, 4, false)
		runInfra(b, e, results, handles[:4], "warm", 4, 4)

		b.ResetTimer()
		b.ReportMetric(float64(rss)/1024, "idle-rss-MB")
		var report strings.Builder
		fmt.Fprintf(&report, "infra's idle RSS: %.1f MB\n", float64(rss)/1024)
		fmt.Fprintf(&report, "%-10s %5s %5s %10s %10s %10s %7s %7s %12s\n", "workload", "conc", "runs", "bare s", "cold s", "infra s", "ratio", "/cold", "/unsandboxed")
		workloads := os.Getenv("BENCH_VS_BARE_WORKLOADS") // "": all
		for _, w := range []struct{ name, book string }{{"trivial", trivialPlaybook}, {"role10", roleBook}} {
			if workloads != "" && !slices.Contains(strings.Fields(workloads), w.name) {
				continue
			}
			must(b, os.WriteFile(book, []byte(w.book), 0o644))
			for _, conc := range []int{1, 4} {
				prefix := fmt.Sprintf("%s-c%d", w.name, conc)
				// rounds of the three sides, each round in another order, so
				// that a drift of the machine's speed weighs on all three.
				var bare, infra, cold, open, cpuBare, cpuInfra, cpuCold, own time.Duration
				for r := range rounds {
					for k := range sides {
						cpu0, own0 := testenv.MachineCPU(b), testenv.ProcessCPU(b, p.Pid())
						switch (r + k) % sides {
						case 0:
							bare += runBare(b, e, invs[:4], n, conc, false)
							cpuBare += testenv.MachineCPU(b) - cpu0
						case 1:
							infra += runInfra(b, e, results, handles[:4], fmt.Sprintf("%s-r%d", prefix, r), n, conc)
							cpuInfra += testenv.MachineCPU(b) - cpu0
							own += testenv.ProcessCPU(b, p.Pid()) - own0
						case 2:
							cold += runBare(b, e, invs[:4], n, conc, true)
							cpuCold += testenv.MachineCPU(b) - cpu0
						default: // the same replica without its sandbox
							earlier.WriteString(p.Stderr())
							p.Signal(syscall.SIGTERM)
							p.Wait(time.Minute)
							q := e.infra(append(slices.Clone(base), "PLAYBOOK_SANDBOX=off")...)
							open += runInfra(b, e, results, handles[:4], fmt.Sprintf("off-%s-r%d", prefix, r), n, conc)
							q.Signal(syscall.SIGTERM)
							q.Wait(time.Minute)
							p = e.infra(base...)
						}
					}
				}
				ratio := infra.Seconds() / bare.Seconds()
				perRun := func(d time.Duration) float64 { return float64(d.Milliseconds()) / float64(n*rounds) }
				unsandboxed := "-"
				if open > 0 {
					unsandboxed = fmt.Sprintf("%.3f", infra.Seconds()/open.Seconds())
					b.ReportMetric(infra.Seconds()/open.Seconds(), prefix+"-infra/unsandboxed")
				}
				fmt.Fprintf(&report, "%-10s %5d %5d %10.2f %10.2f %10.2f %7.3f %7.3f %12s   cpu ms/run: bare %.0f cold %.0f infra %.0f (its own process %.0f)\n", w.name, conc, n*rounds,
					bare.Seconds(), cold.Seconds(), infra.Seconds(), ratio, infra.Seconds()/cold.Seconds(), unsandboxed,
					perRun(cpuBare), perRun(cpuCold), perRun(cpuInfra), perRun(own))
				if os.Getenv("BENCH_BARE_MITOGEN") != "" {
					// Debian's ansible-mitogen: the bare loop with its strategy.
					mito := runBare(b, e, invs[:4], n, conc, false, "ANSIBLE_STRATEGY=mitogen_linear")
					fmt.Fprintf(&report, "%-10s %5d %5d bare with mitogen_linear %.2f s (%.3f of the bare loop)\n", w.name, conc, n,
						mito.Seconds(), mito.Seconds()/(bare.Seconds()/float64(rounds)))
				}
				b.ReportMetric(ratio, prefix+"-infra/bare")
				b.ReportMetric(infra.Seconds()/cold.Seconds(), prefix+"-infra/cold")
				qs := overheadQuantiles(b, jobLines(earlier.String()+p.Stderr(), prefix))
				printSteps(b, fmt.Sprintf("%s, concurrency %d: infra's steps", w.name, conc), qs)
			}
		}
		p.Signal(syscall.SIGTERM)
		p.Wait(time.Minute)

		// The makespan curve: 1, 2, 4 replicas.
		must(b, os.WriteFile(book, []byte(trivialPlaybook), 0o644))
		if jobs > 0 {
			fmt.Fprintf(&report, "\nmakespan of %d trivial jobs over %d targets, STREAM_CONCURRENCY=2 per replica\n%-9s %10s %10s\n",
				jobs, len(handles), "replicas", "seconds", "jobs/s")
		}
		for _, replicas := range []int{1, 2, 4} {
			if jobs == 0 {
				break
			}
			var procs []*infraProc
			for range replicas {
				procs = append(procs, e.infra(append([]string{"STREAM_CONCURRENCY=2", "LOG_LEVEL=info"}, extra...)...))
			}
			wall := runInfra(b, e, results, handles, fmt.Sprintf("mk%d", replicas), jobs, jobs)
			fmt.Fprintf(&report, "%-9d %10.2f %10.2f\n", replicas, wall.Seconds(), float64(jobs)/wall.Seconds())
			b.ReportMetric(wall.Seconds(), fmt.Sprintf("makespan-%dr-s", replicas))
			for _, q := range procs {
				q.Signal(syscall.SIGTERM)
			}
			for _, q := range procs {
				q.Wait(time.Minute)
			}
		}
		b.StopTimer()
		b.Log("\n" + report.String())
		fmt.Print(report.String())
	}
}
