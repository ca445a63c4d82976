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

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// benchJobsPlaybook is the trivial playbook of BenchmarkJobsVsBare.
const benchJobsPlaybook = `- name: Trivial
  hosts: all
  gather_facts: false
  tasks:
    - name: Ping
      ansible.builtin.ping:
`

// benchJobsRequirements is the requirements file of v2, the trivial
// playbook's second repository state: a collection of the Galaxy stand-in
// that the play does not use (what is measured is its install).
const benchJobsRequirements = `collections:
  - name: acme.bench
    version: 1.0.0
`

// Shape of BenchmarkJobsVsBare: replicas of infra, each with
// STREAM_CONCURRENCY=benchJobsSlots, so the bare loop runs
// benchJobsReplicas*benchJobsSlots plays at a time, over benchJobsTargets.
const (
	benchJobsReplicas = 4
	benchJobsSlots    = 2
	benchJobsTargets  = 8
)

// BenchmarkJobsVsBare measures issue 23's job makespan: BENCH_JOBS
// (default 200) jobs of a trivial playbook from a git repository over
// HTTP, each on one of 8 loopback targets (round robin), submitted through
// the deployer's API with a project key and run by 4 infra replicas of
// STREAM_CONCURRENCY=2, against the same number of ansible-playbook runs
// of the same playbook (a checkout of the same commit, the same
// ansible.cfg) in a plain loop, xargs -P 8: equal total concurrency. Both
// sides run in one session, bare first, then the API, then bare again (the
// mean of the two bare runs is the reference, so drift of the machine's
// load is split); it prints both makespans, the machine's CPU time per job
// of each side (testenv.MachineCPU: everything on the machine, the API,
// infra, git, ssh, the targets) and the ratio (goal: within 1.15x).
//
// Then the sequential case: BENCH_JOBS_SEQ (default 20) jobs on one target
// through the API one after the other (each waited for) against the bare
// loop one at a time (goal: within 1.15x), and the same jobs submitted at
// once (goal: no slower than one after another), with the git fetches per
// job of each (upload-pack requests the repository server saw: 0 when the
// cached checkout was current). Both API cases run again on v2, the same
// playbook with a requirements file (a collection from a Galaxy stand-in),
// infra's cache of installed requirements emptied before each, so that
// its first jobs meet a requirements set none installed yet: beside the
// fetches, the Galaxy downloads per job and per distinct requirements set
// (goal: 1 per distinct repository state and requirements set). Run with
// -benchtime=1x.
func BenchmarkJobsVsBare(b *testing.B) {
	n, seq, rounds := 200, 20, 2
	if v, err := strconv.Atoi(os.Getenv("BENCH_JOBS")); err == nil && v > 0 {
		n = v
	}
	if v, err := strconv.Atoi(os.Getenv("BENCH_JOBS_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	if v, err := strconv.Atoi(os.Getenv("BENCH_JOBS_SEQ")); err == nil && v > 0 {
		seq = v
	}
	for range b.N {
		var sshds []*testenv.SSHD
		for range benchJobsTargets {
			sshds = append(sshds, testenv.StartSSHD(b, testenv.SSHDOptions{}))
		}
		keyFile := testenv.ShareClientKey(b, b.TempDir(), sshds)
		token := "ghs_" + testenv.Unique("")
		repos := b.TempDir()
		jobRepo(b, repos, benchJobsPlaybook)
		jobRepoTag(b, repos, "v2", map[string]string{"collections/requirements.yml": benchJobsRequirements})
		gitURL, git := serveRepos(b, "127.0.0.1", token, repos)
		hub := testenv.NewGalaxyServer(b, "")
		hub.Add(b, testenv.BuildCollection(b, "acme", "bench", "1.0.0",
			map[string]string{"roles/noop/tasks/main.yml": "- name: Nothing\n  ansible.builtin.meta: noop\n"}))
		galaxyCache := filepath.Join(b.TempDir(), "galaxy")
		stack := startJobStack(b, token, sshds[0].ClientKey,
			"GALAXY_SERVERS=hub="+hub.URL, "GALAXY_ALLOW_HTTP=true", "GALAXY_CACHE_DIR="+galaxyCache)
		var infras []*testenv.Process
		for range benchJobsReplicas {
			infras = append(infras, stack.startInfra(b, fmt.Sprintf("STREAM_CONCURRENCY=%d", benchJobsSlots), "LOG_LEVEL=info"))
		}
		// The bare side: a checkout of the same commit and inventories of
		// the same targets, infra's ansible.cfg.
		checkout := filepath.Join(b.TempDir(), "ops")
		if out, err := exec.Command("git", "clone", "-q", "--branch", "v1", filepath.Join(repos, "org", "ops.git"), checkout).CombinedOutput(); err != nil {
			b.Fatalf("git clone: %v\n%s", err, out)
		}
		invDir := b.TempDir()
		var invs []string
		for i, s := range sshds {
			invs = append(invs, s.WriteInventory(b, invDir, fmt.Sprintf("t%d", i), keyFile))
		}
		bare := func(jobs int) time.Duration {
			return bareJobLoop(b, stack.root, checkout, invs, jobs, benchJobsReplicas*benchJobsSlots)
		}
		viaAPIOn := func(prefix, ref string, on []*testenv.SSHD, jobs int) (time.Duration, []string) {
			return apiJobs(b, stack, gitURL, ref, on, prefix, jobs)
		}
		viaAPI := func(prefix string, jobs int) time.Duration {
			d, _ := viaAPIOn(prefix, "v1", sshds, jobs)
			return d
		}
		// Warm both: page cache, infra's bare clone (v2 too: the git side
		// of its cases is that of v1's), first host key pins.
		bare(benchJobsTargets)
		viaAPI("warm", benchJobsTargets)
		// v2's first jobs, at once over every target: a requirements set
		// that every replica meets at once (its commit came with v1's
		// clone, so git-wise it is no new state).
		wg0, wd0 := git.uploadPacks.Load(), hub.Downloads()
		viaAPIOn("warm-v2", "v2", sshds, benchJobsTargets)
		wg1, wd1 := git.uploadPacks.Load(), hub.Downloads()

		b.ResetTimer()
		c0 := testenv.MachineCPU(b)
		bare1 := bare(n)
		c1 := testenv.MachineCPU(b)
		api := viaAPI("bench", n)
		c2 := testenv.MachineCPU(b)
		bare2 := bare(n)
		c3 := testenv.MachineCPU(b)
		// The sequential case (issue 33): seq jobs on one target one after
		// the other, each waited for, against the bare loop one at a time;
		// then the same jobs submitted at once, which contend for the host.
		seqBare := bareJobLoop(b, stack.root, checkout, invs[:1], seq, 1)
		oneByOne := func(prefix, ref string) (d time.Duration, ids []string) {
			for i := range seq {
				di, got := viaAPIOn(fmt.Sprintf("%s%d", prefix, i), ref, sshds[:1], 1)
				d, ids = d+di, append(ids, got...)
			}
			return d, ids
		}
		atOnce := func(prefix, ref string) (time.Duration, []string) { return viaAPIOn(prefix, ref, sshds[:1], seq) }
		// The API cases alternate, rounds times each, so that drift of
		// the machine's load is split between them; a v2 case empties
		// infra's requirements cache first (one distinct requirements set
		// per v2 case and round).
		seqAPI, onceAPI := seqCase{name: "one by one"}, seqCase{name: "at once"}
		seqReqs, onceReqs := seqCase{name: "v2 one by one"}, seqCase{name: "v2 at once"}
		for range rounds {
			seqAPI.add(b, git, hub, func() (time.Duration, []string) { return oneByOne("seq", "v1") })
			onceAPI.add(b, git, hub, func() (time.Duration, []string) { return atOnce("once", "v1") })
		}
		for range rounds {
			emptyDir(b, galaxyCache)
			seqReqs.add(b, git, hub, func() (time.Duration, []string) { return oneByOne("seq-v2-", "v2") })
			emptyDir(b, galaxyCache)
			onceReqs.add(b, git, hub, func() (time.Duration, []string) { return atOnce("once-v2-", "v2") })
		}
		b.StopTimer()
		ref := (bare1 + bare2) / 2
		ratio := api.Seconds() / ref.Seconds()
		report := fmt.Sprintf("%d jobs of a trivial playbook over %d targets, concurrency %d (%d infra replicas x STREAM_CONCURRENCY=%d)\n"+
			"%-28s %10s %10s %14s\n%-28s %10.2f %10.2f %14d\n%-28s %10.2f %10.2f %14d\n%-28s %10.2f %10.2f %14d\n%-28s %10.3f (goal <= 1.15)\n",
			n, benchJobsTargets, benchJobsReplicas*benchJobsSlots, benchJobsReplicas, benchJobsSlots,
			"", "seconds", "jobs/s", "CPU ms/job",
			"bare ansible-playbook loop", bare1.Seconds(), float64(n)/bare1.Seconds(), (c1-c0).Milliseconds()/int64(n),
			"API + infra", api.Seconds(), float64(n)/api.Seconds(), (c2-c1).Milliseconds()/int64(n),
			"bare loop again", bare2.Seconds(), float64(n)/bare2.Seconds(), (c3-c2).Milliseconds()/int64(n),
			"API / mean of bare", ratio)
		seqRatio, onceRatio := seqAPI.d.Seconds()/(seqBare.Seconds()*float64(rounds)), onceAPI.d.Seconds()/seqAPI.d.Seconds()
		reqsRatio := onceReqs.d.Seconds() / seqReqs.d.Seconds()
		jobs := int64(seq * rounds)
		row := func(name string, c *seqCase, reqs bool) string {
			dl, perSet := "-", "-"
			if reqs {
				// Each v2 case and round is one distinct repository state
				// and requirements set (the cache emptied before it).
				dl = fmt.Sprintf("%.2f", float64(c.downloads)/float64(jobs))
				perSet = fmt.Sprintf("%.2f", float64(c.downloads)/float64(rounds))
			}
			return fmt.Sprintf("%-28s %10.2f %14d %16.2f %16s %12s\n", name, c.d.Seconds()/float64(rounds),
				c.cpu.Milliseconds()/jobs, float64(c.fetches)/float64(jobs), dl, perSet)
		}
		report += fmt.Sprintf("\n%d jobs of the same playbook on one target, each API case %d times, alternated "+
			"(seconds: the mean; v2: with a requirements file, infra's Galaxy cache emptied before each case)\n"+
			"%-28s %10s %14s %16s %16s %12s\n%-28s %10.2f %14s %16s %16s %12s\n",
			seq, rounds, "", "seconds", "CPU ms/job", "git fetches/job", "Galaxy dl/job", "dl/req set",
			"bare loop, one at a time", seqBare.Seconds(), "-", "-", "-", "-")
		report += row("API, one after another", &seqAPI, false) + row("API, all at once", &onceAPI, false) +
			row("v2, one after another", &seqReqs, true) + row("v2, all at once", &onceReqs, true)
		report += fmt.Sprintf("%-28s %10.3f (goal <= 1.15)\n%-28s %10.3f (goal <= 1.0)\n%-28s %10.3f (goal <= 1.0)\n",
			"one after another / bare", seqRatio, "all at once / one by one", onceRatio, "v2: at once / one by one", reqsRatio)
		report += fmt.Sprintf("v2's first %d jobs (warm-up), at once over %d targets: %.2f git fetches/job, "+
			"%d Galaxy downloads of its one requirements set (goal 1)\n",
			benchJobsTargets, benchJobsTargets, float64(wg1-wg0)/benchJobsTargets, wd1-wd0)
		b.ReportMetric(seqRatio, "seq-api/bare")
		b.ReportMetric(onceRatio, "once/seq")
		b.ReportMetric(float64(onceReqs.downloads)/float64(rounds), "once-downloads/set")
		b.ReportMetric(api.Seconds(), "api-s")
		b.ReportMetric(ref.Seconds(), "bare-s")
		b.ReportMetric(ratio, "api/bare")
		for _, p := range infras {
			p.Signal(syscall.SIGTERM)
		}
		for _, p := range infras {
			p.Wait(time.Minute)
		}
		report += "\n" + stepTable(b, infras, []*seqCase{&seqAPI, &onceAPI, &seqReqs, &onceReqs})
		b.Log("\n" + report)
		fmt.Print(report)
	}
}

// bareJobLoop runs the checkout's site.yml n times with ansible-playbook
// (xargs -P conc), round robin over the inventories, with infra's
// ansible.cfg, each run with its own ssh ControlPath directory (as each of
// infra's runs has), and returns the wall time.
func bareJobLoop(b *testing.B, root, checkout string, invs []string, n, conc int) time.Duration {
	var list strings.Builder
	for i := range n {
		list.WriteString(invs[i%len(invs)] + "\n")
	}
	// The ControlPath sockets' directory is short: a socket's path must fit
	// in 108 bytes, and the test's TempDir may not leave room (TMPDIR).
	home := b.TempDir()
	cp, err := os.MkdirTemp("/tmp", "bj")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(cp) })
	play := `sh -c 'd=$(mktemp -d ` + cp + `/rXXXXXX) && ANSIBLE_SSH_CONTROL_PATH_DIR=$d /usr/bin/ansible-playbook -i {} site.yml >$d/out || { cat $d/out; exit 1; }'`
	cmd := exec.Command("bash", "-c", fmt.Sprintf(`xargs -P %d -I{} %s`, conc, play))
	cmd.Dir = checkout
	cmd.Stdin = strings.NewReader(list.String())
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "LANG=C.UTF-8",
		"ANSIBLE_CONFIG=" + filepath.Join(root, "ansible", "ansible.cfg"),
		"ANSIBLE_CACHE_PLUGIN_CONNECTION=" + filepath.Join(home, "facts")}
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("bare loop: %v\n%s", err, out)
	}
	return time.Since(start)
}

// apiJobs submits n jobs of site.yml at ref through the API, job i on
// target i mod len(sshds), all at once, waits for every one to succeed and
// returns the wall time from the first submission to the last result. A
// submission the key's rate limit (API_RATE_LIMIT) refuses is sent again.
func apiJobs(b *testing.B, stack *jobStack, gitURL, ref string, sshds []*testenv.SSHD, prefix string, n int) (time.Duration, []string) {
	start := time.Now()
	ids := make([]string, n)
	for i := range n {
		s := sshds[i%len(sshds)]
		job := fmt.Sprintf(`{"source":{"type":"playbook","repository":%q,"ref":%q,"paths":["site.yml"],"git_credential":"git"},
			"inventory":{"type":"inline","hosts":{"t%d":{"ansible_host":%q,"ansible_port":%d,"ansible_user":%q}}},
			"credentials":{"ssh":"ssh"},"options":{"timeout":600}}`, gitURL+"/org/ops.git", ref, i%len(sshds), s.Host, s.Port, s.User)
		code, resp := stack.call(b, "POST", "/jobs", job)
		for code == 429 { // the key's rate limit, as a CI client meets it
			time.Sleep(100 * time.Millisecond)
			code, resp = stack.call(b, "POST", "/jobs", job)
		}
		var j struct{ ID string }
		if code != 202 || json.Unmarshal([]byte(resp), &j) != nil {
			b.Fatalf("%s-%d: submit: %d %s", prefix, i, code, resp)
		}
		ids[i] = j.ID
	}
	for i, id := range ids {
		for {
			code, resp := stack.call(b, "GET", "/jobs/"+id+"?wait=5m", "")
			var j struct{ Status string }
			if code != 200 || json.Unmarshal([]byte(resp), &j) != nil {
				b.Fatalf("%s-%d: %d %s", prefix, i, code, resp)
			}
			if j.Status == "succeeded" {
				break
			}
			if j.Status != "queued" && j.Status != "running" {
				b.Fatalf("%s-%d: %s", prefix, i, resp)
			}
		}
	}
	return time.Since(start), ids
}

// stepTable returns the mean of each step of the jobs of each of cases,
// in ms, from the "job finished" lines of the infra replicas' logs (the
// step_*_ms fields), steps as rows and cases as columns, with each case's
// sum and its busy looks per job.
func stepTable(b *testing.B, infras []*testenv.Process, cases []*seqCase) string {
	caseOf := map[string]int{}
	for i, c := range cases {
		for _, id := range c.jobs {
			caseOf[id] = i
		}
	}
	sums := map[string][]float64{}
	var steps []string
	counts, looks := make([]int, len(cases)), make([]int, len(cases))
	for _, p := range infras {
		for line := range strings.Lines(p.Stdout() + p.Stderr()) {
			var ev map[string]any
			if json.Unmarshal([]byte(line), &ev) != nil {
				continue
			}
			id, _ := ev["job_id"].(string)
			i, ok := caseOf[id]
			msg, _ := ev["message"].(string)
			if !ok {
				continue
			}
			if strings.HasPrefix(msg, "waiting for another run") {
				looks[i]++
			}
			if msg != "job finished" {
				continue
			}
			counts[i]++
			for k, v := range ev {
				ms, isNum := v.(float64)
				if !isNum || !strings.HasPrefix(k, "step_") || !strings.HasSuffix(k, "_ms") {
					continue
				}
				name := strings.TrimSuffix(strings.TrimPrefix(k, "step_"), "_ms")
				if sums[name] == nil {
					sums[name] = make([]float64, len(cases))
					steps = append(steps, name)
				}
				sums[name][i] += ms
			}
		}
	}
	slices.Sort(steps)
	var t strings.Builder
	fmt.Fprintf(&t, "mean step times per job, ms (infra's \"job finished\" lines)\n%-16s", "step")
	for i, c := range cases {
		fmt.Fprintf(&t, " %16s", fmt.Sprintf("%s (%d)", c.name, counts[i]))
	}
	t.WriteString("\n")
	total := make([]float64, len(cases))
	for _, s := range steps {
		fmt.Fprintf(&t, "%-16s", s)
		for i := range cases {
			m := sums[s][i] / float64(max(counts[i], 1))
			total[i] += m
			fmt.Fprintf(&t, " %16.1f", m)
		}
		t.WriteString("\n")
	}
	fmt.Fprintf(&t, "%-16s", "sum")
	for i := range cases {
		fmt.Fprintf(&t, " %16.1f", total[i])
	}
	fmt.Fprintf(&t, "\n%-16s", "busy looks/job")
	for i := range cases {
		fmt.Fprintf(&t, " %16.2f", float64(looks[i])/float64(max(counts[i], 1)))
	}
	t.WriteString("\n")
	for i, c := range cases {
		if counts[i] != len(c.jobs) {
			b.Errorf("case %s: %d jobs, %d \"job finished\" lines", c.name, len(c.jobs), counts[i])
		}
	}
	return t.String()
}

// seqCase sums the rounds of one case of BenchmarkJobsVsBare's
// sequential part: its wall time, the machine's CPU time, the git
// fetches, the Galaxy downloads and its jobs' ids (for stepTable).
type seqCase struct {
	name      string
	d, cpu    time.Duration
	fetches   int32
	downloads int
	jobs      []string
}

// add runs one round of the case (run returns its wall time and its
// jobs) and adds what it took.
func (c *seqCase) add(b *testing.B, git *gitCounts, hub *testenv.GalaxyServer, run func() (time.Duration, []string)) {
	g, dl, cpu := git.uploadPacks.Load(), hub.Downloads(), testenv.MachineCPU(b)
	d, ids := run()
	c.d += d
	c.jobs = append(c.jobs, ids...)
	c.cpu += testenv.MachineCPU(b) - cpu
	c.fetches += git.uploadPacks.Load() - g
	c.downloads += hub.Downloads() - dl
}

// emptyDir removes what dir holds, keeping dir.
func emptyDir(b *testing.B, dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			b.Fatal(err)
		}
	}
}
