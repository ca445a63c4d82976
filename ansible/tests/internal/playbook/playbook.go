// Package playbook runs ansible-playbook the way the infra service does
// (inventory and !unsafe extra-vars files in a private run directory, cwd =
// ansible/, an allow-listed environment, SSH keys from an agent) and reads
// the autoprov_events stream it produces.
package playbook

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Host is the single inventory host of a run.
type Host struct {
	// Alias is the inventory name (the server handle).
	Alias string
	// Addr, Port and User are ansible_host, ansible_port and ansible_user.
	Addr string
	Port int
	User string
	// KnownHosts is the known_hosts content pinning the host key.
	KnownHosts string
	// Vars are more host variables (e.g. ansible_connection).
	Vars map[string]any
}

// Run describes one ansible-playbook invocation.
type Run struct {
	// AnsibleDir is the ansible/ directory (working directory of the run).
	AnsibleDir string
	// Playbook is relative to AnsibleDir (e.g. "playbooks/setup_server.yml").
	Playbook string
	// Hosts make up the inventory (usually one).
	Hosts []Host
	// ExtraVars are written to vars.yml with every string tagged !unsafe.
	ExtraVars map[string]any
	// Env adds environment variables (secrets such as GITHUB_TOKEN).
	Env map[string]string
	// Config is ANSIBLE_CONFIG; empty means AnsibleDir/ansible.cfg.
	Config string
	// SSHAuthSock is the ssh-agent socket.
	SSHAuthSock string
	// Dir is the private run directory (inventory, vars, events, caches).
	Dir string
	// FactCacheDir is ANSIBLE_CACHE_PLUGIN_CONNECTION (default Dir/facts).
	FactCacheDir string
	// NoEvents leaves AUTOPROV_EVENTS_PATH unset.
	NoEvents bool
}

// Result is the outcome of a run.
type Result struct {
	ExitCode int
	Stdout   string
	Stderr   string
	Events   []Event
	Duration time.Duration
}

// Event is one line of the autoprov_events stream (docs/events.md).
type Event struct {
	V            int                  `json:"v"`
	Seq          int                  `json:"seq"`
	TS           string               `json:"ts"`
	Event        string               `json:"event"`
	Playbook     string               `json:"playbook"`
	Play         string               `json:"play"`
	Task         string               `json:"task"`
	Action       string               `json:"action"`
	Host         string               `json:"host"`
	Changed      bool                 `json:"changed"`
	IgnoreErrors bool                 `json:"ignore_errors"`
	Msg          string               `json:"msg"`
	RC           *int                 `json:"rc"`
	Hosts        map[string]HostStats `json:"hosts"`
	// Raw is the line as written.
	Raw string `json:"-"`
}

// HostStats are the per-host counters of the stats event.
type HostStats struct {
	OK          int `json:"ok"`
	Changed     int `json:"changed"`
	Failed      int `json:"failed"`
	Unreachable int `json:"unreachable"`
	Skipped     int `json:"skipped"`
	Rescued     int `json:"rescued"`
	Ignored     int `json:"ignored"`
}

// Stats returns the stats event's counters for host (ok=false without one).
func (r *Result) Stats(host string) (HostStats, bool) {
	for i := len(r.Events) - 1; i >= 0; i-- {
		if r.Events[i].Event == "stats" {
			s, ok := r.Events[i].Hosts[host]
			return s, ok
		}
	}
	return HostStats{}, false
}

// Changed lists the names of the tasks that reported a change.
func (r *Result) Changed() []string {
	var out []string
	for _, e := range r.Events {
		if e.Event == "host_ok" && e.Changed {
			out = append(out, e.Task)
		}
	}
	return out
}

// Failures lists the failed or unreachable task results (task: msg).
func (r *Result) Failures() []string {
	var out []string
	for _, e := range r.Events {
		if (e.Event == "host_failed" && !e.IgnoreErrors) || e.Event == "host_unreachable" {
			out = append(out, e.Task+": "+e.Msg)
		}
	}
	return out
}

// Summary is a short human description for test failure messages.
func (r *Result) Summary() string {
	tail := r.Stdout
	if len(tail) > 6000 {
		tail = "..." + tail[len(tail)-6000:]
	}
	return fmt.Sprintf("exit %d after %s\nfailures: %v\nstderr: %s\nstdout tail:\n%s",
		r.ExitCode, r.Duration.Round(time.Millisecond), r.Failures(), strings.TrimSpace(r.Stderr), tail)
}

// Execute runs ansible-playbook and waits for it. A non-zero exit is not an
// error (see Result.ExitCode); failing to start it or to read its events is.
func Execute(ctx context.Context, r Run) (*Result, error) {
	if err := os.MkdirAll(r.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create run dir: %w", err)
	}
	inv, err := writeInventory(r)
	if err != nil {
		return nil, err
	}
	varsFile := filepath.Join(r.Dir, "vars.yml")
	if err := os.WriteFile(varsFile, []byte(UnsafeYAML(r.ExtraVars)), 0o600); err != nil {
		return nil, fmt.Errorf("write vars: %w", err)
	}
	events := filepath.Join(r.Dir, "events.jsonl")
	_ = os.Remove(events)
	cpDir, err := os.MkdirTemp("", "apcp")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(cpDir)
	home := filepath.Join(r.Dir, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return nil, err
	}
	config := r.Config
	if config == "" {
		config = filepath.Join(r.AnsibleDir, "ansible.cfg")
	}
	facts := r.FactCacheDir
	if facts == "" {
		facts = filepath.Join(r.Dir, "facts")
	}
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LANG=C.UTF-8",
		"HOME=" + home,
		"ANSIBLE_CONFIG=" + config,
		"ANSIBLE_CACHE_PLUGIN_CONNECTION=" + facts,
		"ANSIBLE_SSH_CONTROL_PATH_DIR=" + cpDir,
		"ANSIBLE_NOCOLOR=1",
		"ANSIBLE_LOCAL_TEMP=" + filepath.Join(home, "tmp"),
	}
	if r.SSHAuthSock != "" {
		env = append(env, "SSH_AUTH_SOCK="+r.SSHAuthSock)
	}
	if !r.NoEvents {
		env = append(env, "AUTOPROV_EVENTS_PATH="+events)
	}
	keys := make([]string, 0, len(r.Env))
	for k := range r.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+r.Env[k])
	}
	cmd := exec.CommandContext(ctx, "ansible-playbook", "-i", inv, r.Playbook, "-e", "@"+varsFile)
	cmd.Dir = r.AnsibleDir
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	err = cmd.Run()
	res := &Result{Stdout: stdout.String(), Stderr: stderr.String(), Duration: time.Since(start)}
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			return res, fmt.Errorf("run ansible-playbook %s: %w", r.Playbook, err)
		}
		res.ExitCode = ee.ExitCode()
	}
	// The SSH control masters outlive the run (ControlPersist): close them.
	closeControlMasters(cpDir)
	if !r.NoEvents {
		evs, err := ReadEvents(events)
		if err != nil {
			return res, err
		}
		res.Events = evs
	}
	return res, nil
}

// closeControlMasters asks every SSH control master under dir to exit.
func closeControlMasters(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		sock := filepath.Join(dir, e.Name())
		cmd := exec.Command("ssh", "-o", "ControlPath="+sock, "-O", "exit", "unused")
		_ = cmd.Run()
	}
}

// ReadEvents parses an events file.
func ReadEvents(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open events: %w", err)
	}
	defer f.Close()
	return ParseEvents(f)
}

// ParseEvents parses an events stream.
func ParseEvents(r interface{ Read([]byte) (int, error) }) ([]Event, error) {
	var out []Event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 128*1024), 128*1024)
	for sc.Scan() {
		line := sc.Text()
		var e Event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return out, fmt.Errorf("parse event %q: %w", line, err)
		}
		e.Raw = line
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("read events: %w", err)
	}
	return out, nil
}

func writeInventory(r Run) (string, error) {
	var b strings.Builder
	b.WriteString("all:\n  hosts:\n")
	for _, h := range r.Hosts {
		fmt.Fprintf(&b, "    %s:\n", h.Alias)
		if h.Addr != "" {
			fmt.Fprintf(&b, "      ansible_host: %s\n", strconv.Quote(h.Addr))
		}
		if h.Port != 0 {
			fmt.Fprintf(&b, "      ansible_port: %d\n", h.Port)
		}
		if h.User != "" {
			fmt.Fprintf(&b, "      ansible_user: %s\n", strconv.Quote(h.User))
		}
		if h.KnownHosts != "" {
			kh := filepath.Join(r.Dir, "known_hosts")
			if err := os.WriteFile(kh, []byte(h.KnownHosts), 0o600); err != nil {
				return "", fmt.Errorf("write known_hosts: %w", err)
			}
			fmt.Fprintf(&b, "      ansible_ssh_common_args: %s\n",
				strconv.Quote("-o UserKnownHostsFile="+kh+" -o StrictHostKeyChecking=yes"))
		}
		keys := make([]string, 0, len(h.Vars))
		for k := range h.Vars {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			v, _ := json.Marshal(h.Vars[k])
			fmt.Fprintf(&b, "      %s: %s\n", k, v)
		}
	}
	path := filepath.Join(r.Dir, "inventory.yml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return "", fmt.Errorf("write inventory: %w", err)
	}
	return path, nil
}

// UnsafeYAML renders vars as YAML with every string tagged !unsafe, as the
// infra service writes extra-vars files. Values may be strings, numbers,
// booleans, lists and maps of those.
func UnsafeYAML(vars map[string]any) string {
	var b strings.Builder
	keys := make([]string, 0, len(vars))
	for k := range vars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		b.WriteString(k + ": " + unsafeValue(vars[k]) + "\n")
	}
	if b.Len() == 0 {
		return "{}\n"
	}
	return b.String()
}

func unsafeValue(v any) string {
	switch x := v.(type) {
	case string:
		q, _ := json.Marshal(x)
		return "!unsafe " + string(q)
	case []string:
		parts := make([]string, len(x))
		for i, s := range x {
			parts[i] = unsafeValue(s)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case []any:
		parts := make([]string, len(x))
		for i, s := range x {
			parts[i] = unsafeValue(s)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			q, _ := json.Marshal(k)
			parts[i] = string(q) + ": " + unsafeValue(x[k])
		}
		return "{" + strings.Join(parts, ", ") + "}"
	default:
		q, _ := json.Marshal(x)
		return string(q)
	}
}
