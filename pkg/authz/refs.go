package authz

import (
	"fmt"
	"path"
	"regexp"
	"strings"

	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
)

// Placeholders of a reference template.
const (
	// PlaceholderProjectID is the request's project_id, a lower-case UUID.
	PlaceholderProjectID = "{project_id}"
	// PlaceholderProjectIDEnv is the project_id in upper case with "_" for
	// "-", for variable names: env:AUTOPROV_PROJECT_{PROJECT_ID}_TOKEN.
	PlaceholderProjectIDEnv = "{PROJECT_ID}"
)

var projectIDRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// template is one DEPLOY_SECRET_REFS entry: a reference whose path
// segments may hold placeholders and path.Match patterns, "**" as its last
// segment for any rest of one or more segments, and an optional #field
// (a pattern too); without #field any field, or none, matches.
type template struct {
	text     string
	scheme   secrets.Scheme
	segments []string // vault: mount first; env: the name
	rest     bool     // last segment was "**"
	field    string   // "" for any
	hasField bool
}

func parseTemplate(s string) (template, error) {
	t := template{text: s}
	scheme, rest, ok := strings.Cut(s, ":")
	if !ok {
		return t, fmt.Errorf("%q: want <scheme>:<path>, e.g. vault:secret/projects/{project_id}/**", s)
	}
	t.scheme = secrets.Scheme(scheme)
	switch t.scheme {
	case secrets.SchemeVault, secrets.SchemeEnv, secrets.SchemeFile:
	default:
		return t, fmt.Errorf("%q: scheme must be vault, env or file", s)
	}
	if strings.Contains(rest, "?") {
		return t, fmt.Errorf("%q: no ?version in a template (every version of an allowed secret is allowed)", s)
	}
	if p, f, ok := strings.Cut(rest, "#"); ok {
		rest, t.field, t.hasField = p, f, true
		if _, err := path.Match(f, ""); err != nil || f == "" {
			return t, fmt.Errorf("%q: bad #field pattern", s)
		}
	}
	t.segments = strings.Split(rest, "/")
	if last := t.segments[len(t.segments)-1]; last == "**" {
		t.rest = true
		t.segments = t.segments[:len(t.segments)-1]
	}
	if t.scheme == secrets.SchemeEnv && (len(t.segments) != 1 || t.rest || t.hasField) {
		return t, fmt.Errorf("%q: an env: template is one variable name (pattern), without / ** or #", s)
	}
	for _, seg := range t.segments {
		if seg == "" || seg == "**" || strings.Contains(seg, "**") {
			return t, fmt.Errorf("%q: empty segment, or ** not as the whole last segment", s)
		}
		if _, err := path.Match(seg, ""); err != nil {
			return t, fmt.Errorf("%q: bad pattern in segment %q", s, seg)
		}
	}
	if t.scheme == secrets.SchemeVault && len(t.segments) < 1+boolInt(!t.rest) {
		return t, fmt.Errorf("%q: a vault: template needs a mount and a path", s)
	}
	// The template with a sample project and no patterns must be a valid
	// reference: it checks the characters of the literal parts.
	sample := strings.NewReplacer(PlaceholderProjectID, "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f",
		PlaceholderProjectIDEnv, "9B2F4C6E_1D3A_4E5B_8C7D_0A1B2C3D4E5F", "**", "x", "*", "x", "?", "x", "[", "x", "]", "x").Replace(s)
	if _, err := secrets.ParseRef(sample); err != nil {
		return t, fmt.Errorf("%q: %v", s, err)
	}
	return t, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// match reports whether ref is allowed by the template for projectID.
func (t template) match(projectID string, ref secrets.Ref) bool {
	if ref.Scheme != t.scheme {
		return false
	}
	var segs []string
	switch ref.Scheme {
	case secrets.SchemeVault:
		segs = append([]string{ref.Mount}, strings.Split(ref.Path, "/")...)
	case secrets.SchemeEnv:
		segs = []string{ref.Path}
	default:
		segs = strings.Split(ref.Path, "/")
	}
	switch {
	case t.rest && len(segs) <= len(t.segments):
		return false // ** stands for at least one segment
	case !t.rest && len(segs) != len(t.segments):
		return false
	}
	sub := strings.NewReplacer(PlaceholderProjectID, projectID,
		PlaceholderProjectIDEnv, strings.ToUpper(strings.ReplaceAll(projectID, "-", "_")))
	for i, pat := range t.segments {
		if ok, err := path.Match(sub.Replace(pat), segs[i]); err != nil || !ok {
			return false
		}
	}
	if t.hasField {
		if ok, err := path.Match(t.field, ref.Field); err != nil || !ok || ref.Field == "" {
			return false
		}
	}
	return true
}

// RefError is a refused secret reference; its text names the reference
// (never a value) and why.
type RefError struct {
	Field  string // the request key: github_token_ref, secrets_ref
	Ref    string
	Reason string
}

func (e *RefError) Error() string {
	return fmt.Sprintf("%s %s refused: %s", e.Field, e.Ref, e.Reason)
}

// Unwrap returns ErrDenied.
func (e *RefError) Unwrap() error { return ErrDenied }

// Ref decides whether a request of project projectID (a UUID, as the wire
// contract reads it) may name ref in its field. own are the references of
// the service's own credentials (SSH_KEY_REF and the servers' ssh_key_ref):
// a reference to the same secret (scheme, mount and path; any version or
// field) is refused even when a template would allow it. It returns the
// parsed reference, or a *RefError.
func (a *Authorizer) Ref(projectID, field, ref string, own []string) (secrets.Ref, error) {
	deny := func(shown, reason string) (secrets.Ref, error) {
		return secrets.Ref{}, &RefError{Field: field, Ref: shown, Reason: reason}
	}
	r, err := secrets.ParseRef(ref)
	if err != nil {
		return deny("(unparsable)", err.Error())
	}
	if !projectIDRE.MatchString(projectID) {
		return deny(r.String(), "the request has no valid project_id")
	}
	if namesAny(r, own) {
		return deny(r.String(), "it names a credential of the service itself")
	}
	for _, t := range a.templates {
		if t.match(projectID, r) {
			return r, nil
		}
	}
	if len(a.templates) == 0 {
		return deny(r.String(), "DEPLOY_SECRET_REFS is empty: requests may name no secrets")
	}
	return deny(r.String(), "project "+projectID+" may not use it (DEPLOY_SECRET_REFS)")
}

// NamesAny reports whether ref names the same secret as one of refs (same
// scheme, mount and path, whatever version or field). An unparsable ref
// names nothing.
func NamesAny(ref string, refs []string) bool {
	r, err := secrets.ParseRef(ref)
	return err == nil && namesAny(r, refs)
}

func namesAny(r secrets.Ref, refs []string) bool {
	for _, o := range refs {
		or, err := secrets.ParseRef(o)
		if err == nil && sameSecret(r, or) {
			return true
		}
	}
	return false
}

// sameSecret reports whether a and b name the same secret, whatever
// version or field they pick.
func sameSecret(a, b secrets.Ref) bool {
	return a.Scheme == b.Scheme && a.Mount == b.Mount && path.Clean(a.Path) == path.Clean(b.Path)
}

// Templates returns the reference templates, as configured.
func (a *Authorizer) Templates() []string {
	out := make([]string, len(a.templates))
	for i, t := range a.templates {
		out[i] = t.text
	}
	return out
}
