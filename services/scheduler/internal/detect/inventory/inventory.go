// Package inventory detects servers in static Ansible inventories: any
// format Ansible reads (INI, YAML, JSON, a directory with group_vars and
// host_vars, inventory plugins), read through `ansible-inventory --list`,
// so that what Ansible sees is what the scheduler sees.
//
// A host's groups (with their parents) become labels "group:<name>", its
// variables labels of their own (strings, numbers and booleans; lists and
// maps are left out), except connection variables (ansible_*) and
// variables whose names look secret (password, secret, token, key, ...):
// labels are not secret. ansible_host, ansible_port and ansible_user give
// the server's address, SSH port and user; autoprov_ssh_key_ref a secret
// reference of its SSH key; autoprov_projects the projects that own it (a
// list of project ids, or one string of them separated by commas or
// spaces; set on a group, it owns the group's hosts; absent: an operator
// sets the owners).
package inventory

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
)

// SSHKeyRefVar is the host variable holding a secret reference of the
// server's SSH key.
const SSHKeyRefVar = "autoprov_ssh_key_ref"

// ProjectsVar is the host (or group) variable listing the projects that
// own the server.
const ProjectsVar = "autoprov_projects"

// Detector reads one inventory source (a file or a directory).
type Detector struct {
	path string
	bin  string
}

// New returns a Detector for the inventory at path, read with the
// ansible-inventory command bin ("" for ansible-inventory on PATH).
func New(path, bin string) (*Detector, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("inventory %s: %w", path, err)
	}
	if bin == "" {
		bin = "ansible-inventory"
	}
	return &Detector{path: abs, bin: bin}, nil
}

// Name is "static:<absolute path>".
func (d *Detector) Name() string { return "static:" + d.path }

// Detect yields the servers of List.
func (d *Detector) Detect(ctx context.Context, yield func(fleet.Detected) error) error {
	servers, err := d.List(ctx)
	if err != nil {
		return err
	}
	for _, s := range servers {
		if err := yield(s); err != nil {
			return err
		}
	}
	return nil
}

// List runs ansible-inventory --list. An unreadable or unparsable
// inventory is an error (Ansible is told to fail rather than warn), never
// an empty listing.
func (d *Detector) List(ctx context.Context) ([]fleet.Detected, error) {
	if _, err := os.Stat(d.path); err != nil {
		return nil, fmt.Errorf("inventory %s: %w", d.path, err)
	}
	cmd := exec.CommandContext(ctx, d.bin, "--list", "-i", d.path)
	cmd.Dir = filepath.Dir(d.path)
	cmd.Env = append(minimalEnv(),
		// Fail instead of warning and listing nothing: an inventory that
		// cannot be read must not orphan its servers.
		"ANSIBLE_INVENTORY_UNPARSED_FAILED=True",
		"ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED=True",
		"ANSIBLE_NOCOLOR=1",
		"ANSIBLE_RETRY_FILES_ENABLED=False",
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("ansible-inventory %s: %w", d.path, ctx.Err())
		}
		return nil, fmt.Errorf("ansible-inventory %s: %w: %s", d.path, err, lastLines(stderr.String(), 5))
	}
	return Parse(stdout.Bytes())
}

// minimalEnv passes what ansible-inventory needs, nothing of the service's
// own environment (it holds secrets).
func minimalEnv() []string {
	var env []string
	for _, k := range []string{"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "ANSIBLE_CONFIG"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	if !slices.ContainsFunc(env, func(s string) bool { return strings.HasPrefix(s, "HOME=") }) {
		env = append(env, "HOME="+os.TempDir())
	}
	return env
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// secretVarRE matches variable names that may hold secrets.
var secretVarRE = regexp.MustCompile(`(?i)pass|secret|token|key|cred|private|vault`)

// Parse turns the JSON of `ansible-inventory --list` into servers, sorted
// by handle.
func Parse(data []byte) ([]fleet.Detected, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("ansible-inventory output: %w", err)
	}
	var meta struct {
		HostVars map[string]map[string]any `json:"hostvars"`
	}
	if m, ok := raw["_meta"]; ok {
		if err := json.Unmarshal(m, &meta); err != nil {
			return nil, fmt.Errorf("ansible-inventory output: _meta: %w", err)
		}
	}
	type group struct {
		Hosts    []string `json:"hosts"`
		Children []string `json:"children"`
	}
	groups := map[string]group{}
	for name, v := range raw {
		if name == "_meta" {
			continue
		}
		var g group
		if err := json.Unmarshal(v, &g); err != nil {
			return nil, fmt.Errorf("ansible-inventory output: group %s: %w", name, err)
		}
		groups[name] = g
	}
	// Each host's groups, parents included.
	hostGroups := map[string]map[string]bool{}
	var walk func(name string, chain []string)
	walk = func(name string, chain []string) {
		if slices.Contains(chain, name) {
			return // a cycle; Ansible refuses them, be safe anyway
		}
		chain = append(chain, name)
		g := groups[name]
		for _, h := range g.Hosts {
			if hostGroups[h] == nil {
				hostGroups[h] = map[string]bool{}
			}
			for _, c := range chain {
				hostGroups[h][c] = true
			}
		}
		for _, c := range g.Children {
			walk(c, chain)
		}
	}
	walk("all", nil)
	for name := range groups { // groups not reachable from all (should not happen)
		walk(name, nil)
	}
	for h := range meta.HostVars {
		if hostGroups[h] == nil {
			hostGroups[h] = map[string]bool{}
		}
	}
	var out []fleet.Detected
	for host, gs := range hostGroups {
		vars := meta.HostVars[host]
		d := fleet.Detected{Handle: host, Address: host, Labels: map[string]string{}}
		if v, ok := scalar(vars["ansible_host"]); ok && v != "" {
			d.Address = v
		}
		if v, ok := scalar(vars["ansible_port"]); ok && v != "" {
			p, err := strconv.Atoi(v)
			if err != nil || p < 1 || p > 65535 {
				return nil, fmt.Errorf("host %s: ansible_port %q is not a port", host, v)
			}
			d.SSHPort = p
		}
		if v, ok := scalar(vars["ansible_user"]); ok {
			d.SSHUser = v
		}
		if v, ok := scalar(vars[SSHKeyRefVar]); ok {
			d.SSHKeyRef = v
		}
		if v, ok := vars[ProjectsVar]; ok {
			p, err := projects(v)
			if err != nil {
				return nil, fmt.Errorf("host %s: %s: %w", host, ProjectsVar, err)
			}
			d.Projects = p
		}
		for g := range gs {
			if g != "all" && g != "ungrouped" {
				d.Labels["group:"+g] = ""
			}
		}
		for k, v := range vars {
			if strings.HasPrefix(k, "ansible_") || k == SSHKeyRefVar || k == ProjectsVar || secretVarRE.MatchString(k) {
				continue
			}
			if s, ok := scalar(v); ok {
				d.Labels[k] = s
			}
		}
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b fleet.Detected) int { return strings.Compare(a.Handle, b.Handle) })
	return out, nil
}

// projects reads autoprov_projects: a list of project ids, or a string of
// them separated by commas or spaces; null or "" is no project.
func projects(v any) ([]string, error) {
	switch x := v.(type) {
	case nil:
		return []string{}, nil
	case string:
		return fleet.ParseProjects(x)
	case []any:
		list := make([]string, 0, len(x))
		for _, e := range x {
			s, ok := e.(string)
			if !ok {
				return nil, fmt.Errorf("want project ids (strings), not %v", e)
			}
			list = append(list, s)
		}
		return fleet.CanonicalProjects(list)
	}
	return nil, fmt.Errorf("want a list of project ids or a string of them, not %T", v)
}

// scalar renders a JSON scalar as a label value.
func scalar(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case bool:
		return strconv.FormatBool(x), true
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), true
	}
	return "", false
}
