package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/joho/godotenv"
	"golang.org/x/mod/semver"
)

// An environment package is a folder config/<env>/ (seed 004's config
// packages): common.env and <service>.env (the services' settings, loaded
// by the services themselves when AUTOPROV_ENV=<env>), inventories/ (Ansible
// inventories), site-vars.json (infra's PLAYBOOK_VARS_FILE), and
// package.json, its manifest: a SemVer version and, for every version
// released, the digest of the content it was sealed with. validate refuses
// a package whose content changed without a new version.
const manifestName = "package.json"

type manifest struct {
	Version string            `json:"version"`
	Sealed  map[string]string `json:"sealed"`
}

// envPackage is a loaded package.
type envPackage struct {
	Dir      string
	Manifest manifest
	Digest   string // of every file but the manifest
}

func loadPackage(dir string) (*envPackage, error) {
	data, err := os.ReadFile(filepath.Join(dir, manifestName))
	if err != nil {
		return nil, fmt.Errorf("package %s: %w", dir, err)
	}
	p := &envPackage{Dir: dir}
	if err := json.Unmarshal(data, &p.Manifest); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, manifestName), err)
	}
	if p.Manifest.Sealed == nil {
		p.Manifest.Sealed = map[string]string{}
	}
	if p.Digest, err = contentDigest(dir); err != nil {
		return nil, err
	}
	return p, nil
}

// contentDigest hashes the package's files (names and contents, in name
// order), the manifest left out.
func contentDigest(dir string) (string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%s: a symbolic link in a package (copy the file in)", p)
		}
		if !d.IsDir() && p != filepath.Join(dir, manifestName) {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	h := sha256.New()
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		rel, _ := filepath.Rel(dir, f)
		fmt.Fprintf(h, "%s\x00%d\x00", filepath.ToSlash(rel), len(data))
		h.Write(data)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

func validSemver(v string) bool { return semver.IsValid("v"+v) && !strings.HasPrefix(v, "v") }

// versionProblems checks the manifest against the content: a SemVer
// version, sealed with the content as it is, newer than every other sealed
// version.
func (p *envPackage) versionProblems() []string {
	m := p.Manifest
	file := filepath.Join(p.Dir, manifestName)
	if !validSemver(m.Version) {
		return []string{fmt.Sprintf("%s: version %q is not a SemVer version (MAJOR.MINOR.PATCH)", file, m.Version)}
	}
	var out []string
	for v := range m.Sealed {
		if !validSemver(v) {
			out = append(out, fmt.Sprintf("%s: sealed version %q is not SemVer", file, v))
		} else if v != m.Version && semver.Compare("v"+v, "v"+m.Version) > 0 {
			out = append(out, fmt.Sprintf("%s: version %s is older than the sealed %s", file, m.Version, v))
		}
	}
	switch sealed, ok := m.Sealed[m.Version]; {
	case !ok:
		out = append(out, fmt.Sprintf("%s: version %s is not sealed: run `autoprov config seal %s`", file, m.Version, p.Dir))
	case sealed != p.Digest:
		out = append(out, fmt.Sprintf("%s: the content changed since version %s was sealed: bump the version, then run `autoprov config seal %s`", file, m.Version, p.Dir))
	}
	return out
}

// secretVar matches variables that must come from the environment or a
// secret store, never from a versioned package.
var secretVar = regexp.MustCompile(`(?i)(^AUTOPROV_SECRET_|PASSWORD|^VAULT_TOKEN$|^VAULT_SECRET_ID$|_KEY$|TOKEN$)`)

// secretProblems finds secrets written into the package's env files.
func (p *envPackage) secretProblems() []string {
	var out []string
	envFiles, _ := filepath.Glob(filepath.Join(p.Dir, "*.env"))
	for _, f := range envFiles {
		vars, err := godotenv.Read(f)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", f, err))
			continue
		}
		keys := make([]string, 0, len(vars))
		for k := range vars {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if secretVar.MatchString(k) {
				out = append(out, fmt.Sprintf("%s: %s is a secret: set it in the environment or reference it (vault:, env:, file:), never in a package", f, k))
			} else if strings.Contains(vars[k], "://") && strings.Contains(vars[k], "@") && urlHasPassword(vars[k]) {
				out = append(out, fmt.Sprintf("%s: %s holds a URL with a password: set it in the environment", f, k))
			}
		}
	}
	return out
}

func urlHasPassword(s string) bool {
	_, rest, ok := strings.Cut(s, "://")
	if !ok {
		return false
	}
	userinfo, _, ok := strings.Cut(rest, "@")
	if !ok || strings.ContainsAny(userinfo, "/") {
		return false
	}
	_, pw, ok := strings.Cut(userinfo, ":")
	return ok && pw != ""
}

// configCmd manages environment packages.
type configCmd struct {
	Seal configSealCmd `cmd:"" help:"record the package's content as its current version (after bumping it); validate then accepts it"`
}

type configSealCmd struct {
	Dir string `arg:"" type:"existingdir" help:"the package folder, e.g. config/production"`
}

func (c *configSealCmd) Run(g *globals) error {
	p, err := loadPackage(c.Dir)
	if err != nil {
		return err
	}
	m := &p.Manifest
	if !validSemver(m.Version) {
		return usageError{fmt.Errorf("version %q is not a SemVer version", m.Version)}
	}
	if d, ok := m.Sealed[m.Version]; ok {
		if d == p.Digest {
			fmt.Fprintf(g.env.Stdout, "%s %s is sealed already\n", c.Dir, m.Version)
			return nil
		}
		return errors.New("version " + m.Version + " was sealed with other content: bump the version in " + filepath.Join(c.Dir, manifestName))
	}
	for v := range m.Sealed {
		if semver.Compare("v"+v, "v"+m.Version) > 0 {
			return fmt.Errorf("version %s is older than the sealed %s", m.Version, v)
		}
	}
	m.Sealed[m.Version] = p.Digest
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.Dir, manifestName), append(data, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(g.env.Stdout, "sealed %s %s (%s)\n", c.Dir, m.Version, p.Digest)
	return nil
}
