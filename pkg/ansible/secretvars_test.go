package ansible

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestRunJobSecretVars: a job's secret vars reach the play as those
// variables, their values literal (a "{{ 7*6 }}" in one is not templated),
// through the environment only: the play itself copies every file of the
// run directory while it runs, and none holds a value; the generated
// secret-vars.yml holds the lookups; no argv and no output line holds a
// value (no redaction here: Ansible itself never shows it).
func TestRunJobSecretVars(t *testing.T) {
	t.Parallel()
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	r, logs := newTestRunner(t, nil)
	password := "sv-CANARY-" + testenv.Unique("pw") + " {{ 7*6 }} 'q\" $HOME"
	token := "tok-CANARY-" + testenv.Unique("tk")
	sum := func(v string) string { h := sha256.Sum256([]byte(v)); return hex.EncodeToString(h[:]) }
	out := t.TempDir()
	play := `- hosts: all
  gather_facts: false
  tasks:
    - name: The secret vars are the values, untemplated
      ansible.builtin.assert:
        that:
          - (db_password | hash('sha256')) == '` + sum(password) + `'
          - (api_token | hash('sha256')) == '` + sum(token) + `'
          - plain == 'x'
        quiet: true
    - name: Copy every file of the run directory while the play runs
      ansible.builtin.shell: >-
        find {{ run_root }} -type f -exec cat {} + > {{ out }}/rundir.txt;
        cat $(find {{ run_root }} -name secret-vars.yml) > {{ out }}/secret-vars.txt;
        sleep 1
      changed_when: false
`
	dir := jobDir(t, play, "")
	js := jobOn(s, dir)
	js.Vars = map[string]any{"out": out, "run_root": r.cfg.RunRoot, "plain": "x"}
	js.SecretVars = map[string]string{"db_password": password, "api_token": token}
	js.Options.Verbosity = 3
	var mu sync.Mutex
	var lines []string
	js.OnOutput = func(l string) { mu.Lock(); lines = append(lines, l); mu.Unlock() }
	var inArgv atomic.Bool
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			entries, _ := os.ReadDir("/proc")
			for _, e := range entries {
				if _, err := strconv.Atoi(e.Name()); err != nil {
					continue
				}
				data, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
				if strings.Contains(string(data), "CANARY") {
					inArgv.Store(true)
				}
			}
		}
	}()
	res, err := r.RunJob(context.Background(), js)
	close(stop)
	mu.Lock()
	output := strings.Join(lines, "\n")
	mu.Unlock()
	if err != nil || res.Outcome != OutcomeSucceeded {
		t.Fatalf("RunJob: %v %+v\n%s", err, res, output)
	}
	if inArgv.Load() {
		t.Error("a secret var's value was in a process's argv")
	}
	snapshot, err := os.ReadFile(filepath.Join(out, "rundir.txt"))
	if err != nil || len(snapshot) == 0 {
		t.Fatalf("run dir not copied: %v", err)
	}
	gen, _ := os.ReadFile(filepath.Join(out, "secret-vars.txt"))
	for _, want := range []string{
		`api_token: "{{ lookup('ansible.builtin.env', 'AUTOPROV_SECRET_VAR_0') }}"`,
		`db_password: "{{ lookup('ansible.builtin.env', 'AUTOPROV_SECRET_VAR_1') }}"`,
	} {
		if !strings.Contains(string(gen), want) {
			t.Errorf("secret-vars.yml %q lacks %s", gen, want)
		}
	}
	for name, v := range map[string]string{"password": password, "token": token} {
		for where, text := range map[string]string{"a run dir file": string(snapshot), "the output": output,
			"the runner's log": logs.String(), "the result": fmt.Sprintf("%+v", res)} {
			if strings.Contains(text, v) || strings.Contains(text, strings.Split(v, " ")[0]) {
				t.Errorf("%s holds the %s", where, name)
			}
		}
	}
	if entries, _ := os.ReadDir(r.cfg.RunRoot); len(entries) != 0 {
		t.Errorf("run root not emptied: %v", entries)
	}
}

// TestValidateJobSecretVars: secret vars follow extra vars' naming rules
// and may not be extra vars too, nor meet a caller's SecretEnv of the
// runner's names for them.
func TestValidateJobSecretVars(t *testing.T) {
	t.Parallel()
	r, _ := newTestRunner(t, nil)
	dir := jobDir(t, "- hosts: all\n  tasks: []\n", "")
	good := func() JobSpec {
		js := jobOn(testenv.StartSSHD(t, testenv.SSHDOptions{}), dir)
		js.Vars = map[string]any{"x": 1}
		js.SecretVars = map[string]string{"b": "vb", "a": "va"}
		return js
	}
	g := good()
	if _, err := r.validateJob(&g); err != nil {
		t.Fatalf("good job: %v", err)
	}
	if g.SecretEnv[envSecretVar+"0"] != "va" || g.SecretEnv[envSecretVar+"1"] != "vb" {
		t.Errorf("secret env %v, want the values by sorted name", g.SecretEnv)
	}
	for name, mutate := range map[string]func(*JobSpec){
		"extra var too":  func(s *JobSpec) { s.SecretVars["x"] = "v" },
		"connection var": func(s *JobSpec) { s.SecretVars["ansible_password"] = "v" },
		"bad name":       func(s *JobSpec) { s.SecretVars["a-b"] = "v" },
		"NUL value":      func(s *JobSpec) { s.SecretVars["a"] = "v\x00" },
		"runner's env":   func(s *JobSpec) { s.SecretEnv = map[string]string{envSecretVar + "0": "v"} },
	} {
		s := good()
		mutate(&s)
		if _, err := r.validateJob(&s); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
