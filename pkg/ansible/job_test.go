package ansible

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestValidateJob: a job spec's hosts, groups, options and environment
// are checked before anything is written; a blocked host needs no key.
func TestValidateJob(t *testing.T) {
	t.Parallel()
	r, _ := newTestRunner(t, nil)
	play := filepath.Join(t.TempDir(), "site.yml")
	if err := os.WriteFile(play, []byte("- hosts: all\n  tasks: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	key := testHostKey(t)
	good := func() JobSpec {
		return JobSpec{
			Spec:         Spec{JobID: "j"},
			PlaybookPath: play,
			Hosts: []JobHost{
				{Host: Host{Alias: "web_1:a", Address: "192.0.2.10", User: "root", KnownHostsKey: key},
					Vars: map[string]any{"role": "x", "ansible_become": true}},
				{Host: Host{Alias: "down", Address: "192.0.2.11", User: "root"}, Blocked: true},
			},
			Groups:  map[string]JobGroup{"web": {Hosts: []string{"web_1:a"}}},
			Options: JobOptions{Tags: []string{"a"}, Limit: "web:!down", Verbosity: 4, Forks: 5},
			Env:     map[string]string{"ANSIBLE_COLLECTIONS_PATH": "/x"},
		}
	}
	g := good()
	keys, err := r.validateJob(&g)
	if err != nil {
		t.Fatalf("good job: %v", err)
	}
	if keys[0].line == "" || keys[1].line != "" || g.Hosts[0].Port != 22 || g.Timeout != r.cfg.Timeout {
		t.Errorf("keys %+v, spec %+v", keys, g)
	}
	for name, mutate := range map[string]func(*JobSpec){
		"relative playbook":   func(s *JobSpec) { s.PlaybookPath = "site.yml" },
		"missing playbook":    func(s *JobSpec) { s.PlaybookPath = play + ".no" },
		"no host":             func(s *JobSpec) { s.Hosts = nil },
		"host twice":          func(s *JobSpec) { s.Hosts[1].Alias = s.Hosts[0].Alias },
		"alias template":      func(s *JobSpec) { s.Hosts[0].Alias = "{{x}}" },
		"unpinned, unblocked": func(s *JobSpec) { s.Hosts[1].Blocked = false },
		"address option":      func(s *JobSpec) { s.Hosts[0].Address = "-oProxyCommand=x" },
		"connection var":      func(s *JobSpec) { s.Hosts[0].Vars["ansible_connection"] = "local" },
		"ssh args var":        func(s *JobSpec) { s.Groups["web"] = JobGroup{Vars: map[string]any{"ansible_ssh_extra_args": "-o x"}} },
		"group unknown host":  func(s *JobSpec) { s.Groups["web"] = JobGroup{Hosts: []string{"nope"}} },
		"group all":           func(s *JobSpec) { s.Groups["all"] = JobGroup{} },
		"tag comma":           func(s *JobSpec) { s.Options.Tags = []string{"a,b"} },
		"limit file":          func(s *JobSpec) { s.Options.Limit = "@/etc/passwd" },
		"verbosity":           func(s *JobSpec) { s.Options.Verbosity = 5 },
		"env other":           func(s *JobSpec) { s.Env = map[string]string{"ANSIBLE_SSH_ARGS": "x"} },
		"inventory plugin":    func(s *JobSpec) { s.InventoryEnabled = "script" },
		"secret env reserved": func(s *JobSpec) { s.SecretEnv = map[string]string{"LD_PRELOAD": "x"} },
	} {
		s := good()
		mutate(&s)
		if _, err := r.validateJob(&s); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestJobInputs: the generated inventory pins each host, blocks a host that
// failed its check without a connection, keeps variables as data, and
// Ansible's own parser reads it; the vault script holds no password.
func TestJobInputs(t *testing.T) {
	t.Parallel()
	r, _ := newTestRunner(t, nil)
	key := testHostKey(t)
	js := JobSpec{
		Spec: Spec{JobID: "j", Vars: map[string]any{"x": "{{ lookup('pipe','id') }}"}},
		Hosts: []JobHost{
			{Host: Host{Alias: "up", Address: "192.0.2.10", Port: 2222, User: "root", KnownHostsKey: key},
				Vars: map[string]any{"note": "{{ not templated }}"}},
			{Host: Host{Alias: "down", Address: "192.0.2.11", Port: 22, User: "root"}, Blocked: true},
		},
		Groups:        map[string]JobGroup{"web": {Hosts: []string{"up", "down"}, Vars: map[string]any{"tier": "front"}}},
		VaultPassword: "vault-pw-canary",
	}
	play := filepath.Join(t.TempDir(), "site.yml")
	if err := os.WriteFile(play, []byte("- hosts: all\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	js.PlaybookPath = play
	keys, err := r.validateJob(&js)
	if err != nil {
		t.Fatal(err)
	}
	d, err := r.newRunDir("j", false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.remove()
	if err := d.writeJobInputs(&js, keys, jobMarkers(&js, keys)); err != nil {
		t.Fatal(err)
	}
	known, _ := os.ReadFile(d.knownHosts)
	if !strings.HasPrefix(string(known), "[192.0.2.10]:2222 ssh-ed25519 ") || strings.Count(string(known), "\n") != 1 {
		t.Errorf("known_hosts %q, want the pinned host only", known)
	}
	script, _ := os.ReadFile(filepath.Join(d.path, "vault-pass"))
	if strings.Contains(string(script), "vault-pw-canary") || !strings.Contains(string(script), envVaultPassword) {
		t.Errorf("vault script %q", script)
	}
	for host, wants := range map[string][]string{
		"up":   {"HostKeyAlgorithms=ssh-ed25519", `"__ansible_unsafe": "{{ not templated }}"`, `"tier"`, markerEnv + "=", "autoprov-"},
		"down": {"ProxyCommand=/bin/false", `"ansible_connection": "ssh"`},
	} {
		out, err := execOutput(t, "/usr/bin/ansible-inventory", "-i", d.inventory, "--host", host)
		if err != nil {
			t.Fatalf("ansible-inventory: %v\n%s", err, out)
		}
		for _, want := range wants {
			if !strings.Contains(out, want) {
				t.Errorf("%s: inventory lacks %s:\n%s", host, want, out)
			}
		}
	}
	argv := r.jobArgv(d, &js)
	if s := strings.Join(argv, " "); strings.Contains(s, "vault-pw-canary") || !strings.Contains(s, "--vault-password-file=") {
		t.Errorf("argv %q", s)
	}
}

// A job's run reports its runner steps as a one-host run does: the run
// directory, the agent, the takeover (before ansible-playbook starts, so
// waited for whole), the start and the play, which is part of the time
// from the start to the exit.
func TestRunJobReportsItsSteps(t *testing.T) {
	t.Parallel()
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	r, _ := newTestRunner(t, nil)
	dir := jobDir(t, "- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.ping:\n", "")
	res, err := r.RunJob(context.Background(), jobOn(s, dir))
	if err != nil || res.Outcome != OutcomeSucceeded {
		t.Fatalf("RunJob: %v %+v", err, res)
	}
	st := res.Steps
	if st.RunDir <= 0 || st.Agent <= 0 || st.Takeover <= 0 || st.Start <= 0 || st.Play <= 0 {
		t.Errorf("steps %+v: want every one counted", st)
	}
	if st.TakeoverWait != st.Takeover {
		t.Errorf("takeover %v, waited %v: a job's takeover runs before its play, which waits for all of it", st.Takeover, st.TakeoverWait)
	}
	if ran := res.ExitedAt.Sub(res.StartedAt); st.Play > ran {
		t.Errorf("play %v, more than ansible-playbook's %v from exec to exit", st.Play, ran)
	}
}
