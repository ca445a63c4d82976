package main

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/runlog"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets/vaulttest"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps/time4vpstest"
)

func TestRecoveryRunsTheRecoveryPlaybook(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	e.infra()
	e.provision("job-rec", "web-1", func(m *messages.ProvisionerMessage) { m.IsRecovery = true })
	r := e.waitProvision("job-rec", 3*time.Minute)
	if r.Status != messages.StatusSucceeded || r.Playbook != "recovery.yml" {
		t.Fatalf("result = %s %s %+v", r.Status, r.Playbook, r.Error)
	}
	if spans := e.spans("web-1"); len(spans) != 1 || spans[0].playbook != "recovery" {
		t.Fatalf("runs = %+v", spans)
	}
}

func TestForceReinstallWithoutProviderNukesThenSetsUp(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	e.infra()
	e.provision("job-nuke", "web-1", func(m *messages.ProvisionerMessage) { m.ForceReinstall = true })
	r := e.waitProvision("job-nuke", 3*time.Minute) // two plays
	if r.Status != messages.StatusSucceeded || r.Playbook != "setup_server.yml" {
		t.Fatalf("result = %s %s %+v", r.Status, r.Playbook, r.Error)
	}
	spans := e.spans("web-1")
	if len(spans) != 2 || spans[0].playbook != "nuke" || spans[1].playbook != "setup_server" {
		t.Fatalf("runs = %+v, want nuke then setup", spans)
	}
	assertNoOverlap(t, spans)
	if cp := e.run("job-nuke").Checkpoint; cp["nuke_done"] != true {
		t.Errorf("checkpoint = %v", cp)
	}
}

func TestForceReinstallThroughTime4VPS(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	api := time4vpstest.Start(t, time4vpstest.Config{Username: "ops@example.com", Password: "t4v-password", TaskPolls: 2})
	api.AddServer(time4vpstest.VPS{ID: 42, IP: sshd.Host, Domain: "vps42.example"})
	// The stored address is stale and the pinned key is the old OS's: the
	// provider refresh corrects the first, the reinstall drops the second.
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO servers
		(handle, address, ssh_port, ssh_user, source, provider_id, host_key, labels)
		VALUES ('t4v-42', '192.0.2.77', $1, $2, 'time4vps', '42', 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOldOldOldOldOldOldOldOldOldOldOldOldOldOldOld', '{"os":"kvm-debian-12-x86_64"}')`,
		sshd.Port, sshd.User); err != nil {
		t.Fatal(err)
	}
	e.infra("TIME4VPS_URL="+api.URL(), "TIME4VPS_USERNAME="+api.Username(), "TIME4VPS_PASSWORD="+api.Password(),
		"TIME4VPS_TASK_POLL_INTERVAL=100ms")
	e.provision("job-t4v", "t4v-42", func(m *messages.ProvisionerMessage) { m.ForceReinstall = true })
	r := e.waitProvision("job-t4v", 2*time.Minute)
	if r.Status != messages.StatusSucceeded {
		t.Fatalf("result = %s %+v", r.Status, r.Error)
	}
	if n := api.Count(time4vpstest.EndpointReinstall); n != 1 {
		t.Errorf("reinstall requested %d times, want exactly 1", n)
	}
	calls := api.Reinstalls()
	if len(calls) != 1 || calls[0].OS != "kvm-debian-12-x86_64" || !strings.HasPrefix(calls[0].SSHKey, "ssh-ed25519 ") {
		t.Errorf("reinstall calls = %+v", calls)
	}
	s := e.server("t4v-42")
	if s.Address != sshd.Host {
		t.Errorf("address = %s, want the provider's %s", s.Address, sshd.Host)
	}
	if !strings.Contains(s.HostKey, strings.Fields(sshd.HostKey)[1]) {
		t.Errorf("host key not re-pinned after the reinstall: %q", s.HostKey)
	}
	cp := e.run("job-t4v").Checkpoint
	if cp["reinstall_done"] != true || cp["reinstall_task_id"] == nil {
		t.Errorf("checkpoint = %v", cp)
	}
	if spans := e.spans("t4v-42"); len(spans) != 1 || spans[0].playbook != "setup_server" {
		t.Errorf("runs = %+v (no nuke for provider rebuilds)", spans)
	}
}

// TestSecretsLeakNowhere deploys with every secret (SSH key, GitHub token,
// the project's env) served by the Vault stand-in, and looks for the secret
// values in everything the run leaves: the process list while it runs, the
// service's logs, results and progress events, Postgres rows, and files in
// the run root and fact cache. The deploy test playbook even prints the
// token without no_log.
func TestSecretsLeakNowhere(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)

	canaryToken := "ghp_CANARY" + testenv.Unique("tok")
	canaryEnv := map[string]string{"API_KEY": "canary-api-" + testenv.Unique("k"), "DB_PASSWORD": "canary pw with spaces " + testenv.Unique("p")}
	const project = "3f1c9f2e-8a57-4d6b-9a0e-2b1f4c5d6e7f"
	vault := vaulttest.New(t)
	vault.Put("", "secret", "infra/ssh", map[string]any{"private_key": string(sshd.ClientKey)})
	vault.Put("", "secret", "projects/"+project+"/gh", map[string]any{"token": canaryToken})
	envData := map[string]any{}
	for k, v := range canaryEnv {
		envData[k] = v
	}
	vault.Put("", "secret", "projects/"+project+"/env", envData)
	// Two logins with the shipped policies' paths: the service's reads the
	// SSH keys, the projects' reads project paths only.
	vaultToken := vault.CreateToken("", vaulttest.TokenSpec{TTL: time.Hour, Renewable: true,
		ReadPaths: []string{"secret/data/infra/ssh", "secret/data/infra/ssh/*"}})
	projectToken := vault.CreateToken("", vaulttest.TokenSpec{TTL: time.Hour, Renewable: true,
		ReadPaths: []string{"secret/data/projects/*"}})
	e.sshKey = nil // only Vault has the key
	p := e.infra("VAULT_ADDR="+vault.URL(), "VAULT_TOKEN="+vaultToken, "SSH_KEY_REF=vault:secret/infra/ssh#private_key",
		"PROJECT_VAULT_ADDR="+vault.URL(), "PROJECT_VAULT_TOKEN="+projectToken)

	canaries := map[string]string{"github token": canaryToken, "vault token": vaultToken, "project vault token": projectToken}
	for k, v := range canaryEnv {
		canaries["env "+k] = v
	}
	for i, line := range strings.Split(strings.TrimSpace(string(sshd.ClientKey)), "\n") {
		if len(line) > 20 && !strings.HasPrefix(line, "-----") {
			canaries["ssh key line "+string(rune('a'+i))] = line
		}
	}
	for name, v := range canaries {
		canaries[name+" (base64)"] = base64.StdEncoding.EncodeToString([]byte(v))
	}

	// Watch every process's command line while the job runs.
	var cmdlineHits sync.Map
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for !stop.Load() {
			entries, _ := os.ReadDir("/proc")
			for _, d := range entries {
				cmd, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
				if err != nil {
					continue
				}
				for name, v := range canaries {
					if strings.Contains(string(cmd), v) {
						cmdlineHits.Store(name, strings.ReplaceAll(string(cmd), "\x00", " "))
					}
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	})

	e.publish(messages.StreamAnsibleDeployQueue, &messages.AnsibleDeployMessage{
		RequestMeta: messages.RequestMeta{JobID: "deploy-1"}, ProjectID: project, RepoFullName: "acme/shop",
		Branch: "release/1.2", ServerIP: sshd.Host, Port: 8080, Modules: []string{"web", "worker"},
		GitHubTokenRef: "vault:secret/projects/" + project + "/gh#token", SecretsRef: "vault:secret/projects/" + project + "/env",
	})
	var r *messages.AnsibleDeployResult
	testenv.WaitFor(t, 3*time.Minute, "the deploy result", func() bool {
		if rs := e.deployResults("deploy-1"); len(rs) > 0 {
			r = rs[0]
			return true
		}
		return false
	})
	stop.Store(true)
	wg.Wait()
	if r.Status != messages.StatusSucceeded || r.ProjectID != project || r.Port != 8080 {
		t.Fatalf("result = %s %+v %+v", r.Status, r.Error, r.Outcome)
	}

	// The playbook got everything, secrets as environment variables only.
	var got map[string]any
	data, err := os.ReadFile(filepath.Join(e.ansibleDir, "out", "web-1.deploy.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	dotenv, err := secrets.RenderDotenv(canaryEnv)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"repo": "acme/shop", "branch": "release/1.2", "port": float64(8080),
		"modules": []any{"web", "worker"}, "project_id": project,
		"token_sha256": sha256hex(canaryToken), "env_sha256": sha256hex(string(dotenv))}
	for k, v := range want {
		if js, _ := json.Marshal(got[k]); string(js) != mustJSON(v) {
			t.Errorf("playbook saw %s = %s, want %s", k, js, mustJSON(v))
		}
	}
	if !strings.Contains(r.OutputTail, "using token "+secrets.Redacted) {
		t.Errorf("the printed token is not masked in the output tail:\n%s", r.OutputTail)
	}

	// The whole output is kept in the run log store (Postgres by default),
	// redacted like the tail, and holds the tail.
	rc, info, err := runlog.NewPostgres(e.pool, runlog.DefaultMaxBytes).Open(context.Background(), "deploy-1")
	if err != nil {
		t.Fatalf("full run log: %v", err)
	}
	full, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || info.Truncated || int64(len(full)) != info.Size {
		t.Fatalf("full run log: %v, info %+v, %d bytes", err, info, len(full))
	}
	if !strings.Contains(string(full), "using token "+secrets.Redacted) || !strings.Contains(string(full), strings.TrimSpace(r.OutputTail)) {
		t.Errorf("the full log lacks the masked token line or the tail:\n%s", full)
	}

	// Now look everywhere for the values.
	var places []string
	scanFull := string(full)
	cmdlineHits.Range(func(k, v any) bool {
		places = append(places, "process list ("+k.(string)+"): "+v.(string))
		return true
	})
	scan := func(where, text string) {
		for name, v := range canaries {
			if strings.Contains(text, v) {
				places = append(places, where+" contains the "+name)
			}
		}
	}
	scan("infra logs", p.Stderr()+p.Stdout())
	scan("the full run log", scanFull)
	for _, s := range []string{messages.StreamDeployResults, messages.ProgressStream(messages.JobKindDeploy, "deploy-1")} {
		for _, m := range e.results(s) {
			scan("stream "+s, m.Values["data"].(string))
		}
	}
	e.scanRows(func(table, row string) { scan("postgres table "+table, row) })
	for _, dir := range []string{e.runRoot, e.factCache} {
		_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			data, _ := os.ReadFile(path)
			scan("file "+path, string(data))
			return nil
		})
	}
	for _, place := range places {
		t.Error("secret leaked: " + place)
	}
	assertRunRootEmpty(t, e.runRoot)
	if s := e.server("web-1"); s.Status != store.ServerNew {
		t.Errorf("a deploy changed the server's status to %s", s.Status)
	}
}

func sha256hex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
