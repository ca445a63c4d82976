package cli

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
)

// sshKeyRefVar is the host variable the scheduler reads a server's SSH key
// reference from (services/scheduler/internal/detect/inventory); infra
// resolves it when it runs a play on the server.
const sshKeyRefVar = "autoprov_ssh_key_ref"

// inventoryRefs reads the hosts' SSH key references from the output of
// `ansible-inventory --list` of the inventory at path: one SecretRef per
// place a reference is written (file:line, found in the inventory's
// files) with the hosts that get it, and one with an empty Ref for the
// hosts without one (infra uses SSH_KEY_REF for them).
func inventoryRefs(path string, listing []byte) ([]service.SecretRef, error) {
	names, hostVars, err := inventoryHosts(path, listing)
	if err != nil {
		return nil, err
	}
	type place struct{ loc, ref string }
	byPlace := map[place][]string{}
	var order []place
	files := newInventoryFiles(path)
	for _, h := range names {
		ref, _ := hostVars[h][sshKeyRefVar].(string)
		p := place{loc: path, ref: ref}
		if ref != "" {
			p.loc = cmp.Or(files.locate(h, ref), path)
		}
		if _, seen := byPlace[p]; !seen {
			order = append(order, p)
		}
		byPlace[p] = append(byPlace[p], h)
	}
	out := make([]service.SecretRef, 0, len(order))
	for _, p := range order {
		src := "inventory " + p.loc + " " + hostList(byPlace[p])
		if p.ref == "" {
			src += " (no " + sshKeyRefVar + ": SSH_KEY_REF)"
		}
		out = append(out, service.SecretRef{Source: src, Ref: p.ref})
	}
	return out, nil
}

// inventoryHosts reads the output of `ansible-inventory --list` of the
// inventory at path: its hosts' names, sorted, and their variables.
func inventoryHosts(path string, listing []byte) ([]string, map[string]map[string]any, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(listing, &raw); err != nil {
		return nil, nil, fmt.Errorf("%s: ansible-inventory output: %w", path, err)
	}
	var meta struct {
		HostVars map[string]map[string]any `json:"hostvars"`
	}
	if m, ok := raw["_meta"]; ok {
		if err := json.Unmarshal(m, &meta); err != nil {
			return nil, nil, fmt.Errorf("%s: ansible-inventory output: _meta: %w", path, err)
		}
	}
	hosts := map[string]bool{}
	for h := range meta.HostVars {
		hosts[h] = true
	}
	for name, v := range raw {
		var g struct {
			Hosts []string `json:"hosts"`
		}
		if name != "_meta" && json.Unmarshal(v, &g) == nil {
			for _, h := range g.Hosts {
				hosts[h] = true
			}
		}
	}
	names := make([]string, 0, len(hosts))
	for h := range hosts {
		names = append(names, h)
	}
	sort.Strings(names)
	return names, meta.HostVars, nil
}

// inventoryAddressProblems lists the hosts of an inventory the scheduler
// would refuse for their address (ansible_host, else the host's name): one
// the store does not accept, or a special one (loopback, metadata,
// link-local, ...: authz.Guard, with the scheduler's
// SPECIAL_ALLOW_NETWORKS). The scheduler skips them and registers the rest.
func inventoryAddressProblems(path string, listing []byte, guard *authz.Guard) ([]string, error) {
	names, hostVars, err := inventoryHosts(path, listing)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, h := range names {
		addr := h
		if v, ok := hostVars[h]["ansible_host"].(string); ok && v != "" {
			addr = v
		}
		c, err := store.CanonicalAddress(addr)
		if err != nil {
			out = append(out, fmt.Sprintf("host %s: address %q refused: %v (the scheduler skips it)", h, addr, err))
			continue
		}
		var ae *authz.AddressError
		if errors.As(guard.Check(c), &ae) {
			out = append(out, fmt.Sprintf("host %s: address %s refused (%s): %s (the scheduler skips it; SPECIAL_ALLOW_NETWORKS lets test targets through)",
				h, addr, ae.Class, ae.Reason))
		}
	}
	return out, nil
}

// hostList names hosts: "host a", "hosts a, b, c", at most five by name.
func hostList(hosts []string) string {
	if len(hosts) == 1 {
		return "host " + hosts[0]
	}
	const most = 5
	if len(hosts) > most {
		return fmt.Sprintf("hosts %s and %d more", strings.Join(hosts[:most], ", "), len(hosts)-most)
	}
	return "hosts " + strings.Join(hosts, ", ")
}

// inventoryFiles finds where in an inventory (a file, or a directory with
// group_vars and host_vars) a reference is written.
type inventoryFiles struct {
	files []string
	lines map[string][]string
}

func newInventoryFiles(path string) *inventoryFiles {
	f := &inventoryFiles{lines: map[string][]string{}}
	st, err := os.Stat(path)
	if err != nil {
		return f
	}
	if !st.IsDir() {
		f.files = []string{path}
		return f
	}
	_ = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			f.files = append(f.files, p)
		}
		return nil
	})
	return f
}

// maxInventoryFile is the largest inventory file searched for a reference.
const maxInventoryFile = 4 << 20

func (f *inventoryFiles) read(p string) []string {
	if l, ok := f.lines[p]; ok {
		return l
	}
	var lines []string
	if st, err := os.Stat(p); err == nil && st.Size() <= maxInventoryFile {
		if data, err := os.ReadFile(p); err == nil {
			lines = strings.Split(string(data), "\n")
		}
	}
	f.lines[p] = lines
	return lines
}

// locate returns "file:line" of the line setting host's reference ref: the
// host's own line (INI), else the first such line after the host's name
// (YAML), else the first such line (group vars), preferring a file named
// after the host (host_vars); "" when no line matches.
func (f *inventoryFiles) locate(host, ref string) string {
	files := append([]string(nil), f.files...)
	sort.SliceStable(files, func(i, j int) bool {
		return hostFile(files[i], host) && !hostFile(files[j], host)
	})
	for _, file := range files {
		lines := f.read(file)
		hostLine := -1
		var cands []int
		for i, l := range lines {
			if hostLine < 0 && startsWithHost(l, host) {
				hostLine = i
			}
			if strings.Contains(l, sshKeyRefVar) && strings.Contains(l, ref) {
				cands = append(cands, i)
			}
		}
		if len(cands) == 0 {
			continue
		}
		pick := cands[0]
		for _, i := range cands {
			if hostLine >= 0 && i >= hostLine {
				pick = i
				break
			}
		}
		return fmt.Sprintf("%s:%d", file, pick+1)
	}
	return ""
}

// hostFile reports whether p is host's host_vars file.
func hostFile(p, host string) bool {
	base := filepath.Base(p)
	return strings.TrimSuffix(base, filepath.Ext(base)) == host || base == host
}

// startsWithHost reports whether line starts (after indentation) with the
// host name as a word: "web-1 ansible_host=..." or "web-1:".
func startsWithHost(line, host string) bool {
	rest, ok := strings.CutPrefix(strings.TrimSpace(line), host)
	return ok && (rest == "" || rest[0] == ' ' || rest[0] == '\t' || rest[0] == ':')
}
