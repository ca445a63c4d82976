package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
	n, seq := 200, 20
	if v, err := strconv.Atoi(os.Getenv("BENCH_JOBS")); err == nil && v > 0 {
		n = v
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
		viaAPIOn := func(prefix, ref string, on []*testenv.SSHD, jobs int) time.Duration {
			return apiJobs(b, stack, gitURL, ref, on, prefix, jobs)
		}
		viaAPI := func(prefix string, jobs int) time.Duration { return viaAPIOn(prefix, "v1", sshds, jobs) }
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
		g0, c4 := git.uploadPacks.Load(), testenv.MachineCPU(b)
		oneByOne := func(prefix, ref string) (d time.Duration) {
			for i := range seq {
				d += viaAPIOn(fmt.Sprintf("%s%d", prefix, i), ref, sshds[:1], 1)
			}
			return d
		}
		seqAPI := oneByOne("seq", "v1")
		g1, c5 := git.uploadPacks.Load(), testenv.MachineCPU(b)
		onceAPI := viaAPIOn("once", "v1", sshds[:1], seq)
		g2, c6 := git.uploadPacks.Load(), testenv.MachineCPU(b)
		// The same on v2, each case's first jobs meeting its requirements
		// set anew: one distinct repository state and requirements set
		// per case.
		emptyDir(b, galaxyCache)
		d0, g3, c7 := hub.Downloads(), git.uploadPacks.Load(), testenv.MachineCPU(b)
		seqReqs := oneByOne("seq-v2-", "v2")
		emptyDir(b, galaxyCache)
		d1, g4, c8 := hub.Downloads(), git.uploadPacks.Load(), testenv.MachineCPU(b)
		onceReqs := viaAPIOn("once-v2", "v2", sshds[:1], seq)
		d2, g5, c9 := hub.Downloads(), git.uploadPacks.Load(), testenv.MachineCPU(b)
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
		seqRatio, onceRatio := seqAPI.Seconds()/seqBare.Seconds(), onceAPI.Seconds()/seqAPI.Seconds()
		reqsRatio := onceReqs.Seconds() / seqReqs.Seconds()
		perJob := func(a, z int32) float64 { return float64(z-a) / float64(seq) }
		// Each v2 case is one distinct repository state and requirements
		// set (the cache emptied before it).
		const sets = 1
		perSet := func(a, z int) float64 { return float64(z-a) / sets }
		row := "%-28s %10.2f %14d %16.2f %16.2f %12.2f\n"
		report += fmt.Sprintf("\n%d jobs of the same playbook on one target (v2: with a requirements file, "+
			"infra's Galaxy cache emptied before each case)\n"+
			"%-28s %10s %14s %16s %16s %12s\n%-28s %10.2f %14s %16s %16s %12s\n%-28s %10.2f %14d %16.2f %16s %12s\n%-28s %10.2f %14d %16.2f %16s %12s\n"+
			row+row+
			"%-28s %10.3f (goal <= 1.15)\n%-28s %10.3f (goal <= 1.0)\n%-28s %10.3f (goal <= 1.0)\n",
			seq, "", "seconds", "CPU ms/job", "git fetches/job", "Galaxy dl/job", "dl/req set",
			"bare loop, one at a time", seqBare.Seconds(), "-", "-", "-", "-",
			"API, one after another", seqAPI.Seconds(), (c5-c4).Milliseconds()/int64(seq), perJob(g0, g1), "-", "-",
			"API, all at once", onceAPI.Seconds(), (c6-c5).Milliseconds()/int64(seq), perJob(g1, g2), "-", "-",
			"v2, one after another", seqReqs.Seconds(), (c8-c7).Milliseconds()/int64(seq), perJob(g3, g4), float64(d1-d0)/float64(seq), perSet(d0, d1),
			"v2, all at once", onceReqs.Seconds(), (c9-c8).Milliseconds()/int64(seq), perJob(g4, g5), float64(d2-d1)/float64(seq), perSet(d1, d2),
			"one after another / bare", seqRatio, "all at once / one by one", onceRatio, "v2: at once / one by one", reqsRatio)
		report += fmt.Sprintf("v2's first %d jobs (warm-up), at once over %d targets: %.2f git fetches/job, "+
			"%d Galaxy downloads of its one requirements set (goal 1)\n",
			benchJobsTargets, benchJobsTargets, float64(wg1-wg0)/benchJobsTargets, wd1-wd0)
		b.ReportMetric(seqRatio, "seq-api/bare")
		b.ReportMetric(onceRatio, "once/seq")
		b.ReportMetric(perSet(d1, d2), "once-downloads/set")
		b.ReportMetric(api.Seconds(), "api-s")
		b.ReportMetric(ref.Seconds(), "bare-s")
		b.ReportMetric(ratio, "api/bare")
		for _, p := range infras {
			p.Signal(syscall.SIGTERM)
		}
		for _, p := range infras {
			p.Wait(time.Minute)
		}
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
func apiJobs(b *testing.B, stack *jobStack, gitURL, ref string, sshds []*testenv.SSHD, prefix string, n int) time.Duration {
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
	return time.Since(start)
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
