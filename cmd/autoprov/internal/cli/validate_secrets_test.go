package cli

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/secrets/vaulttest"
)

// validateSecretsFixture is a Vault stand-in holding SSH keys under the
// infra policy's paths, a file root and an env file naming references of
// every backend, and an inventory whose hosts name keys that resolve,
// are missing, are malformed, fall outside the token's policy, or are
// refused by infra.
type validateSecretsFixture struct {
	dir, settings, inventory string
	environ                  map[string]string
	canaries                 map[string]string // what no output may hold
	vault                    *vaulttest.Server
}

func newValidateSecretsFixture(t *testing.T) *validateSecretsFixture {
	t.Helper()
	dir := t.TempDir()
	write := fileWriter(t, dir)
	keyPath := filepath.Join(dir, "id_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", keyPath).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	key, err := os.ReadFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(keyPath)

	vault := vaulttest.New(t)
	vault.Put("", "secret", "infra/ssh", map[string]any{"private_key": string(key)})
	vault.Put("", "secret", "infra/ssh/web-1", map[string]any{"private_key": string(key)})
	vault.Put("", "secret", "ops/other", map[string]any{"private_key": string(key)})
	// The token's policy is infra-ssh.hcl's: the fleet's SSH keys only.
	token := vault.CreateToken("", vaulttest.TokenSpec{TTL: time.Hour, Renewable: true,
		ReadPaths: []string{"secret/data/infra/ssh", "secret/data/infra/ssh/*"}})

	const signingKey = "canary-signing-key-0123456789abcdef-0123456789"
	const slackURL = "https://hooks.slack.example/services/CANARY-slack-url"
	write("root/slack/url", slackURL)
	write("root/keys/short", "canary-short")
	write("root/keys/notakey", "canary-not-a-key")

	f := &validateSecretsFixture{dir: dir, vault: vault}
	f.settings = write("s.env", strings.Join([]string{
		"REDIS_URL=redis://redis:6379/0", "DATABASE_URL=postgres://u:pw@db/autoprov",
		"VAULT_ADDR=" + vault.URL(), "VAULT_TIMEOUT=5s",
		"SECRETS_FILE_ROOT=" + filepath.Join(dir, "root"),
		"SSH_KEY_REF=vault:secret/infra/ssh#private_key",
		"REQUEST_KEYS=sched-1@provisioner:queue=env:AUTOPROV_SECRET_REQ_KEY,short-1@provisioner:queue=file:keys/short",
		"SLACK_WEBHOOK_URL_REF=file:slack/url",
		"TELEGRAM_BOT_TOKEN_REF=env:AUTOPROV_SECRET_TELEGRAM", "TELEGRAM_CHAT_ID=42",
	}, "\n")+"\n")
	// YAML: in an INI inventory "#" starts a comment, even in a value.
	f.inventory = write("hosts.yml", `all:
  children:
    web:
      hosts:
        web-1:
          ansible_host: 192.0.2.10
          autoprov_ssh_key_ref: "vault:secret/infra/ssh/web-1#private_key"
        web-2:
          autoprov_ssh_key_ref: "vault:secret/infra/ssh/web-2#private_key"
        web-3:
          autoprov_ssh_key_ref: "vault:secret/ops/other#private_key"
        web-4:
          autoprov_ssh_key_ref: "vault:secret/infra/ssh/../other#private_key"
        web-5:
          autoprov_ssh_key_ref: env:AUTOPROV_SECRET_REQ_KEY
        web-6:
          autoprov_ssh_key_ref: file:keys/notakey
        web-7:
          ansible_host: 192.0.2.16
        web-8:
          autoprov_ssh_key_ref: "vault:secret/infra/ssh/web-1#private_key"
    db:
      hosts:
        db-1:
          ansible_host: 192.0.2.20
      vars:
        autoprov_ssh_key_ref: "vault:secret/infra/ssh/db#private_key"
`)
	// The Vault token and the env: secrets are in autoprov's environment,
	// not in the settings file (as an operator keeps them).
	f.environ = map[string]string{"PATH": os.Getenv("PATH"), "VAULT_TOKEN": token, "AUTOPROV_SECRET_REQ_KEY": signingKey}
	f.canaries = map[string]string{"vault token": token, "signing key": signingKey, "slack url": slackURL, "short key": "canary-short", "not a key": "canary-not-a-key"}
	for i, line := range strings.Split(strings.TrimSpace(string(key)), "\n") {
		if !strings.HasPrefix(line, "-----") {
			f.canaries["ssh key line "+string(rune('a'+i))] = line
		}
	}
	return f
}

// run runs the command line with the fixture's environment.
func (f *validateSecretsFixture) run(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var list []string
	for k, v := range f.environ {
		list = append(list, k+"="+v)
	}
	return runWith(t, f.environ, func() []string { return list }, args...)
}

// noCanary fails the test when text holds a secret value.
func (f *validateSecretsFixture) noCanary(t *testing.T, what, text string) {
	t.Helper()
	for name, v := range f.canaries {
		if strings.Contains(text, v) {
			t.Errorf("%s holds the %s:\n%s", what, name, text)
		}
	}
}

// TestValidateSecrets: every secret reference the settings and the
// inventories name is resolved by the service that uses it, with its own
// backends (vault: through the stand-in, env:, file:) and rules; each
// failure names what holds the reference, the reference and the kind of
// failure; no value is ever printed.
func TestValidateSecrets(t *testing.T) {
	t.Parallel()
	bin := serviceBinaries(t)
	f := newValidateSecretsFixture(t)

	out, errOut, code := f.run(t, "--env-file", f.settings, "validate", "--bin-dir", bin, "--inventory", f.inventory)
	f.noCanary(t, "validate's output", out+errOut)
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s%s", code, out, errOut)
	}
	inv := "inventory " + f.inventory
	for _, want := range []string{
		"ok   infra configuration (" + f.settings + ")",
		"ok   scheduler configuration (" + f.settings + ")",
		"ok   deployer configuration (" + f.settings + ")",
		"FAIL infra secret references (12 resolved by infra)",
		"FAIL scheduler secret references (2 resolved by scheduler)",
		"ok   " + inv,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "deployer secret references") {
		t.Errorf("the deployer names no references, yet:\n%s", out)
	}
	problems := []struct {
		name, want string
	}{
		{"a missing secret", inv + ":9 host web-2: vault:secret/infra/ssh/web-2#private_key: not_found: "},
		{"a path the token's policy refuses", inv + ":11 host web-3: vault:secret/ops/other#private_key: permission: "},
		{"a malformed path", inv + ":13 host web-4: vault:secret/infra/ssh/../other#private_key: bad_ref: "},
		{"a host key naming a signing key", inv + ":15 host web-5: env:AUTOPROV_SECRET_REQ_KEY: refused: "},
		{"a host key that is no SSH key", inv + ":17 host web-6: file:keys/notakey: unusable: "},
		{"a group var, missing", inv + ":27 host db-1: vault:secret/infra/ssh/db#private_key: not_found: "},
		{"a signing key too short", "REQUEST_KEYS key short-1: file:keys/short: unusable: "},
		{"an unset env: variable", "TELEGRAM_BOT_TOKEN_REF: env:AUTOPROV_SECRET_TELEGRAM: not_found: "},
	}
	for _, p := range problems {
		if !strings.Contains(out, p.want) {
			t.Errorf("%s: output lacks %q:\n%s", p.name, p.want, out)
		}
	}
	// What resolves is not a problem: SSH_KEY_REF, web-1 and web-8 (one
	// reference, resolved once), web-7 (SSH_KEY_REF), the signing key from
	// autoprov's environment, the Slack URL from the file root.
	for _, ok := range []string{"SSH_KEY_REF:", "web-1", "web-7", "web-8", "sched-1", "SLACK_WEBHOOK_URL_REF"} {
		if strings.Contains(out, ok) {
			t.Errorf("%s resolves, yet it is reported:\n%s", ok, out)
		}
	}
	if n := strings.Count(out, "\n       "); n != len(problems) {
		t.Errorf("%d problems printed, want %d:\n%s", n, len(problems), out)
	}

	// --json: each reference with its service, source and kind.
	var report struct {
		OK     bool          `json:"ok"`
		Checks []checkResult `json:"checks"`
	}
	out, errOut, code = f.run(t, "--json", "--env-file", f.settings, "validate", "--bin-dir", bin, "--service", "infra", "--inventory", f.inventory)
	f.noCanary(t, "validate --json", out+errOut)
	mustJSON(t, out, &report)
	if code != 1 || report.OK {
		t.Fatalf("--json: exit %d\n%s", code, out)
	}
	kinds := map[string]string{}
	for _, c := range report.Checks {
		for _, s := range c.Secrets {
			if s.Service != "infra" || s.OK != (s.Kind == "") {
				t.Errorf("outcome %+v", s)
			}
			kinds[s.Source] = s.Kind
		}
	}
	for source, kind := range map[string]string{
		"SSH_KEY_REF": "", "REQUEST_KEYS key sched-1": "", "REQUEST_KEYS key short-1": "unusable",
		inv + ":7 host web-1": "", inv + ":9 host web-2": "not_found", inv + ":11 host web-3": "permission",
		inv + ":13 host web-4": "bad_ref", inv + ":15 host web-5": "refused", inv + ":17 host web-6": "unusable",
		inv + " host web-7 (no autoprov_ssh_key_ref: SSH_KEY_REF)": "", inv + ":21 host web-8": "", inv + ":27 host db-1": "not_found",
	} {
		if got, ok := kinds[source]; !ok || got != kind {
			t.Errorf("%s: kind %q (reported: %v), want %q", source, got, ok, kind)
		}
	}

	// --no-secrets: the configuration alone.
	out, _, code = f.run(t, "--env-file", f.settings, "validate", "--bin-dir", bin, "--inventory", f.inventory, "--no-secrets")
	if code != 0 || strings.Contains(out, "secret references") {
		t.Fatalf("--no-secrets: exit %d\n%s", code, out)
	}
}

// TestValidateSecretsVaultDown: with Vault unreachable infra cannot open
// its secret backends (it would not start), so every reference it names
// fails as unavailable, env: and file: ones too, each named.
func TestValidateSecretsVaultDown(t *testing.T) {
	t.Parallel()
	bin := serviceBinaries(t)
	f := newValidateSecretsFixture(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close()
	data, err := os.ReadFile(f.settings)
	if err != nil {
		t.Fatal(err)
	}
	settings := filepath.Join(f.dir, "down.env")
	text := strings.Replace(string(data), "VAULT_ADDR="+f.vault.URL(), "VAULT_ADDR="+down, 1)
	text = strings.Replace(text, "SSH_KEY_REF=vault:secret/infra/ssh#private_key", "SSH_KEY_REF=file:keys/short", 1)
	if err := os.WriteFile(settings, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := f.run(t, "--env-file", settings, "validate", "--bin-dir", bin, "--service", "infra,deployer")
	f.noCanary(t, "validate's output", out+errOut)
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"ok   infra configuration", "FAIL infra secret references (3 resolved by infra)",
		"SSH_KEY_REF: file:keys/short: unavailable: ", "REQUEST_KEYS key sched-1: env:AUTOPROV_SECRET_REQ_KEY: unavailable: "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
