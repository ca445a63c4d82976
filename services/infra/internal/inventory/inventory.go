// Package inventory turns a job's inventory (inline, a file in a git
// repository, a URL, an inventory plugin) into a file in the job's run
// directory, and resolves it with ansible-inventory to the hosts the job
// would connect to, so that the caller can authorize every one of them
// before any connection.
//
// What ansible-inventory may run is fixed per kind: inline, git and URL
// inventories are read by the yaml and ini plugins only (no script, no
// plugin configuration hiding in a file), a dynamic inventory by the one
// plugin it names. A host whose connection cannot be known from the
// listing (a template in ansible_host, a connection other than ssh, ssh
// arguments that could proxy elsewhere) is refused.
package inventory

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sources"
)

// Kinds of inventory (Spec.Kind).
const (
	KindInline  = "inline"
	KindGit     = "git"
	KindURL     = "url"
	KindDynamic = "dynamic"
)

// Errors callers inspect with errors.Is.
var (
	// ErrInvalid is a malformed Spec or inventory (the request's fault).
	ErrInvalid = errors.New("invalid inventory")
	// ErrTooManyHosts is an inventory over Config.MaxHosts.
	ErrTooManyHosts = errors.New("too many hosts")
	// ErrTooLarge is a URL inventory over Config.MaxBytes.
	ErrTooLarge = errors.New("inventory too large")
	// ErrFetch is a URL inventory that could not be fetched (status,
	// network, timeout, redirect).
	ErrFetch = errors.New("inventory fetch failed")
	// ErrHostVar is a host whose connection variables cannot be
	// authorized: a template in ansible_host, ansible_port or
	// ansible_user, a connection other than ssh, or ssh arguments, key
	// files or host key settings of its own.
	ErrHostVar = errors.New("host variables refused")
)

// Defaults of Config's zero fields.
const (
	defaultMaxHosts = 500
	defaultMaxBytes = 4 << 20
	defaultTimeout  = 30 * time.Second
)

// Config is the operator's settings (environment, with infra's prefix).
type Config struct {
	MaxHosts int           `env:"MAX_HOSTS" envDefault:"500" desc:"most hosts one job's inventory may hold"`
	MaxBytes int64         `env:"MAX_BYTES" envDefault:"4194304" desc:"largest inventory fetched from a URL"`
	Timeout  time.Duration `env:"TIMEOUT" envDefault:"30s" desc:"time limit of fetching a URL inventory, and of ansible-inventory"`
}

// Spec is one job's inventory; Kind selects the fields that apply.
type Spec struct {
	Kind string

	// inline
	Hosts    []string                  // host names or addresses
	Groups   map[string][]string       // group name -> hosts
	HostVars map[string]map[string]any // host -> variables (rendered !unsafe)

	// git: Repo at Repo.Ref, the file at Path inside it
	Repo sources.Repo
	Path string

	// url: an http(s) URL fetched with GET; Format is yaml, ini or json
	// (empty: from the Content-Type, else yaml). Header and HeaderValue
	// are the credential's header (e.g. Authorization, "Bearer ...") the
	// caller resolved from its reference; empty means none.
	URL         string
	Format      string
	Header      string
	HeaderValue string

	// dynamic: an inventory plugin (namespace.collection.name) and its
	// configuration; Env holds the cloud credential as environment
	// variables of ansible-inventory only.
	Plugin       string
	PluginConfig map[string]any
	Env          map[string]string
}

// Host is one host the inventory resolves to, with what a connection to
// it would use.
type Host struct {
	Name    string   // inventory_hostname
	Address string   // ansible_host (or ansible_ssh_host), else Name
	Port    int      // ansible_port (or ansible_ssh_port), else 22
	User    string   // ansible_user (or ansible_ssh_user), empty if none
	Groups  []string // groups the host is in, sorted, "all" and "ungrouped" left out
	// Vars are the host's other variables as the listing has them (group
	// variables merged in), !unsafe strings as plain strings; the
	// connection variables read into the fields above are left out. The
	// caller decides which names it passes on (a dynamic inventory's
	// variables reach the play only through them).
	Vars map[string]any
}

// Run is where one job's inventory goes and what ansible-inventory sees.
type Run struct {
	// Dir is the job's private run directory; the inventory is written
	// in it as inventory.<ext> (a git inventory is checked out under
	// Dir/inventory-src).
	Dir string
	// CollectionsPath holds the job's installed collections (inventory
	// plugins of a dynamic inventory come from there); may be empty.
	CollectionsPath string
	// Sandbox runs ansible-inventory as the job's play would run (its
	// plugins are the job's code); nil: as this process.
	Sandbox Sandbox
}

// Sandbox makes a command of a job's (ansible.Runner.JobCommand).
type Sandbox interface {
	JobCommand(ctx context.Context, dir string, argv, env []string) (*exec.Cmd, func(), error)
}

// Resolver resolves inventories. It is safe for concurrent use.
type Resolver struct {
	cfg    Config
	cache  *sources.Cache
	log    zerolog.Logger
	client *http.Client
}

// NewResolver validates cfg. cache serves git inventories (nil: refused);
// guard refuses URL inventories at special addresses (loopback,
// link-local, metadata, this host's own ...) at connect time, before any
// packet is sent; it is required.
func NewResolver(cfg Config, cache *sources.Cache, guard *authz.Guard, log zerolog.Logger) (*Resolver, error) {
	if guard == nil {
		return nil, errors.New("inventory: an address guard is required")
	}
	if cfg.MaxHosts < 0 || cfg.MaxBytes < 0 || cfg.Timeout < 0 {
		return nil, errors.New("inventory: limits must not be negative")
	}
	if cfg.MaxHosts == 0 {
		cfg.MaxHosts = defaultMaxHosts
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = defaultMaxBytes
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = defaultTimeout
	}
	return &Resolver{cfg: cfg, cache: cache, log: log, client: guardedClient(guard, cfg.Timeout)}, nil
}

var (
	groupRe  = pattern.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`, 128)
	varRe    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	pluginRe = regexp.MustCompile(`^[a-z0-9_]+\.[a-z0-9_]+\.[a-z0-9_]+$`)
	envRe    = pattern.MustCompile(`^[A-Z_][A-Z0-9_]*$`, 128)
)

// Resolve writes spec's inventory into run.Dir and lists its hosts with
// `ansible-inventory -i <file> --list`. file is the inventory to hand
// ansible-playbook (-i), with ANSIBLE_INVENTORY_ENABLED=Enabled(spec,
// file) as Resolve used. Errors wrap ErrInvalid, ErrTooManyHosts,
// ErrTooLarge, ErrFetch, ErrHostVar, authz.ErrDenied (a URL at a refused
// address) or the sources errors.
func (r *Resolver) Resolve(ctx context.Context, spec Spec, run Run) (file string, hosts []Host, commit string, err error) {
	if !filepath.IsAbs(run.Dir) {
		return "", nil, "", fmt.Errorf("%w: run directory must be absolute", ErrInvalid)
	}
	switch spec.Kind {
	case KindInline:
		file, err = r.inline(spec, run)
	case KindGit:
		file, commit, err = r.git(ctx, spec, run)
	case KindURL:
		file, err = r.fetch(ctx, spec, run)
	case KindDynamic:
		file, err = r.dynamic(spec, run)
	default:
		return "", nil, "", fmt.Errorf("%w: kind %q", ErrInvalid, spec.Kind)
	}
	if err != nil {
		return "", nil, "", err
	}
	hosts, err = r.list(ctx, spec, run, file)
	if err != nil {
		return "", nil, "", err
	}
	return file, hosts, commit, nil
}

// Enabled is the ANSIBLE_INVENTORY_ENABLED value for spec's file (as
// Resolve returned it): the caller runs ansible-playbook with it too, so
// that the play reads the inventory exactly as Resolve did. A dynamic
// inventory enables its plugin only; any other file one parser chosen by
// its name: yaml for .yml, .yaml and .json, ini for the rest. No script
// and no plugin configuration hiding in a file of a repository runs.
func Enabled(spec Spec, file string) string {
	if spec.Kind == KindDynamic {
		return spec.Plugin
	}
	switch strings.ToLower(filepath.Ext(file)) {
	case ".yml", ".yaml", ".json":
		return "ansible.builtin.yaml"
	}
	return "ansible.builtin.ini"
}

// inline writes hosts, groups and host variables as a YAML inventory,
// every variable !unsafe.
func (r *Resolver) inline(spec Spec, run Run) (string, error) {
	if len(spec.Hosts) == 0 {
		return "", fmt.Errorf("%w: no hosts", ErrInvalid)
	}
	if len(spec.Hosts) > r.cfg.MaxHosts {
		return "", fmt.Errorf("%w: %d hosts, at most %d", ErrTooManyHosts, len(spec.Hosts), r.cfg.MaxHosts)
	}
	known := map[string]bool{}
	for _, h := range spec.Hosts {
		if err := checkHostName(h); err != nil {
			return "", err
		}
		known[h] = true
	}
	var b strings.Builder
	b.WriteString("# Generated by autoprovisioner from an inline inventory.\nall:\n  hosts:\n")
	for _, h := range spec.Hosts {
		vars := spec.HostVars[h]
		for k := range vars {
			if !varRe.MatchString(k) {
				return "", fmt.Errorf("%w: host %s: variable name %q", ErrInvalid, h, k)
			}
		}
		v := "{}"
		if len(vars) > 0 {
			var err error
			if v, err = ansible.UnsafeYAML(vars); err != nil {
				return "", fmt.Errorf("%w: host %s: %v", ErrInvalid, h, err)
			}
		}
		fmt.Fprintf(&b, "    %s: %s\n", quote(h), v)
	}
	for h := range spec.HostVars {
		if !known[h] {
			return "", fmt.Errorf("%w: host_vars for %q, which is not in hosts", ErrInvalid, h)
		}
	}
	if len(spec.Groups) > 0 {
		b.WriteString("  children:\n")
		for _, g := range sortedKeys(spec.Groups) {
			if !groupRe.MatchString(g) || g == "all" || g == "ungrouped" {
				return "", fmt.Errorf("%w: group name %q", ErrInvalid, g)
			}
			fmt.Fprintf(&b, "    %s:\n      hosts:\n", g)
			for _, h := range spec.Groups[g] {
				if !known[h] {
					return "", fmt.Errorf("%w: group %s holds %q, which is not in hosts", ErrInvalid, g, h)
				}
				fmt.Fprintf(&b, "        %s: {}\n", quote(h))
			}
		}
	}
	return writeFile(filepath.Join(run.Dir, "inventory.yml"), []byte(b.String()))
}

// checkHostName refuses names YAML inventories would read as patterns or
// that hold template or control characters.
func checkHostName(h string) error {
	if h == "" || len(h) > 253 || strings.ContainsAny(h, "[]{}%#,\"'\\ \t\r\n\x00") {
		return fmt.Errorf("%w: host name %q", ErrInvalid, h)
	}
	return nil
}

// git checks the inventory file out of its repository and returns it
// with the commit it was checked out at.
func (r *Resolver) git(ctx context.Context, spec Spec, run Run) (file, commit string, err error) {
	if r.cache == nil {
		return "", "", fmt.Errorf("%w: git inventories are not configured", ErrInvalid)
	}
	if spec.Path == "" {
		return "", "", fmt.Errorf("%w: path is required", ErrInvalid)
	}
	dst := filepath.Join(run.Dir, "inventory-src")
	if commit, err = r.cache.Checkout(ctx, spec.Repo, dst); err != nil {
		return "", "", fmt.Errorf("inventory repository: %w", err)
	}
	if file, err = sources.SafePath(dst, spec.Path); err != nil {
		return "", "", fmt.Errorf("inventory: %w", err)
	}
	if _, err := os.Stat(file); err != nil {
		return "", "", fmt.Errorf("%w: %s is not in the repository", ErrInvalid, spec.Path)
	}
	return file, commit, nil
}

// dynamic writes the plugin's configuration file.
func (r *Resolver) dynamic(spec Spec, run Run) (string, error) {
	if !pluginRe.MatchString(spec.Plugin) {
		return "", fmt.Errorf("%w: plugin %q: want namespace.collection.name", ErrInvalid, spec.Plugin)
	}
	if _, ok := spec.PluginConfig["plugin"]; ok {
		return "", fmt.Errorf("%w: the plugin is named by plugin, not in its configuration", ErrInvalid)
	}
	for name := range spec.Env {
		if err := checkEnvName(name); err != nil {
			return "", err
		}
	}
	cfg := map[string]any{"plugin": spec.Plugin}
	for k, v := range spec.PluginConfig {
		cfg[k] = v
	}
	b, err := jsonMarshal(cfg)
	if err != nil {
		return "", fmt.Errorf("%w: plugin configuration: %v", ErrInvalid, err)
	}
	// Plugins recognise their files by name (aws_ec2 reads *.aws_ec2.yml).
	short := spec.Plugin[strings.LastIndex(spec.Plugin, ".")+1:]
	return writeFile(filepath.Join(run.Dir, "inventory."+short+".yml"), b)
}

// checkEnvName refuses credential variables that would change how the
// tools themselves run.
func checkEnvName(name string) error {
	if !envRe.MatchString(name) {
		return fmt.Errorf("%w: environment variable name %q", ErrInvalid, name)
	}
	for _, p := range []string{"ANSIBLE_", "PYTHON", "LD_", "GIT_", "SSH_"} {
		if strings.HasPrefix(name, p) {
			return fmt.Errorf("%w: environment variable %s may not be set by a credential", ErrInvalid, name)
		}
	}
	switch name {
	case "PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "SHELL", "USER", "IFS", "ENV", "BASH_ENV", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY":
		return fmt.Errorf("%w: environment variable %s may not be set by a credential", ErrInvalid, name)
	}
	return nil
}

// writeFile creates path (0600), which must not exist.
func writeFile(path string, data []byte) (string, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return "", fmt.Errorf("write inventory: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return "", fmt.Errorf("write inventory: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("write inventory: %w", err)
	}
	return path, nil
}
