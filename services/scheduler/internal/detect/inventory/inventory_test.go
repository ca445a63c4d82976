package inventory

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
)

func write(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func detect(t *testing.T, path string) ([]fleet.Detected, error) {
	t.Helper()
	d, err := New(path, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return d.List(ctx)
}

func byHandle(list []fleet.Detected) map[string]fleet.Detected {
	out := map[string]fleet.Detected{}
	for _, d := range list {
		out[d.Handle] = d
	}
	return out
}

// TestFormats reads the same fleet written in each format Ansible reads,
// through the real ansible-inventory, and expects the same servers.
func TestFormats(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ini := write(t, dir, "ini/hosts.ini", `
[web]
web-1 ansible_host=192.0.2.10 ansible_port=2222 ansible_user=debian env=prod
web-2 ansible_host=192.0.2.11 db_password=hunter2

[db]
db-1 ansible_host=192.0.2.20

[prod:children]
web
`)
	yml := write(t, dir, "yaml/hosts.yml", `
all:
  children:
    prod:
      children:
        web:
          hosts:
            web-1: {ansible_host: 192.0.2.10, ansible_port: 2222, ansible_user: debian, env: prod}
            web-2: {ansible_host: 192.0.2.11, db_password: hunter2}
    db:
      hosts:
        db-1: {ansible_host: 192.0.2.20}
`)
	tree := filepath.Join(dir, "tree")
	write(t, tree, "hosts", "[web]\nweb-1\nweb-2\n[db]\ndb-1\n[prod:children]\nweb\n")
	write(t, tree, "host_vars/web-1.yml", "ansible_host: 192.0.2.10\nansible_port: 2222\nansible_user: debian\n")
	write(t, tree, "host_vars/web-2.yml", "ansible_host: 192.0.2.11\ndb_password: hunter2\n")
	write(t, tree, "host_vars/db-1.yml", "ansible_host: 192.0.2.20\n")
	write(t, tree, "group_vars/prod.yml", "env: prod\n")
	// In the tree, env comes from group_vars/prod, so web-2 has it too.
	for _, tc := range []struct {
		name, path string
		web2Env    bool
	}{{"ini", ini, false}, {"yaml", yml, false}, {"directory with group_vars and host_vars", tree, true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			list, err := detect(t, tc.path)
			if err != nil {
				t.Fatal(err)
			}
			got := byHandle(list)
			if len(got) != 3 {
				t.Fatalf("servers %v", list)
			}
			w1 := got["web-1"]
			if w1.Address != "192.0.2.10" || w1.SSHPort != 2222 || w1.SSHUser != "debian" {
				t.Errorf("web-1 connection: %+v", w1)
			}
			want := map[string]string{"group:web": "", "group:prod": "", "env": "prod"}
			if !maps.Equal(w1.Labels, want) {
				t.Errorf("web-1 labels %v, want %v", w1.Labels, want)
			}
			w2 := got["web-2"]
			if _, ok := w2.Labels["db_password"]; ok {
				t.Error("a secret-looking variable became a label")
			}
			if _, ok := w2.Labels["env"]; ok != tc.web2Env {
				t.Errorf("web-2 labels %v", w2.Labels)
			}
			if d := got["db-1"]; d.Address != "192.0.2.20" || d.SSHPort != 0 || !maps.Equal(d.Labels, map[string]string{"group:db": ""}) {
				t.Errorf("db-1: %+v", d)
			}
		})
	}
}

func TestBrokenInventoryFails(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, path := range map[string]string{
		"missing":    filepath.Join(dir, "nope.ini"),
		"unparsable": write(t, dir, "bad.yml", "all:\n  hosts: [this is: not: valid\n"),
		"bad port":   write(t, dir, "port.ini", "a ansible_port=http\n"),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			list, err := detect(t, path)
			if err == nil {
				t.Fatalf("no error; listed %v", list)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Error("secret in error")
			}
		})
	}
}

// TestProjectsVariable: autoprov_projects, on a host or on a group, says
// which projects own a server; a host without it says nothing (nil: an
// operator sets the owners). It never becomes a label.
func TestProjectsVariable(t *testing.T) {
	t.Parallel()
	const a, b = "aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000002"
	dir := t.TempDir()
	path := write(t, dir, "hosts.yml", `
all:
  hosts:
    free-1: {ansible_host: 192.0.2.30}
    none-1: {ansible_host: 192.0.2.31, autoprov_projects: ""}
  children:
    tenant_b:
      vars: {autoprov_projects: [`+b+`]}
      hosts:
        b-1: {ansible_host: 192.0.2.32}
        ab-1: {ansible_host: 192.0.2.33, autoprov_projects: "`+strings.ToUpper(b)+`, `+a+`"}
`)
	list, err := detect(t, path)
	if err != nil {
		t.Fatal(err)
	}
	got := byHandle(list)
	for _, tt := range []struct {
		host string
		want []string // nil: the inventory says nothing
	}{
		{"free-1", nil},
		{"none-1", []string{}},
		{"b-1", []string{b}},
		{"ab-1", []string{a, b}},
	} {
		d := got[tt.host]
		if (d.Projects == nil) != (tt.want == nil) || strings.Join(d.Projects, ",") != strings.Join(tt.want, ",") {
			t.Errorf("%s: projects %#v, want %#v", tt.host, d.Projects, tt.want)
		}
		if _, ok := d.Labels[ProjectsVar]; ok {
			t.Errorf("%s: %s became a label", tt.host, ProjectsVar)
		}
	}
	bad := write(t, dir, "bad.yml", "all:\n  hosts:\n    x-1: {ansible_host: 192.0.2.40, autoprov_projects: tenant-b}\n")
	if _, err := detect(t, bad); err == nil || !strings.Contains(err.Error(), ProjectsVar) {
		t.Fatalf("a bad project id: %v, want an error naming %s", err, ProjectsVar)
	}
}
