package ansible

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

func TestReadLines(t *testing.T) {
	t.Parallel()
	type line struct {
		text string
		long bool
	}
	tests := []struct {
		name  string
		input string
		max   int
		want  []line
	}{
		{"plain", "a\nbb\n", 10, []line{{"a", false}, {"bb", false}}},
		{"no final newline", "a\nbb", 10, []line{{"a", false}, {"bb", false}}},
		{"crlf", "a\r\nb\r\n", 10, []line{{"a", false}, {"b", false}}},
		{"empty lines", "\n\nx\n", 10, []line{{"", false}, {"", false}, {"x", false}}},
		{"exactly max", "0123456789\nx\n", 10, []line{{"0123456789", false}, {"x", false}}},
		{"too long", "0123456789AB\nx\n", 10, []line{{"0123456789", true}, {"x", false}}},
		{"much too long", strings.Repeat("y", 200000) + "\nz\n", 10, []line{{"yyyyyyyyyy", true}, {"z", false}}},
		{"long line beyond the reader buffer", strings.Repeat("q", 100000) + "\n", 1 << 20, []line{{strings.Repeat("q", 100000), false}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []line
			touches := 0
			readLines(strings.NewReader(tt.input), tt.max, func() { touches++ }, func(b []byte, long bool) {
				got = append(got, line{string(b), long})
			})
			if len(got) != len(tt.want) {
				t.Fatalf("got %d lines, want %d", len(got), len(tt.want))
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("line %d = %.40q/%v, want %.40q/%v", i, got[i].text, got[i].long, tt.want[i].text, tt.want[i].long)
				}
			}
			if touches == 0 {
				t.Error("touch never called")
			}
		})
	}
}

func TestDecodeEventRedactsAndCounts(t *testing.T) {
	t.Parallel()
	redact := func(s string) string { return strings.ReplaceAll(s, "s3cret", "[REDACTED]") }
	lines := []string{
		`{"v":1,"seq":1,"ts":"2026-01-02T03:04:05.001Z","event":"playbook_start","playbook":"p.yml"}`,
		`{"v":1,"seq":2,"ts":"2026-01-02T03:04:05.002Z","event":"task_start","playbook":"p.yml","play":"P","task":"use s3cret","action":"shell"}`,
		`not json`,
		`{"v":2,"seq":3,"event":"host_ok"}`,
		`{"v":1,"seq":4}`,
		`{"v":1,"seq":5,"ts":"2026-01-02T03:04:06.000Z","event":"host_failed","task":"use s3cret","host":"h","msg":"bad s3cret","rc":3,"ignore_errors":true}`,
		`{"v":1,"seq":6,"ts":"x","event":"host_failed","task":"t2","host":"h","play":"P","msg":"real failure"}`,
		`{"v":1,"seq":7,"event":"host_ok","host":"h","changed":true}`,
		`{"v":1,"seq":8,"event":"host_unreachable","task":"t3","host":"h","msg":"gone"}`,
		`{"v":1,"seq":9,"event":"future_event","host":"h"}`,
		`{"v":1,"seq":10,"event":"stats","hosts":{"h":{"ok":1,"changed":1,"failed":1,"unreachable":1,"skipped":0,"rescued":2,"ignored":1}}}`,
	}
	var st eventState
	var evs []Event
	for _, l := range lines {
		ev, err := decodeEvent([]byte(l), redact)
		if err != nil {
			st.malformed++
			continue
		}
		st.add(ev)
		evs = append(evs, ev)
	}
	if st.malformed != 3 || st.count != 8 {
		t.Fatalf("malformed %d, count %d; want 3, 8", st.malformed, st.count)
	}
	if evs[1].Task != "use [REDACTED]" || evs[2].Msg != "bad [REDACTED]" || *evs[2].RC != 3 || !evs[2].IgnoreErrors {
		t.Errorf("events = %+v %+v", evs[1], evs[2])
	}
	if want := time.Date(2026, 1, 2, 3, 4, 5, 2e6, time.UTC); !evs[1].Time.Equal(want) {
		t.Errorf("time = %v", evs[1].Time)
	}
	if f := st.failures["h"]; f == nil || f.n != 1 || f.first.ft != (FailedTask{Name: "t2", Host: "h", Play: "P", Message: "real failure"}) {
		t.Errorf("failures = %+v, want the one not ignored", f)
	}
	if ft := st.firstUnreachable(); ft == nil || ft.Name != "t3" {
		t.Errorf("unreachable = %+v", ft)
	}
	if ft := st.firstFailure(); ft != nil {
		t.Errorf("first failure %+v of a host that then was unreachable", ft)
	}
	if got, want := st.derived["h"], (Recap{OK: 1, Changed: 1, Failed: 1, Unreachable: 1, Ignored: 1}); got != want {
		t.Errorf("derived = %+v, want %+v", got, want)
	}
	if got := st.hosts()["h"]; got.Rescued != 2 {
		t.Errorf("hosts() should be the stats event's: %+v", got)
	}
}

// evState is the state after events, then a stats event with stats
// (none when nil).
func evState(stats map[string]Recap, events ...Event) *eventState {
	s := &eventState{}
	for _, ev := range events {
		s.add(ev)
	}
	if stats != nil {
		s.add(Event{Type: EventStats, Stats: stats})
	}
	return s
}

// hostEvent is the host event of type typ that reports ft.
func hostEvent(typ string, ft *FailedTask) Event {
	return Event{Type: typ, Task: ft.Name, Host: ft.Host, Play: ft.Play, Msg: ft.Message}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	failed := &FailedTask{Name: "t", Host: "h", Message: "m"}
	gone := &FailedTask{Name: "u", Host: "h", Message: "refused"}
	running := &FailedTask{Name: "Sleep", Host: "h"}
	fail, unreach := func(ft *FailedTask) Event { return hostEvent(EventHostFailed, ft) }, func(ft *FailedTask) Event { return hostEvent(EventHostUnreachable, ft) }
	tests := []struct {
		name     string
		v        verdict
		want     Outcome
		ft       *FailedTask
		mismatch bool
	}{
		{"ok", verdict{code: 0, ev: &eventState{stats: map[string]Recap{"h": {OK: 3}}}}, OutcomeSucceeded, nil, false},
		{"ok without events", verdict{code: 0, ev: &eventState{}}, OutcomeSucceeded, nil, true},
		{"failed", verdict{code: 2, ev: evState(map[string]Recap{"h": {Failed: 1}}, fail(failed))}, OutcomeFailed, failed, false},
		{"rescued", verdict{code: 0, ev: evState(map[string]Recap{"h": {OK: 1, Rescued: 1}}, fail(failed))}, OutcomeSucceeded, nil, false},
		{"failed before stats", verdict{code: 137, ev: evState(nil, fail(failed))}, OutcomeFailed, failed, true},
		{"unreachable", verdict{code: 4, ev: evState(map[string]Recap{"h": {Unreachable: 1}}, unreach(gone))}, OutcomeUnreachable, gone, false},
		{"unreachable host: its failure does not count", verdict{code: 4, ev: evState(map[string]Recap{"h": {Failed: 1, Unreachable: 1}}, fail(failed), unreach(gone))}, OutcomeUnreachable, gone, false},
		{"ignored unreachable", verdict{code: 0, ev: evState(map[string]Recap{"h": {OK: 2, Ignored: 1}}, unreach(gone))}, OutcomeSucceeded, nil, false},
		{"exit 2 without events", verdict{code: 2, ev: &eventState{}}, OutcomeFailed, nil, true},
		{"parse error", verdict{code: 4, ev: &eventState{}, summary: "ERROR! bad"}, OutcomeError, nil, false},
		{"crash", verdict{code: 250, ev: &eventState{}}, OutcomeError, nil, false},
		{"stopped", verdict{stop: OutcomeTimeout, stopErr: errors.New("too long"), code: 143, lastTask: running, ev: &eventState{}}, OutcomeTimeout, &FailedTask{Name: "Sleep", Host: "h", Message: "too long"}, false},
		{"stopped beats events", verdict{stop: OutcomeCancelled, stopErr: errors.New("c"), code: 143, ev: evState(nil, fail(failed))}, OutcomeCancelled, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := tt.v
			v.alias = "h"
			out, ft, err := v.classify()
			if out != tt.want {
				t.Errorf("outcome %s, want %s", out, tt.want)
			}
			if (ft == nil) != (tt.ft == nil) || (ft != nil && *ft != *tt.ft) {
				t.Errorf("failed task %+v, want %+v", ft, tt.ft)
			}
			if (err == nil) != (out == OutcomeSucceeded) {
				t.Errorf("err = %v for %s", err, out)
			}
			if (v.mismatch != "") != tt.mismatch {
				t.Errorf("mismatch = %q", v.mismatch)
			}
		})
	}
}

// TestClassifyJobFailedTask: of a job's hosts, the failed task is the first
// failure that counts (not ignored, not rescued, on a host that was
// reached), on any host, before any unreachable host; the first unreachable
// host only when no task failed.
func TestClassifyJobFailedTask(t *testing.T) {
	t.Parallel()
	ft := func(task, host, msg string) *FailedTask {
		return &FailedTask{Name: task, Host: host, Play: "P", Message: msg}
	}
	fail := func(task, host, msg string) Event { return hostEvent(EventHostFailed, ft(task, host, msg)) }
	gone := func(task, host string) Event { return hostEvent(EventHostUnreachable, ft(task, host, "refused")) }
	ok := func(task, host string) Event { return Event{Type: EventHostOK, Task: task, Host: host, Play: "P"} }
	type recaps = map[string]Recap
	for _, tt := range []struct {
		name     string
		stats    recaps // nil: no stats event
		events   []Event
		code     int
		want     Outcome
		ft       *FailedTask
		err      string // the error is this (when set)
		mismatch bool
	}{
		{"unreachable host first, then a failed task", recaps{"down": {Unreachable: 1}, "up": {OK: 1, Failed: 1}},
			[]Event{gone("Works", "down"), ok("Works", "up"), fail("Breaks", "up", "boom")}, 4,
			OutcomeFailed, ft("Breaks", "up", "boom"), `failed on up in task "Breaks": boom; host down unreachable`, false},
		{"failed task first, then an unreachable host", recaps{"down": {Unreachable: 1}, "up": {Failed: 1}},
			[]Event{fail("Works", "up", "boom"), gone("Other", "down")}, 4,
			OutcomeFailed, ft("Works", "up", "boom"), "", false},
		{"a rescued failure on another host does not count", recaps{"a": {OK: 2, Rescued: 1}, "b": {OK: 1, Failed: 1}, "c": {Unreachable: 1}},
			[]Event{gone("Works", "c"), fail("Try", "a", "caught"), ok("Rescue", "a"), fail("Install", "b", "boom")}, 4,
			OutcomeFailed, ft("Install", "b", "boom"), "", false},
		{"a host's rescued failure, then its real one", recaps{"a": {OK: 1, Rescued: 1, Failed: 1}, "b": {Unreachable: 1}},
			[]Event{fail("Try", "a", "caught"), gone("Works", "b"), ok("Rescue", "a"), fail("Final", "a", "boom")}, 4,
			OutcomeFailed, ft("Final", "a", "boom"), "", false},
		{"a failure in an always section after the real one", recaps{"a": {Failed: 2}},
			[]Event{fail("Main", "a", "boom"), fail("Always", "a", "again")}, 2,
			OutcomeFailed, ft("Main", "a", "boom"), "", false},
		{"the first of two hosts' failures", recaps{"a": {Failed: 1}, "b": {Failed: 1}},
			[]Event{fail("Second", "b", "first"), fail("Later", "a", "then")}, 2,
			OutcomeFailed, ft("Second", "b", "first"), `failed on b in task "Second": first`, false},
		{"ignored unreachable host, failed task", recaps{"a": {Failed: 1}, "b": {OK: 2, Ignored: 1}},
			[]Event{gone("Probe", "b"), fail("Install", "a", "boom")}, 2,
			OutcomeFailed, ft("Install", "a", "boom"), `failed on a in task "Install": boom`, false},
		{"several unreachable hosts", recaps{"a": {Failed: 1}, "b": {Unreachable: 1}, "c": {Unreachable: 1}, "d": {Unreachable: 1}},
			[]Event{gone("Works", "c"), gone("Works", "b"), gone("Works", "d"), fail("Install", "a", "boom")}, 4,
			OutcomeFailed, ft("Install", "a", "boom"), `failed on a in task "Install": boom; host c and 2 more unreachable`, false},
		{"killed before stats", nil,
			[]Event{gone("Works", "down"), fail("Breaks", "up", "boom")}, 137,
			OutcomeFailed, ft("Breaks", "up", "boom"), `failed on up in task "Breaks": boom; host down unreachable`, true},
		{"nothing failed: the first unreachable host", recaps{"a": {OK: 2}, "b": {Unreachable: 1}, "c": {Unreachable: 1}},
			[]Event{gone("Works", "c"), gone("Works", "b")}, 4,
			OutcomeUnreachable, ft("Works", "c", "refused"), `host c unreachable in task "Works": refused`, false},
		{"a failure on a host that then was unreachable", recaps{"a": {Failed: 1, Unreachable: 1}, "b": {OK: 1}},
			[]Event{fail("Main", "a", "boom"), gone("Always", "a")}, 4,
			OutcomeUnreachable, ft("Always", "a", "refused"), "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v := verdict{code: tt.code, ev: evState(tt.stats, tt.events...), alias: jobHostAlias}
			out, got, err := v.classify()
			if out != tt.want {
				t.Errorf("outcome %s, want %s", out, tt.want)
			}
			if got == nil || *got != *tt.ft {
				t.Errorf("failed task %+v, want %+v", got, tt.ft)
			}
			if err == nil || (tt.err != "" && err.Error() != tt.err) {
				t.Errorf("err = %v, want %q", err, tt.err)
			}
			if (v.mismatch != "") != tt.mismatch {
				t.Errorf("mismatch = %q", v.mismatch)
			}
		})
	}
}

// TestClassifyJobNamesTheHost: a job's run has no one host; its outcome's
// message names the host of the failure from the events, never the run's
// placeholder alias ("failed on of the job").
func TestClassifyJobNamesTheHost(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		ev   *eventState
		code int
		want string
	}{
		{"failed", evState(map[string]Recap{"web-2": {Failed: 1}}, hostEvent(EventHostFailed, &FailedTask{Name: "Install", Host: "web-2", Message: "boom"})), 2,
			`failed on web-2 in task "Install": boom`},
		{"unreachable", evState(map[string]Recap{"db-1": {Unreachable: 1}}, hostEvent(EventHostUnreachable, &FailedTask{Name: "Ping", Host: "db-1", Message: "refused"})), 4,
			`host db-1 unreachable in task "Ping": refused`},
		{"unreachable, no host known", &eventState{stats: map[string]Recap{"db-1": {Unreachable: 1}}}, 4,
			`a host of the job unreachable`},
		{"failed, no host known", evState(nil, hostEvent(EventHostFailed, &FailedTask{Name: "Install"})), 2,
			`failed on a host of the job in task "Install"`},
	} {
		v := verdict{code: tt.code, ev: tt.ev, alias: jobHostAlias}
		_, _, err := v.classify()
		if err == nil || err.Error() != tt.want {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
}

// TestStoppedRecap: a stopped job's play has a recap of every host it
// was for, and its running task names the hosts still on it, from the
// events as they came.
func TestStoppedRecap(t *testing.T) {
	t.Parallel()
	hosts := func(names ...string) []JobHost {
		var out []JobHost
		for _, n := range names {
			out = append(out, JobHost{Host: Host{Alias: n}, Blocked: n == "down"})
		}
		return out
	}
	host := func(typ, name string) Event { return Event{Type: typ, Host: name, Task: "t"} }
	task := Event{Type: EventTaskStart, Task: "Sleep"}
	for _, tt := range []struct {
		name     string
		hosts    []JobHost
		limit    string
		events   []Event
		wantHost string
		recap    []string // hosts in the recap
	}{
		{"timed out on the first task: every host on it", hosts("a", "b"), "", []Event{task}, "a, b", []string{"a", "b"}},
		{"one host answered the running task", hosts("a", "b"), "", []Event{task, host(EventHostOK, "a")}, "b", []string{"a", "b"}},
		{"a task done by all, the next one running", hosts("a", "b"), "",
			[]Event{task, host(EventHostOK, "a"), host(EventHostOK, "b"), task, host(EventHostOK, "b")}, "a", []string{"a", "b"}},
		{"a failed host left the play", hosts("a", "b"), "",
			[]Event{task, host(EventHostFailed, "a"), host(EventHostOK, "b"), task}, "b", []string{"a", "b"}},
		{"a blocked host is not in it", hosts("a", "down"), "", []Event{task}, "a", []string{"a"}},
		{"with a limit, only hosts seen", hosts("a", "b", "c"), "a:b",
			[]Event{task, host(EventHostOK, "a"), task}, "a", []string{"a"}},
		{"many hosts", hosts("h1", "h2", "h3", "h4", "h5", "h6", "h7"), "", []Event{task}, "h1, h2, h3, h4, h5 and 2 more",
			[]string{"h1", "h2", "h3", "h4", "h5", "h6", "h7"}},
	} {
		ev := &eventState{}
		for _, e := range tt.events {
			ev.add(e)
		}
		res := &Result{Hosts: ev.hosts(), FailedTask: &FailedTask{Name: "Sleep", Message: "run exceeded its time limit"}}
		if res.Hosts == nil {
			res.Hosts = map[string]Recap{}
		}
		js := &JobSpec{Hosts: tt.hosts, Options: JobOptions{Limit: tt.limit}}
		stoppedRecap(res, js, ev)
		if res.FailedTask.Host != tt.wantHost {
			t.Errorf("%s: failed task host %q, want %q", tt.name, res.FailedTask.Host, tt.wantHost)
		}
		var got []string
		for h := range res.Hosts {
			got = append(got, h)
		}
		slices.Sort(got)
		if !slices.Equal(got, tt.recap) {
			t.Errorf("%s: recap of %v, want %v", tt.name, got, tt.recap)
		}
	}
}

func TestTail(t *testing.T) {
	t.Parallel()
	redact := func(s string) string {
		s = strings.ReplaceAll(s, "s3cret", "***")
		return strings.ReplaceAll(s, "multi\nline", "***")
	}
	tl := newTail(3, 1000, redact)
	for _, l := range []string{"one", "two s3cret", "three", "four"} {
		tl.add([]byte(l), false)
	}
	if got := tl.String(); got != "two ***\nthree\nfour\n" {
		t.Errorf("tail = %q", got)
	}
	tl = newTail(100, 400, redact)
	tl.add([]byte("multi"), false)
	tl.add([]byte("line"), false)
	if got := tl.String(); got != "***\n" {
		t.Errorf("multi-line secret: tail = %q", got)
	}
	// A long line is redacted before it is cut: no half secret remains.
	long := strings.Repeat("x", 95) + "s3cret" + strings.Repeat("y", 1000)
	tl.add([]byte(long), false)
	got := tl.String()
	if strings.Contains(got, "s3c") || !strings.Contains(got, "…[cut]") {
		t.Errorf("long line: %q", got)
	}
	for i := 0; i < 50; i++ {
		tl.add([]byte(strings.Repeat("z", 50)), false)
	}
	if n := len(tl.String()); n > 400 {
		t.Errorf("tail holds %d bytes, cap 400", n)
	}
	tl.add([]byte("ERROR! the real cause"), false)
	tl.add([]byte(""), false)
	tl.add([]byte("  ^ here"), false)
	if s := tl.summary(); s != "ERROR! the real cause" {
		t.Errorf("summary = %q", s)
	}
	tl.add([]byte("bad utf8 \xff"), false)
	if s := tl.String(); !strings.Contains(s, "bad utf8 \uFFFD") {
		t.Errorf("invalid UTF-8 kept: %q", s)
	}
}

func TestValidateSpec(t *testing.T) {
	t.Parallel()
	r, _ := newTestRunner(t, nil)
	good := Spec{
		JobID: "j", Playbook: "ping.yml",
		Host: Host{Alias: "srv-1", Address: "192.0.2.10", User: "root", KnownHostsKey: testHostKey(t) + " comment"},
	}
	// The largest value an environment variable holds is accepted.
	good.SecretEnv = map[string]string{"GITHUB_TOKEN": "t", "AUTOPROV_DEPLOY_SSH_PUBKEY": "k",
		"PROJECT_ENV": "A=1\nB=" + strings.Repeat("2", 32*4096-1-len("PROJECT_ENV=A=1\nB="))}
	if _, err := r.validateSpec(&good); err != nil {
		t.Fatalf("good spec: %v", err)
	}
	if good.Host.Port != 22 || good.Timeout != r.cfg.Timeout || good.IdleTimeout != r.cfg.IdleTimeout || good.Redact == nil {
		t.Errorf("defaults not filled: %+v", good)
	}
	// A request's own limit lowers the wall-clock limit, never raises it.
	for _, tc := range []struct{ timeout, limit, want time.Duration }{
		{0, time.Minute, time.Minute},
		{0, 2 * r.cfg.Timeout, r.cfg.Timeout},
		{10 * time.Minute, 0, 10 * time.Minute},
		{10 * time.Minute, time.Hour, 10 * time.Minute},
	} {
		s := good
		s.Timeout, s.TimeoutCap = tc.timeout, tc.limit
		if _, err := r.validateSpec(&s); err != nil || s.Timeout != tc.want {
			t.Errorf("Timeout %v TimeoutCap %v: limit %v (%v), want %v", tc.timeout, tc.limit, s.Timeout, err, tc.want)
		}
	}
	tests := map[string]func(*Spec){
		"no job":             func(s *Spec) { s.JobID = "" },
		"playbook traversal": func(s *Spec) { s.Playbook = "../ping.yml" },
		"playbook dir":       func(s *Spec) { s.Playbook = "sub/ping.yml" },
		"playbook missing":   func(s *Spec) { s.Playbook = "nope.yml" },
		"playbook not yml":   func(s *Spec) { s.Playbook = "ping" },
		"alias newline":      func(s *Spec) { s.Host.Alias = "a\nb" },
		"alias dash":         func(s *Spec) { s.Host.Alias = "-a" },
		"alias template":     func(s *Spec) { s.Host.Alias = "{{x}}" },
		"address option":     func(s *Spec) { s.Host.Address = "-oProxyCommand=x" },
		"address space":      func(s *Spec) { s.Host.Address = "a b" },
		"port":               func(s *Spec) { s.Host.Port = 70000 },
		"user":               func(s *Spec) { s.Host.User = "-l" },
		"user empty":         func(s *Spec) { s.Host.User = "" },
		"key garbage":        func(s *Spec) { s.Host.KnownHostsKey = "nope" },
		"key options": func(s *Spec) {
			s.Host.KnownHostsKey = `command="x" ` + strings.Fields(good.Host.KnownHostsKey)[0] + " " + strings.Fields(good.Host.KnownHostsKey)[1]
		},
		"key two lines":   func(s *Spec) { s.Host.KnownHostsKey = good.Host.KnownHostsKey + "\n" + good.Host.KnownHostsKey },
		"env lower":       func(s *Spec) { s.SecretEnv = map[string]string{"token": "x"} },
		"env reserved":    func(s *Spec) { s.SecretEnv = map[string]string{"PATH": "x"} },
		"env ansible":     func(s *Spec) { s.SecretEnv = map[string]string{"ANSIBLE_BECOME_PASS": "x"} },
		"env ld":          func(s *Spec) { s.SecretEnv = map[string]string{"LD_PRELOAD": "x"} },
		"env bash":        func(s *Spec) { s.SecretEnv = map[string]string{"BASH_ENV": "x"} },
		"env events path": func(s *Spec) { s.SecretEnv = map[string]string{"AUTOPROV_EVENTS_PATH": "x"} },
		"env nul":         func(s *Spec) { s.SecretEnv = map[string]string{"TOKEN": "a\x00b"} },
		"env too large": func(s *Spec) {
			s.SecretEnv = map[string]string{"PROJECT_ENV": strings.Repeat("x", 128*1024)}
		},
		"negative timeout": func(s *Spec) { s.Timeout = -time.Second },
	}
	for name, mutate := range tests {
		s := good
		s.Host.Port = 0
		mutate(&s)
		if _, err := r.validateSpec(&s); err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(err.Error(), "a\x00b") {
			t.Errorf("%s: error quotes the secret value: %v", name, err)
		}
	}
}

func TestKnownHostsAndInventory(t *testing.T) {
	t.Parallel()
	key := pinnedKey{line: "ssh-ed25519 AAAA", algorithms: "ssh-ed25519"}
	for _, tt := range []struct {
		h    Host
		want string
	}{
		{Host{Address: "192.0.2.1", Port: 22}, "192.0.2.1 ssh-ed25519 AAAA\n"},
		{Host{Address: "192.0.2.1", Port: 2222}, "[192.0.2.1]:2222 ssh-ed25519 AAAA\n"},
		{Host{Address: "2001:db8::1", Port: 2222}, "[2001:db8::1]:2222 ssh-ed25519 AAAA\n"},
		{Host{Address: "srv.example.org", Port: 22}, "srv.example.org ssh-ed25519 AAAA\n"},
	} {
		if got := knownHostsLine(tt.h, key); got != tt.want {
			t.Errorf("knownHostsLine(%+v) = %q, want %q", tt.h, got, tt.want)
		}
	}
	s := testenv.StartSSHD(t, testenv.SSHDOptions{ExtraHostKeyTypes: []string{"rsa"}})
	h := hostOf(s)
	h.KnownHostsKey = s.HostKeys[1]
	pk, err := validateHost(&h)
	if err != nil {
		t.Fatal(err)
	}
	if pk.algorithms != "rsa-sha2-512,rsa-sha2-256" {
		t.Errorf("rsa algorithms = %q", pk.algorithms)
	}
	// The inventory goes through Ansible's own parser.
	r, _ := newTestRunner(t, nil)
	d, err := r.newRunDir("j", false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.remove()
	spec := Spec{Host: h, Vars: map[string]any{"x": 1}}
	m := newRemoteMarker(h, pk)
	if err := d.writeInputs(&spec, pk, m); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{d.inventory, d.knownHosts, d.vars, filepath.Join(d.path, markerName)} {
		st, err := os.Stat(f)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v, want mode 0600", f, st.Mode(), err)
		}
	}
	if st, _ := os.Stat(d.path); st.Mode().Perm() != 0o700 {
		t.Errorf("run dir mode %v", st.Mode())
	}
	out, err := execOutput(t, "/usr/bin/ansible-inventory", "-i", d.inventory, "--host", "target-1")
	if err != nil {
		t.Fatalf("ansible-inventory: %v\n%s", err, out)
	}
	for _, want := range []string{`"__ansible_unsafe": "127.0.0.1"`, `"__ansible_unsafe": "root"`, "HostKeyAlgorithms=rsa-sha2-512,rsa-sha2-256", "UserKnownHostsFile=" + d.knownHosts, "StrictHostKeyChecking=yes", "-F /dev/null",
		"/usr/bin/env AUTOPROV_RUN=" + m.String() + " python3", "~/.ansible/tmp/autoprov-" + m.scope} {
		if !strings.Contains(out, want) {
			t.Errorf("inventory lacks %s:\n%s", want, out)
		}
	}
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	base := Config{AnsibleDir: testAnsibleDir(t), PlaybookBin: playbookBin, GuardPath: guardBin, FactCacheDir: t.TempDir(),
		KillGrace: 3 * time.Second, Timeout: time.Hour, IdleTimeout: 10 * time.Minute}
	tests := map[string]func(c *Config){
		"no ansible dir":    func(c *Config) { c.AnsibleDir = "" },
		"no bin":            func(c *Config) { c.PlaybookBin = "" },
		"no run root":       func(c *Config) { c.RunRoot = "" },
		"no kill grace":     func(c *Config) { c.KillGrace = 0 },
		"no timeout":        func(c *Config) { c.Timeout = 0 },
		"negative idle":     func(c *Config) { c.IdleTimeout = -time.Second },
		"negative tail":     func(c *Config) { c.OutputTailLines = -1 },
		"no ansible.cfg":    func(c *Config) { c.AnsibleDir = t.TempDir() },
		"relative bin":      func(c *Config) { c.PlaybookBin = "ansible-playbook" },
		"missing bin":       func(c *Config) { c.PlaybookBin = "/nonexistent/ansible-playbook" },
		"long run root":     func(c *Config) { c.RunRoot = "/tmp/" + strings.Repeat("r", 40) },
		"run root with sp":  func(c *Config) { c.RunRoot = "/tmp/a b" },
		"relative run root": func(c *Config) { c.RunRoot = "tmp/x" },
		"shared run root":   func(c *Config) { c.RunRoot = "/tmp" },
		"symlink run root": func(c *Config) {
			dir := shortTempDir(t, "aps")
			_ = os.Symlink(t.TempDir(), dir+"/l")
			c.RunRoot = dir + "/l"
		},
	}
	for name, mutate := range tests {
		c := base
		c.RunRoot = shortTempDir(t, "apr")
		mutate(&c)
		if _, err := New(c, testLogger(t)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	c := base
	c.RunRoot = shortTempDir(t, "apr") + "/new"
	c.FactCacheDir = t.TempDir()
	r, err := New(c, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(c.RunRoot); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("RunRoot not created 0700: %v %v", st, err)
	}
	got := r.Config()
	if got.PlaybookBin != playbookBin || got.KillGrace != 3*time.Second || got.Timeout != time.Hour ||
		got.IdleTimeout != 10*time.Minute || got.OutputTailLines != DefaultOutputTailLines ||
		got.OutputTailBytes != DefaultOutputTailBytes || !r.Guarded() {
		t.Errorf("config: %+v guarded %v", got, r.Guarded())
	}
}

// TestTestdataConfigMatchesRepo keeps testdata/ansible/ansible.cfg equal to
// the repository's ansible/ansible.cfg except for the settings marked
// "test:" there.
func TestTestdataConfigMatchesRepo(t *testing.T) {
	t.Parallel()
	repo := readINI(t, "../../ansible/ansible.cfg")
	test := readINI(t, "testdata/ansible/ansible.cfg")
	differ := map[string]bool{"defaults.roles_path": true, "defaults.library": true, "defaults.callback_plugins": true, "defaults.timeout": true}
	for k, v := range repo {
		if !differ[k] && test[k] != v {
			t.Errorf("%s: testdata has %q, repository %q", k, test[k], v)
		}
	}
	for k := range test {
		if _, ok := repo[k]; !ok && !differ[k] {
			t.Errorf("%s: only in testdata", k)
		}
	}
	for _, k := range []string{"defaults.callbacks_enabled", "ssh_connection.pipelining"} {
		if test[k] == "" {
			t.Errorf("testdata config lacks %s", k)
		}
	}
}

// readINI reads an ansible.cfg into section.key -> value.
func readINI(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	defer f.Close()
	out := map[string]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, ";"):
		case strings.HasPrefix(l, "["):
			section = strings.Trim(l, "[]")
		default:
			k, v, _ := strings.Cut(l, "=")
			out[section+"."+strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return out
}
