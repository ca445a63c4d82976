package cli

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestEnvPackage walks an environment package through its life: unsealed,
// sealed, changed without a bump (refused), a bad value (the service's own
// check, through AUTOPROV_ENV), bumped and sealed, a secret written in,
// a version going back.
func TestEnvPackage(t *testing.T) {
	t.Parallel()
	bin := serviceBinaries(t)
	cfg := t.TempDir()
	pkg := filepath.Join(cfg, "staging")
	write := func(rel, text string) {
		t.Helper()
		p := filepath.Join(pkg, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	setVersion := func(v string) {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(pkg, manifestName))
		if err != nil {
			t.Fatal(err)
		}
		var m manifest
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		m.Version = v
		data, _ = json.Marshal(m)
		write(manifestName, string(data))
	}
	write(manifestName, `{"version": "1.0.0"}`)
	write("common.env", "REDIS_URL=redis://redis.staging:6379/0\nDATABASE_URL=postgres://autoprov@db.staging/autoprov\nLOG_LEVEL=info\n")
	write("infra.env", "STREAM_CONCURRENCY=8\nSSH_KEY_REF=vault:secret/infra/ssh#private_key\n")
	write("inventories/hosts.ini", "[web]\nweb-1 ansible_host=192.0.2.10\n")
	write("site-vars.json", `{"docker_install_source": "debian"}`)

	env := map[string]string{"PATH": os.Getenv("PATH")}
	// The package's checks; its references (vault: without a Vault) are
	// checked once below.
	validate := func(extra ...string) (string, int) {
		t.Helper()
		args := append([]string{"validate", "--env", "staging", "--config-dir", cfg, "--bin-dir", bin, "--no-secrets"}, extra...)
		out, errOut, code := run(t, env, args...)
		return out + errOut, code
	}

	out, code := validate()
	if code != 1 || !strings.Contains(out, "version 1.0.0 is not sealed") {
		t.Fatalf("unsealed package: exit %d\n%s", code, out)
	}
	if out, _, code := run(t, env, "config", "seal", pkg); code != 0 || !strings.Contains(out, "sealed") {
		t.Fatalf("seal: exit %d\n%s", code, out)
	}
	out, code = validate()
	if code != 0 || !strings.Contains(out, "ok   infra configuration (package staging)") || !strings.Contains(out, "ok   inventory") || !strings.Contains(out, "ok   site vars") {
		t.Fatalf("sealed package: exit %d\n%s", code, out)
	}
	// By default infra resolves its references: SSH_KEY_REF (also the key
	// of the inventory's host, which names none) needs a Vault the package
	// does not configure.
	out, errOut, code := run(t, env, "validate", "--env", "staging", "--config-dir", cfg, "--bin-dir", bin)
	if code != 1 || !strings.Contains(out, "FAIL infra secret references (2 resolved by infra)") ||
		!strings.Contains(out, "SSH_KEY_REF: vault:secret/infra/ssh#private_key: disabled: ") ||
		!strings.Contains(out, "staging/inventories/hosts.ini host web-1 (no autoprov_ssh_key_ref: SSH_KEY_REF): disabled: ") {
		t.Fatalf("package's references: exit %d\n%s%s", code, out, errOut)
	}

	// A change without a bump; the service itself rejects the value.
	write("infra.env", "STREAM_CONCURRENCY=0\nSSH_KEY_REF=vault:secret/infra/ssh#private_key\n")
	out, code = validate()
	if code != 1 || !strings.Contains(out, "content changed since version 1.0.0") || !strings.Contains(out, "STREAM_CONCURRENCY") {
		t.Fatalf("changed package: exit %d\n%s", code, out)
	}
	if _, errOut, code := run(t, env, "config", "seal", pkg); code != 1 || !strings.Contains(errOut, "bump the version") {
		t.Fatalf("seal of changed content under a sealed version: exit %d %s", code, errOut)
	}
	write("infra.env", "STREAM_CONCURRENCY=16\nSSH_KEY_REF=vault:secret/infra/ssh#private_key\n")
	setVersion("1.1.0")
	if _, _, code := run(t, env, "config", "seal", pkg); code != 0 {
		t.Fatalf("seal 1.1.0: exit %d", code)
	}
	if out, code = validate(); code != 0 {
		t.Fatalf("bumped package: exit %d\n%s", code, out)
	}

	// Secrets never belong in a package.
	write("common.env", "REDIS_URL=redis://:hunter2@redis.staging:6379/0\nDATABASE_URL=postgres://autoprov@db.staging/autoprov\nVAULT_TOKEN=s.hunter3\n")
	out, code = validate()
	if code != 1 || !strings.Contains(out, "VAULT_TOKEN is a secret") || !strings.Contains(out, "REDIS_URL holds a URL with a password") {
		t.Fatalf("package with secrets: exit %d\n%s", code, out)
	}
	if strings.Contains(out, "hunter2") || strings.Contains(out, "hunter3") {
		t.Fatalf("validate prints a secret:\n%s", out)
	}

	// Versions only go forward; a bad name is refused.
	write("common.env", "REDIS_URL=redis://redis.staging:6379/0\nDATABASE_URL=postgres://autoprov@db.staging/autoprov\n")
	setVersion("0.9.0")
	if out, code = validate(); code != 1 || !strings.Contains(out, "older than the sealed 1.1.0") {
		t.Fatalf("version going back: exit %d\n%s", code, out)
	}
	if _, errOut, code := run(t, env, "validate", "--env", "../staging", "--config-dir", cfg); code != 2 {
		t.Fatalf("--env with a path: exit %d %s", code, errOut)
	}
}

// TestExamplePackage: the repository's example package is sealed and
// valid; its SSH key comes from the environment, so the secret check
// passes with a key there and names the reference without one.
func TestExamplePackage(t *testing.T) {
	t.Parallel()
	bin := serviceBinaries(t)
	keyPath := filepath.Join(t.TempDir(), "id_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", keyPath).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	key, err := os.ReadFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"validate", "--env", "example", "--config-dir", "../../../../config", "--bin-dir", bin}
	env := map[string]string{"PATH": os.Getenv("PATH"), "AUTOPROV_SECRET_SSH_KEY": string(key)}
	list := func() []string {
		var l []string
		for k, v := range env {
			l = append(l, k+"="+v)
		}
		return l
	}
	out, errOut, code := runWith(t, env, list, args...)
	if code != 0 || strings.Count(out, "ok ") < 7 {
		t.Fatalf("config/example with its key: exit %d\n%s%s", code, out, errOut)
	}
	if strings.Contains(out+errOut, "PRIVATE KEY") {
		t.Fatalf("validate printed the key:\n%s%s", out, errOut)
	}
	delete(env, "AUTOPROV_SECRET_SSH_KEY")
	out, errOut, code = runWith(t, env, list, args...)
	if code != 1 || !strings.Contains(out, "SSH_KEY_REF: env:AUTOPROV_SECRET_SSH_KEY: not_found") {
		t.Fatalf("config/example without its key: exit %d\n%s%s", code, out, errOut)
	}
	if _, _, code = run(t, env, append(args, "--no-secrets")...); code != 0 {
		t.Fatalf("config/example --no-secrets: exit %d", code)
	}
}
