package api_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/templates"
)

// sender posts webhooks as a git host does, from their public docs:
// GitHub signs the body (X-Hub-Signature-256: sha256=<hex HMAC-SHA256>),
// Gitea too (X-Gitea-Signature: <hex>), GitLab sends the secret itself
// (X-Gitlab-Token); each names the event and the delivery.
type sender struct {
	e        *dt.Env
	provider string
	url      string
	secret   string
	n        int
}

func hexHMAC(secret, body string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(body))
	return hex.EncodeToString(m.Sum(nil))
}

// push sends a push of ref to commit (all zeros: a deletion); event ""
// is the provider's push event.
func (s *sender) push(ref, commit, event string) (int, []byte) {
	s.n++
	body := fmt.Sprintf(`{"ref":%q,"before":"%s","after":%q,"repository":{"full_name":"acme/playbooks"},"n":%d}`,
		ref, strings.Repeat("1", 40), commit, s.n)
	return s.send(body, event, s.secret)
}

func (s *sender) send(body, event, secret string) (int, []byte) {
	delivery := fmt.Sprintf("%08d-0000-4000-8000-000000000000", s.n)
	var hdr []string
	switch s.provider {
	case "github":
		hdr = []string{"X-GitHub-Event", cmpOr(event, "push"), "X-GitHub-Delivery", delivery,
			"X-Hub-Signature-256", "sha256=" + hexHMAC(secret, body), "User-Agent", "GitHub-Hookshot/test"}
	case "gitea":
		hdr = []string{"X-Gitea-Event", cmpOr(event, "push"), "X-Gitea-Delivery", delivery, "X-Gitea-Signature", hexHMAC(secret, body)}
	case "gitlab":
		if strings.Contains(body, `"refs/tags/`) {
			event = cmpOr(event, "Tag Push Hook")
		}
		if !strings.Contains(body, `"after":"0000`) {
			body = strings.Replace(body, `"after":`, `"checkout_sha":"`+body[strings.Index(body, `"after":"`)+9:][:40]+`","after":`, 1)
		}
		hdr = []string{"X-Gitlab-Event", cmpOr(event, "Push Hook"), "X-Gitlab-Event-UUID", delivery, "X-Gitlab-Token", secret}
	}
	resp, data := s.e.Do("POST", s.url, "", body, hdr...)
	return resp.StatusCode, data
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func sha(n int) string { return fmt.Sprintf("a%039x", n) }

// TestTriggers: a template's trigger launches it when git hosting posts a
// push its filters match, verified as GitHub, GitLab and Gitea sign, with
// the pushed commit as the job's ref; a replayed body, a bad signature and
// a rotated-out secret are refused and launch nothing; a push the filters
// do not match is ignored; a revoked key's trigger is refused and says
// so. Another project sees no trigger, and no row holds a secret.
func TestTriggers(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{})
	ctx := context.Background()
	key := e.Key("trig", []auth.Scope{auth.ScopeTemplatesWrite, auth.ScopeTemplatesLaunch, auth.ScopeCredentialsWrite, auth.ScopeJobsRead}, dt.Project)
	noLaunch := e.Key("trig-nolaunch", []auth.Scope{auth.ScopeTemplatesWrite}, dt.Project)
	keyB := e.Key("trig-b", []auth.Scope{auth.ScopeTemplatesWrite, auth.ScopeTemplatesLaunch, auth.ScopeTemplatesRead}, projectB)
	sshCredential(t, e, key)
	withRef := templateBody("site")
	withRef["ask_on_launch"] = map[string]any{"ref": true}
	tpl := createTemplate(t, e, key, withRef)
	noRef := createTemplate(t, e, key, templateBody("no-ref"))
	base := "/api/v1/templates/" + tpl.ID + "/triggers"
	launch := map[string]any{"survey": map[string]any{"release": "from-git"}}

	for _, tc := range []struct {
		name, key, path string
		body            map[string]any
		status          int
		field           string
	}{
		{"a template that does not ask for the ref", key, "/api/v1/templates/" + noRef.ID + "/triggers",
			map[string]any{"name": "x", "provider": "github", "launch": launch}, 422, "template"},
		{"unknown provider", key, base, map[string]any{"name": "x", "provider": "bitbucket", "launch": launch}, 422, "provider"},
		{"bad pattern", key, base, map[string]any{"name": "x", "provider": "github", "branches": []string{"["}, "launch": launch}, 422, "branches[0]"},
		{"a fixed ref", key, base, map[string]any{"name": "x", "provider": "github", "launch": map[string]any{"ref": "main", "survey": launch["survey"]}}, 422, "launch.ref"},
		{"a launch the survey refuses", key, base, map[string]any{"name": "x", "provider": "github"}, 422, "launch.survey.release"},
		{"without templates:launch", noLaunch, base, map[string]any{"name": "x", "provider": "github", "launch": launch}, 403, ""},
		{"another project's template", keyB, base, map[string]any{"name": "x", "provider": "github", "launch": launch}, 404, ""},
	} {
		resp, body := e.Do("POST", tc.path, tc.key, tc.body)
		p := dt.JSON[api.Problem](t, body)
		if resp.StatusCode != tc.status || (tc.field != "" && (len(p.Errors) == 0 || p.Errors[0].Field != tc.field)) {
			t.Errorf("%s: %d %s, want %d naming %q", tc.name, resp.StatusCode, body, tc.status, tc.field)
		}
	}

	create := func(t *testing.T, name, provider string, branches, tags []string) *templates.Trigger {
		t.Helper()
		resp, body := e.Do("POST", base, key, map[string]any{"name": name, "provider": provider, "branches": branches, "tags": tags, "launch": launch})
		if resp.StatusCode != 201 {
			t.Fatalf("trigger %s: %d %s", name, resp.StatusCode, body)
		}
		dt.CheckSchema(t, "Trigger", body)
		tr := dt.JSON[templates.Trigger](t, body)
		if !strings.HasPrefix(tr.Secret, "trg_") || tr.URL != "/api/v1/hooks/"+tr.ID || resp.Header.Get("Cache-Control") != "no-store" {
			t.Fatalf("created %s", body)
		}
		return &tr
	}
	gh := create(t, "github", "github", []string{"main", "release/*"}, []string{"v*"})
	if resp, _ := e.Do("POST", base, key, map[string]any{"name": "github", "provider": "github", "launch": launch}); resp.StatusCode != 409 {
		t.Errorf("a second trigger of the name: %d", resp.StatusCode)
	}
	github := &sender{e: e, provider: "github", url: gh.URL, secret: gh.Secret}

	launched := func(t *testing.T, status int, body []byte, commit string) string {
		t.Helper()
		d := dt.JSON[templates.TriggerDelivery](t, body)
		if status != 202 || d.Outcome != "launched" || d.JobID == "" || d.Commit != commit {
			t.Fatalf("delivery: %d %s, want a launch of %s", status, body, commit)
		}
		m := lastJobMessage(t, e)
		if m.JobID != d.JobID || m.Source.Ref != commit || m.Options.ExtraVars["release"] != "from-git" || !strings.HasPrefix(m.CorrelationID, "trigger:") {
			t.Fatalf("queued job %s ref %q vars %v correlation %q, want %s at %s", m.JobID, m.Source.Ref, m.Options.ExtraVars, m.CorrelationID, d.JobID, commit)
		}
		resp, job := e.Do("GET", "/api/v1/jobs/"+d.JobID, key, nil)
		if resp.StatusCode != 200 || !strings.Contains(string(job), `"version":1`) || !strings.Contains(string(job), tpl.ID) {
			t.Fatalf("job: %d %s", resp.StatusCode, job)
		}
		return d.JobID
	}
	ignored := func(t *testing.T, status int, body []byte, why string) {
		t.Helper()
		d := dt.JSON[templates.TriggerDelivery](t, body)
		if status != 200 || d.Outcome != "ignored" || !strings.Contains(d.Reason, why) {
			t.Errorf("delivery: %d %s, want ignored for %q", status, body, why)
		}
	}

	t.Run("github", func(t *testing.T) {
		status, body := github.push("refs/heads/main", sha(1), "")
		launched(t, status, body, sha(1))
		queued := e.Redis.XLen(ctx, e.Streams.JobQueue).Val()

		// The same body again, under a new delivery id (not signed): a replay.
		first := fmt.Sprintf(`{"ref":%q,"before":"%s","after":%q,"repository":{"full_name":"acme/playbooks"},"n":%d}`,
			"refs/heads/main", strings.Repeat("1", 40), sha(1), 1)
		github.n = 41
		if status, body := github.send(first, "push", gh.Secret); status != 409 {
			t.Errorf("replay: %d %s", status, body)
		}
		if status, body := github.send(strings.Replace(first, `"n":1`, `"n":2`, 1), "push", "trg_not-the-secret"); status != 401 {
			t.Errorf("another secret: %d %s", status, body)
		}
		if resp, body := e.Do("POST", gh.URL, "", first, "X-GitHub-Event", "push"); resp.StatusCode != 401 {
			t.Errorf("unsigned: %d %s", resp.StatusCode, body)
		}
		if n := e.Redis.XLen(ctx, e.Streams.JobQueue).Val(); n != queued {
			t.Errorf("refused deliveries queued %d jobs", n-queued)
		}

		// The same new body at once from 8 senders: one launch.
		queued = e.Redis.XLen(ctx, e.Streams.JobQueue).Val()
		same := strings.Replace(first, sha(1), sha(8), 1)
		statuses := make(chan int, 8)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				s := &sender{e: e, provider: "github", url: gh.URL, secret: gh.Secret}
				status, _ := s.send(same, "push", gh.Secret)
				statuses <- status
			})
		}
		wg.Wait()
		close(statuses)
		counts := map[int]int{}
		for s := range statuses {
			counts[s]++
		}
		if counts[202] != 1 || counts[409] != 7 || e.Redis.XLen(ctx, e.Streams.JobQueue).Val() != queued+1 {
			t.Errorf("8 deliveries of one body at once: %v, %d jobs queued", counts, e.Redis.XLen(ctx, e.Streams.JobQueue).Val()-queued)
		}

		status, body = github.push("refs/heads/dev", sha(2), "")
		ignored(t, status, body, "matches no pattern of branches")
		status, body = github.push("refs/heads/release/2.0", sha(3), "")
		launched(t, status, body, sha(3))
		status, body = github.push("refs/tags/v2.0.0", sha(4), "")
		launched(t, status, body, sha(4))
		status, body = github.push("refs/tags/nightly", sha(5), "")
		ignored(t, status, body, "matches no pattern of tags")
		status, body = github.push("refs/heads/main", strings.Repeat("0", 40), "")
		ignored(t, status, body, "was deleted")
		status, body = github.push("refs/heads/main", sha(6), "ping")
		ignored(t, status, body, "ping")
		if status, body := github.push("refs/heads/main", sha(7), "issues"); status != 422 {
			t.Errorf("an issues event: %d %s", status, body)
		}
		if status, body := github.push("refs/heads/main", "$(reboot)", ""); status != 422 {
			t.Errorf("a commit that is not one: %d %s", status, body)
		}
	})

	t.Run("gitlab and gitea", func(t *testing.T) {
		gl := create(t, "gitlab", "gitlab", nil, nil)
		gitlab := &sender{e: e, provider: "gitlab", url: gl.URL, secret: gl.Secret}
		status, body := gitlab.push("refs/heads/feature/x", sha(11), "")
		launched(t, status, body, sha(11))
		status, body = gitlab.push("refs/tags/v1", sha(12), "")
		ignored(t, status, body, "matches no pattern of tags")
		gitlab.secret = gh.Secret // another trigger's secret
		if status, body := gitlab.push("refs/heads/main", sha(13), ""); status != 401 {
			t.Errorf("another trigger's token: %d %s", status, body)
		}

		gt := create(t, "gitea", "gitea", []string{"main"}, nil)
		gitea := &sender{e: e, provider: "gitea", url: gt.URL, secret: gt.Secret}
		status, body = gitea.push("refs/heads/main", sha(21), "")
		launched(t, status, body, sha(21))
		// A GitHub-signed body posted to the Gitea trigger with GitHub's
		// headers only: Gitea's event header is missing.
		github := &sender{e: e, provider: "github", url: gt.URL, secret: gt.Secret, n: 100}
		if status, body := github.push("refs/heads/main", sha(22), ""); status != 422 {
			t.Errorf("github headers to a gitea trigger: %d %s", status, body)
		}
	})

	t.Run("rotate", func(t *testing.T) {
		resp, body := e.Do("POST", "/api/v1/triggers/"+gh.ID+"/rotate", key, nil)
		rotated := dt.JSON[templates.Trigger](t, body)
		if resp.StatusCode != 200 || rotated.Secret == "" || rotated.Secret == gh.Secret {
			t.Fatalf("rotate: %d %s", resp.StatusCode, body)
		}
		if status, body := github.push("refs/heads/main", sha(31), ""); status != 401 {
			t.Errorf("the old secret: %d %s", status, body)
		}
		github.secret = rotated.Secret
		status, body := github.push("refs/heads/main", sha(32), "")
		launched(t, status, body, sha(32))
	})

	t.Run("no secret in a row", func(t *testing.T) {
		var rows string
		if err := e.DB.QueryRow(ctx, `SELECT COALESCE(string_agg(t::text, ' '), '') FROM job_triggers t`).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(rows, github.secret) || strings.Contains(rows, "trg_") {
			t.Errorf("a trigger row holds its secret: %s", rows)
		}
	})

	t.Run("tenants", func(t *testing.T) {
		for _, path := range []string{"/api/v1/triggers/" + gh.ID, base} {
			if resp, body := e.Do("GET", path, keyB, nil); resp.StatusCode != 404 {
				t.Errorf("another project GET %s: %d %s", path, resp.StatusCode, body)
			}
		}
		for _, path := range []string{"/api/v1/triggers/" + gh.ID + "/rotate"} {
			if resp, body := e.Do("POST", path, keyB, nil); resp.StatusCode != 404 {
				t.Errorf("another project POST %s: %d %s", path, resp.StatusCode, body)
			}
		}
		if resp, body := e.Do("DELETE", "/api/v1/triggers/"+gh.ID, keyB, nil); resp.StatusCode != 404 {
			t.Errorf("another project DELETE: %d %s", resp.StatusCode, body)
		}
		if resp, body := e.Do("POST", "/api/v1/hooks/"+strings.Repeat("0", 8)+"-0000-7000-8000-000000000000", "", "{}",
			"X-GitHub-Event", "push"); resp.StatusCode != 404 {
			t.Errorf("an unknown trigger: %d %s", resp.StatusCode, body)
		}
	})

	t.Run("deliveries shown", func(t *testing.T) {
		resp, body := e.Do("GET", "/api/v1/triggers/"+gh.ID, key, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("get: %d %s", resp.StatusCode, body)
		}
		dt.CheckSchema(t, "Trigger", body)
		tr := dt.JSON[templates.Trigger](t, body)
		outcomes := map[string]int{}
		for _, d := range tr.Recent {
			outcomes[d.Outcome]++
		}
		// main, the 8 at once, release/2.0, v2.0.0, after the rotation; dev, nightly, the deletion.
		if tr.Secret != "" || outcomes["launched"] != 5 || outcomes["ignored"] != 3 {
			t.Errorf("deliveries %v in %s", outcomes, body)
		}
		resp, body = e.Do("GET", base, key, nil)
		list := dt.JSON[api.TriggerList](t, body)
		if resp.StatusCode != 200 || len(list.Items) != 3 {
			t.Errorf("list: %d %s", resp.StatusCode, body)
		}
	})

	t.Run("revoked key", func(t *testing.T) {
		if _, err := e.DB.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE name = 'trig'`); err != nil {
			t.Fatal(err)
		}
		status, body := github.push("refs/heads/main", sha(41), "")
		if status != 422 || !strings.Contains(string(body), "revoked") {
			t.Fatalf("a revoked key's trigger: %d %s", status, body)
		}
		var outcome, reason string
		if err := e.DB.QueryRow(ctx, `SELECT outcome, reason FROM trigger_deliveries WHERE trigger_id = $1 AND commit = $2`,
			gh.ID, sha(41)).Scan(&outcome, &reason); err != nil || outcome != "refused" || !strings.Contains(reason, "revoked") {
			t.Errorf("recorded %q %q (%v)", outcome, reason, err)
		}
	})
}
