// Package inventory turns a job's inventory (inline, a file in a git
// repository, a URL, an inventory plugin) into a file in the job's run
// directory, and resolves it with ansible-inventory to the hosts the job
// would connect to, so that the caller can authorize every one of them
// before any connection.
package inventory

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
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
	// network, timeout).
	ErrFetch = errors.New("inventory fetch failed")
	// ErrHostVar is a host whose connection variables cannot be
	// authorized: a template in ansible_host, ansible_port or
	// ansible_user, a connection other than ssh, or ssh arguments (a
	// ProxyCommand would connect elsewhere).
	ErrHostVar = errors.New("host variables refused")
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
	Groups   map[string][]string       // group name -> hosts (each in Hosts)
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

	// dynamic: an inventory plugin (namespace.collection.name, or a
	// built-in name) and its configuration; Env holds the cloud
	// credential as environment variables of ansible-inventory only.
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
}

// Run is where one job's inventory goes and what ansible-inventory sees.
type Run struct {
	// Dir is the job's private run directory; the inventory is written
	// in it as inventory.<ext> (or, for git, checked out under
	// Dir/inventory-src).
	Dir string
	// CollectionsPath holds the job's installed collections (inventory
	// plugins of a dynamic inventory come from there).
	CollectionsPath string
}

// Resolver resolves inventories. It is safe for concurrent use.
type Resolver struct {
	cfg    Config
	cache  *sources.Cache
	guard  *authz.Guard
	log    zerolog.Logger
	client any
}

// NewResolver validates cfg. cache serves git inventories; guard refuses
// URL inventories at special addresses (loopback, link-local, metadata,
// this host's own ...) at connect time, before any packet is sent.
func NewResolver(cfg Config, cache *sources.Cache, guard *authz.Guard, log zerolog.Logger) (*Resolver, error) {
	return &Resolver{cfg: cfg, cache: cache, guard: guard, log: log}, errors.New("not implemented")
}

// Resolve writes spec's inventory into run.Dir and lists its hosts with
// `ansible-inventory -i <file> --list`. file is the inventory to hand
// ansible-playbook (-i). Errors wrap ErrInvalid, ErrTooManyHosts,
// ErrTooLarge, ErrFetch, ErrHostVar, authz.ErrDenied (a URL at a
// refused address) or the sources errors.
func (r *Resolver) Resolve(ctx context.Context, spec Spec, run Run) (file string, hosts []Host, err error) {
	return "", nil, errors.New("not implemented")
}
