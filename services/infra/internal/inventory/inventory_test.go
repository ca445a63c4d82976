package inventory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sources"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sources/sourcestest"
)

// newResolver is a resolver whose guard lets loopback through (the test
// servers are there) unless strict.
func newResolver(t *testing.T, cfg Config, strict bool) *Resolver {
	t.Helper()
	special := authz.SpecialConfig{AllowNetworks: []string{"127.0.0.0/8"}}
	if strict {
		special = authz.SpecialConfig{}
	}
	guard, err := authz.NewGuard(special, authz.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cache, err := sources.NewCache(sources.Config{CacheDir: filepath.Join(t.TempDir(), "cache"), AllowHTTP: true}, zerolog.Nop(), sources.WithGuard(guard))
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewResolver(cfg, cache, guard, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func run(t *testing.T) Run { return Run{Dir: t.TempDir()} }

func TestInline(t *testing.T) {
	r := newResolver(t, Config{}, false)
	spec := Spec{
		Kind:   KindInline,
		Hosts:  []string{"web1", "198.51.100.7", "db1"},
		Groups: map[string][]string{"web": {"web1", "198.51.100.7"}, "db": {"db1"}},
		HostVars: map[string]map[string]any{
			"web1": {"ansible_host": "198.51.100.5", "ansible_port": 2222, "ansible_user": "deploy", "motd": "{{ lookup('pipe', 'id') }}"},
			"db1":  {"ansible_host": "198.51.100.9"},
		},
	}
	file, hosts, _, err := r.Resolve(context.Background(), spec, run(t))
	if err != nil {
		t.Fatal(err)
	}
	want := []Host{
		{Name: "198.51.100.7", Address: "198.51.100.7", Port: 22, Groups: []string{"web"}},
		{Name: "db1", Address: "198.51.100.9", Port: 22, Groups: []string{"db"}},
		{Name: "web1", Address: "198.51.100.5", Port: 2222, User: "deploy", Groups: []string{"web"},
			Vars: map[string]any{"motd": "{{ lookup('pipe', 'id') }}"}},
	}
	checkHosts(t, want, hosts)
	if b, _ := os.ReadFile(file); !bytes.Contains(b, []byte(`!unsafe "{{ lookup('pipe', 'id') }}"`)) {
		t.Errorf("host vars are not !unsafe:\n%s", b)
	}
	for name, bad := range map[string]Spec{
		"no hosts":          {Kind: KindInline},
		"pattern host":      {Kind: KindInline, Hosts: []string{"web[1:3]"}},
		"group of stranger": {Kind: KindInline, Hosts: []string{"a"}, Groups: map[string][]string{"g": {"b"}}},
		"bad group":         {Kind: KindInline, Hosts: []string{"a"}, Groups: map[string][]string{"g-1": {"a"}}},
		"vars of stranger":  {Kind: KindInline, Hosts: []string{"a"}, HostVars: map[string]map[string]any{"b": {"x": 1}}},
		"unknown kind":      {Kind: "static"},
	} {
		if _, _, _, err := r.Resolve(context.Background(), bad, run(t)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

func TestHostVarsRefused(t *testing.T) {
	r := newResolver(t, Config{}, false)
	for name, vars := range map[string]map[string]any{
		"local connection": {"ansible_connection": "local"},
		"docker":           {"ansible_connection": "community.docker.docker"},
		"proxy command":    {"ansible_ssh_common_args": "-o ProxyCommand=nc 169.254.169.254 22"},
		"own key file":     {"ansible_ssh_private_key_file": "/etc/infra/id_ed25519"},
		"no host keys":     {"ansible_host_key_checking": false},
		"bad port":         {"ansible_port": 70000},
		"bad address":      {"ansible_host": "a b"},
	} {
		spec := Spec{Kind: KindInline, Hosts: []string{"h"}, HostVars: map[string]map[string]any{"h": vars}}
		if _, _, _, err := r.Resolve(context.Background(), spec, run(t)); !errors.Is(err, ErrHostVar) {
			t.Errorf("%s: err = %v, want ErrHostVar", name, err)
		}
	}
}

func TestGit(t *testing.T) {
	srv := sourcestest.NewGitServer(t, "tok")
	repo := srv.NewRepo(t, "acme/inventory.git")
	repo.Commit(t, map[string]string{
		"prod/hosts.yml":          "all:\n  children:\n    web:\n      hosts:\n        web[1:3]:\n",
		"prod/group_vars/web.yml": "ansible_user: deploy\n",
		"prod/host_vars/web2.yml": "ansible_host: 198.51.100.2\n",
		"templated/hosts.yml":     "all:\n  hosts:\n    h:\n      ansible_host: \"{{ lookup('env', 'X') }}\"\n",
		"script/hosts.sh":         "#!/bin/sh\necho '{\"all\": {\"hosts\": [\"evil\"]}}'\n",
		"plugin/gen.yml":          "plugin: ansible.builtin.generator\nhosts:\n  name: \"gen_{{ n }}\"\nlayers:\n  n: [a, b]\n",
	})
	if err := os.Chmod(filepath.Join(repo.Dir, "script/hosts.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	repo.Commit(t, nil)
	r := newResolver(t, Config{}, false)
	spec := Spec{Kind: KindGit, Repo: sources.Repo{URL: repo.URL, Ref: "main", Token: "tok"}, Path: "prod/hosts.yml"}
	_, hosts, _, err := r.Resolve(context.Background(), spec, run(t))
	if err != nil {
		t.Fatal(err)
	}
	want := []Host{
		{Name: "web1", Address: "web1", Port: 22, User: "deploy", Groups: []string{"web"}},
		{Name: "web2", Address: "198.51.100.2", Port: 22, User: "deploy", Groups: []string{"web"}},
		{Name: "web3", Address: "web3", Port: 22, User: "deploy", Groups: []string{"web"}},
	}
	checkHosts(t, want, hosts)
	cases := []struct {
		path string
		want error
	}{
		{"../../etc/hosts", sources.ErrPath},
		{"/etc/hosts", sources.ErrPath},
		{"missing.yml", ErrInvalid},
		{"templated/hosts.yml", ErrHostVar},
		{"script/hosts.sh", ErrInvalid}, // no script runs
		{"plugin/gen.yml", ErrInvalid},  // no plugin but the request's
	}
	for _, c := range cases {
		s := spec
		s.Path = c.path
		if _, _, _, err := r.Resolve(context.Background(), s, run(t)); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.path, err, c.want)
		}
	}
	small := newResolver(t, Config{MaxHosts: 2}, false)
	if _, _, _, err := small.Resolve(context.Background(), spec, run(t)); !errors.Is(err, ErrTooManyHosts) {
		t.Errorf("three hosts from a range, limit 2: err = %v", err)
	}
}

// inventoryServer serves body with contentType to requests carrying the
// credential header, and counts the connections it accepted.
type inventoryServer struct {
	url      string
	accepted atomic.Int32
}

func serveInventory(t *testing.T, handler http.HandlerFunc) *inventoryServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &inventoryServer{url: "http://" + l.Addr().String()}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second,
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				s.accepted.Add(1)
			}
		}}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return s
}

func TestURL(t *testing.T) {
	const secret = "Bearer cmdb-secret-41"
	bodies := map[string]struct{ ctype, body string }{
		"/yaml": {"application/yaml", "all:\n  hosts:\n    a1:\n      ansible_host: 198.51.100.11\n"},
		"/json": {"application/json", `{"all": {"hosts": {"a1": {"ansible_host": "198.51.100.11"}}}}`},
		"/ini":  {"text/plain", "[web]\na1 ansible_host=198.51.100.11\n"},
		"/big":  {"application/yaml", "all:\n  hosts:\n" + strings.Repeat("    # padding padding padding\n", 2000)},
		"/move": {"", ""},
	}
	srv := serveInventory(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != secret {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		if r.URL.Path == "/move" {
			http.Redirect(w, r, "/yaml", http.StatusFound) // followed, it would succeed
			return
		}
		b, ok := bodies[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", b.ctype)
		fmt.Fprint(w, b.body)
	})
	r := newResolver(t, Config{MaxBytes: 32 << 10}, false)
	for _, c := range []struct{ path, format string }{{"/yaml", ""}, {"/json", ""}, {"/ini", "ini"}, {"/json", "json"}, {"/yaml", "yaml"}} {
		spec := Spec{Kind: KindURL, URL: srv.url + c.path, Format: c.format, Header: "Authorization", HeaderValue: secret}
		rd := run(t)
		_, hosts, _, err := r.Resolve(context.Background(), spec, rd)
		if err != nil {
			t.Errorf("%s (format %q): %v", c.path, c.format, err)
			continue
		}
		if len(hosts) != 1 || hosts[0].Name != "a1" || hosts[0].Address != "198.51.100.11" {
			t.Errorf("%s: hosts = %+v", c.path, hosts)
		}
		scan(t, rd.Dir, "cmdb-secret-41")
	}
	for _, c := range []struct {
		path, header string
		want         error
	}{
		{"/big", secret, ErrTooLarge},
		{"/nope", secret, ErrFetch},
		{"/yaml", "Bearer wrong", ErrFetch},
		{"/move", secret, ErrFetch},
	} {
		spec := Spec{Kind: KindURL, URL: srv.url + c.path, Header: "Authorization", HeaderValue: c.header}
		if _, _, _, err := r.Resolve(context.Background(), spec, run(t)); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.path, err, c.want)
		}
	}
}

// TestURLSpecialAddressRefused: with the operator's default policy a URL at
// loopback or this host is refused before connect(2): the server on
// loopback never sees a connection. (Every address here stays on this
// machine even if the guard broke; pkg/authz tests the other classes.)
func TestURLSpecialAddressRefused(t *testing.T) {
	srv := serveInventory(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "all:\n  hosts:\n    a1:\n")
	})
	port := srv.url[strings.LastIndex(srv.url, ":")+1:]
	strict := newResolver(t, Config{}, true)
	for _, u := range []string{srv.url + "/inv", "http://localhost:" + port + "/inv", "http://[::1]:" + port + "/inv", "http://0.0.0.0:" + port + "/inv"} {
		_, _, _, err := strict.Resolve(context.Background(), Spec{Kind: KindURL, URL: u}, run(t))
		if !errors.Is(err, authz.ErrDenied) {
			t.Errorf("%s: err = %v, want authz.ErrDenied", u, err)
		}
	}
	if n := srv.accepted.Load(); n != 0 {
		t.Fatalf("the refused fetches opened %d connections", n)
	}
	// The same URL with loopback allowed connects: the count above is real.
	if _, _, _, err := newResolver(t, Config{}, false).Resolve(context.Background(), Spec{Kind: KindURL, URL: srv.url + "/inv"}, run(t)); err != nil {
		t.Fatal(err)
	}
	if srv.accepted.Load() == 0 {
		t.Fatal("an allowed fetch was not counted")
	}
}

// staticPlugin is an inventory plugin that adds the hosts of its
// configuration, and insists on its cloud credential in the environment.
const staticPlugin = `from __future__ import annotations
import os
from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin

DOCUMENTATION = r'''
name: static
short_description: hosts from its configuration file
description: hosts from its configuration file, for tests
options:
  plugin:
    description: this plugin
    required: true
    choices: ['acme.cloud.static']
  hosts:
    description: hosts, each with name, address, port and user
    type: list
    elements: dict
    default: []
'''


class InventoryModule(BaseInventoryPlugin):
    NAME = 'acme.cloud.static'

    def verify_file(self, path):
        return super().verify_file(path) and path.endswith(('static.yml', 'static.yaml'))

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        if not os.environ.get('ACME_CLOUD_TOKEN', '').startswith('cloud-'):
            raise AnsibleParserError('acme cloud: no credential')
        self.inventory.add_group('cloud')
        for h in self.get_option('hosts'):
            self.inventory.add_host(h['name'], group='cloud')
            self.inventory.set_variable(h['name'], 'ansible_host', h['address'])
            self.inventory.set_variable(h['name'], 'ansible_port', h['port'])
            self.inventory.set_variable(h['name'], 'ansible_user', h['user'])
            for k, v in h.get('vars', {}).items():
                self.inventory.set_variable(h['name'], k, v)
`

func TestDynamic(t *testing.T) {
	hub := sourcestest.NewGalaxyServer(t, "")
	hub.Add(t, sourcestest.BuildCollection(t, "acme", "cloud", "1.0.0", map[string]string{"plugins/inventory/static.py": staticPlugin}))
	g, err := sources.NewGalaxy(sources.GalaxyConfig{Servers: []string{"hub=" + hub.URL}, AllowHTTP: true}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	rd := run(t)
	inst, err := g.InstallCollection(context.Background(), rd.Dir, "", "acme.cloud", "", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	rd.CollectionsPath = inst.CollectionsPath
	spec := Spec{
		Kind:   KindDynamic,
		Plugin: "acme.cloud.static",
		PluginConfig: map[string]any{"hosts": []any{
			map[string]any{"name": "vm1", "address": "198.51.100.21", "port": 22, "user": "admin",
				"vars": map[string]any{"role": "web", "motd": "{{ not templated }}", "tags": []any{"a", "b"}}},
			map[string]any{"name": "vm2", "address": "198.51.100.22", "port": 2200, "user": "admin"},
		}},
		Env: map[string]string{"ACME_CLOUD_TOKEN": "cloud-secret-77"},
	}
	_, hosts, _, err := newResolver(t, Config{}, false).Resolve(context.Background(), spec, rd)
	if err != nil {
		t.Fatal(err)
	}
	want := []Host{
		// The host's own variables come with it, connection ones read
		// into the fields, a template as plain data.
		{Name: "vm1", Address: "198.51.100.21", Port: 22, User: "admin", Groups: []string{"cloud"},
			Vars: map[string]any{"role": "web", "motd": "{{ not templated }}", "tags": []any{"a", "b"}}},
		{Name: "vm2", Address: "198.51.100.22", Port: 2200, User: "admin", Groups: []string{"cloud"}},
	}
	checkHosts(t, want, hosts)
	scan(t, rd.Dir, "cloud-secret-77")

	// Without the credential the plugin fails, and so does Resolve.
	rd2 := Run{Dir: t.TempDir(), CollectionsPath: inst.CollectionsPath}
	spec.Env = nil
	if _, _, _, err := newResolver(t, Config{}, false).Resolve(context.Background(), spec, rd2); !errors.Is(err, ErrInvalid) {
		t.Errorf("without the credential: err = %v", err)
	}
	for _, bad := range []map[string]string{{"LD_PRELOAD": "/x.so"}, {"ANSIBLE_INVENTORY_ENABLED": "script"}, {"PATH": "/tmp"}, {"lower": "x"}} {
		spec.Env = bad
		if _, _, _, err := newResolver(t, Config{}, false).Resolve(context.Background(), spec, Run{Dir: t.TempDir()}); !errors.Is(err, ErrInvalid) {
			t.Errorf("env %v: err = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestHostLimit(t *testing.T) {
	r := newResolver(t, Config{MaxHosts: 2}, false)
	spec := Spec{Kind: KindInline, Hosts: []string{"a", "b", "c"}}
	if _, _, _, err := r.Resolve(context.Background(), spec, run(t)); !errors.Is(err, ErrTooManyHosts) {
		t.Errorf("err = %v, want ErrTooManyHosts", err)
	}
	spec.Hosts = spec.Hosts[:2]
	if _, hosts, _, err := r.Resolve(context.Background(), spec, run(t)); err != nil || len(hosts) != 2 {
		t.Errorf("two hosts: %v %v", hosts, err)
	}
}

// scan fails the test when a file under root holds needle.
func scan(t *testing.T, root, needle string) {
	t.Helper()
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(needle)) {
				t.Errorf("%q found in %s", needle, p)
			}
		}
		return nil
	})
}

func checkHosts(t *testing.T, want, got []Host) {
	t.Helper()
	if !reflect.DeepEqual(want, got) {
		t.Errorf("hosts:\n got %+v\nwant %+v", got, want)
	}
}
