package sources

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"
)

// ErrGalaxy is a requirement this service refuses to install: a server
// not in the allowed list, a source other than a Galaxy server (git, url,
// file, dir), or a malformed requirements file.
var ErrGalaxy = errors.New("requirement refused")

// GalaxyConfig is the operator's list of Galaxy servers (environment,
// with infra's prefix).
type GalaxyConfig struct {
	// Servers are the allowed servers as name=url, in order; the first is
	// the default of entries that name none. Names are [a-z0-9_]+.
	Servers []string      `env:"SERVERS" envSeparator:"," envDefault:"galaxy=https://galaxy.ansible.com/" desc:"allowed Galaxy servers as name=url, comma separated; the first is the default; requirements naming any other server are refused"`
	Timeout time.Duration `env:"TIMEOUT" envDefault:"5m" desc:"time limit of one ansible-galaxy install"`
	// AllowHTTP lets http:// server URLs through (tests on loopback).
	AllowHTTP bool `env:"ALLOW_HTTP" desc:"allow plain http:// Galaxy servers (development only)"`
}

// Galaxy installs collections and roles with ansible-galaxy into a run's
// own directories, from the allowed servers only. It is safe for
// concurrent use.
type Galaxy struct {
	cfg GalaxyConfig
	log zerolog.Logger
}

// NewGalaxy validates cfg.
func NewGalaxy(cfg GalaxyConfig, log zerolog.Logger) (*Galaxy, error) {
	return &Galaxy{cfg: cfg, log: log}, errors.New("not implemented")
}

// Installed are the directories a run's Ansible reads what Install put
// there from (ANSIBLE_COLLECTIONS_PATH, ANSIBLE_ROLES_PATH).
type Installed struct {
	CollectionsPath string // <runDir>/collections
	RolesPath       string // <runDir>/roles
}

// Install installs the collections and roles of the requirements file
// reqFile (a path inside the checkout, as SafePath returns) into runDir's
// own paths. Every entry must come from an allowed server: an entry's
// source (collections) or server (roles: "src" naming a Galaxy role) is
// an allowed server's name or URL, or absent (the default server); any
// other source, or type git, url, file or dir, is refused with ErrGalaxy
// before ansible-galaxy runs. tokens maps server names to their tokens
// (the job's Galaxy credentials), handed to ansible-galaxy in its
// environment only.
func (g *Galaxy) Install(ctx context.Context, runDir, reqFile string, tokens map[string]string) (Installed, error) {
	return Installed{}, errors.New("not implemented")
}

// InstallCollection installs one collection (namespace.name) at version
// (a constraint such as ">=1.0.0", or empty for the latest) from server
// (an allowed server's name or URL; empty: the default) into runDir's own
// paths, as Install does; for a collection_role source.
func (g *Galaxy) InstallCollection(ctx context.Context, runDir, collection, version, server string, tokens map[string]string) (Installed, error) {
	return Installed{}, errors.New("not implemented")
}
