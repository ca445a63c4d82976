package templates

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
)

// Provider is the git hosting a trigger takes webhooks from; each signs
// them its own way.
type Provider string

// The providers, and how each proves a webhook is theirs (from their
// public documentation):
const (
	// GitHub signs the body with HMAC-SHA256 under the secret:
	// X-Hub-Signature-256: sha256=<hex>; the event is X-GitHub-Event, the
	// delivery X-GitHub-Delivery.
	GitHub Provider = "github"
	// GitLab sends the secret itself as X-Gitlab-Token (over TLS); the
	// event is X-Gitlab-Event ("Push Hook", "Tag Push Hook"), the
	// delivery X-Gitlab-Event-UUID.
	GitLab Provider = "gitlab"
	// Gitea signs the body as GitHub does, in hex without a prefix:
	// X-Gitea-Signature (newer releases also send X-Hub-Signature-256);
	// the event is X-Gitea-Event, the delivery X-Gitea-Delivery.
	Gitea Provider = "gitea"
)

// Valid reports whether p is a known provider.
func (p Provider) Valid() bool { return p == GitHub || p == GitLab || p == Gitea }

// ErrBadSignature: a webhook's signature (or token) is missing or does
// not match the trigger's secret.
var ErrBadSignature = errors.New("the webhook's signature does not match the trigger's secret")

// verify checks that body, sent with h, was signed by p with secret.
func verify(p Provider, secret string, h http.Header, body []byte) error {
	if p == GitLab {
		token := h.Get("X-Gitlab-Token")
		if token == "" || !hmac.Equal([]byte(token), []byte(secret)) {
			return ErrBadSignature
		}
		return nil
	}
	var sig string
	if p == Gitea {
		sig = h.Get("X-Gitea-Signature")
	}
	if sig == "" {
		var ok bool
		if sig, ok = strings.CutPrefix(h.Get("X-Hub-Signature-256"), "sha256="); !ok {
			return ErrBadSignature
		}
	}
	got, err := hex.DecodeString(sig)
	if err != nil {
		return ErrBadSignature
	}
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	if !hmac.Equal(got, m.Sum(nil)) {
		return ErrBadSignature
	}
	return nil
}

// Push is what a verified webhook says was pushed.
type Push struct {
	// Event is the provider's event name ("push", "Tag Push Hook", "ping").
	Event string
	// Ref is the full ref pushed (refs/heads/main, refs/tags/v1.2);
	// Branch or Tag its short name.
	Ref, Branch, Tag string
	// Commit is the commit the ref now points at ("" when deleted).
	Commit string
	// Delivery is the provider's delivery id ("" when it sends none).
	Delivery string
	// Ping: the provider is only checking the URL (GitHub's ping).
	Ping bool
}

var (
	commitRE   = regexp.MustCompile(`^[0-9a-f]{40}([0-9a-f]{24})?$`)
	deliveryRE = regexp.MustCompile(`^[A-Za-z0-9-]{1,100}$`)
	zeroCommit = regexp.MustCompile(`^0+$`)
)

// parsePush reads the push of a webhook body of p (a verified one). An
// event that is not a push, or a body that is not one, is an error saying
// so.
func parsePush(p Provider, h http.Header, body []byte) (Push, error) {
	var push Push
	var event, delivery string
	switch p {
	case GitHub:
		event, delivery = h.Get("X-GitHub-Event"), h.Get("X-GitHub-Delivery")
	case GitLab:
		event, delivery = h.Get("X-Gitlab-Event"), h.Get("X-Gitlab-Event-UUID")
	case Gitea:
		event, delivery = h.Get("X-Gitea-Event"), h.Get("X-Gitea-Delivery")
	}
	push.Event = truncate(event, 100)
	if deliveryRE.MatchString(delivery) {
		push.Delivery = delivery
	}
	switch {
	case p == GitHub && event == "ping":
		push.Ping = true
		return push, nil
	case (p == GitHub || p == Gitea) && event == "push", p == GitLab && (event == "Push Hook" || event == "Tag Push Hook"):
	default:
		return push, fmt.Errorf("the %s event %q is not a push: only pushes of branches and tags launch", p, truncate(event, 100))
	}
	var b struct {
		Ref         string  `json:"ref"`
		After       string  `json:"after"`
		CheckoutSHA *string `json:"checkout_sha"` // GitLab; null when deleted
		Deleted     bool    `json:"deleted"`      // GitHub
	}
	if strings.HasPrefix(h.Get("Content-Type"), "application/x-www-form-urlencoded") {
		// GitHub's other content type: the JSON in the payload field.
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return push, fmt.Errorf("the push is not a form: %v", err)
		}
		body = []byte(form.Get("payload"))
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return push, fmt.Errorf("the push is not JSON: %v", err)
	}
	push.Ref = truncate(b.Ref, 300)
	if branch, ok := strings.CutPrefix(b.Ref, "refs/heads/"); ok && branch != "" {
		push.Branch = branch
	} else if tag, ok := strings.CutPrefix(b.Ref, "refs/tags/"); ok && tag != "" {
		push.Tag = tag
	} else {
		return push, fmt.Errorf("the push's ref %q is neither a branch nor a tag", push.Ref)
	}
	commit := b.After
	if p == GitLab {
		if b.CheckoutSHA == nil {
			return push, nil // a deletion: no commit
		}
		commit = *b.CheckoutSHA
	}
	if b.Deleted || zeroCommit.MatchString(commit) {
		return push, nil // a deletion: no commit
	}
	if !commitRE.MatchString(commit) {
		return push, fmt.Errorf("the push's commit %q is not a commit id", truncate(commit, 64))
	}
	push.Commit = commit
	return push, nil
}
