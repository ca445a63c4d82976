package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
)

// The callback plugin's own tests run ansible-playbook directly, with the
// project's ansible.cfg and a static inventory (several hosts, the local
// connection, a file or FIFO for the events): they check the plugin's
// output line by line, as docs/events.md specifies it, and that the
// runner's decoder (ansible.DecodeEvent) reads every line. The playbooks
// themselves run through the runner, as the infra service runs them (see
// runPlay).

// rawEvent is one line of the plugin's output, decoded by the runner's
// decoder, and as JSON.
type rawEvent struct {
	ansible.Event
	Line string
	JSON map[string]any
}

// readEvents reads an event stream line by line.
func readEvents(t *testing.T, r io.Reader) []rawEvent {
	t.Helper()
	var out []rawEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 128*1024), 128*1024)
	for sc.Scan() {
		line := sc.Bytes()
		ev, err := ansible.DecodeEvent(line)
		if err != nil {
			t.Errorf("the runner cannot decode event %q: %v", line, err)
			continue
		}
		raw := rawEvent{Event: ev, Line: string(line)}
		if err := json.Unmarshal(line, &raw.JSON); err != nil {
			t.Errorf("event %q is not a JSON object: %v", line, err)
			continue
		}
		out = append(out, raw)
	}
	if err := sc.Err(); err != nil {
		t.Errorf("read events: %v", err)
	}
	return out
}

// ansiblePlaybook runs ansible-playbook in the ansible directory with the
// project's config, the events inventory and env added to a minimal
// environment; it returns the exit status and the output.
func ansiblePlaybook(t *testing.T, dir string, env map[string]string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command("/usr/bin/ansible-playbook", append([]string{"-i", filepath.Join(repoRoot(t), "ansible/tests/testdata/events_inventory.yml")}, args...)...)
	cmd.Dir = ansibleDir(t)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "HOME=" + dir,
		"ANSIBLE_CONFIG=" + filepath.Join(ansibleDir(t), "ansible.cfg"), "ANSIBLE_NOCOLOR=1",
		"ANSIBLE_LOCAL_TEMP=" + filepath.Join(dir, "tmp"), "ANSIBLE_SSH_CONTROL_PATH_DIR=" + filepath.Join(dir, "cp"),
		"ANSIBLE_CACHE_PLUGIN_CONNECTION=" + filepath.Join(dir, "facts")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run ansible-playbook: %v", err)
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

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

	got := make(chan []rawEvent, 1)
	go func() {
		f, err := os.Open(fifo) // blocks until the plugin opens it for writing
		if err != nil {
			t.Errorf("open the events FIFO: %v", err)
			got <- nil
			return
		}
		defer f.Close()
		got <- readEvents(t, f)
	}()

	exit, output := ansiblePlaybook(t, dir, map[string]string{"EVENTS_SECRET": secret, "AUTOPROV_EVENTS_PATH": fifo},
		"-e", "events_gone_port="+strconv.Itoa(deadPort), filepath.Join(repoRoot(t), "ansible/tests/testdata/events.yml"))
	var evs []rawEvent
	select {
	case evs = <-got:
	case <-time.After(time.Minute):
		t.Fatal("no end of the event stream")
	}
	if exit == 0 {
		t.Errorf("exit 0 despite an unreachable host")
	}
	if len(evs) == 0 {
		t.Fatalf("no events; exit %d:\n%s", exit, output)
	}

	for i, e := range evs {
		if v, _ := e.JSON["v"].(float64); v != 1 || e.Seq != i+1 {
			t.Errorf("event %d: v=%v seq=%d, want v=1 seq=%d", i, e.JSON["v"], e.Seq, i+1)
		}
		ts, _ := e.JSON["ts"].(string)
		if _, err := time.Parse("2006-01-02T15:04:05.000Z07:00", ts); err != nil || !strings.HasSuffix(ts, "Z") || e.Time.IsZero() {
			t.Errorf("event %d: ts %q is not RFC 3339 UTC with ms", i, ts)
		}
		if e.Playbook != "events.yml" {
			t.Errorf("event %d: playbook %q", i, e.Playbook)
		}
		if len(e.Line)+1 > 64*1024 {
			t.Errorf("event %d: line of %d bytes", i, len(e.Line)+1)
		}
		if len(e.Msg) > 32*1024 {
			t.Errorf("event %d (%s): msg of %d bytes", i, e.Task, len(e.Msg))
		}
		if strings.Contains(e.Line, secret) {
			t.Errorf("event %d leaks the no_log secret: %s", i, e.Line)
		}
		for k := range e.JSON {
			switch k {
			case "v", "seq", "ts", "event", "playbook", "play", "task", "action", "host", "changed", "ignore_errors", "msg", "msg_cut_start", "msg_cut_end", "rc", "hosts":
			default:
				t.Errorf("event %d: unexpected key %q", i, k)
			}
		}
	}
	if evs[0].Type != ansible.EventPlaybookStart {
		t.Errorf("first event %q, want playbook_start", evs[0].Type)
	}
	if last := evs[len(evs)-1]; last.Type != ansible.EventStats {
		t.Errorf("last event %q, want stats", last.Type)
	}

	find := func(event, host, task string) *rawEvent {
		for i := range evs {
			if evs[i].Type == event && evs[i].Host == host && evs[i].Task == task {
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
			t.Errorf("ok task event: %s", e.Line)
		}
	}
	if e := find("host_ok", "local", "A changed task"); e != nil && !e.Changed {
		t.Errorf("changed task event: %s", e.Line)
	}
	if e := find("host_failed", "local", "A failing task that is ignored"); e != nil {
		if !e.IgnoreErrors || !strings.Contains(e.Msg, "non-zero return code") || !strings.Contains(e.Msg, "boom") || e.RC == nil || *e.RC != 3 {
			t.Errorf("ignored failure event: %s", e.Line)
		}
	}
	find("host_skipped", "local", "A skipped task")
	if e := find("host_ok", "local", "A secret task"); e != nil && !strings.Contains(e.Msg, "no_log") {
		t.Errorf("no_log task event should say it was censored: %s", e.Line)
	}
	find("host_failed", "local", "A failing secret task")
	if e := find("host_ok", "local", "A looped task"); e != nil && e.Changed {
		t.Errorf("loop event: %s", e.Line)
	}
	if e := find("host_ok", "local", "A task with a huge output"); e != nil && (len(e.Msg) < 4096 || len(e.Msg) > 32*1024 ||
		!strings.Contains(e.Line, `"msg_cut_start":true`)) {
		t.Errorf("huge output: msg of %d bytes, %s", len(e.Msg), e.Line[:min(len(e.Line), 200)])
	}
	find("handler_start", "", "A handler")
	if e := find("host_unreachable", "gone", "An ok task"); e != nil && e.Msg == "" {
		t.Errorf("unreachable event without msg: %s", e.Line)
	}
	items := 0
	for _, e := range evs {
		if e.Task == "A looped task" && e.Type == ansible.EventHostOK {
			items++
		}
	}
	if items != 1 {
		t.Errorf("looped task: %d host_ok events, want 1 (no per-item events)", items)
	}

	st, ok := evs[len(evs)-1].Stats["local"]
	if !ok {
		t.Fatalf("no stats for local")
	}
	want := ansible.Recap{OK: 8, Changed: 1, Failed: 0, Skipped: 1, Ignored: 2}
	if st != want {
		t.Errorf("stats for local: %+v, want %+v", st, want)
	}
	if gone := evs[len(evs)-1].Stats["gone"]; gone.Unreachable != 1 {
		t.Errorf("stats for gone: %+v, want 1 unreachable", gone)
	}
	if strings.Contains(output, secret) {
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
	tiny := func(env map[string]string) {
		t.Helper()
		if exit, out := ansiblePlaybook(t, dir, env, "--limit", "local", pb); exit != 0 {
			t.Fatalf("tiny playbook: exit %d:\n%s", exit, out)
		}
	}
	tiny(nil)
	entries, _ := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if len(entries) != 0 {
		t.Errorf("events written without AUTOPROV_EVENTS_PATH: %v", entries)
	}
	// Two runs into the same file: appended, each starting at seq 1.
	path := filepath.Join(dir, "append.jsonl")
	for i := 0; i < 2; i++ {
		tiny(map[string]string{"AUTOPROV_EVENTS_PATH": path})
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	evs := readEvents(t, f)
	starts := 0
	for _, e := range evs {
		if e.Type == ansible.EventPlaybookStart {
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
