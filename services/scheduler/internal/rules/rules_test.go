package rules

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func playbookDir(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("- hosts: all\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const good = `
defaults:
  retry_limit: 3
rules:
  - name: everyone
    playbooks: [base.yml]
  - name: web
    match:
      all:
        - group: web
        - label: env
          equals: prod
      any:
        - label: monitoring
        - group: edge
    playbooks: [nginx.yml, base.yml]
    settings:
      retry_limit: 5
      health_url: "http://{address}:8080/healthz"
  - name: db
    match:
      all: [{group: db}]
    playbooks: [postgres.yml]
    settings: {retry_limit: 7}
`

func TestPlan(t *testing.T) {
	t.Parallel()
	dir := playbookDir(t, "base.yml", "nginx.yml", "postgres.yml")
	set, err := Parse("rules.yml", []byte(good), dir)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		labels    map[string]string
		playbooks []string
		retry     int
		health    string
	}{
		{"nothing special", map[string]string{}, []string{"base.yml"}, 3, ""},
		{"web prod monitored", map[string]string{"group:web": "", "env": "prod", "monitoring": "yes"},
			[]string{"base.yml", "nginx.yml"}, 5, "http://{address}:8080/healthz"},
		{"web prod at the edge", map[string]string{"group:web": "", "env": "prod", "group:edge": ""},
			[]string{"base.yml", "nginx.yml"}, 5, "http://{address}:8080/healthz"},
		{"web prod without any-of", map[string]string{"group:web": "", "env": "prod"}, []string{"base.yml"}, 3, ""},
		{"web staging", map[string]string{"group:web": "", "env": "staging", "monitoring": ""}, []string{"base.yml"}, 3, ""},
		{"web and db: file order, last setting wins", map[string]string{"group:web": "", "group:db": "", "env": "prod", "monitoring": ""},
			[]string{"base.yml", "nginx.yml", "postgres.yml"}, 7, "http://{address}:8080/healthz"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := set.Plan(tt.labels)
			if !slices.Equal(p.Playbooks, tt.playbooks) || p.Settings.RetryLimit != tt.retry || p.Settings.HealthURL != tt.health {
				t.Errorf("plan %+v, want playbooks %v retry %d health %q", p, tt.playbooks, tt.retry, tt.health)
			}
		})
	}
	var nilSet *Set
	if p := nilSet.Plan(nil); len(p.Playbooks) != 0 {
		t.Errorf("nil set plan %+v", p)
	}
}

func TestErrorsNameFileLineRule(t *testing.T) {
	t.Parallel()
	dir := playbookDir(t, "base.yml")
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"syntax", "rules:\n  - name: a\n\tplaybooks: x\n", []string{"rules.yml:", "not valid YAML", "tab character"}},
		{"unknown top key", "rule:\n  - name: a\n", []string{`rules.yml:1: unknown key "rule" in the rules file`}},
		{"missing playbook", "rules:\n  - name: web\n    playbooks: [nginx.yml]\n",
			[]string{`rules.yml:3: rule "web": playbook "nginx.yml" does not exist in`}},
		{"path in playbook", "rules:\n  - name: web\n    playbooks: [../etc/passwd.yml]\n",
			[]string{`rules.yml:3: rule "web": playbook "../etc/passwd.yml" must be a file name`}},
		{"reserved playbook", "rules:\n  - name: web\n    playbooks: [setup_server.yml]\n",
			[]string{`rules.yml:3: rule "web": playbook "setup_server.yml" is run by infra itself`}},
		{"no name", "rules:\n  - playbooks: [base.yml]\n", []string{`rules.yml:2: rule "#1": name is required`}},
		{"duplicate names", "rules:\n  - name: a\n    playbooks: [base.yml]\n  - name: a\n    playbooks: [base.yml]\n",
			[]string{`rules.yml:4: rule "a": name "a" already used by the rule at line 2`}},
		{"bad condition", "rules:\n  - name: a\n    playbooks: [base.yml]\n    match:\n      all:\n        - group: web\n          label: x\n",
			[]string{`rules.yml:6: rule "a": a condition has either group or label, not both`}},
		{"equals with group", "rules:\n  - name: a\n    playbooks: [base.yml]\n    match:\n      any:\n        - group: web\n          equals: x\n",
			[]string{`rules.yml:7: rule "a": equals goes with label, not group`}},
		{"bad retry limit", "rules:\n  - name: a\n    settings:\n      retry_limit: zero\n",
			[]string{`rules.yml:4: rule "a": retry_limit must be an integer from 1 to 100`}},
		{"bad health url", "rules:\n  - name: a\n    settings:\n      health_url: ftp://x\n",
			[]string{`rules.yml:4: rule "a": health_url must be an http(s) URL`}},
		{"does nothing", "rules:\n  - name: a\n", []string{`rules.yml:2: rule "a": the rule has neither playbooks nor settings`}},
		{"several problems at once", "rules:\n  - name: a\n    playbooks: [x.yml]\n  - name: b\n    typo: 1\n    playbooks: [base.yml]\n",
			[]string{`rules.yml:3: rule "a": playbook "x.yml" does not exist`, `rules.yml:5: rule "b": unknown key "typo"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("rules.yml", []byte(tt.yaml), dir)
			var rerr *Error
			if !errors.As(err, &rerr) {
				t.Fatalf("Parse = %v, want *Error", err)
			}
			if len(rerr.Problems) != len(tt.want) && tt.name != "syntax" {
				t.Errorf("%d problems, want %d:\n%v", len(rerr.Problems), len(tt.want), err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
		})
	}
	if set, err := Parse("empty.yml", nil, dir); err != nil || len(set.Rules) != 0 {
		t.Errorf("empty file: %v %v", set, err)
	}
}

func TestHolderKeepsOldRulesOnBadReload(t *testing.T) {
	t.Parallel()
	dir := playbookDir(t, "base.yml", "nginx.yml", "postgres.yml")
	path := filepath.Join(t.TempDir(), "rules.yml")
	if err := os.WriteFile(path, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := NewHolder(path, dir, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	h.Reloaded = make(chan error, 10)
	ctx, cancel := contextWithCancel(t)
	done := make(chan error)
	go func() { done <- h.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-h.watching

	// A broken file (written in place) is refused: the old rules stay.
	if err := os.WriteFile(path, []byte("rules:\n  - name: x\n    playbooks: [missing.yml]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := waitReload(t, h); err == nil || !strings.Contains(err.Error(), `rule "x": playbook "missing.yml" does not exist`) {
		t.Fatalf("bad reload: %v", err)
	}
	if n := len(h.Rules().Rules); n != 3 {
		t.Errorf("rules in force after a bad reload: %d, want the old 3", n)
	}
	// A good file replacing it by rename is taken.
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte("rules:\n  - name: only\n    playbooks: [base.yml]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	if err := waitReload(t, h); err != nil {
		t.Fatalf("good reload: %v", err)
	}
	if r := h.Rules().Rules; len(r) != 1 || r[0].Name != "only" {
		t.Errorf("rules after reload: %+v", r)
	}
	if _, err := NewHolder(filepath.Join(t.TempDir(), "missing.yml"), dir, zerolog.Nop(), nil); err == nil {
		t.Error("a missing rules file at start is accepted")
	}
}

func waitReload(t *testing.T, h *Holder) error {
	t.Helper()
	select {
	case err := <-h.Reloaded:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("no reload after the file changed")
		return nil
	}
}
