// Package sources brings the playbooks, roles and collections a job runs
// into the job's private run directory.
//
// A Cache keeps one bare clone per repository under its directory: cloned
// on first use, fetched on reuse, each guarded by a lock (flock on a lock
// file) that serialises concurrent jobs of this process and of other
// replicas on the host. Checkout writes the files of one commit into a
// directory of the caller and returns the commit's id. Git runs with a
// fixed environment: no system or global configuration, no hooks, only
// the https (and, when allowed, http) protocol, no redirects, and the
// token, when there is one, only in an environment variable as an HTTP
// header: never on a command line, in the cache's or the checkout's
// configuration, or in a file.
//
// SafePath keeps every path a request names inside its checkout,
// RolePlay and CollectionRolePlay write the play that runs a role, and
// Galaxy installs requirements from the operator's Galaxy servers only.
package sources

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
)

// Errors callers inspect with errors.Is; each is wrapped with its context.
var (
	// ErrURL is a repository URL this cache may not fetch (scheme,
	// credentials in the URL, not absolute).
	ErrURL = errors.New("repository URL not allowed")
	// ErrRef is a branch, tag or commit the repository does not have.
	ErrRef = errors.New("reference not found")
	// ErrTooLarge is a repository or checkout over its size limit.
	ErrTooLarge = errors.New("over the size limit")
	// ErrFetch is a clone or fetch that failed (network, authentication,
	// timeout); its text holds git's message with the token masked.
	ErrFetch = errors.New("fetch failed")
	// ErrPath is a path that leaves its root (.., absolute, symlink out).
	ErrPath = errors.New("path leaves the checkout")
)

// Config is the operator's settings of sources (environment variables
// with infra's prefix; desc is the --help line). The zero value of a
// field means its default.
type Config struct {
	CacheDir      string        `env:"CACHE_DIR" desc:"directory of the cache of bare clones of Ansible jobs' repositories (default: autoprov-sources next to PLAYBOOK_RUN_ROOT)"`
	CacheMaxBytes int64         `env:"CACHE_MAX_BYTES" envDefault:"4294967296" desc:"size of the cache of bare clones past which the least recently used repositories are removed"`
	RepoMaxBytes  int64         `env:"REPO_MAX_BYTES" envDefault:"1073741824" desc:"largest bare clone of one repository; a clone or fetch past it fails"`
	CheckoutMax   int64         `env:"CHECKOUT_MAX_BYTES" envDefault:"1073741824" desc:"largest checkout of one commit (its files added up)"`
	Timeout       time.Duration `env:"TIMEOUT" envDefault:"5m" desc:"time limit of one clone or fetch and its checkout, lock wait excluded"`
	LockTimeout   time.Duration `env:"LOCK_TIMEOUT" envDefault:"10m" desc:"longest wait for the lock of a repository another job or replica holds"`
	// AllowHTTP lets plain http:// repositories (and Galaxy servers)
	// through: for tests and development on loopback only.
	AllowHTTP bool `env:"ALLOW_HTTP" desc:"allow plain http:// repository URLs (development only)"`
	// AllowNetworks lets repositories (and URL inventories) at these
	// special addresses through, on top of SPECIAL_ALLOW_NETWORKS: a git
	// server on this host, without letting deploy targets there too.
	AllowNetworks []string `env:"ALLOW_NETWORKS" envSeparator:"," desc:"networks (CIDR) of special addresses (this host's own, loopback, ...) where job repositories and URL inventories may be, on top of SPECIAL_ALLOW_NETWORKS, which targets use; cloud metadata never (empty by default)"`
}

// Repo names one repository at one reference.
type Repo struct {
	// URL is an https:// URL (http:// only with Config.AllowHTTP), with no
	// credentials in it.
	URL string
	// Ref is a branch, a tag or a commit id (full or at least 7 hex
	// digits); empty means the repository's default branch.
	Ref string
	// Token, when set, is sent as HTTP basic authentication
	// (x-access-token:<token>, as GitHub, GitLab and Gitea accept it),
	// through the environment of git only.
	Token string
}

// Cache is the cache of bare clones. It is safe for concurrent use, and
// several processes may share its directory.
type Cache struct {
	cfg    Config
	log    zerolog.Logger
	guard  *authz.Guard
	lookup func(ctx context.Context, network, host string) ([]netip.Addr, error)
	// onExec, when set (tests), sees every git command line.
	onExec func(argv []string)
}

// Option configures NewCache.
type Option func(*Cache)

// WithGuard makes every fetch check the repository's addresses with
// guard first (loopback, link-local, cloud metadata, this host's own
// ... are refused with an error wrapping authz.ErrDenied, before git
// runs) and pins git's connection to the addresses checked
// (http.curloptResolve), so that a second name resolution cannot lead it
// elsewhere.
func WithGuard(guard *authz.Guard) Option { return func(c *Cache) { c.guard = guard } }
