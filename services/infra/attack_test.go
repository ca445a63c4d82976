package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets/vaulttest"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/signing"
)

// The attack tests run each attack of issue 8 for real: the real infra
// binary (hardened, with runguard), real Redis and Postgres, loopback sshd
// targets, the Vault stand-in. Each checks what the attacker gets (the
// published result), what the operator sees (dead letters, the runs row),
// and that no secret reached logs, results or rows.

const attackProject = "3f1c9f2e-8a57-4d6b-9a0e-2b1f4c5d6e7f"

// deploy publishes a deploy of attackProject to ip with the given references.
func (e *e2e) deploy(jobID, ip, ghRef, envRef string) {
	e.t.Helper()
	e.publish(messages.StreamAnsibleDeployQueue, &messages.AnsibleDeployMessage{
		RequestMeta: messages.RequestMeta{JobID: jobID}, ProjectID: attackProject, RepoFullName: "acme/shop",
		Branch: "main", ServerIP: ip, Port: 8080, GitHubTokenRef: ghRef, SecretsRef: envRef,
	})
}

// waitDeploy waits for the one result of jobID.
func (e *e2e) waitDeploy(jobID string) *messages.AnsibleDeployResult {
	e.t.Helper()
	var r *messages.AnsibleDeployResult
	testenv.WaitFor(e.t, 2*time.Minute, "the result of "+jobID, func() bool {
		if rs := e.deployResults(jobID); len(rs) > 0 {
			r = rs[0]
			return true
		}
		return false
	})
	return r
}

// expect checks a result's status, kind and message (exact when exact).
func expect(t *testing.T, r *messages.AnsibleDeployResult, status messages.Status, kind messages.ErrorKind, msg string, exact bool) {
	t.Helper()
	if r.Status != status || r.Error == nil || r.Error.Kind != kind {
		t.Fatalf("result %s %+v, want %s %s", r.Status, r.Error, status, kind)
	}
	if exact && r.Error.Message != msg || !exact && !strings.Contains(r.Error.Message, msg) {
		t.Errorf("message %q, want %q (exact: %v)", r.Error.Message, msg, exact)
	}
}

// runRow checks the run row of a refused deploy: done, with the result's
// status, keyed by its kind.
func (e *e2e) runRow(t *testing.T, jobID string, status messages.Status) *store.Run {
	t.Helper()
	r := e.run(jobID)
	if r.Kind != "deploy" || r.State != store.RunDone || r.Status != string(status) {
		t.Errorf("run row of %s: kind %s state %s status %s, want deploy done %s", jobID, r.Kind, r.State, r.Status, status)
	}
	return r
}

// noDeployPlayed fails when the deploy test playbook ran anywhere.
func (e *e2e) noDeployPlayed(t *testing.T) {
	t.Helper()
	if m, _ := filepath.Glob(filepath.Join(e.ansibleDir, "out", "*.deploy.json")); len(m) > 0 {
		t.Errorf("a deploy play ran: %v", m)
	}
}

// noDeadLetters fails when infra dead-lettered a deploy: refusals are
// outcomes, recorded once, not poison.
func (e *e2e) noDeadLetters(t *testing.T) {
	t.Helper()
	if n := e.rdb.XLen(context.Background(), messages.StreamAnsibleDeployQueue+stream.DeadLetterSuffix).Val(); n != 0 {
		t.Errorf("%d dead-letter entries, want none", n)
	}
}

// sshAttempts returns infra's SSH check attempts so far (all classes).
func (p *infraProc) sshAttempts(t *testing.T) float64 {
	var n float64
	re := regexp.MustCompile(`(?m)^autoprov_ssh_attempts_total\{[^}]*\} (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(p.metrics(t), -1) {
		var v float64
		fmt.Sscan(m[1], &v)
		n += v
	}
	return n
}

// assertNowhere fails when any secret value appears in infra's logs, the
// deploy results and progress, the dead letters, or a Postgres row.
func (e *e2e) assertNowhere(t *testing.T, p *infraProc, secrets map[string]string) {
	t.Helper()
	var places []string
	scan := func(where, text string) {
		for name, v := range secrets {
			if v != "" && strings.Contains(text, v) {
				places = append(places, where+" holds the "+name)
			}
		}
	}
	scan("infra's log", p.Stderr()+p.Stdout())
	keys, _ := e.rdb.Keys(context.Background(), "*").Result()
	for _, k := range keys {
		if typ, _ := e.rdb.Type(context.Background(), k).Result(); typ != "stream" || k == messages.StreamAnsibleDeployQueue {
			continue // the request itself holds references, never values
		}
		for _, m := range e.results(k) {
			scan("stream "+k, fmt.Sprint(m.Values))
		}
	}
	e.scanRows(func(table, row string) { scan("table "+table, row) })
	for _, pl := range places {
		t.Error("secret leaked: " + pl)
	}
}

// keyLines are the base64 lines of a PEM private key: what a leak would show.
func keyLines(key []byte) map[string]string {
	out := map[string]string{}
	for i, line := range strings.Split(strings.TrimSpace(string(key)), "\n") {
		if len(line) > 20 && !strings.HasPrefix(line, "-----") {
			out[fmt.Sprintf("ssh key line %d", i)] = line
		}
	}
	return out
}

// TestAttackUnregisteredTargetGetsNoSecrets: the review's critical attack.
// A deploy names an unregistered host (a live sshd on this machine that
// would accept infra's key; no server is registered yet) and, as
// secrets_ref, the file SSH_KEY_REF names; another sends the same reference
// to a registered server. Neither reads the key: the first is refused as a
// silent host would be (no SSH attempt at all), the second as a credential
// of the service itself.
func TestAttackUnregisteredTargetGetsNoSecrets(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "infra"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "infra", "ssh_key"), sshd.ClientKey, 0o600); err != nil {
		t.Fatal(err)
	}
	p := e.infra("SECRETS_FILE_ROOT="+root, "SSH_KEY_REF=file:infra/ssh_key")

	e.deploy("steal-1", sshd.Host, "", "file:infra/ssh_key")
	r := e.waitDeploy("steal-1")
	expect(t, r, messages.StatusUnreachable, messages.KindSSHUnreachable, sshd.Host+":22 did not answer SSH", true)
	e.runRow(t, "steal-1", messages.StatusUnreachable)

	e.addServer("web-1", sshd)

	e.deploy("steal-2", sshd.Host, "", "file:infra/ssh_key")
	r = e.waitDeploy("steal-2")
	expect(t, r, messages.StatusFailed, messages.KindSecretUnavailable, "names a credential of the service itself", false)
	e.runRow(t, "steal-2", messages.StatusFailed)

	e.waitAcked(messages.StreamAnsibleDeployQueue, time.Minute)
	if n := p.sshAttempts(t); n != 0 {
		t.Errorf("%v SSH check attempts: a refused deploy dialed", n)
	}
	e.noDeployPlayed(t)
	e.noDeadLetters(t)
	e.assertNowhere(t, p, keyLines(sshd.ClientKey))
}

// TestAttackEnvTokenReference: references to the service's environment
// (its own SSH key variable, a token next to it) are off for requests.
func TestAttackEnvTokenReference(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	token := "ghp_CANARY" + testenv.Unique("tok")
	p := e.infra("AUTOPROV_SECRET_GH_TOKEN=" + token)

	e.deploy("env-1", sshd.Host, "env:AUTOPROV_SECRET_GH_TOKEN", "")
	e.deploy("env-2", sshd.Host, "", "env:AUTOPROV_SECRET_SSH_KEY")
	for _, id := range []string{"env-1", "env-2"} {
		r := e.waitDeploy(id)
		expect(t, r, messages.StatusFailed, messages.KindSecretUnavailable, "refused", false)
		e.runRow(t, id, messages.StatusFailed)
	}
	e.waitAcked(messages.StreamAnsibleDeployQueue, time.Minute)
	e.noDeployPlayed(t)
	e.noDeadLetters(t)
	secrets := keyLines(sshd.ClientKey)
	secrets["token"] = token
	e.assertNowhere(t, p, secrets)
	// Nor is the token in the environment block of the running service.
	if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.Pid())); err == nil && strings.Contains(string(env), token) {
		t.Error("the token is readable in /proc/<infra>/environ")
	}
}

// TestAttackVaultServicePathFailsBeforeAnyRequest: even when the operator's
// templates let a project name the service's Vault path (a too-wide
// DEPLOY_SECRET_REFS), the project login (its own token, policy of project
// paths only) refuses it before any request reaches Vault.
func TestAttackVaultServicePathFailsBeforeAnyRequest(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	vault := vaulttest.New(t)
	vault.Put("", "secret", "infra/ssh", map[string]any{"private_key": string(sshd.ClientKey)})
	projectToken := vault.CreateToken("", vaulttest.TokenSpec{TTL: time.Hour, Renewable: true, ReadPaths: []string{"secret/data/projects/*"}})
	p := e.infra("PROJECT_VAULT_ADDR="+vault.URL(), "PROJECT_VAULT_TOKEN="+projectToken, "DEPLOY_SECRET_REFS=vault:secret/**")
	before := vault.Count(vaulttest.EndpointKVRead)

	e.deploy("vault-1", sshd.Host, "", "vault:secret/infra/ssh#private_key")
	r := e.waitDeploy("vault-1")
	expect(t, r, messages.StatusFailed, messages.KindSecretUnavailable, "secret/infra/ssh", false)
	e.runRow(t, "vault-1", messages.StatusFailed)
	if n := vault.Count(vaulttest.EndpointKVRead) - before; n != 0 {
		t.Errorf("%d KV reads reached Vault, want none", n)
	}
	e.waitAcked(messages.StreamAnsibleDeployQueue, time.Minute)
	e.noDeployPlayed(t)
	secrets := keyLines(sshd.ClientKey)
	secrets["project vault token"] = projectToken
	e.assertNowhere(t, p, secrets)
}

// TestAttackMappedAddressKeepsPinAndLock: a registered server addressed as
// ::ffff:a.b.c.d is that server: its pinned host key is enforced (here a
// wrong one, so the deploy must fail with a mismatch instead of trusting
// the presented key), its lock taken, no new pin recorded.
func TestAttackMappedAddressKeepsPinAndLock(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	wrong := testenv.StartSSHD(t, testenv.SSHDOptions{}).HostKey
	if _, err := e.pool.Exec(context.Background(), `UPDATE servers SET host_key = $1 WHERE handle = 'web-1'`, wrong); err != nil {
		t.Fatal(err)
	}
	p := e.infra()
	e.deploy("alias-1", "::ffff:"+sshd.Host, "", "")
	r := e.waitDeploy("alias-1")
	if r.Status != messages.StatusFailed || r.Error == nil || r.Error.Kind != messages.KindHostKeyMismatch {
		t.Fatalf("result %s %+v, want failed host_key_mismatch (the pin of web-1 enforced)", r.Status, r.Error)
	}
	row := e.runRow(t, "alias-1", messages.StatusFailed)
	if row.Target != "server:web-1" || row.ServerHandle != "web-1" {
		t.Errorf("run row target %q server %q, want the lock of web-1", row.Target, row.ServerHandle)
	}
	var pins int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM host_keys`).Scan(&pins); err != nil || pins != 0 {
		t.Errorf("%d unregistered host pins (%v), want none", pins, err)
	}
	if s := e.server("web-1"); s.HostKey != wrong {
		t.Errorf("web-1's pin changed to %q", s.HostKey)
	}

	// With the right pin, the alias deploys to web-1, as web-1.
	if _, err := e.pool.Exec(context.Background(), `UPDATE servers SET host_key = $1 WHERE handle = 'web-1'`, sshd.HostKey); err != nil {
		t.Fatal(err)
	}
	e.deploy("alias-2", "::ffff:"+sshd.Host, "", "")
	if r := e.waitDeploy("alias-2"); r.Status != messages.StatusSucceeded {
		t.Fatalf("result %s %+v", r.Status, r.Error)
	}
	if _, err := os.Stat(filepath.Join(e.ansibleDir, "out", "web-1.deploy.json")); err != nil {
		t.Errorf("the deploy did not run as web-1: %v", err)
	}
	e.noDeadLetters(t)
	e.assertNowhere(t, p, keyLines(sshd.ClientKey))
}

// TestAttackUnsignedProducerRefused: with request signing required, an
// entry no known producer signed (unsigned, or signed with a key infra does
// not know) is dead-lettered without a result, a run or a play, even though
// its writer had Redis access; a signed one is handled.
func TestAttackUnsignedProducerRefused(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	e.addServer("web-1", sshd)
	key := testenv.Unique("deployer-key-0123456789abcdef0123456789")
	p := e.infra("REQUEST_SIGNATURES=require",
		"REQUEST_KEYS=deployer-1@"+messages.StreamAnsibleDeployQueue+"=env:AUTOPROV_SECRET_DEPLOYER_KEY",
		"AUTOPROV_SECRET_DEPLOYER_KEY="+key)

	e.deploy("unsigned-1", sshd.Host, "", "")
	forged := stream.NewProducer(e.rdb, stream.ProducerOptions{Sign: func(s string, data []byte) (string, error) {
		return messages.Sign("deployer-1", []byte("not the key, but just as long as one"), s, data)
	}})
	signed := stream.NewProducer(e.rdb, stream.ProducerOptions{Sign: func(s string, data []byte) (string, error) {
		return messages.Sign("deployer-1", []byte(key), s, data)
	}})
	for pr, id := range map[*stream.Producer]string{forged: "forged-1", signed: "signed-1"} {
		data, err := messages.Encode(&messages.AnsibleDeployMessage{
			RequestMeta: messages.RequestMeta{JobID: id}, ProjectID: attackProject, RepoFullName: "acme/shop",
			Branch: "main", ServerIP: sshd.Host, Port: 8080,
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pr.Publish(context.Background(), messages.StreamAnsibleDeployQueue, data); err != nil {
			t.Fatal(err)
		}
	}
	if r := e.waitDeploy("signed-1"); r.Status != messages.StatusSucceeded {
		t.Fatalf("signed deploy: %s %+v", r.Status, r.Error)
	}
	e.waitAcked(messages.StreamAnsibleDeployQueue, time.Minute)
	dead := e.results(messages.StreamAnsibleDeployQueue + stream.DeadLetterSuffix)
	reasons := map[string]bool{}
	for _, d := range dead {
		reasons[fmt.Sprint(d.Values[stream.DeadFieldReason])] = true
	}
	if len(dead) != 2 || !reasons[signing.ReasonUnsigned] || !reasons[signing.ReasonBadSignature] {
		t.Errorf("dead letters %v, want one unsigned and one bad_signature", reasons)
	}
	for _, id := range []string{"unsigned-1", "forged-1"} {
		if rs := e.deployResults(id); len(rs) != 0 {
			t.Errorf("%s: %d results, want none", id, len(rs))
		}
		if _, err := store.GetRun(context.Background(), e.pool, id); err == nil {
			t.Errorf("%s: a run row exists", id)
		}
	}
	e.assertNowhere(t, p, map[string]string{"producer key": key, "producer key (hex)": hex.EncodeToString([]byte(key))})
}

// TestAttackMetadataAddressNoPacket: the cloud metadata address, plain or
// mapped into IPv6, is refused before any dial: no SSH attempt is made, and
// the requester hears what a silent host would say.
func TestAttackMetadataAddressNoPacket(t *testing.T) {
	t.Parallel()
	e := newE2E(t, nil)
	e.sshKey = []byte(testenv.Unique("not-a-key"))
	// Even an operator allow-list containing it cannot let it through.
	p := e.infra("DEPLOY_ALLOW_NETWORKS=169.254.0.0/16,0.0.0.0/0")
	e.deploy("meta-1", "169.254.169.254", "", "")
	e.deploy("meta-2", "::ffff:169.254.169.254", "", "")
	for _, id := range []string{"meta-1", "meta-2"} {
		r := e.waitDeploy(id)
		expect(t, r, messages.StatusUnreachable, messages.KindSSHUnreachable, "169.254.169.254:22 did not answer SSH", true)
		if r.Attempt != 1 || r.Playbook != "deploy_project.yml" {
			t.Errorf("%s: attempt %d playbook %q: a refusal must look like a silent host's result", id, r.Attempt, r.Playbook)
		}
		e.runRow(t, id, messages.StatusUnreachable)
	}
	e.waitAcked(messages.StreamAnsibleDeployQueue, time.Minute)
	if n := p.sshAttempts(t); n != 0 {
		t.Errorf("%v SSH check attempts, want none: the refusal must come before any dial", n)
	}
	if !strings.Contains(p.Stderr(), "deploy target refused") {
		t.Error("the operator's log does not say why the target was refused")
	}
	e.noDeployPlayed(t)
	e.noDeadLetters(t)
}
