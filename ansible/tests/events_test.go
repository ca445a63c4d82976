package tests

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/ansible/tests/internal/playbook"
)

// TestEventsCallback runs a small playbook against localhost (local
// connection) and an unreachable host, with the project's ansible.cfg, and
// checks the autoprov_events stream read from a FIFO.
func TestEventsCallback(t *testing.T) {
	t.Parallel()
	requireTools(t, "ansible-playbook")
	const secret = "s3cr3t-Ev3nts-Value-91f2"
	dir := newRunDir(t)
	fifo := filepath.Join(dir, "events.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// A port nothing listens on: connection refused, so the host is unreachable.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadPort := l.Addr().(*net.TCPAddr).Port
	l.Close()

	type readResult struct {
		events []playbook.Event
		err    error
	}
	got := make(chan readResult, 1)
	go func() {
		f, err := os.Open(fifo) // blocks until the plugin opens it for writing
		if err != nil {
			got <- readResult{err: err}
			return
		}
		defer f.Close()
		evs, err := playbook.ParseEvents(f)
		got <- readResult{evs, err}
	}()

	res := runPlaybook(t, playbook.Run{
		Playbook: filepath.Join(repoRoot(t), "ansible/tests/testdata/events.yml"),
		Hosts: []playbook.Host{
			{Alias: "local", Vars: map[string]any{"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}},
			{Alias: "gone", Addr: "127.0.0.1", Port: deadPort, User: "nobody", Vars: map[string]any{"ansible_connection": "ssh"}},
		},
		Env:      map[string]string{"EVENTS_SECRET": secret, "AUTOPROV_EVENTS_PATH": fifo},
		Dir:      dir,
		NoEvents: true,
	})
	var rr readResult
	select {
	case rr = <-got:
	case <-time.After(time.Minute):
		t.Fatal("no end of the event stream")
	}
	if rr.err != nil {
		t.Fatalf("read events: %v", rr.err)
	}
	evs := rr.events
	if res.ExitCode == 0 {
		t.Errorf("exit 0 despite an unreachable host")
	}
	if len(evs) == 0 {
		t.Fatalf("no events; %s", res.Summary())
	}

	for i, e := range evs {
		if e.V != 1 || e.Seq != i+1 {
			t.Errorf("event %d: v=%d seq=%d, want v=1 seq=%d", i, e.V, e.Seq, i+1)
		}
		if _, err := time.Parse("2006-01-02T15:04:05.000Z07:00", e.TS); err != nil || !strings.HasSuffix(e.TS, "Z") {
			t.Errorf("event %d: ts %q is not RFC 3339 UTC with ms", i, e.TS)
		}
		if e.Playbook != "events.yml" {
			t.Errorf("event %d: playbook %q", i, e.Playbook)
		}
		if len(e.Raw)+1 > 64*1024 {
			t.Errorf("event %d: line of %d bytes", i, len(e.Raw)+1)
		}
		if len(e.Msg) > 32*1024 {
			t.Errorf("event %d (%s): msg of %d bytes", i, e.Task, len(e.Msg))
		}
		if strings.Contains(e.Raw, secret) {
			t.Errorf("event %d leaks the no_log secret: %s", i, e.Raw)
		}
		var raw map[string]any
		if err := json.Unmarshal([]byte(e.Raw), &raw); err != nil {
			t.Fatal(err)
		}
		for k := range raw {
			switch k {
			case "v", "seq", "ts", "event", "playbook", "play", "task", "action", "host", "changed", "ignore_errors", "msg", "msg_cut_start", "msg_cut_end", "rc", "hosts":
			default:
				t.Errorf("event %d: unexpected key %q", i, k)
			}
		}
	}
	if evs[0].Event != "playbook_start" {
		t.Errorf("first event %q, want playbook_start", evs[0].Event)
	}
	if last := evs[len(evs)-1]; last.Event != "stats" {
		t.Errorf("last event %q, want stats", last.Event)
	}

	find := func(event, host, task string) *playbook.Event {
		for i := range evs {
			if evs[i].Event == event && evs[i].Host == host && evs[i].Task == task {
				return &evs[i]
			}
		}
		t.Errorf("no %s event for %s / %q", event, host, task)
		return nil
	}
	if e := find("play_start", "", ""); e != nil && e.Play != "Events test play" {
		t.Errorf("play_start play %q", e.Play)
	}
	if e := find("task_start", "", "An ok task"); e != nil && e.Action != "ansible.builtin.command" {
		t.Errorf("task_start action %q", e.Action)
	}
	if e := find("host_ok", "local", "An ok task"); e != nil {
		if e.Changed || !strings.Contains(e.Msg, "hello-stdout") || e.RC == nil || *e.RC != 0 {
			t.Errorf("ok task event: %s", e.Raw)
		}
	}
	if e := find("host_ok", "local", "A changed task"); e != nil && !e.Changed {
		t.Errorf("changed task event: %s", e.Raw)
	}
	if e := find("host_failed", "local", "A failing task that is ignored"); e != nil {
		if !e.IgnoreErrors || !strings.Contains(e.Msg, "non-zero return code") && !strings.Contains(e.Msg, "boom") || e.RC == nil || *e.RC != 3 {
			t.Errorf("ignored failure event: %s", e.Raw)
		}
	}
	find("host_skipped", "local", "A skipped task")
	if e := find("host_ok", "local", "A secret task"); e != nil && !strings.Contains(e.Msg, "no_log") {
		t.Errorf("no_log task event should say it was censored: %s", e.Raw)
	}
	find("host_failed", "local", "A failing secret task")
	if e := find("host_ok", "local", "A looped task"); e != nil && e.Changed {
		t.Errorf("loop event: %s", e.Raw)
	}
	if e := find("host_ok", "local", "A task with a huge output"); e != nil && (len(e.Msg) < 4096 || len(e.Msg) > 32*1024 ||
		!strings.Contains(e.Raw, `"msg_cut_start":true`)) {
		t.Errorf("huge output: msg of %d bytes, %s", len(e.Msg), e.Raw[:min(len(e.Raw), 200)])
	}
	find("handler_start", "", "A handler")
	if e := find("host_unreachable", "gone", "An ok task"); e != nil && e.Msg == "" {
		t.Errorf("unreachable event without msg: %s", e.Raw)
	}
	items := 0
	for _, e := range evs {
		if e.Task == "A looped task" && e.Event == "host_ok" {
			items++
		}
	}
	if items != 1 {
		t.Errorf("looped task: %d host_ok events, want 1 (no per-item events)", items)
	}

	st, ok := res.Stats("local")
	if !ok {
		stats := evs[len(evs)-1]
		st, ok = stats.Hosts["local"]
	}
	if !ok {
		t.Fatalf("no stats for local")
	}
	want := playbook.HostStats{OK: 8, Changed: 1, Failed: 0, Skipped: 1, Ignored: 2}
	if st != want {
		t.Errorf("stats for local: %+v, want %+v", st, want)
	}
	if gone := evs[len(evs)-1].Hosts["gone"]; gone.Unreachable != 1 {
		t.Errorf("stats for gone: %+v, want 1 unreachable", gone)
	}
	if strings.Contains(res.Stdout+res.Stderr, secret) {
		t.Errorf("ansible-playbook output leaks the no_log secret")
	}
}

// TestEventsCallbackDisabled checks the plugin stays silent without
// AUTOPROV_EVENTS_PATH and appends to a regular file across runs.
func TestEventsCallbackDisabled(t *testing.T) {
	t.Parallel()
	requireTools(t, "ansible-playbook")
	dir := newRunDir(t)
	pb := filepath.Join(dir, "tiny.yml")
	if err := os.WriteFile(pb, []byte("- name: Tiny\n  hosts: all\n  gather_facts: false\n  tasks:\n"+
		"    - name: Ping\n      ansible.builtin.ping:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	local := []playbook.Host{{Alias: "local", Vars: map[string]any{"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}}}
	res := runPlaybook(t, playbook.Run{Playbook: pb, Hosts: local, Dir: dir, NoEvents: true})
	if res.ExitCode != 0 {
		t.Fatalf("tiny playbook: %s", res.Summary())
	}
	entries, _ := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if len(entries) != 0 {
		t.Errorf("events written without AUTOPROV_EVENTS_PATH: %v", entries)
	}
	// Two runs into the same file: appended, each starting at seq 1.
	path := filepath.Join(dir, "append.jsonl")
	for i := 0; i < 2; i++ {
		res := runPlaybook(t, playbook.Run{Playbook: pb, Hosts: local, Dir: dir, NoEvents: true,
			Env: map[string]string{"AUTOPROV_EVENTS_PATH": path}})
		if res.ExitCode != 0 {
			t.Fatalf("tiny playbook: %s", res.Summary())
		}
	}
	evs, err := playbook.ReadEvents(path)
	if err != nil {
		t.Fatal(err)
	}
	starts := 0
	for _, e := range evs {
		if e.Event == "playbook_start" {
			starts++
			if e.Seq != 1 {
				t.Errorf("playbook_start seq %d", e.Seq)
			}
		}
	}
	if starts != 2 || len(evs) != 2*len(evs[:len(evs)/2]) {
		t.Errorf("appended stream: %d playbook_start events in %d lines", starts, len(evs))
	}
}
