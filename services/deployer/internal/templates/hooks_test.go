package templates

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

// TestVerify checks each provider's proof against the examples of their
// public documentation: GitHub's "Validating webhook deliveries" gives the
// secret "It's a Secret to Everybody", the payload "Hello, World!" and
// its X-Hub-Signature-256; Gitea signs the same HMAC in hex without the
// prefix; GitLab sends the secret itself.
func TestVerify(t *testing.T) {
	const secret, body = "It's a Secret to Everybody", "Hello, World!"
	const sig = "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	for _, tc := range []struct {
		name   string
		p      Provider
		h      http.Header
		body   string
		wantOK bool
	}{
		{"github: the documented example", GitHub, header("X-Hub-Signature-256", "sha256="+sig), body, true},
		{"github: another body", GitHub, header("X-Hub-Signature-256", "sha256="+sig), body + " ", false},
		{"github: no prefix", GitHub, header("X-Hub-Signature-256", sig), body, false},
		{"github: the old SHA-1 header only", GitHub, header("X-Hub-Signature", "sha1=01dc10d0c83e72ed246219cdd91669667fe2ca59"), body, false},
		{"github: no signature", GitHub, header(), body, false},
		{"github: not hex", GitHub, header("X-Hub-Signature-256", "sha256=zz"), body, false},
		{"github: upper-case hex", GitHub, header("X-Hub-Signature-256", "sha256="+strings.ToUpper(sig)), body, true},
		{"gitea: its header", Gitea, header("X-Gitea-Signature", sig), body, true},
		{"gitea: the GitHub header newer releases send", Gitea, header("X-Hub-Signature-256", "sha256="+sig), body, true},
		{"gitea: a wrong signature", Gitea, header("X-Gitea-Signature", strings.Repeat("0", 64)), body, false},
		{"gitlab: the token", GitLab, header("X-Gitlab-Token", secret), body, true},
		{"gitlab: another token", GitLab, header("X-Gitlab-Token", secret+"x"), body, false},
		{"gitlab: a GitHub signature is not a token", GitLab, header("X-Hub-Signature-256", "sha256="+sig), body, false},
	} {
		err := verify(tc.p, secret, tc.h, []byte(tc.body))
		if (err == nil) != tc.wantOK {
			t.Errorf("%s: %v, want ok=%v", tc.name, err, tc.wantOK)
		}
	}
}

// TestParsePush reads the push events as each provider documents their
// bodies and headers.
func TestParsePush(t *testing.T) {
	const sha = "0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c"
	const zero = "0000000000000000000000000000000000000000"
	form := "payload=" + url.QueryEscape(`{"ref":"refs/heads/main","after":"`+sha+`"}`)
	for _, tc := range []struct {
		name    string
		p       Provider
		h       http.Header
		body    string
		want    Push
		wantErr string
	}{
		{"github branch", GitHub, header("X-GitHub-Event", "push", "X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
			`{"ref":"refs/heads/main","before":"` + zero + `","after":"` + sha + `","deleted":false}`,
			Push{Event: "push", Ref: "refs/heads/main", Branch: "main", Commit: sha, Delivery: "72d3162e-cc78-11e3-81ab-4c9367dc0958"}, ""},
		{"github tag", GitHub, header("X-GitHub-Event", "push"), `{"ref":"refs/tags/v1.2.0","after":"` + sha + `"}`,
			Push{Event: "push", Ref: "refs/tags/v1.2.0", Tag: "v1.2.0", Commit: sha}, ""},
		{"github form body", GitHub, header("X-GitHub-Event", "push", "Content-Type", "application/x-www-form-urlencoded"), form,
			Push{Event: "push", Ref: "refs/heads/main", Branch: "main", Commit: sha}, ""},
		{"github deletion", GitHub, header("X-GitHub-Event", "push"), `{"ref":"refs/heads/old","after":"` + zero + `","deleted":true}`,
			Push{Event: "push", Ref: "refs/heads/old", Branch: "old"}, ""},
		{"github ping", GitHub, header("X-GitHub-Event", "ping"), `{"zen":"Keep it logically awesome."}`,
			Push{Event: "ping", Ping: true}, ""},
		{"github issue event", GitHub, header("X-GitHub-Event", "issues"), `{}`, Push{}, "not a push"},
		{"github bad commit", GitHub, header("X-GitHub-Event", "push"), `{"ref":"refs/heads/main","after":"$(reboot)"}`, Push{}, "not a commit id"},
		{"github other ref", GitHub, header("X-GitHub-Event", "push"), `{"ref":"refs/pull/1/head","after":"` + sha + `"}`, Push{}, "neither a branch nor a tag"},
		{"github not json", GitHub, header("X-GitHub-Event", "push"), `ref=main`, Push{}, "not JSON"},
		{"gitlab push hook", GitLab, header("X-Gitlab-Event", "Push Hook", "X-Gitlab-Event-UUID", "13792a34-cac6-4fda-95a8-c58e00a3954e"),
			`{"object_kind":"push","ref":"refs/heads/main","after":"` + sha + `","checkout_sha":"` + sha + `"}`,
			Push{Event: "Push Hook", Ref: "refs/heads/main", Branch: "main", Commit: sha, Delivery: "13792a34-cac6-4fda-95a8-c58e00a3954e"}, ""},
		{"gitlab tag push hook", GitLab, header("X-Gitlab-Event", "Tag Push Hook"),
			`{"object_kind":"tag_push","ref":"refs/tags/v1","after":"` + sha + `","checkout_sha":"` + sha + `"}`,
			Push{Event: "Tag Push Hook", Ref: "refs/tags/v1", Tag: "v1", Commit: sha}, ""},
		{"gitlab deletion", GitLab, header("X-Gitlab-Event", "Push Hook"),
			`{"object_kind":"push","ref":"refs/heads/old","after":"` + zero + `","checkout_sha":null}`,
			Push{Event: "Push Hook", Ref: "refs/heads/old", Branch: "old"}, ""},
		{"gitlab merge request", GitLab, header("X-Gitlab-Event", "Merge Request Hook"), `{}`, Push{}, "not a push"},
		{"gitea push", Gitea, header("X-Gitea-Event", "push", "X-Gitea-Delivery", "f6266f16-1bf3-46a5-9ea4-602e06ead473"),
			`{"ref":"refs/heads/dev","before":"` + zero + `","after":"` + sha + `"}`,
			Push{Event: "push", Ref: "refs/heads/dev", Branch: "dev", Commit: sha, Delivery: "f6266f16-1bf3-46a5-9ea4-602e06ead473"}, ""},
		{"gitea bad delivery id is dropped", Gitea, header("X-Gitea-Event", "push", "X-Gitea-Delivery", "a b"),
			`{"ref":"refs/heads/dev","after":"` + sha + `"}`,
			Push{Event: "push", Ref: "refs/heads/dev", Branch: "dev", Commit: sha}, ""},
	} {
		got, err := parsePush(tc.p, tc.h, []byte(tc.body))
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case got != tc.want:
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestTriggerMatches(t *testing.T) {
	const sha = "0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c"
	branch := func(b string) Push { return Push{Ref: "refs/heads/" + b, Branch: b, Commit: sha} }
	tag := func(v string) Push { return Push{Ref: "refs/tags/" + v, Tag: v, Commit: sha} }
	for _, tc := range []struct {
		name           string
		branches, tags []string
		push           Push
		want           bool
	}{
		{"no filters: any branch", nil, nil, branch("feature/x"), true},
		{"no filters: no tag", nil, nil, tag("v1"), false},
		{"branch pattern", []string{"main", "release/*"}, nil, branch("release/2.0"), true},
		{"branch not matched", []string{"main", "release/*"}, nil, branch("dev"), false},
		{"a pattern does not cross a slash", []string{"release/*"}, nil, branch("release/2/x"), false},
		{"tag pattern", nil, []string{"v*"}, tag("v1.2.0"), true},
		{"tags only: no branch", nil, []string{"v*"}, branch("main"), false},
		{"tag not matched", []string{"*"}, []string{"v*"}, tag("nightly"), false},
		{"deleted", nil, nil, Push{Ref: "refs/heads/x", Branch: "x"}, false},
	} {
		tr := &Trigger{Branches: tc.branches, Tags: tc.tags}
		if got, why := tr.matches(tc.push); got != tc.want || (!got && why == "") {
			t.Errorf("%s: %v (%q), want %v", tc.name, got, why, tc.want)
		}
	}
}
