package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// secretVarPlay asserts db_password against its sha256 (the play holds no
// value) and, while it runs, copies every file under the run root and the
// jobs' work directory, for the test to search.
const secretVarPlay = `- name: Secret vars
  hosts: all
  gather_facts: false
  tasks:
    - name: The secret var is the value, untemplated
      ansible.builtin.assert:
        that:
          - (db_password | hash('sha256')) == want_sum
          - out is defined
        quiet: true
    - name: Copy every file of the run while it runs
      ansible.builtin.shell: >-
        find {{ run_root }} {{ work_dir }} -type f -exec cat {} + > {{ out }}/during.txt 2>/dev/null;
        cat $(find {{ run_root }} -name secret-vars.yml) > {{ out }}/secret-vars.txt;
        sleep 1
      changed_when: false
`

// TestAnsibleJobSecretVars: options.secret_vars reach the play as those
// variables (a "{{ 7*6 }}" in the value arrives literally) after the job
// waited for its busy host; the value is never in argv, a file of the run
// (while it runs or after), infra's logs, the streams or the rows; the
// generated vars file holds the lookup only. A reference the project may
// not use, and one that resolves to nothing, fail the job naming the
// secret var's field, before the play.
func TestAnsibleJobSecretVars(t *testing.T) {
	t.Parallel()
	w := newJobWorld(t, 1)
	canary := "sv-CANARY-" + testenv.Unique("pw") + " {{ 7*6 }}"
	sum := sha256.Sum256([]byte(canary))
	w.repo.Commit(t, map[string]string{"secret.yml": secretVarPlay, "hold.yml": holdPlay})
	workDir := filepath.Join(filepath.Dir(w.e2e.runRoot), "jobs")
	p := w.start("SERVER_BUSY_RECHECK=200ms", "PROJ_SECRET_DBPW="+canary, "OTHER_SECRET=not-the-projects")

	// A job holding the host: the secret job waits (prepared.go) first.
	holder := w.job("job-sv-holder", map[string]messages.Vars{"t1": w.host(0)}, "hold.yml")
	holder.Options.ExtraVars["hold"] = int64(4)
	w.submit(holder)
	testenv.WaitFor(t, 2*time.Minute, "the holder's task to run", func() bool {
		got, _ := os.ReadFile(filepath.Join(w.out, "holds.log"))
		return strings.Contains(string(got), "start ")
	})

	var inArgv atomic.Bool
	stop := make(chan struct{})
	go watchArgv("sv-CANARY-", &inArgv, stop)
	m := w.job("job-secret-vars", map[string]messages.Vars{"t1": w.host(0)}, "secret.yml")
	m.Options.ExtraVars["want_sum"] = hex.EncodeToString(sum[:])
	m.Options.ExtraVars["run_root"] = w.runRoot
	m.Options.ExtraVars["work_dir"] = workDir
	m.Options.SecretVars = map[string]string{"db_password": "env:PROJ_SECRET_DBPW"}
	m.Options.Verbosity = 4
	w.submit(m)
	testenv.WaitFor(t, 2*time.Minute, "the secret job to wait for its host", func() bool {
		return strings.Contains(p.Stderr(), `"job_id":"job-secret-vars"`) && strings.Contains(p.Stderr(), "waiting for another run")
	})
	jobStatus(t, w.waitJob("job-sv-holder", 3*time.Minute), messages.StatusSucceeded, "")
	r := w.waitJob("job-secret-vars", 3*time.Minute)
	close(stop)
	jobStatus(t, r, messages.StatusSucceeded, "")

	if inArgv.Load() {
		t.Error("the secret var's value was in a process's argv")
	}
	during, err := os.ReadFile(filepath.Join(w.out, "during.txt"))
	if err != nil || !strings.Contains(string(during), "want_sum") {
		t.Fatalf("the run's files were not copied during the run (%v): %.200q", err, during)
	}
	gen, _ := os.ReadFile(filepath.Join(w.out, "secret-vars.txt"))
	if want := `db_password: "{{ lookup('ansible.builtin.env', 'AUTOPROV_SECRET_VAR_0') }}"`; strings.TrimSpace(string(gen)) != want {
		t.Errorf("secret-vars.yml %q, want only %s", gen, want)
	}
	// The value, and its first part (a leak with "{{ 7*6 }}" templated).
	leaks := map[string]string{"secret var": canary, "secret var's start": strings.Fields(canary)[0]}
	for name, v := range leaks {
		if strings.Contains(string(during), v) {
			t.Errorf("a file of the run held the %s while it ran", name)
		}
		if strings.Contains(r.OutputTail, v) {
			t.Errorf("the output holds the %s", name)
		}
	}
	w.assertNowhere(t, p, leaks)
	for _, dir := range []string{w.runRoot, workDir} {
		_ = filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
			if err == nil && info.Mode().IsRegular() {
				if data, _ := os.ReadFile(path); strings.Contains(string(data), leaks["secret var's start"]) {
					t.Errorf("file %s holds the secret var", path)
				}
			}
			return nil
		})
	}

	// Refused (not the project's) and unresolvable references: the job
	// fails naming the field, and its play never runs.
	for id, ref := range map[string]string{"job-sv-refused": "env:OTHER_SECRET", "job-sv-missing": "env:PROJ_SECRET_NONE"} {
		m := w.job(id, map[string]messages.Vars{"t1": w.host(0)}, "secret.yml")
		m.Options.ExtraVars["want_sum"], m.Options.ExtraVars["run_root"], m.Options.ExtraVars["work_dir"] = "x", w.runRoot, workDir
		m.Options.SecretVars = map[string]string{"token": ref}
		os.Remove(filepath.Join(w.out, "during.txt"))
		w.submit(m)
		r := w.waitJob(id, 3*time.Minute)
		jobStatus(t, r, messages.StatusFailed, messages.KindSecretUnavailable)
		if !strings.Contains(r.Error.Message, "options.secret_vars[token]") {
			t.Errorf("%s: message %q does not name options.secret_vars[token]", id, r.Error.Message)
		}
		if id == "job-sv-refused" && !strings.Contains(r.Error.Message, "refused") {
			t.Errorf("%s: message %q, want the reference refused", id, r.Error.Message)
		}
		if len(r.Playbooks) != 0 && r.Playbooks[0].Status != messages.PlaybookSkipped {
			t.Errorf("%s: playbooks %+v, want none run", id, r.Playbooks)
		}
		if _, err := os.Stat(filepath.Join(w.out, "during.txt")); err == nil {
			t.Errorf("%s: the play ran", id)
		}
	}
	w.assertNowhere(t, p, map[string]string{"other project's secret": "not-the-projects"})
}
