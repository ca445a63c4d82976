package cli

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// githubPush delivers a push of commit to main at url as GitHub signs it
// (X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>) with secret,
// and returns the answer's status and body.
func githubPush(t *testing.T, url, secret, commit string) (int, string) {
	t.Helper()
	body := fmt.Sprintf(`{"ref":"refs/heads/main","before":"%040d","after":%q,"repository":{"full_name":"org/pb"}}`, 0, commit)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(body))
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", "push")
	req.Header.Set("X-GitHub-Delivery", "d-"+commit[:8])
	req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac.Sum(nil)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// hookOf reads the url and the secret trigger create (or rotate) prints.
func hookOf(t *testing.T, stdout string) (url, secret string) {
	t.Helper()
	u := regexp.MustCompile(`(?m)^  url: (\S+)$`).FindStringSubmatch(stdout)
	s := regexp.MustCompile(`(?m)^  secret: (\S+)$`).FindStringSubmatch(stdout)
	if u == nil || s == nil {
		t.Fatalf("no url or secret in:\n%s", stdout)
	}
	return u[1], s[1]
}

// TestTriggerCommands: `autoprov trigger` against the real deployer: create
// prints the hook URL and the secret, and a push GitHub would sign with
// that secret to that URL launches the template on the pushed commit;
// show lists the delivery; rotate prints a new secret and the old one
// stops verifying; list, delete. A provider the API does not know names
// the field; a key of another project finds none of it.
func TestTriggerCommands(t *testing.T) {
	t.Parallel()
	d := startDeployer(t)
	env := d.cliEnv(d.key(t, "templates:write,templates:launch", testProject))
	tpl := createTemplate(t, env)

	stdout, stderr, code := run(t, env, "trigger", "create", tpl, "--name", "on-push", "--provider", "github",
		"--branch", "main", "--branch", "release/*", "--set", "replicas=2")
	if code != 0 || !strings.Contains(stdout, "trigger on-push ") || !strings.Contains(stdout, "launches on a push of: branches main,release/*") ||
		!strings.Contains(stdout, "shown only now") {
		t.Fatalf("trigger create: %d %s %s", code, stdout, stderr)
	}
	id := strings.TrimSuffix(strings.Fields(stdout)[2], ":")
	url, secret := hookOf(t, stdout)
	if url != "http://"+d.api+"/api/v1/hooks/"+id {
		t.Errorf("url %s", url)
	}

	commit := strings.Repeat("ab", 20)
	if status, body := githubPush(t, url, secret, commit); status != http.StatusAccepted || !strings.Contains(body, `"launched"`) {
		t.Fatalf("a push signed with the secret printed: %d %s", status, body)
	}
	entries, err := d.rdb.XRange(context.Background(), messages.StreamAnsibleJobQueue, "-", "+").Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("%d entries on the job queue (%v)", len(entries), err)
	}
	data, _ := entries[0].Values[messages.DataField].(string)
	m, err := messages.DecodeAnsibleJobMessage([]byte(data))
	if err != nil || m.Source.Ref != commit || m.Options.ExtraVars["replicas"] != int64(2) {
		t.Errorf("the job launched: %+v %v", m, err)
	}
	if stdout, stderr, code := run(t, env, "trigger", "show", id); code != 0 || !strings.Contains(stdout, "recent:") ||
		!strings.Contains(stdout, "refs/heads/main") || !strings.Contains(stdout, "launched") || strings.Contains(stdout, secret) {
		t.Errorf("trigger show: %d %s %s", code, stdout, stderr)
	}

	stdout, stderr, code = run(t, env, "trigger", "rotate", id)
	if code != 0 {
		t.Fatalf("trigger rotate: %d %s %s", code, stdout, stderr)
	}
	if _, rotated := hookOf(t, stdout); rotated == secret {
		t.Errorf("rotate printed the same secret")
	} else {
		if status, body := githubPush(t, url, secret, strings.Repeat("cd", 20)); status != http.StatusUnauthorized {
			t.Errorf("a push signed with the old secret: %d %s", status, body)
		}
		if status, body := githubPush(t, url, rotated, strings.Repeat("ef", 20)); status != http.StatusAccepted {
			t.Errorf("a push signed with the new secret: %d %s", status, body)
		}
	}

	if stdout, stderr, code := run(t, env, "trigger", "list", tpl); code != 0 || !strings.Contains(stdout, url) || strings.Contains(stdout, secret) {
		t.Errorf("trigger list: %d %s %s", code, stdout, stderr)
	}
	if _, stderr, code := run(t, env, "trigger", "create", tpl, "--name", "other", "--provider", "bitbucket"); code != ExitFailed ||
		!strings.Contains(stderr, "create the trigger: HTTP 422") || !strings.Contains(stderr, "\n  provider: ") {
		t.Errorf("an unknown provider: %d %s", code, stderr)
	}

	other := d.cliEnv(d.key(t, "templates:write,templates:launch", "0c9d8e7f-6a5b-4c3d-9e2f-1a0b9c8d7e6f"))
	for _, args := range [][]string{{"trigger", "list", tpl}, {"trigger", "show", id}, {"trigger", "rotate", id}, {"trigger", "delete", id},
		{"trigger", "create", tpl, "--name", "mine", "--provider", "gitlab"}} {
		if _, stderr, code := run(t, other, args...); code != ExitFailed || !strings.Contains(stderr, "HTTP 404") {
			t.Errorf("%v with another project's key: %d %s", args, code, stderr)
		}
	}

	if stdout, stderr, code := run(t, env, "trigger", "delete", id); code != 0 || stdout != "trigger "+id+" deleted\n" {
		t.Errorf("trigger delete: %d %s %s", code, stdout, stderr)
	}
	if stdout, stderr, code := run(t, env, "--json", "trigger", "list", tpl); code != 0 || !json.Valid([]byte(stdout)) ||
		strings.Contains(stdout, id) {
		t.Errorf("trigger list after the delete: %d %s %s", code, stdout, stderr)
	}
}
