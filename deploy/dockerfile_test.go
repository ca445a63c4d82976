package deploy

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	Cmd  string // upper case: FROM, RUN, ...
	Args string
	Line int
}

// stage is a build stage: its FROM and what follows.
type stage struct {
	Name, Base string
	// From is FROM's image as written (Base with build arguments expanded).
	From   string
	Instrs []instruction
}

// parseDockerfile splits a Dockerfile into stages. It knows what this
// repository's Dockerfile uses: comments, line continuations, no heredocs.
func parseDockerfile(t *testing.T, path string) []stage {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var stages []stage
	globals := map[string]string{} // ARG NAME=default before the first FROM
	var cur strings.Builder
	start, n := 0, 0
	flush := func() {
		text := strings.TrimSpace(cur.String())
		cur.Reset()
		if text == "" {
			return
		}
		cmd, args, _ := strings.Cut(text, " ")
		in := instruction{Cmd: strings.ToUpper(cmd), Args: strings.TrimSpace(args), Line: start}
		if in.Cmd == "FROM" {
			fields := strings.Fields(in.Args)
			// A base named by a build argument is checked as its default:
			// the public image users build from.
			base := os.Expand(fields[0], func(k string) string { return globals[k] })
			st := stage{Base: base, From: fields[0]}
			if len(fields) == 3 && strings.EqualFold(fields[1], "AS") {
				st.Name = fields[2]
			}
			stages = append(stages, st)
			return
		}
		if len(stages) == 0 {
			if in.Cmd != "ARG" {
				t.Fatalf("%s:%d: %s before the first FROM", path, in.Line, in.Cmd)
			}
			k, v, ok := strings.Cut(in.Args, "=")
			if !ok || v == "" {
				t.Fatalf("%s:%d: ARG %s before the first FROM has no default", path, in.Line, in.Args)
			}
			globals[k] = v
			return
		}
		stages[len(stages)-1].Instrs = append(stages[len(stages)-1].Instrs, in)
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		trim := strings.TrimSpace(line)
		if strings.HasPrefix(trim, "#") {
			continue
		}
		if cur.Len() == 0 {
			if trim == "" {
				continue
			}
			start = n
		}
		if strings.HasSuffix(trim, "\\") {
			cur.WriteString(strings.TrimSuffix(trim, "\\") + " ")
			continue
		}
		cur.WriteString(trim)
		flush()
	}
	flush()
	if len(stages) == 0 {
		t.Fatalf("%s: no FROM", path)
	}
	return stages
}

func stageByName(stages []stage, name string) (stage, bool) {
	for _, s := range stages {
		if s.Name == name {
			return s, true
		}
	}
	return stage{}, false
}

// chain returns a stage and the stages it is built on, the base first.
func chain(t *testing.T, stages []stage, name string) []stage {
	t.Helper()
	var out []stage
	for name != "" {
		s, ok := stageByName(stages, name)
		if !ok {
			break
		}
		out = append([]stage{s}, out...)
		name = s.Base
		if len(out) > len(stages) {
			t.Fatalf("stage %s: FROM loop", name)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no stage %q", name)
	}
	return out
}

// effective returns the last value of instruction cmd over a stage chain.
func effective(ch []stage, cmd string) (instruction, bool) {
	var last instruction
	found := false
	for _, s := range ch {
		for _, in := range s.Instrs {
			if in.Cmd == cmd {
				last, found = in, true
			}
		}
	}
	return last, found
}

// envOf returns the ENV variables a stage chain sets (KEY=value forms).
func envOf(t *testing.T, ch []stage) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, s := range ch {
		for _, in := range s.Instrs {
			if in.Cmd != "ENV" {
				continue
			}
			for _, kv := range strings.Fields(in.Args) {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					t.Fatalf("line %d: ENV %q: use the KEY=value form", in.Line, in.Args)
				}
				env[k] = strings.Trim(v, `"`)
			}
		}
	}
	return env
}

// pinned: a digest, or a tag with an exact version: x.y.z (a suffix such
// as -bookworm or -slim may follow), or x.y for Debian and Postgres, whose
// x.y releases (12.12, 15.14) are exact; never latest, a bare major or minor, or no tag.
var pinned = regexp.MustCompile(`^([a-z0-9./_-]+?)(:(\d+)\.(\d+)(\.\d+)?(-[a-z0-9.-]+)?)?(@sha256:[0-9a-f]{64})?$`)

func isPinned(image string) bool {
	m := pinned.FindStringSubmatch(image)
	switch {
	case m == nil:
		return false
	case m[7] != "":
		return true
	case m[2] == "":
		return false
	}
	return m[5] != "" || twoPartExact[m[1]]
}

var twoPartExact = map[string]bool{"debian": true, "postgres": true}

// secretName matches ARG and ENV names that would put a secret in an image.
var secretName = regexp.MustCompile(`(?i)(pass(word)?|token|secret|private|credential|api_?key|_key$)`)

// runtimeStages are the images the system runs (the demo target plays a
// server and runs sshd as root on purpose; it is checked apart).
var runtimeStages = []string{"scheduler", "infra", "deployer", "demo"}

func TestDockerfile(t *testing.T) {
	stages := parseDockerfile(t, filepath.Join(root, "Dockerfile"))
	names := map[string]bool{}
	for _, s := range stages {
		names[s.Name] = true
	}

	t.Run("multi-stage, runtime images not built on the build image", func(t *testing.T) {
		if len(stages) < 2 {
			t.Fatalf("%d stages, want a build stage and runtime stages", len(stages))
		}
		for _, name := range append(runtimeStages, "target") {
			for _, s := range chain(t, stages, name) {
				if strings.HasPrefix(s.Base, "golang:") {
					t.Errorf("stage %s is built on %s: the Go toolchain would ship in it", name, s.Base)
				}
			}
		}
	})

	t.Run("every base image pinned", func(t *testing.T) {
		for _, s := range stages {
			if names[s.Base] {
				continue // a previous stage
			}
			if !isPinned(s.Base) {
				t.Errorf("FROM %s (stage %s): pin an exact version or a digest", s.Base, s.Name)
			}
		}
		for _, bad := range []string{"debian", "debian:latest", "debian:12", "debian:12-slim", "alpine:3", "alpine:3.22", "golang:1.26-bookworm", "redis:7", "redis:7.4", "postgres:15"} {
			if isPinned(bad) {
				t.Errorf("isPinned(%q) = true", bad)
			}
		}
		for _, good := range []string{"debian:12.12-slim", "alpine:3.22.2", "golang:1.26.8-bookworm", "hashicorp/vault:1.20.4", "debian@sha256:" + strings.Repeat("a", 64)} {
			if !isPinned(good) {
				t.Errorf("isPinned(%q) = false", good)
			}
		}
	})

	// scripts/containers.sh builds every stage from local bases where no
	// registry is reachable: each public base must be a build argument.
	t.Run("every public base image is a build argument", func(t *testing.T) {
		for _, s := range stages {
			if !names[s.Base] && !strings.HasPrefix(s.From, "${") {
				t.Errorf("FROM %s (stage %s): name the image in an ARG before the first FROM (its default) and use ${ARG}", s.From, s.Name)
			}
		}
	})

	t.Run("runtime images run as a non-root user", func(t *testing.T) {
		for _, name := range runtimeStages {
			user, ok := effective(chain(t, stages, name), "USER")
			if !ok {
				t.Errorf("stage %s has no USER: it runs as root", name)
				continue
			}
			u, _, _ := strings.Cut(user.Args, ":")
			if u == "root" || u == "0" || u == "" {
				t.Errorf("stage %s: USER %s is root", name, user.Args)
			}
		}
	})

	t.Run("no secrets in ARG, ENV or COPY", func(t *testing.T) {
		for _, s := range stages {
			for _, in := range s.Instrs {
				switch in.Cmd {
				case "ARG", "ENV":
					for _, kv := range strings.Fields(in.Args) {
						k, _, _ := strings.Cut(kv, "=")
						if secretName.MatchString(k) {
							t.Errorf("line %d: %s %s: a secret in a build argument or ENV stays in the image", in.Line, in.Cmd, k)
						}
					}
				case "COPY", "ADD":
					for _, src := range copySources(in) {
						base := filepath.Base(src)
						if src == "." {
							continue
						}
						if strings.HasPrefix(base, ".env") || strings.HasPrefix(base, "id_") || strings.HasSuffix(base, ".pem") || strings.HasSuffix(base, ".key") {
							t.Errorf("line %d: %s %s copies a secret into a layer", in.Line, in.Cmd, src)
						}
						if !strings.Contains(in.Args, "--from=") {
							if _, err := os.Stat(filepath.Join(root, src)); err != nil {
								t.Errorf("line %d: %s %s: %v", in.Line, in.Cmd, src, err)
							}
						}
					}
				}
			}
		}
		// COPY . . sends the build context: .dockerignore must keep local
		// secrets and state out of it.
		ignore, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(ignore), "\n")
		for _, want := range []string{".git", ".env", ".env.*", "run", "bin", ".cache"} {
			if !slices.Contains(lines, want) {
				t.Errorf(".dockerignore lacks %q", want)
			}
		}
	})

	t.Run("service images: health check on the admin port, entry point", func(t *testing.T) {
		for _, svc := range services {
			ch := chain(t, stages, svc)
			env := envOf(t, ch)
			vars := serviceVars(t, svc)
			for k := range env {
				if _, ok := vars[k]; !ok {
					t.Errorf("stage %s sets ENV %s, which %s does not read", svc, k, svc)
				}
			}
			port := adminPort(t, vars["ADMIN_ADDR"])
			if got := adminPort(t, env["ADMIN_ADDR"]); got != port || !strings.HasPrefix(env["ADMIN_ADDR"], "0.0.0.0:") {
				t.Errorf("stage %s: ADMIN_ADDR=%s, want 0.0.0.0:%s (the service's default port, reachable from outside the container)", svc, env["ADMIN_ADDR"], port)
			}
			hc, ok := effective(ch, "HEALTHCHECK")
			if !ok || !strings.Contains(hc.Args, "127.0.0.1:"+port+"/readyz") {
				t.Errorf("stage %s: HEALTHCHECK %q, want a probe of 127.0.0.1:%s/readyz", svc, hc.Args, port)
			}
			ep, ok := effective(ch, "ENTRYPOINT")
			if !ok || !strings.Contains(ep.Args, "/usr/local/bin/"+svc) {
				t.Errorf("stage %s: ENTRYPOINT %q, want /usr/local/bin/%s", svc, ep.Args, svc)
			}
		}
	})

	t.Run("infra image carries ansible-core, openssh-client, runguard, the collections", func(t *testing.T) {
		ch := chain(t, stages, "infra")
		var all strings.Builder
		for _, s := range ch {
			for _, in := range s.Instrs {
				all.WriteString(in.Cmd + " " + in.Args + "\n")
			}
		}
		text := all.String()
		for _, want := range []string{"ansible-core", "openssh-client", "/out/runguard", "ansible/playbooks", "ansible/roles", "ansible/plugins", "ansible/ansible.cfg"} {
			if !strings.Contains(text, want) {
				t.Errorf("infra stage lacks %s", want)
			}
		}
		env := envOf(t, ch)
		if env["PLAYBOOK_GUARD"] != "/usr/local/bin/runguard" || env["PLAYBOOK_BIN"] != "/usr/bin/ansible-playbook" {
			t.Errorf("infra stage: PLAYBOOK_GUARD=%q PLAYBOOK_BIN=%q", env["PLAYBOOK_GUARD"], env["PLAYBOOK_BIN"])
		}
		// Every collection a role or playbook names must be in the image:
		// ansible.builtin comes with ansible-core; any other must be
		// installed with ansible-galaxy.
		for coll := range collectionsUsed(t, filepath.Join(root, "ansible")) {
			if coll == "ansible.builtin" {
				continue
			}
			if !strings.Contains(text, "ansible-galaxy collection install") || !strings.Contains(text, coll) {
				t.Errorf("the roles use collection %s, which the infra image does not install", coll)
			}
		}
	})
}

// copySources returns the source paths of a COPY or ADD (flags and the
// destination left out; JSON form not used here).
func copySources(in instruction) []string {
	var fields []string
	for _, f := range strings.Fields(in.Args) {
		if !strings.HasPrefix(f, "--") {
			fields = append(fields, f)
		}
	}
	if len(fields) < 2 {
		return nil
	}
	return fields[:len(fields)-1]
}

// fqcn matches a task's module in fully-qualified form (ns.collection.module:).
var fqcn = regexp.MustCompile(`(?m)^\s*-?\s*([a-z][a-z0-9_]*\.[a-z][a-z0-9_]*)\.[a-z][a-z0-9_]*:\s`)

// sysctlRoots are the first parts of sysctl keys (net.core.somaxconn: ...),
// which look like module names in the roles' variables.
var sysctlRoots = map[string]bool{"net": true, "fs": true, "kernel": true, "vm": true, "dev": true, "user": true, "abi": true, "debug": true, "crypto": true}

// collectionsUsed lists the collections the YAML under dir names.
func collectionsUsed(t *testing.T, dir string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "tests" {
			return filepath.SkipDir
		}
		if d.IsDir() || (!strings.HasSuffix(p, ".yml") && !strings.HasSuffix(p, ".yaml")) {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range fqcn.FindAllStringSubmatch(string(data), -1) {
			if ns, _, _ := strings.Cut(m[1], "."); !sysctlRoots[ns] {
				out[m[1]] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !out["ansible.builtin"] {
		t.Fatalf("found no ansible.builtin module under %s: the scan is broken", dir)
	}
	return out
}
