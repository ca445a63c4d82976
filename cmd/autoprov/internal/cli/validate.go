package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
)

// validateCmd checks a configuration before it is rolled out, with the
// services' own validation: each service binary runs with --check-config
// (it loads and validates its settings, connects to nothing, starts
// nothing) in the environment the --env-file describes.
type validateCmd struct {
	Env        string        `name:"env" help:"check the environment package config/<env>/ (its version, its secrets, each service loading it with AUTOPROV_ENV, its inventories and site vars)"`
	ConfigDir  string        `name:"config-dir" default:"config" help:"where environment packages are"`
	Services   []string      `name:"service" default:"scheduler,infra,deployer" help:"services whose configuration to check"`
	BinDir     string        `name:"bin-dir" type:"existingdir" help:"where the service binaries are (default: next to autoprov, then PATH)"`
	Inventory  []string      `name:"inventory" type:"existingfile" help:"Ansible inventory file to parse (repeatable)"`
	AnsibleDir string        `name:"ansible-dir" type:"existingdir" help:"syntax-check every playbook in DIR/playbooks with ansible-playbook and lint DIR with ansible-lint (production profile)"`
	NoLint     bool          `name:"no-lint" help:"with --ansible-dir: skip ansible-lint"`
	Rules      string        `name:"rules" type:"existingfile" help:"the scheduler's rules file to check (as RULES_FILE; its playbooks are looked up in --ansible-dir, else PLAYBOOK_DIR); a RULES_FILE in the settings is checked anyway"`
	NoSecrets  bool          `name:"no-secrets" help:"do not resolve the secret references (by default each service resolves those its settings name, and infra those of the inventories' hosts, with the backends it uses at run time; values are never printed): for a machine that cannot reach Vault"`
	Timeout    time.Duration `default:"2m" help:"limit of each check"`
}

// checkResult is the outcome of one check.
type checkResult struct {
	Check    string   `json:"check"`
	OK       bool     `json:"ok"`
	Problems []string `json:"problems,omitempty"`
	// Secrets are the outcomes of a service's secret references (never
	// their values).
	Secrets []secretOutcome `json:"secrets,omitempty"`
}

// secretOutcome is one reference a service checked.
type secretOutcome struct {
	Service string `json:"service"`
	service.SecretResult
}

func (c *validateCmd) Run(g *globals) error {
	var results []checkResult
	if c.Env != "" {
		pkg, err := c.packageChecks(g)
		if err != nil {
			return err
		}
		results = append(results, pkg...)
	}
	// The inventories first: infra's check resolves their hosts' SSH keys.
	var invResults []checkResult
	var hostRefs []service.SecretRef
	for _, inv := range c.Inventory {
		r, refs := c.checkInventory(g, inv)
		invResults = append(invResults, r)
		hostRefs = append(hostRefs, refs...)
	}
	for _, svc := range c.Services {
		var extra []service.SecretRef
		if svc == "infra" {
			extra = hostRefs
		}
		results = append(results, c.checkService(g, svc, extra)...)
	}
	results = append(results, invResults...)
	if c.AnsibleDir != "" {
		results = append(results, c.checkPlaybooks(g)...)
	}
	problems := 0
	for _, r := range results {
		problems += len(r.Problems)
	}
	if g.json {
		if err := writeJSON(g.env.Stdout, struct {
			OK     bool          `json:"ok"`
			Checks []checkResult `json:"checks"`
		}{problems == 0, results}); err != nil {
			return err
		}
	} else {
		for _, r := range results {
			mark := "ok  "
			if !r.OK {
				mark = "FAIL"
			}
			fmt.Fprintf(g.env.Stdout, "%s %s\n", mark, r.Check)
			for _, p := range r.Problems {
				fmt.Fprintf(g.env.Stdout, "       %s\n", p)
			}
		}
		if problems > 0 {
			fmt.Fprintf(g.env.Stdout, "%d problems\n", problems)
		}
	}
	if problems > 0 {
		return &problemsFound{n: problems}
	}
	return nil
}

// packageChecks checks the environment package --env names and queues its
// inventories for checking.
func (c *validateCmd) packageChecks(g *globals) ([]checkResult, error) {
	if !envName.MatchString(c.Env) {
		return nil, usageError{fmt.Errorf("--env %q is not an environment name", c.Env)}
	}
	dir := filepath.Join(c.ConfigDir, c.Env)
	p, err := loadPackage(dir)
	if err != nil {
		return nil, usageError{err}
	}
	version := checkResult{Check: "package " + dir + " version " + p.Manifest.Version, Problems: p.versionProblems()}
	secrets := checkResult{Check: "package " + dir + " holds no secrets", Problems: p.secretProblems()}
	out := []checkResult{version, secrets}
	if vars := filepath.Join(dir, "site-vars.json"); fileExists(vars) {
		r := checkResult{Check: "site vars " + vars}
		var obj map[string]any
		if data, err := os.ReadFile(vars); err != nil {
			r.Problems = []string{err.Error()}
		} else if err := json.Unmarshal(data, &obj); err != nil {
			r.Problems = []string{fmt.Sprintf("%s: not a JSON object: %v", vars, err)}
		}
		out = append(out, r)
	}
	invs, _ := filepath.Glob(filepath.Join(dir, "inventories", "*"))
	c.Inventory = append(c.Inventory, invs...)
	for k := range out {
		out[k].OK = len(out[k].Problems) == 0
	}
	return out, nil
}

var envName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// childEnv is the environment of a check: with --env, AUTOPROV_ENV and
// AUTOPROV_CONFIG_DIR (the service loads the package itself); the
// --env-file's variables when one is given; PATH, HOME and TMPDIR to run
// at all; the secret backends' credentials from autoprov's environment
// (see secretCredentials). Without either, autoprov's own environment.
func (c *validateCmd) childEnv(g *globals) []string {
	if g.envFile == "" && c.Env == "" {
		return os.Environ()
	}
	var env []string
	if c.Env != "" {
		abs, err := filepath.Abs(c.ConfigDir)
		if err != nil {
			abs = c.ConfigDir
		}
		env = append(env, "AUTOPROV_ENV="+c.Env, "AUTOPROV_CONFIG_DIR="+abs)
	}
	for _, name := range []string{"PATH", "HOME", "TMPDIR"} {
		if v := g.env.Getenv(name); v != "" {
			if _, set := g.file[name]; !set {
				env = append(env, name+"="+v)
			}
		}
	}
	keys := make([]string, 0, len(g.file))
	for k := range g.file {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+g.file[k])
	}
	return append(env, c.secretCredentials(g)...)
}

// secretCredentials are the variables of autoprov's environment a service
// needs to resolve its references and that neither an environment package
// nor (usually) an env file holds: the Vault token or AppRole secret_id
// (VAULT_* and PROJECT_VAULT_*) and the variables env: references read
// (SECRETS_ENV_PREFIX, default AUTOPROV_SECRET_). The --env-file's own
// settings win.
func (c *validateCmd) secretCredentials(g *globals) []string {
	if g.env.Environ == nil {
		return nil
	}
	prefix := g.file["SECRETS_ENV_PREFIX"]
	if prefix == "" {
		prefix = g.env.Getenv("SECRETS_ENV_PREFIX")
	}
	if prefix == "" {
		prefix = "AUTOPROV_SECRET_"
	}
	var out []string
	for _, kv := range g.env.Environ() {
		k, _, ok := strings.Cut(kv, "=")
		if _, set := g.file[k]; !ok || set {
			continue
		}
		switch {
		case k == "VAULT_TOKEN", k == "VAULT_SECRET_ID", k == "PROJECT_VAULT_TOKEN", k == "PROJECT_VAULT_SECRET_ID",
			len(prefix) >= 4 && strings.HasPrefix(k, prefix):
			out = append(out, kv)
		}
	}
	return out
}

// binary finds a service's binary.
func (c *validateCmd) binary(name string) (string, error) {
	if c.BinDir != "" {
		p := filepath.Join(c.BinDir, name)
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("binary %s: %w", name, err)
		}
		return p, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("binary %s not found next to autoprov or in PATH (use --bin-dir)", name)
	}
	return p, nil
}

// checkService runs the service's own check: --check-config, or by
// default --check-secrets, which also resolves every secret reference its
// settings name (and, for infra, extra: the inventories' hosts' SSH key
// references). It returns the configuration's result, then the secret
// references' when there were any.
func (c *validateCmd) checkService(g *globals, svc string, extra []service.SecretRef) []checkResult {
	r := checkResult{Check: svc + " configuration"}
	switch {
	case c.Env != "" && g.envFile != "":
		r.Check += " (package " + c.Env + ", " + g.envFile + ")"
	case c.Env != "":
		r.Check += " (package " + c.Env + ")"
	case g.envFile != "":
		r.Check += " (" + g.envFile + ")"
	}
	bin, err := c.binary(svc)
	if err != nil {
		r.Problems = []string{err.Error()}
		return []checkResult{r}
	}
	env := c.childEnv(g)
	if svc == "scheduler" && c.Rules != "" {
		// The scheduler's own check loads the rules file, naming file and
		// line of each problem.
		r.Check += " with rules " + c.Rules
		env = append(env, "RULES_FILE="+absPath(c.Rules))
		if c.AnsibleDir != "" {
			env = append(env, "PLAYBOOK_DIR="+absPath(c.AnsibleDir))
		}
	}
	args := []string{"--check-config"}
	if !c.NoSecrets {
		args = []string{"--check-secrets"}
		if len(extra) > 0 {
			file, err := writeSecretRefs(extra)
			if err != nil {
				r.Problems = []string{err.Error()}
				return []checkResult{r}
			}
			defer os.Remove(file)
			args = append(args, "--secret-refs", file)
		}
	}
	stdout, stderr, code, err := c.run(g, bin, "", env, args...)
	valid := strings.Contains(stdout, svc+": configuration valid")
	var outcomes []secretOutcome
	if valid && !c.NoSecrets {
		outcomes = secretOutcomes(svc, stdout)
	}
	switch {
	case err != nil:
		r.Problems = []string{fmt.Sprintf("run %s: %v", bin, err)}
	case code == 0 && valid:
		r.OK = true
	case code == 1 && valid && len(outcomes) > 0:
		r.OK = true // the configuration is valid; some references are not
	case code == 2:
		r.Problems = configProblems(svc, stderr)
	default:
		r.Problems = []string{fmt.Sprintf("%s %s exited %d: %s", svc, args[0], code, strings.TrimSpace(stderr+stdout))}
	}
	if !r.OK || len(outcomes) == 0 {
		return []checkResult{r}
	}
	s := checkResult{Check: fmt.Sprintf("%s secret references (%d resolved by %s)", svc, len(outcomes), svc), Secrets: outcomes}
	for _, o := range outcomes {
		if !o.OK {
			s.Problems = append(s.Problems, o.problem())
		}
	}
	s.OK = len(s.Problems) == 0
	return []checkResult{r, s}
}

// secretOutcomes reads the JSON lines --check-secrets writes after
// "NAME: configuration valid".
func secretOutcomes(svc, stdout string) []secretOutcome {
	var out []secretOutcome
	for _, line := range strings.Split(stdout, "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var res service.SecretResult
		if json.Unmarshal([]byte(line), &res) == nil {
			out = append(out, secretOutcome{Service: svc, SecretResult: res})
		}
	}
	return out
}

// problem is the outcome's line: what holds the reference, the reference,
// the kind of failure and what the service said (never a value).
func (o secretOutcome) problem() string {
	detail := strings.Join(strings.Fields(o.Error), " ") // Vault's errors span lines
	if o.Ref == "" {
		return fmt.Sprintf("%s: %s: %s", o.Source, o.Kind, detail)
	}
	if canon, err := secrets.ParseRef(o.Ref); err == nil {
		detail = strings.TrimPrefix(detail, "secret "+canon.String()+": ")
	}
	return fmt.Sprintf("%s: %s: %s: %s", o.Source, o.Ref, o.Kind, detail)
}

// writeSecretRefs writes refs to a temporary file for --secret-refs
// (references name secrets, they hold none).
func writeSecretRefs(refs []service.SecretRef) (string, error) {
	f, err := os.CreateTemp("", "autoprov-secret-refs-*.jsonl")
	if err != nil {
		return "", fmt.Errorf("secret references file: %w", err)
	}
	enc := json.NewEncoder(f)
	for _, r := range refs {
		if err := enc.Encode(r); err != nil {
			f.Close()
			os.Remove(f.Name())
			return "", fmt.Errorf("secret references file: %w", err)
		}
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("secret references file: %w", err)
	}
	return f.Name(), nil
}

// stepName names a check's command for the progress line.
func stepName(bin string, args []string) string {
	name := strings.Join(append([]string{filepath.Base(bin)}, args...), " ")
	if len(name) > 100 {
		name = name[:97] + "..."
	}
	return "running " + name
}

// absPath returns p made absolute (p itself when that fails).
func absPath(p string) string {
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

// configProblems splits a service's *ConfigError text ("svc: invalid
// configuration (N problems):\n  A: ...\n  B: ...", or one problem on one
// line) into its problems.
func configProblems(svc, stderr string) []string {
	text := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(stderr), svc+": "))
	head, rest, multi := strings.Cut(text, "\n")
	if !multi {
		return []string{strings.TrimPrefix(head, "invalid configuration: ")}
	}
	var out []string
	for _, line := range strings.Split(rest, "\n") {
		if line = strings.TrimSpace(line); line != "" {
			out = append(out, line)
		}
	}
	return out
}

// checkInventory parses the inventory with ansible-inventory (unparsed
// sources are errors) and returns, for infra's secret check, its hosts'
// SSH key references (see inventoryRefs).
func (c *validateCmd) checkInventory(g *globals, path string) (checkResult, []service.SecretRef) {
	r := checkResult{Check: "inventory " + path}
	bin, err := exec.LookPath("ansible-inventory")
	if err != nil {
		r.Problems = []string{"ansible-inventory not found in PATH (install ansible-core)"}
		return r, nil
	}
	// Unparsed sources are warnings by default: make them errors.
	env := append(os.Environ(), "ANSIBLE_INVENTORY_UNPARSED_FAILED=True", "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED=True", "ANSIBLE_NOCOLOR=1")
	stdout, stderr, code, err := c.run(g, bin, "", env, "-i", path, "--list")
	r.ansibleOutcome(stderr, code, err)
	if !r.OK {
		return r, nil
	}
	if probs, err := c.addressProblems(g, path, []byte(stdout)); err != nil {
		r.Problems = append(r.Problems, err.Error())
	} else {
		r.Problems = append(r.Problems, probs...)
	}
	r.OK = len(r.Problems) == 0
	if c.NoSecrets {
		return r, nil
	}
	refs, err := inventoryRefs(path, []byte(stdout))
	if err != nil {
		r.OK, r.Problems = false, []string{err.Error()}
	}
	return r, refs
}

// addressProblems lists the inventory's hosts the scheduler would refuse
// for their address, with the SPECIAL_ALLOW_NETWORKS of the scheduler's
// settings (--env-file, the --env package, or autoprov's environment).
// This machine's own addresses are not the scheduler's: not checked here.
func (c *validateCmd) addressProblems(g *globals, path string, listing []byte) ([]string, error) {
	vars := map[string]string{}
	for _, kv := range c.childEnv(g) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	getenv, err := service.WithEnvPackage(func(k string) string { return vars[k] }, "scheduler")
	if err != nil {
		return nil, err
	}
	var allow []string
	for _, n := range strings.Split(getenv("SPECIAL_ALLOW_NETWORKS"), ",") {
		if n = strings.TrimSpace(n); n != "" {
			allow = append(allow, n)
		}
	}
	guard, err := authz.NewGuard(authz.SpecialConfig{AllowNetworks: allow},
		authz.Options{InterfaceAddrs: func() ([]net.Addr, error) { return nil, nil }})
	if err != nil {
		return nil, err
	}
	return inventoryAddressProblems(path, listing, guard)
}

func (c *validateCmd) checkPlaybooks(g *globals) []checkResult {
	books, _ := filepath.Glob(filepath.Join(c.AnsibleDir, "playbooks", "*.yml"))
	if len(books) == 0 {
		return []checkResult{{Check: "playbooks in " + c.AnsibleDir, Problems: []string{"no playbooks/*.yml"}}}
	}
	bin, err := exec.LookPath("ansible-playbook")
	if err != nil {
		return []checkResult{{Check: "playbooks in " + c.AnsibleDir, Problems: []string{"ansible-playbook not found in PATH (install ansible-core)"}}}
	}
	var out []checkResult
	for _, b := range books {
		rel, _ := filepath.Rel(c.AnsibleDir, b)
		r := checkResult{Check: "playbook " + b}
		env := append(os.Environ(), "ANSIBLE_NOCOLOR=1")
		_, stderr, code, err := c.run(g, bin, c.AnsibleDir, env, "--syntax-check", "-i", "localhost,", rel)
		r.ansibleOutcome(stderr, code, err)
		out = append(out, r)
	}
	if !c.NoLint {
		out = append(out, c.lint(g))
	}
	return out
}

// lint runs ansible-lint over the Ansible directory, as the repository's
// own tests do (production profile, offline); each violation is a problem
// naming its file and line.
func (c *validateCmd) lint(g *globals) checkResult {
	r := checkResult{Check: "ansible-lint " + c.AnsibleDir + " (production profile)"}
	bin, err := exec.LookPath("ansible-lint")
	if err != nil {
		r.Problems = []string{"ansible-lint not found in PATH (install Debian's ansible-lint, or use --no-lint)"}
		return r
	}
	abs, _ := filepath.Abs(c.AnsibleDir)
	env := append(os.Environ(), "ANSIBLE_NOCOLOR=1", "ANSIBLE_CONFIG="+filepath.Join(abs, "ansible.cfg"))
	stdout, stderr, code, err := c.run(g, bin, c.AnsibleDir, env, "--nocolor", "--offline", "--profile", "production", "-f", "pep8")
	switch {
	case err != nil:
		r.Problems = []string{err.Error()}
	case code == 0:
		r.OK = true
	default:
		for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
			if line = strings.TrimSpace(line); line != "" {
				r.Problems = append(r.Problems, filepath.Join(c.AnsibleDir, line))
			}
		}
		if len(r.Problems) == 0 {
			r.Problems = []string{fmt.Sprintf("ansible-lint exited %d: %s", code, strings.Join(strings.Fields(stderr), " "))}
		}
	}
	return r
}

// ansibleOutcome records the outcome of an Ansible command in r.
func (r *checkResult) ansibleOutcome(stderr string, code int, err error) {
	switch {
	case err != nil:
		r.Problems = []string{err.Error()}
	case code != 0:
		r.Problems = ansibleErrors(stderr)
	default:
		r.OK = true
	}
}

// ansibleErrors keeps the ERROR and WARNING lines of Ansible's output with
// what follows them (the file, line and column Ansible names).
func ansibleErrors(stderr string) []string {
	var out []string
	for _, block := range strings.Split(strings.TrimSpace(stderr), "\n\n") {
		block = strings.TrimSpace(block)
		if strings.HasPrefix(block, "ERROR!") || strings.HasPrefix(block, "[WARNING]") || strings.Contains(block, "line ") {
			out = append(out, strings.Join(strings.Fields(block), " "))
		}
	}
	if len(out) == 0 && stderr != "" {
		out = []string{strings.Join(strings.Fields(stderr), " ")}
	}
	if len(out) == 0 {
		out = []string{"failed without a message"}
	}
	return out
}

// run runs a check's command and returns its output and exit status; err
// is for a command that could not run or timed out.
func (c *validateCmd) run(g *globals, bin, dir string, env []string, args ...string) (string, string, int, error) {
	ctx, cancel := context.WithTimeout(g.ctx, c.Timeout)
	defer cancel()
	defer g.progress(stepName(bin, args))()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir, cmd.Env = dir, env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return "", "", -1, fmt.Errorf("%s: %w", filepath.Base(bin), ctx.Err())
	case errors.As(err, &exit):
		return stdout.String(), stderr.String(), exit.ExitCode(), nil
	case err != nil:
		return "", "", -1, err
	}
	return stdout.String(), stderr.String(), 0, nil
}
