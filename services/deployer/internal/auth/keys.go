// Package auth holds the deployer's API keys: how they are made, stored
// (as SHA-256 hashes only), checked on each request (with a short cache),
// limited per key (a rate shared by every replica through Redis), and
// managed from the command line (`deployer keys ...`).
package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// Scope is a permission an API key holds.
type Scope string

// The scopes. A write scope includes its read scope; admin includes all.
const (
	ScopeDeploymentsRead  Scope = "deployments:read"
	ScopeDeploymentsWrite Scope = "deployments:write"
	// ScopeJobsRead and ScopeJobsWrite read and submit Ansible jobs
	// (/api/v1/jobs) of the key's projects.
	ScopeJobsRead  Scope = "jobs:read"
	ScopeJobsWrite Scope = "jobs:write"
	// ScopeCredentialsWrite manages the credentials of the key's projects
	// (/api/v1/credentials); it grants credentials:read, which lists them.
	ScopeCredentialsWrite Scope = "credentials:write"
	ScopeCredentialsRead  Scope = "credentials:read"
	// ScopeTemplatesWrite manages the job templates of the key's projects
	// (/api/v1/templates); ScopeTemplatesLaunch launches them. Both grant
	// templates:read.
	ScopeTemplatesRead   Scope = "templates:read"
	ScopeTemplatesWrite  Scope = "templates:write"
	ScopeTemplatesLaunch Scope = "templates:launch"
	ScopeServersRead     Scope = "servers:read"
	ScopeServersWrite    Scope = "servers:write"
	ScopeAdmin           Scope = "admin"
)

// Scopes returns every scope.
func Scopes() []Scope {
	return []Scope{ScopeDeploymentsRead, ScopeDeploymentsWrite, ScopeJobsRead, ScopeJobsWrite,
		ScopeCredentialsRead, ScopeCredentialsWrite, ScopeTemplatesRead, ScopeTemplatesWrite, ScopeTemplatesLaunch,
		ScopeServersRead, ScopeServersWrite, ScopeAdmin}
}

// ParseScopes parses a comma-separated list of scopes (or a list of
// strings), rejecting unknown ones and removing duplicates.
func ParseScopes(list []string) ([]Scope, error) {
	var out []Scope
	for _, item := range list {
		for s := range strings.SplitSeq(item, ",") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			if !slices.Contains(Scopes(), Scope(s)) {
				return nil, fmt.Errorf("unknown scope %q (known: %s)", truncate(s, 40), joinScopes(Scopes()))
			}
			if !slices.Contains(out, Scope(s)) {
				out = append(out, Scope(s))
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("at least one scope is required (known: %s)", joinScopes(Scopes()))
	}
	return out, nil
}

func joinScopes(scopes []Scope) string {
	s := make([]string, len(scopes))
	for i, sc := range scopes {
		s[i] = string(sc)
	}
	return strings.Join(s, ", ")
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// NamePattern is the shape of a key's name.
const NamePattern = `^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`

var nameRE = regexp.MustCompile(NamePattern)

// ValidName reports whether name is a valid key name.
func ValidName(name string) bool { return nameRE.MatchString(name) }

// Key is a stored API key (never the key itself: only its hash is kept).
type Key struct {
	ID     string
	Name   string
	Prefix string // the key's first characters, to recognise it
	Scopes []Scope
	// RateLimit is the key's requests per second; 0 means the default.
	RateLimit int
	// Projects are the projects whose deployments the key may submit and
	// see (lower-case UUIDs); empty for a fleet-wide key.
	Projects []string
	// FleetWide keys see every project: admin keys, operator keys for the
	// servers, keys created with --fleet-wide.
	FleetWide bool
	// Legacy is set on keys made before keys were bound to projects: the
	// migration made them fleet-wide, and `deployer keys list` flags them
	// until they are narrowed.
	Legacy     bool
	CreatedAt  time.Time
	LastUsedAt time.Time // zero: never used
	RevokedAt  time.Time // zero: live
}

// Has reports whether the key grants scope: admin grants everything, and
// a write scope grants its read scope. The fleet's scopes (admin, servers)
// count only on a fleet-wide key: one bound to projects that holds them
// anyway (a row written around Binding, by hand or by an older version)
// is refused them rather than trusted with every project's servers and
// keys.
func (k *Key) Has(scope Scope) bool {
	for _, s := range k.Scopes {
		if !k.FleetWide && fleetScope(s) {
			continue
		}
		switch {
		case s == scope, s == ScopeAdmin:
			return true
		case s == ScopeTemplatesLaunch && scope == ScopeTemplatesRead:
			return true
		case strings.HasSuffix(string(scope), ":read") && string(s) == strings.TrimSuffix(string(scope), ":read")+":write":
			return true
		}
	}
	return false
}

// fleetScope reports whether s acts on the whole fleet (see Binding).
func fleetScope(s Scope) bool {
	return s == ScopeAdmin || s == ScopeServersRead || s == ScopeServersWrite
}

// HoldsProject reports whether the key may act for project (a project id
// in any case): a fleet-wide key holds every project.
func (k *Key) HoldsProject(project string) bool {
	if k.FleetWide {
		return true
	}
	p, ok := messages.CanonicalProjectID(project)
	return ok && slices.Contains(k.Projects, p)
}

// Binding decides which projects a key with scopes is bound to, from the
// projects and the explicit fleet-wide choice of its creator, and returns
// them canonical (lower-case, sorted, without duplicates) with whether the
// key is fleet-wide:
//
//   - an admin key is fleet-wide (it manages every key anyway);
//   - a key with a servers scope acts on the fleet, which no project owns:
//     it is fleet-wide, so it cannot be bound to projects;
//   - a key with a deployments, jobs, credentials or templates scope is bound to projects, unless it is
//     explicitly fleet-wide (an operator's key that sees every project).
//
// Project ids follow the rule of a request's project_id.
func Binding(scopes []Scope, projects []string, fleetWide bool) ([]string, bool, error) {
	var out []string
	for i, p := range projects {
		c, ok := messages.CanonicalProjectID(strings.TrimSpace(p))
		if !ok { // the value is not repeated: it may be anything pasted
			return nil, false, fmt.Errorf("project %d of %d is not a project id (a UUID in 8-4-4-4-12 form)", i+1, len(projects))
		}
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	admin, servers, deploys := false, false, false
	for _, s := range scopes {
		switch s {
		case ScopeAdmin:
			admin = true
		case ScopeServersRead, ScopeServersWrite:
			servers = true
		case ScopeDeploymentsRead, ScopeDeploymentsWrite, ScopeJobsRead, ScopeJobsWrite,
			ScopeCredentialsRead, ScopeCredentialsWrite, ScopeTemplatesRead, ScopeTemplatesWrite, ScopeTemplatesLaunch:
			deploys = true
		}
	}
	switch {
	case len(out) > 0 && fleetWide:
		return nil, false, errors.New("a key is either bound to projects or fleet-wide, not both")
	case len(out) > 0 && admin:
		return nil, false, errors.New("an admin key is fleet-wide: it cannot be bound to projects")
	case len(out) > 0 && servers:
		return nil, false, errors.New("servers scopes act on the whole fleet: such a key is fleet-wide and cannot be bound to projects (make one key per role)")
	case len(out) > 0:
		return out, false, nil
	case fleetWide || admin || !deploys:
		return nil, true, nil
	}
	return nil, false, errors.New("a key with deployments, jobs or credentials scopes needs the projects it may act for (--project), or --fleet-wide for an operator's key that sees every project")
}

// KeyPrefix starts every key, so that secret scanners and people recognise
// one ("autoprov API key").
const KeyPrefix = "apk_"

// keyRE is the shape of a key: the prefix and 52 base32 characters (256
// random bits).
var keyRE = regexp.MustCompile(`^apk_[a-z2-7]{52}$`)

var keyEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// NewSecret returns a new random key.
func NewSecret() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err)) // never fails on Linux
	}
	return KeyPrefix + strings.ToLower(keyEncoding.EncodeToString(b[:]))
}

// WellFormed reports whether s has the shape of a key; malformed values are
// refused without a database lookup.
func WellFormed(s string) bool { return keyRE.MatchString(s) }

// Hash returns the SHA-256 of a key, the only form in which keys are stored.
// Keys carry 256 random bits, so a fast hash is enough: there is nothing to
// guess from it.
func Hash(secret string) []byte {
	sum := sha256.Sum256([]byte(secret))
	return sum[:]
}

// DisplayPrefix returns the part of a key shown in lists: the prefix and
// the next 8 characters.
func DisplayPrefix(secret string) string {
	if len(secret) < len(KeyPrefix)+8 {
		return secret
	}
	return secret[:len(KeyPrefix)+8]
}
