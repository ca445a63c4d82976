package deploy

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

// loadCompose loads docker-compose.yml the way `docker compose` does, with
// the variables of envFiles (and nothing from this process's environment).
func loadCompose(t *testing.T, envFiles ...string) (*types.Project, error) {
	t.Helper()
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := cli.NewProjectOptions([]string{filepath.Join(abs, "docker-compose.yml")},
		cli.WithWorkingDirectory(abs),
		cli.WithEnvFiles(envFiles...),
		cli.WithDotEnv,
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		t.Fatal(err)
	}
	return opts.LoadProject(context.Background())
}

// composeRoles says what each service of the stack is: long-running
// services need a health check, one-shot jobs run to completion.
var composeRoles = map[string]string{
	"redis": "server", "postgres": "server", "vault": "server",
	"scheduler": "server", "infra": "server", "deployer": "server", "target": "server",
	"vault-init": "job", "demo-keys": "job", "demo": "job",
}

func TestCompose(t *testing.T) {
	project, err := loadCompose(t, filepath.Join(root, ".env.example"))
	if err != nil {
		t.Fatalf("docker-compose.yml with .env.example: %v", err)
	}
	if project.Name != "autoprov" {
		t.Errorf("project name %q", project.Name)
	}
	stages := parseDockerfile(t, filepath.Join(root, "Dockerfile"))

	t.Run("services, health checks, one-shot jobs", func(t *testing.T) {
		for name, role := range composeRoles {
			svc, ok := project.Services[name]
			if !ok {
				t.Errorf("service %s missing", name)
				continue
			}
			hc := svc.HealthCheck
			hasHC := hc != nil && !hc.Disable && len(hc.Test) > 0
			if role == "server" && !hasHC {
				t.Errorf("service %s has no health check", name)
			}
			if role == "job" && svc.Restart != "no" {
				t.Errorf("one-shot %s: restart %q, want \"no\"", name, svc.Restart)
			}
		}
		for name := range project.Services {
			if _, ok := composeRoles[name]; !ok {
				t.Errorf("service %s is not described by this test: add it to composeRoles", name)
			}
		}
	})

	t.Run("depends_on with conditions", func(t *testing.T) {
		for name, svc := range project.Services {
			for dep, d := range svc.DependsOn {
				want := "service_healthy"
				if composeRoles[dep] == "job" {
					want = "service_completed_successfully"
				}
				if d.Condition != want {
					t.Errorf("%s depends on %s with condition %q, want %s", name, dep, d.Condition, want)
				}
			}
		}
		for _, name := range services {
			deps := project.Services[name].DependsOn
			for _, want := range []string{"redis", "postgres"} {
				if _, ok := deps[want]; !ok {
					t.Errorf("%s does not wait for %s", name, want)
				}
			}
		}
		if _, ok := project.Services["infra"].DependsOn["vault-init"]; !ok {
			t.Error("infra does not wait for vault-init (its SSH key is in Vault)")
		}
		for _, want := range []string{"target", "infra", "scheduler", "deployer"} {
			if _, ok := project.Services["demo"].DependsOn[want]; !ok {
				t.Errorf("demo does not wait for %s", want)
			}
		}
	})

	t.Run("persistent volumes, Redis with AOF", func(t *testing.T) {
		for name, target := range map[string]string{"redis": "/data", "postgres": "/var/lib/postgresql/data", "infra": "/var/lib/autoprov"} {
			found := false
			for _, v := range project.Services[name].Volumes {
				if v.Type == types.VolumeTypeVolume && v.Target == target {
					if _, ok := project.Volumes[v.Source]; !ok {
						t.Errorf("%s mounts volume %s, which is not declared", name, v.Source)
					}
					found = true
				}
			}
			if !found {
				t.Errorf("%s has no named volume at %s", name, target)
			}
		}
		cmd := strings.Join(project.Services["redis"].Command, " ")
		if !strings.Contains(cmd, "--appendonly yes") {
			t.Errorf("redis command %q: AOF is off", cmd)
		}
	})

	t.Run("infra scales: no container name, no published port, graceful stop", func(t *testing.T) {
		infra := project.Services["infra"]
		if infra.ContainerName != "" || len(infra.Ports) > 0 {
			t.Errorf("infra: container_name %q, ports %v: --scale infra=4 would clash", infra.ContainerName, infra.Ports)
		}
		if infra.Environment["STREAM_CONSUMER_NAME"] != nil {
			t.Error("infra sets STREAM_CONSUMER_NAME: every replica would be the same consumer")
		}
		grace := infra.StopGracePeriod
		if grace == nil {
			t.Fatal("infra has no stop_grace_period: Docker kills it 10s after SIGTERM, mid-play")
		}
		// Longer than the service's own shutdown grace, or Docker's SIGKILL
		// cuts the drain short.
		if sg := derefEnv(infra.Environment, "SHUTDOWN_GRACE"); sg != "" {
			d, err := time.ParseDuration(sg)
			if err != nil || *grace <= types.Duration(d) {
				t.Errorf("stop_grace_period %s is not longer than SHUTDOWN_GRACE %s", grace, sg)
			}
		}
		for name, svc := range project.Services {
			if len(svc.Ports) > 0 && name != "deployer" {
				t.Errorf("%s publishes ports %v: only the deployer is reached from outside", name, svc.Ports)
			}
		}
		for _, p := range project.Services["deployer"].Ports {
			if p.Target != 8080 {
				t.Errorf("the deployer publishes port %d, want only its API (8080)", p.Target)
			}
		}
	})

	t.Run("images built from the Dockerfile's targets", func(t *testing.T) {
		for name, svc := range project.Services {
			if svc.Build == nil {
				if !isPinned(svc.Image) {
					t.Errorf("%s: image %s is not pinned to an exact version", name, svc.Image)
				}
				continue
			}
			if _, ok := stageByName(stages, svc.Build.Target); !ok {
				t.Errorf("%s builds target %q, which the Dockerfile does not have", name, svc.Build.Target)
			}
		}
	})

	t.Run("service environments: only variables the services read, and valid", func(t *testing.T) {
		for _, name := range services {
			svc := project.Services[name]
			vars := serviceVars(t, name)
			env := envOf(t, chain(t, stages, svc.Build.Target)) // the image's ENV ...
			for k := range svc.Environment {                    // ... under compose's
				_, read := vars[k]
				why, pending := pendingVars[name][k]
				switch {
				case !read && pending:
					t.Logf("%s: %s is set for %s, which %s does not read yet", name, k, why, name)
				case !read:
					t.Errorf("%s: environment sets %s, which %s does not read", name, k, name)
				}
				env[k] = derefEnv(svc.Environment, k)
			}
			if got, want := adminPort(t, env["ADMIN_ADDR"]), adminPort(t, vars["ADMIN_ADDR"]); got != want {
				t.Errorf("%s: ADMIN_ADDR port %s, the service's default is %s", name, got, want)
			}
			// Files the container sees through bind mounts are read from
			// their host source by the check.
			for k, v := range env {
				for _, m := range svc.Volumes {
					if m.Type == types.VolumeTypeBind && v == m.Target {
						env[k] = m.Source
					}
				}
			}
			if out, ok := checkConfig(t, name, env); !ok {
				t.Errorf("%s rejects its compose configuration:\n%s", name, out)
			}
		}
	})
}

func derefEnv(m types.MappingWithEquals, k string) string {
	if v := m[k]; v != nil {
		return *v
	}
	return ""
}

// TestComposeSecretsOnlyFromEnv: passwords and tokens are never written in
// docker-compose.yml; they come from .env (the load fails, naming them,
// without one) and .env.example holds only placeholders.
func TestComposeSecretsOnlyFromEnv(t *testing.T) {
	if _, err := loadCompose(t); err == nil {
		t.Fatal("docker-compose.yml loads without .env: a secret has a default")
	}
	text, err := os.ReadFile(filepath.Join(root, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	literal := regexp.MustCompile(`(?m)^\s*([A-Z_]*(PASSWORD|TOKEN|SECRET)[A-Z_]*):\s*(.*)$`)
	for _, m := range literal.FindAllStringSubmatch(string(text), -1) {
		if !strings.HasPrefix(strings.TrimSpace(m[3]), "${") || !strings.Contains(m[3], ":?") {
			t.Errorf("docker-compose.yml sets %s to %q: take it from .env as ${%s:?...}", m[1], m[3], m[1])
		}
	}
	for _, missing := range []string{"POSTGRES_PASSWORD", "VAULT_DEV_ROOT_TOKEN"} {
		env := filepath.Join(t.TempDir(), "env")
		example, err := os.ReadFile(filepath.Join(root, ".env.example"))
		if err != nil {
			t.Fatal(err)
		}
		var kept []string
		for _, line := range strings.Split(string(example), "\n") {
			if !strings.HasPrefix(line, missing+"=") {
				kept = append(kept, line)
			}
		}
		if err := os.WriteFile(env, []byte(strings.Join(kept, "\n")), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := loadCompose(t, env); err == nil || !strings.Contains(err.Error(), missing) {
			t.Errorf("without %s the load gives %v, want an error naming it", missing, err)
		}
	}
}
