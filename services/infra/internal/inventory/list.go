package inventory

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// safePATH is the PATH of ansible-inventory.
const safePATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// maxListing bounds ansible-inventory's output.
const maxListing = 64 << 20

// list runs ansible-inventory --list on file and reads the hosts.
func (r *Resolver) list(ctx context.Context, spec Spec, run Run, file string) ([]Host, error) {
	tmp := filepath.Join(run.Dir, "inventory-tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
	}
	cfg := filepath.Join(tmp, "ansible.cfg")
	if err := os.WriteFile(cfg, []byte("# settings come from the environment\n"), 0o600); err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
	}
	env := []string{
		"PATH=" + safePATH,
		"HOME=" + run.Dir,
		"LANG=C.UTF-8", "LC_ALL=C.UTF-8",
		"TMPDIR=" + tmp,
		"ANSIBLE_CONFIG=" + cfg,
		"ANSIBLE_LOCAL_TEMP=" + tmp,
		"ANSIBLE_INVENTORY_ENABLED=" + Enabled(spec, file),
		"ANSIBLE_INVENTORY_UNPARSED_FAILED=True",
		"ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED=True",
		"ANSIBLE_NOCOLOR=1",
		"PYTHONDONTWRITEBYTECODE=1",
	}
	if run.CollectionsPath != "" {
		env = append(env, "ANSIBLE_COLLECTIONS_PATH="+run.CollectionsPath)
	}
	if spec.Kind == KindDynamic {
		for name, v := range spec.Env {
			env = append(env, name+"="+v)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	var cmd *exec.Cmd
	if run.Sandbox != nil {
		bin, err := exec.LookPath("ansible-inventory")
		if err != nil {
			return nil, fmt.Errorf("inventory: %w", err)
		}
		c, done, err := run.Sandbox.JobCommand(ctx, run.Dir, []string{bin, "-i", file, "--list"}, env)
		if err != nil {
			return nil, fmt.Errorf("inventory: %w", err)
		}
		defer done()
		cmd = c
	} else {
		cmd = exec.CommandContext(ctx, "ansible-inventory", "-i", file, "--list")
		cmd.Env = env
		cmd.Dir = run.Dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	}
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &capped{b: &stdout, n: maxListing}
	cmd.Stderr = &capped{b: &stderr, n: 4096}
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("ansible-inventory: %w", ctx.Err())
		}
		msg := strings.TrimSpace(stderr.String())
		for _, v := range spec.Env {
			if v != "" {
				msg = strings.ReplaceAll(msg, v, "***")
			}
		}
		return nil, fmt.Errorf("%w: ansible-inventory: %v: %s", ErrInvalid, err, msg)
	}
	if stdout.Len() >= maxListing {
		return nil, fmt.Errorf("%w: listing over %d bytes", ErrTooLarge, maxListing)
	}
	return r.hosts(stdout.Bytes())
}

// listing is ansible-inventory --list's output: groups by name with their
// hosts and children, and _meta.hostvars (group variables merged in).
type listing map[string]json.RawMessage

type group struct {
	Hosts    []string `json:"hosts"`
	Children []string `json:"children"`
}

// hosts reads the listing into Hosts, refusing what cannot be authorized.
func (r *Resolver) hosts(out []byte) ([]Host, error) {
	var l listing
	if err := json.Unmarshal(out, &l); err != nil {
		return nil, fmt.Errorf("%w: ansible-inventory output: %v", ErrInvalid, err)
	}
	var meta struct {
		HostVars map[string]map[string]any `json:"hostvars"`
	}
	if raw, ok := l["_meta"]; ok {
		if err := json.Unmarshal(raw, &meta); err != nil {
			return nil, fmt.Errorf("%w: ansible-inventory _meta: %v", ErrInvalid, err)
		}
	}
	groups := map[string]group{}
	for name, raw := range l {
		if name == "_meta" {
			continue
		}
		var g group
		if err := json.Unmarshal(raw, &g); err != nil {
			return nil, fmt.Errorf("%w: ansible-inventory group %s: %v", ErrInvalid, name, err)
		}
		groups[name] = g
	}
	// Each host's groups: the groups that hold it, and their parents.
	member := map[string]map[string]bool{}
	var walk func(g string, seen map[string]bool) []string
	walk = func(g string, seen map[string]bool) []string {
		if seen[g] {
			return nil
		}
		seen[g] = true
		hs := append([]string(nil), groups[g].Hosts...)
		for _, c := range groups[g].Children {
			hs = append(hs, walk(c, seen)...)
		}
		return hs
	}
	for name := range groups {
		for _, h := range walk(name, map[string]bool{}) {
			if member[h] == nil {
				member[h] = map[string]bool{}
			}
			if name != "all" && name != "ungrouped" {
				member[h][name] = true
			}
		}
	}
	for h := range meta.HostVars {
		if member[h] == nil {
			member[h] = map[string]bool{}
		}
	}
	if len(member) == 0 {
		return nil, fmt.Errorf("%w: no hosts", ErrInvalid)
	}
	if len(member) > r.cfg.MaxHosts {
		return nil, fmt.Errorf("%w: %d hosts, at most %d", ErrTooManyHosts, len(member), r.cfg.MaxHosts)
	}
	hosts := make([]Host, 0, len(member))
	for name, gs := range member {
		h, err := connection(name, meta.HostVars[name])
		if err != nil {
			return nil, err
		}
		h.Groups = sortedKeys(gs)
		hosts = append(hosts, h)
	}
	sort.Slice(hosts, func(i, j int) bool { return hosts[i].Name < hosts[j].Name })
	return hosts, nil
}

// refusedVars are host variables that would make a connection other than
// the one Host describes (a proxy, another ssh, other keys, no host key
// check).
var refusedVars = []string{
	"ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_ssh_args",
	"ansible_sftp_extra_args", "ansible_scp_extra_args", "ansible_ssh_executable",
	"ansible_ssh_private_key_file", "ansible_private_key_file",
	"ansible_host_key_checking", "ansible_ssh_host_key_checking",
	"ansible_ssh_control_path", "ansible_control_path", "ansible_control_path_dir", "ansible_ssh_control_path_dir",
	"ansible_paramiko_proxy_command", "ansible_ssh_proxy_command",
}

// readVars are the variables connection reads into a Host's fields.
var readVars = []string{"ansible_host", "ansible_ssh_host", "ansible_port", "ansible_ssh_port",
	"ansible_user", "ansible_ssh_user", "ansible_connection"}

// plain is v with ansible-inventory's {"__ansible_unsafe": s} wrappers
// replaced by s, at any depth.
func plain(v any) any {
	switch t := v.(type) {
	case map[string]any:
		if u, ok := t["__ansible_unsafe"].(string); ok && len(t) == 1 {
			return u
		}
		m := make(map[string]any, len(t))
		for k, e := range t {
			m[k] = plain(e)
		}
		return m
	case []any:
		l := make([]any, len(t))
		for i, e := range t {
			l[i] = plain(e)
		}
		return l
	}
	return v
}

// connection reads where host name would be connected to.
func connection(name string, vars map[string]any) (Host, error) {
	refuse := func(why string) (Host, error) {
		return Host{}, fmt.Errorf("%w: host %s: %s", ErrHostVar, name, why)
	}
	for _, k := range refusedVars {
		if _, ok := vars[k]; ok {
			return refuse(k + " is set by the service, not the inventory")
		}
	}
	if c, ok := vars["ansible_connection"]; ok {
		if m, ok := c.(map[string]any); ok && len(m) == 1 {
			if u, ok := m["__ansible_unsafe"].(string); ok {
				c = u
			}
		}
		switch fmt.Sprint(c) {
		case "ssh", "ansible.builtin.ssh", "smart":
		default:
			return refuse(fmt.Sprintf("ansible_connection %v (only ssh)", c))
		}
	}
	h := Host{Name: name, Address: name, Port: 22}
	str := func(keys ...string) (string, bool, error) {
		for _, k := range keys {
			v, ok := vars[k]
			if !ok || v == nil {
				continue
			}
			// ansible-inventory writes !unsafe strings as {"__ansible_unsafe": s}.
			if m, ok := v.(map[string]any); ok && len(m) == 1 {
				if u, ok := m["__ansible_unsafe"].(string); ok {
					v = u
				}
			}
			switch v.(type) {
			case string, float64, bool:
			default:
				return "", false, fmt.Errorf("%w: host %s: %s is not a plain value", ErrHostVar, name, k)
			}
			s := fmt.Sprint(v)
			if strings.Contains(s, "{{") || strings.Contains(s, "{%") || strings.Contains(s, "{#") {
				return "", false, fmt.Errorf("%w: host %s: %s is a template", ErrHostVar, name, k)
			}
			return s, true, nil
		}
		return "", false, nil
	}
	if s, ok, err := str("ansible_host", "ansible_ssh_host"); err != nil {
		return Host{}, err
	} else if ok {
		h.Address = s
	}
	if s, ok, err := str("ansible_port", "ansible_ssh_port"); err != nil {
		return Host{}, err
	} else if ok {
		p, err := strconv.Atoi(s)
		if err != nil || p < 1 || p > 65535 {
			return refuse(fmt.Sprintf("ansible_port %q", s))
		}
		h.Port = p
	}
	if s, ok, err := str("ansible_user", "ansible_ssh_user"); err != nil {
		return Host{}, err
	} else if ok {
		h.User = s
	}
	for k, v := range vars {
		if !slices.Contains(readVars, k) {
			if h.Vars == nil {
				h.Vars = map[string]any{}
			}
			h.Vars[k] = plain(v)
		}
	}
	if h.Address == "" || len(h.Address) > 253 || strings.ContainsAny(h.Address, " \t\r\n\x00{}[]%,/\\") {
		return refuse("ansible_host " + strconv.Quote(h.Address))
	}
	return h, nil
}

// capped keeps the first n bytes written and one more, so that a caller
// sees the output was longer.
type capped struct {
	b *bytes.Buffer
	n int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.n - c.b.Len(); room > 0 {
		c.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// quote is s as a JSON string, which YAML reads as a double-quoted scalar.
func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// jsonMarshal is JSON text (which YAML reads) with a final newline.
func jsonMarshal(v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
