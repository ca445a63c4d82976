package sources

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"go.yaml.in/yaml/v3"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern"
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
	// CacheDir keeps installed requirements per project and content, so
	// that jobs of one project with the same requirements download them
	// once (galaxycache.go).
	CacheDir string        `env:"CACHE_DIR" desc:"directory of installed Galaxy requirements kept per project and requirements set (default: autoprov-galaxy next to PLAYBOOK_RUN_ROOT)"`
	CacheTTL time.Duration `env:"CACHE_TTL" envDefault:"1h" desc:"how long an installed requirements set is reused before it is installed again (version ranges resolved anew); 0: no cache"`
}

// galaxyServer is one allowed server.
type galaxyServer struct{ name, url string }

// Galaxy installs collections and roles with ansible-galaxy into a run's
// own directories, from the allowed servers only. It is safe for
// concurrent use.
type Galaxy struct {
	servers []galaxyServer
	timeout time.Duration
	log     zerolog.Logger
	cache   *installCache // nil: every install downloads
	// onExec, when set (tests), sees every command line.
	onExec func(argv []string)
}

var (
	serverNameRe = pattern.MustCompile(`^[a-z0-9_]+$`, 64)
	collNameRe   = regexp.MustCompile(`^[a-z0-9_]+\.[a-z0-9_]+$`)
	roleSrcRe    = regexp.MustCompile(`^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$`)
	roleNameRe   = pattern.MustCompile(`^[A-Za-z0-9_.-]+$`, 128)
	versionRe    = pattern.MustCompile(`^[0-9A-Za-z.,<>=!*+ -]*$`, 128)
)

// NewGalaxy validates cfg.
func NewGalaxy(cfg GalaxyConfig, log zerolog.Logger) (*Galaxy, error) {
	g := &Galaxy{timeout: cfg.Timeout, log: log}
	if g.timeout <= 0 {
		g.timeout = defaultTimeout
	}
	for _, s := range cfg.Servers {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		name, raw, ok := strings.Cut(s, "=")
		if !ok || !serverNameRe.MatchString(name) {
			return nil, fmt.Errorf("galaxy server %q: want name=url with a name of [a-z0-9_]", s)
		}
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" ||
			(u.Scheme != "https" && !(u.Scheme == "http" && cfg.AllowHTTP)) || strings.ContainsAny(raw, "%\n ") {
			return nil, fmt.Errorf("galaxy server %s: %q is not an https URL without credentials", name, raw)
		}
		if !strings.HasSuffix(raw, "/") {
			raw += "/"
		}
		for _, o := range g.servers {
			if o.name == name {
				return nil, fmt.Errorf("galaxy server %s named twice", name)
			}
		}
		g.servers = append(g.servers, galaxyServer{name: name, url: raw})
	}
	if len(g.servers) == 0 {
		return nil, errors.New("galaxy: no server allowed")
	}
	if cfg.CacheDir != "" && cfg.CacheTTL > 0 {
		c, err := newInstallCache(cfg.CacheDir, cfg.CacheTTL)
		if err != nil {
			return nil, err
		}
		g.cache = c
	}
	return g, nil
}

// Installed are the directories a run's Ansible reads what Install put
// there from (ANSIBLE_COLLECTIONS_PATH, ANSIBLE_ROLES_PATH).
type Installed struct {
	CollectionsPath string // <runDir>/collections
	RolesPath       string // <runDir>/roles
}

// server finds an allowed server by name or URL; empty is the default.
func (g *Galaxy) server(source string) (galaxyServer, error) {
	if source == "" {
		return g.servers[0], nil
	}
	for _, s := range g.servers {
		if source == s.name || strings.TrimSuffix(source, "/") == strings.TrimSuffix(s.url, "/") {
			return s, nil
		}
	}
	return galaxyServer{}, fmt.Errorf("%w: Galaxy server %q is not allowed", ErrGalaxy, source)
}

// collectionReq and roleReq are the sanitized entries handed to
// ansible-galaxy.
type collectionReq struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
	Source  string `json:"source"`
	Type    string `json:"type"`
}

type roleReq struct {
	Name    string `json:"name"`
	Src     string `json:"src"`
	Version string `json:"version,omitempty"`
}

// parseRequirements reads a requirements file and keeps only entries from
// allowed servers, refusing the whole file otherwise.
func (g *Galaxy) parseRequirements(data []byte) ([]collectionReq, []roleReq, error) {
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, nil, fmt.Errorf("%w: requirements file: %v", ErrGalaxy, err)
	}
	var collections, roles []any
	switch d := doc.(type) {
	case []any: // the old format: roles only
		roles = d
	case map[string]any:
		for k := range d {
			if k != "collections" && k != "roles" {
				return nil, nil, fmt.Errorf("%w: requirements file: unknown key %q", ErrGalaxy, k)
			}
		}
		var ok bool
		if d["collections"] != nil {
			if collections, ok = d["collections"].([]any); !ok {
				return nil, nil, fmt.Errorf("%w: collections must be a list", ErrGalaxy)
			}
		}
		if d["roles"] != nil {
			if roles, ok = d["roles"].([]any); !ok {
				return nil, nil, fmt.Errorf("%w: roles must be a list", ErrGalaxy)
			}
		}
	case nil:
	default:
		return nil, nil, fmt.Errorf("%w: requirements file is neither a list nor a mapping", ErrGalaxy)
	}
	var cs []collectionReq
	for i, e := range collections {
		c, err := g.collection(e)
		if err != nil {
			return nil, nil, fmt.Errorf("collections[%d]: %w", i, err)
		}
		cs = append(cs, c)
	}
	var rs []roleReq
	for i, e := range roles {
		r, err := g.role(e)
		if err != nil {
			return nil, nil, fmt.Errorf("roles[%d]: %w", i, err)
		}
		rs = append(rs, r)
	}
	return cs, rs, nil
}

// fields reads a requirement entry's string fields, refusing other keys.
func fields(e any, allowed ...string) (map[string]string, error) {
	m, ok := e.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%w: entry must be a name or a mapping", ErrGalaxy)
	}
	out := map[string]string{}
	for k, v := range m {
		known := false
		for _, a := range allowed {
			known = known || k == a
		}
		if !known {
			return nil, fmt.Errorf("%w: key %q is not supported here", ErrGalaxy, k)
		}
		switch v := v.(type) {
		case string:
			out[k] = v
		case int, float64:
			out[k] = fmt.Sprint(v)
		case nil:
		default:
			return nil, fmt.Errorf("%w: %s must be a string", ErrGalaxy, k)
		}
	}
	return out, nil
}

func (g *Galaxy) collection(e any) (collectionReq, error) {
	if s, ok := e.(string); ok {
		e = map[string]any{"name": s}
	}
	f, err := fields(e, "name", "version", "source", "type")
	if err != nil {
		return collectionReq{}, err
	}
	if t := f["type"]; t != "" && t != "galaxy" {
		return collectionReq{}, fmt.Errorf("%w: type %q (only collections from the allowed Galaxy servers)", ErrGalaxy, t)
	}
	if !collNameRe.MatchString(f["name"]) {
		return collectionReq{}, fmt.Errorf("%w: collection name %q: want namespace.name", ErrGalaxy, f["name"])
	}
	if !versionRe.MatchString(f["version"]) {
		return collectionReq{}, fmt.Errorf("%w: version %q", ErrGalaxy, f["version"])
	}
	srv, err := g.server(f["source"])
	if err != nil {
		return collectionReq{}, err
	}
	return collectionReq{Name: f["name"], Version: f["version"], Source: srv.name, Type: "galaxy"}, nil
}

func (g *Galaxy) role(e any) (roleReq, error) {
	if s, ok := e.(string); ok {
		e = map[string]any{"src": s}
	}
	f, err := fields(e, "name", "src", "version")
	if err != nil {
		return roleReq{}, err
	}
	if f["src"] == "" {
		f["src"] = f["name"]
	}
	if !roleSrcRe.MatchString(f["src"]) {
		return roleReq{}, fmt.Errorf("%w: role src %q: only owner.role from the default Galaxy server", ErrGalaxy, f["src"])
	}
	if f["name"] == "" {
		f["name"] = f["src"]
	}
	if !roleNameRe.MatchString(f["name"]) || !versionRe.MatchString(f["version"]) {
		return roleReq{}, fmt.Errorf("%w: role name or version", ErrGalaxy)
	}
	return roleReq{Name: f["name"], Src: f["src"], Version: f["version"]}, nil
}

// Install installs the collections and roles of the requirements file
// reqFile (a path inside the checkout, as SafePath returns) into runDir's
// own paths. Every entry must come from an allowed server: a collection's
// source is an allowed server's name or URL, or absent (the default
// server); a role is owner.role from the default server. Any other
// source, type git, url, file or dir, a role from a URL or an include is
// refused with ErrGalaxy before ansible-galaxy runs, and ansible-galaxy
// reads only a sanitized copy of the file. tokens maps server names to
// their tokens (the job's Galaxy credentials), handed to ansible-galaxy in
// its environment only. scope is whose install it is (the job's project):
// an install is reused from the cache only within its scope ("": never).
func (g *Galaxy) Install(ctx context.Context, runDir, scope, reqFile string, tokens map[string]string) (Installed, error) {
	data, err := os.ReadFile(reqFile)
	if err != nil {
		return Installed{}, fmt.Errorf("requirements file: %w", err)
	}
	if len(data) > 1<<20 {
		return Installed{}, fmt.Errorf("%w: requirements file over 1 MiB", ErrGalaxy)
	}
	cs, rs, err := g.parseRequirements(data)
	if err != nil {
		return Installed{}, err
	}
	return g.install(ctx, runDir, scope, cs, rs, tokens)
}

// InstallCollection installs one collection (namespace.name) at version
// (a constraint such as ">=1.0.0", or empty for the latest) from server
// (an allowed server's name or URL; empty: the default) into runDir's own
// paths, as Install does (scope too); for a collection_role source.
func (g *Galaxy) InstallCollection(ctx context.Context, runDir, scope, collection, version, server string, tokens map[string]string) (Installed, error) {
	c, err := g.collection(map[string]any{"name": collection, "version": version, "source": server})
	if err != nil {
		return Installed{}, err
	}
	return g.install(ctx, runDir, scope, []collectionReq{c}, nil, tokens)
}

func (g *Galaxy) install(ctx context.Context, runDir, scope string, cs []collectionReq, rs []roleReq, tokens map[string]string) (Installed, error) {
	inst := Installed{CollectionsPath: filepath.Join(runDir, "collections"), RolesPath: filepath.Join(runDir, "roles")}
	for _, d := range []string{inst.CollectionsPath, inst.RolesPath, filepath.Join(runDir, "galaxy-tmp")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return Installed{}, fmt.Errorf("galaxy: %w", err)
		}
	}
	for name := range tokens {
		if _, err := g.server(name); err != nil || name == "" {
			return Installed{}, fmt.Errorf("%w: a token for server %q, which is not allowed", ErrGalaxy, name)
		}
	}
	if g.cache == nil || scope == "" {
		return inst, g.download(ctx, runDir, inst, cs, rs, tokens)
	}
	// One install per scope and requirements set at a time: a second job
	// with the same requirements waits for the first and copies its result.
	key := g.cacheKey(scope, cs, rs)
	unlock, err := g.cache.lock(ctx, key)
	if err != nil {
		if ctx.Err() != nil {
			return Installed{}, context.Cause(ctx)
		}
		return Installed{}, err
	}
	defer unlock()
	hit, err := g.cache.get(key, inst)
	if err != nil || hit {
		if hit {
			g.log.Debug().Str("galaxy_cache", key[:12]).Msg("galaxy requirements from the cache")
		}
		return inst, err
	}
	// Installed apart first, so that the entry holds this set only (a run
	// may install several into its paths), then merged into the run's.
	stage, err := os.MkdirTemp(filepath.Join(runDir, "galaxy-tmp"), "stage-")
	if err != nil {
		return Installed{}, fmt.Errorf("galaxy: %w", err)
	}
	staged := Installed{CollectionsPath: filepath.Join(stage, "collections"), RolesPath: filepath.Join(stage, "roles")}
	if err := g.download(ctx, runDir, staged, cs, rs, tokens); err != nil {
		return Installed{}, err
	}
	if err := g.cache.put(key, staged); err != nil {
		g.log.Warn().Err(err).Msg("galaxy requirements not cached (the next job installs them again)")
	}
	if err := staged.copyInto(inst); err != nil {
		return Installed{}, fmt.Errorf("galaxy: %w", err)
	}
	return inst, os.RemoveAll(stage)
}

// download runs ansible-galaxy for the collections and roles into inst.
func (g *Galaxy) download(ctx context.Context, runDir string, inst Installed, cs []collectionReq, rs []roleReq, tokens map[string]string) error {
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	if len(cs) > 0 {
		file, err := writeRequirements(runDir, "collections", cs)
		if err != nil {
			return err
		}
		if err := g.run(ctx, runDir, tokens, "collection", "install", "--requirements-file", file,
			"--collections-path", inst.CollectionsPath, "--timeout", strconv.Itoa(int(g.timeout.Seconds()))); err != nil {
			return err
		}
	}
	if len(rs) > 0 {
		file, err := writeRequirements(runDir, "roles", rs)
		if err != nil {
			return err
		}
		if err := g.run(ctx, runDir, tokens, "role", "install", "--role-file", file,
			"--roles-path", inst.RolesPath, "--timeout", strconv.Itoa(int(g.timeout.Seconds()))); err != nil {
			return err
		}
	}
	return nil
}

// writeRequirements writes the sanitized requirements (JSON, which YAML
// reads) in runDir.
func writeRequirements(runDir, key string, entries any) (string, error) {
	b, err := json.Marshal(map[string]any{key: entries})
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp(runDir, "requirements-"+key+"-*.yml")
	if err != nil {
		return "", fmt.Errorf("galaxy: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return "", fmt.Errorf("galaxy: %w", err)
	}
	return f.Name(), f.Close()
}

// env is ansible-galaxy's whole environment: the allowed servers, the
// tokens, and nothing of this process's. An empty ansible.cfg in runDir
// keeps any other (the checkout's, the user's) from being read.
func (g *Galaxy) env(runDir string, tokens map[string]string) ([]string, error) {
	cfg := filepath.Join(runDir, "galaxy.cfg")
	if err := os.WriteFile(cfg, []byte("# servers and tokens come from the environment\n"), 0o600); err != nil {
		return nil, fmt.Errorf("galaxy: %w", err)
	}
	// An empty token file of the run's own, so that no user's token is
	// read. Not /dev/null: ansible-galaxy chmods a token path that is no
	// regular file to 0600, which as root made the host's /dev/null
	// unusable for every other user.
	tokenFile := filepath.Join(runDir, "galaxy_token")
	if err := os.WriteFile(tokenFile, nil, 0o600); err != nil {
		return nil, fmt.Errorf("galaxy: %w", err)
	}
	names := make([]string, 0, len(g.servers))
	env := []string{
		"PATH=" + safePATH,
		"HOME=" + runDir,
		"LANG=C.UTF-8", "LC_ALL=C.UTF-8",
		"TMPDIR=" + filepath.Join(runDir, "galaxy-tmp"),
		"ANSIBLE_CONFIG=" + cfg,
		"ANSIBLE_LOCAL_TEMP=" + filepath.Join(runDir, "galaxy-tmp"),
		"ANSIBLE_GALAXY_CACHE_DIR=" + filepath.Join(runDir, "galaxy-tmp", "cache"),
		"ANSIBLE_GALAXY_TOKEN_PATH=" + tokenFile,
		"ANSIBLE_NOCOLOR=1",
		"PYTHONDONTWRITEBYTECODE=1",
	}
	for _, s := range g.servers {
		names = append(names, s.name)
		up := strings.ToUpper(s.name)
		env = append(env, "ANSIBLE_GALAXY_SERVER_"+up+"_URL="+s.url)
		if tok := tokens[s.name]; tok != "" {
			env = append(env, "ANSIBLE_GALAXY_SERVER_"+up+"_TOKEN="+tok)
		}
	}
	return append(env, "ANSIBLE_GALAXY_SERVER_LIST="+strings.Join(names, ",")), nil
}

func (g *Galaxy) run(ctx context.Context, runDir string, tokens map[string]string, args ...string) error {
	env, err := g.env(runDir, tokens)
	if err != nil {
		return err
	}
	if g.onExec != nil {
		g.onExec(args)
	}
	cmd := exec.CommandContext(ctx, "ansible-galaxy", args...)
	cmd.Env = env
	cmd.Dir = runDir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout = &limitedBuffer{b: &out, n: 8192}
	cmd.Stderr = cmd.Stdout
	start := time.Now()
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(out.String())
		for _, tok := range tokens {
			if tok != "" {
				msg = strings.ReplaceAll(msg, tok, "***")
			}
		}
		if ctx.Err() != nil {
			return fmt.Errorf("ansible-galaxy %s install: %w", args[0], ctx.Err())
		}
		return fmt.Errorf("ansible-galaxy %s install: %v: %s", args[0], err, msg)
	}
	g.log.Debug().Str("kind", args[0]).Dur("took", time.Since(start)).Msg("galaxy requirements installed")
	return nil
}
