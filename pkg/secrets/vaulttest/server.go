// Package vaulttest is an httptest stand-in for the part of HashiCorp
// Vault's HTTP API that pkg/secrets uses, for tests on machines where Vault
// cannot run. It follows Vault's API documentation (developer.hashicorp.com
// /vault/api-docs: secret/kv/kv-v2, auth/approle, auth/token):
//
//	POST /v1/auth/<approle-mount>/login    AppRole login
//	GET  /v1/auth/token/lookup-self        token lookup
//	POST /v1/auth/token/renew-self         token renewal (increment, max TTL)
//	GET  /v1/<kv-mount>/data/<path>        KV v2 read (?version=)
//	POST /v1/<kv-mount>/data/<path>        KV v2 write ({"data": {...}})
//
// with Vault's response envelope (request_id, lease_id, renewable,
// lease_duration, data, wrap_info, warnings, auth), X-Vault-Token checks
// (missing, unknown, expired or revoked token: 403 {"errors":["permission
// denied"]}), X-Vault-Namespace, and Vault's error shapes. Tests put
// secrets, create tokens and AppRoles, expire tokens, seal the server and
// count requests per endpoint. Where the stand-in's behaviour is a guess
// rather than documented, a comment says so.
package vaulttest

import (
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock"
)

// Endpoint names a counted kind of request.
type Endpoint string

// Counted endpoints.
const (
	EndpointAppRoleLogin Endpoint = "approle-login"
	EndpointLookupSelf   Endpoint = "lookup-self"
	EndpointRenewSelf    Endpoint = "renew-self"
	EndpointKVRead       Endpoint = "kv-read"
	EndpointKVWrite      Endpoint = "kv-write"
	EndpointOther        Endpoint = "other"
)

// TokenSpec describes a token created with [Server.CreateToken].
type TokenSpec struct {
	// TTL is the token's lease; 0 makes a token that never expires (like
	// a root token: lookup-self reports ttl 0 and expire_time null).
	TTL time.Duration
	// MaxTTL caps renewals; 0 means no cap.
	MaxTTL time.Duration
	// Renewable allows renew-self.
	Renewable bool
	// Policies are reported by lookup-self and login (informational).
	Policies []string
	// ReadPaths, when not nil, is the token's ACL: KV reads are allowed
	// only on API paths ("secret/data/app") equal to an entry, or starting
	// with an entry's text before a trailing "*". Others get Vault's ACL
	// denial.
	ReadPaths []string
	// WritePaths is the token's ACL for KV writes, as ReadPaths is for
	// reads; nil allows none.
	WritePaths []string
}

// AppRole is an AppRole known to the stand-in.
type AppRole struct {
	Name     string
	RoleID   string
	SecretID string
	// Token is the spec of the tokens a login issues.
	Token TokenSpec
}

// Server is the stand-in. Create it with [New].
type Server struct {
	srv   *httptest.Server
	clock clock.Clock

	mu         sync.Mutex
	namespaces map[string]*namespace
	tokens     map[string]*token
	counts     map[Endpoint]int
	sealed     bool
}

type namespace struct {
	kv      map[string]*kvMount
	approle map[string]map[string]AppRole // mount -> role_id -> role
}

type kvMount struct {
	secrets map[string][]kvVersion
}

type kvVersion struct {
	data    map[string]any
	created time.Time
}

type token struct {
	id, accessor string
	ns           string
	spec         TokenSpec
	path         string
	meta         map[string]string
	issued       time.Time
	expires      time.Time // zero: never
	maxExpires   time.Time // zero: no cap
	revoked      bool
}

// Option configures a Server.
type Option func(*options)

type options struct {
	clock clock.Clock
	tls   bool
}

// WithClock makes the server measure token lifetimes with c (typically a
// *clocktest.Fake shared with the code under test).
func WithClock(c clock.Clock) Option { return func(o *options) { o.clock = c } }

// WithTLS serves HTTPS with a self-signed certificate; see
// [Server.CACertFile].
func WithTLS() Option { return func(o *options) { o.tls = true } }

// New starts a stand-in with a KV v2 engine mounted at "secret" in the root
// namespace (as a Vault dev server has) and closes it when the test ends.
func New(t testing.TB, opts ...Option) *Server {
	t.Helper()
	o := options{clock: clock.System()}
	for _, opt := range opts {
		opt(&o)
	}
	s := &Server{
		clock:      o.clock,
		namespaces: map[string]*namespace{"": newNamespace()},
		tokens:     make(map[string]*token),
		counts:     make(map[Endpoint]int),
	}
	s.EnableKV("", "secret")
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serveHTTP))
	// TLS handshake failures are expected in tests of VAULT_CACERT.
	s.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	if o.tls {
		s.srv.StartTLS()
	} else {
		s.srv.Start()
	}
	t.Cleanup(s.srv.Close)
	return s
}

func newNamespace() *namespace {
	return &namespace{kv: make(map[string]*kvMount), approle: make(map[string]map[string]AppRole)}
}

// URL is the server's address, for VAULT_ADDR.
func (s *Server) URL() string { return s.srv.URL }

// Client returns an HTTP client that trusts the server (for WithTLS).
func (s *Server) Client() *http.Client { return s.srv.Client() }

// CACertFile writes the server's certificate (its own CA) as PEM to a file
// in dir and returns the path, for VAULT_CACERT. Only with WithTLS.
func (s *Server) CACertFile(t testing.TB, dir string) string {
	t.Helper()
	cert := s.srv.Certificate()
	if cert == nil {
		t.Fatal("vaulttest: CACertFile needs WithTLS")
	}
	p := filepath.Join(dir, "vault-ca.pem")
	b := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// CreateNamespace creates a namespace (Vault Enterprise) with a KV v2
// engine at "secret".
func (s *Server) CreateNamespace(ns string) {
	s.mu.Lock()
	ns = normNS(ns)
	if _, ok := s.namespaces[ns]; !ok {
		s.namespaces[ns] = newNamespace()
	}
	s.mu.Unlock()
	s.EnableKV(ns, "secret")
}

// EnableKV mounts a KV v2 engine at mount in namespace ns ("" is root).
func (s *Server) EnableKV(ns, mount string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.mustNS(ns)
	if _, ok := n.kv[mount]; !ok {
		n.kv[mount] = &kvMount{secrets: make(map[string][]kvVersion)}
	}
}

// Put writes a new version of the secret at mount/path in namespace ns
// and returns its version number (1 for a new secret).
func (s *Server) Put(ns, mount, path string, data map[string]any) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.mustNS(ns).kv[mount]
	if !ok {
		panic(fmt.Sprintf("vaulttest: no KV mount %q in namespace %q", mount, ns))
	}
	cp := make(map[string]any, len(data))
	for k, v := range data {
		cp[k] = v
	}
	m.secrets[path] = append(m.secrets[path], kvVersion{data: cp, created: s.clock.Now()})
	return len(m.secrets[path])
}

// AddAppRole enables AppRole at mount in namespace ns (when not yet) and
// adds the role.
func (s *Server) AddAppRole(ns, mount string, r AppRole) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.mustNS(ns)
	if n.approle[mount] == nil {
		n.approle[mount] = make(map[string]AppRole)
	}
	if r.Name == "" {
		r.Name = "role"
	}
	n.approle[mount][r.RoleID] = r
}

// CreateToken issues a token in namespace ns and returns it.
func (s *Server) CreateToken(ns string, spec TokenSpec) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mustNS(ns)
	return s.issueLocked(normNS(ns), spec, "auth/token/create", nil).id
}

// ExpireToken makes the token invalid, as if its TTL had run out.
func (s *Server) ExpireToken(tok string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.tokens[tok]; ok {
		t.revoked = true
	}
}

// ExpireAllTokens makes every token issued so far invalid.
func (s *Server) ExpireAllTokens() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.tokens {
		t.revoked = true
	}
}

// TokenValid reports whether tok is a live token.
func (s *Server) TokenValid(tok string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tokens[tok]
	return ok && s.liveLocked(t)
}

// LiveTokens returns the number of live tokens.
func (s *Server) LiveTokens() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, t := range s.tokens {
		if s.liveLocked(t) {
			n++
		}
	}
	return n
}

// IssuedTokens returns every token the server has issued, live or not, so
// tests can check that none of them leaked into logs or errors.
func (s *Server) IssuedTokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.tokens))
	for id := range s.tokens {
		out = append(out, id)
	}
	return out
}

// SetSealed seals or unseals the server: sealed, it answers every request
// with 503 {"errors":["Vault is sealed"]}.
func (s *Server) SetSealed(sealed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sealed = sealed
}

// Count returns how many requests reached endpoint e.
func (s *Server) Count(e Endpoint) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[e]
}

func (s *Server) mustNS(ns string) *namespace {
	n, ok := s.namespaces[normNS(ns)]
	if !ok {
		panic(fmt.Sprintf("vaulttest: no namespace %q (CreateNamespace first)", ns))
	}
	return n
}

func normNS(ns string) string { return strings.Trim(ns, "/") }

func (s *Server) issueLocked(ns string, spec TokenSpec, path string, meta map[string]string) *token {
	now := s.clock.Now()
	t := &token{
		id:       "hvs." + randomString(24),
		accessor: randomString(24),
		ns:       ns,
		spec:     spec,
		path:     path,
		meta:     meta,
		issued:   now,
	}
	if spec.TTL > 0 {
		t.expires = now.Add(spec.TTL)
		if spec.MaxTTL > 0 {
			t.maxExpires = now.Add(spec.MaxTTL)
			if t.expires.After(t.maxExpires) {
				t.expires = t.maxExpires
			}
		}
	}
	s.tokens[t.id] = t
	return t
}

func (s *Server) liveLocked(t *token) bool {
	if t.revoked {
		return false
	}
	return t.expires.IsZero() || s.clock.Now().Before(t.expires)
}

// envelope is Vault's response body (api-docs, "Sample response"):
// absent parts are null, never omitted. vault-client-go needs "data"
// present (even null) to decode "auth".
type envelope struct {
	RequestID     string   `json:"request_id"`
	LeaseID       string   `json:"lease_id"`
	Renewable     bool     `json:"renewable"`
	LeaseDuration int      `json:"lease_duration"`
	Data          any      `json:"data"`
	WrapInfo      any      `json:"wrap_info"`
	Warnings      []string `json:"warnings"`
	Auth          any      `json:"auth"`
	MountType     string   `json:"mount_type"`
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// writeErrors writes Vault's error shape {"errors":[...]}; an empty list
// is [] (a missing KV secret answers 404 {"errors":[]}).
func writeErrors(w http.ResponseWriter, status int, msgs ...string) {
	if msgs == nil {
		msgs = []string{}
	}
	writeJSON(w, status, map[string][]string{"errors": msgs})
}

const (
	msgDenied = "permission denied"
	// Vault's ACL denial of a valid token is a multierror; this is its text
	// as Vault 1.x prints it, to the best of our knowledge.
	msgACLDenied = "1 error occurred:\n\t* permission denied\n\n"
)

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), "/v1/")
	if !ok {
		s.counts[EndpointOther]++
		http.NotFound(w, r)
		return
	}
	if s.sealed {
		s.counts[EndpointOther]++
		writeErrors(w, http.StatusServiceUnavailable, "Vault is sealed")
		return
	}
	nsName := normNS(r.Header.Get("X-Vault-Namespace"))
	ns, ok := s.namespaces[nsName]
	if !ok {
		s.counts[EndpointOther]++
		// Unsure: Vault Enterprise rejects an unknown namespace; the
		// exact status and text are not documented. Vault OSS has no
		// namespaces at all.
		writeErrors(w, http.StatusNotFound, "namespace not found")
		return
	}

	switch {
	case rest == "auth/token/lookup-self":
		s.counts[EndpointLookupSelf]++
		if r.Method != http.MethodGet {
			writeErrors(w, http.StatusMethodNotAllowed, "unsupported operation")
			return
		}
		if t := s.authLocked(w, r, nsName); t != nil {
			s.lookupSelf(w, t)
		}
		return
	case rest == "auth/token/renew-self":
		s.counts[EndpointRenewSelf]++
		if r.Method != http.MethodPost && r.Method != http.MethodPut {
			writeErrors(w, http.StatusMethodNotAllowed, "unsupported operation")
			return
		}
		if t := s.authLocked(w, r, nsName); t != nil {
			s.renewSelf(w, r, t)
		}
		return
	}
	if mount, ok := loginMount(rest); ok {
		if roles, ok := ns.approle[mount]; ok {
			s.counts[EndpointAppRoleLogin]++
			if r.Method != http.MethodPost && r.Method != http.MethodPut {
				writeErrors(w, http.StatusMethodNotAllowed, "unsupported operation")
				return
			}
			s.appRoleLogin(w, r, nsName, mount, roles)
			return
		}
	}

	segs := strings.Split(rest, "/")
	if len(segs) >= 3 && segs[1] == "data" {
		if kv, ok := ns.kv[segs[0]]; ok {
			if r.Method == http.MethodPost || r.Method == http.MethodPut {
				s.counts[EndpointKVWrite]++
				if t := s.authLocked(w, r, nsName); t != nil {
					s.kvWrite(w, r, t, segs[0], segs[2:], kv)
				}
				return
			}
			s.counts[EndpointKVRead]++
			t := s.authLocked(w, r, nsName)
			if t == nil {
				return
			}
			if r.Method != http.MethodGet {
				writeErrors(w, http.StatusMethodNotAllowed, "unsupported operation")
				return
			}
			s.kvRead(w, r, t, segs[0], segs[2:], kv)
			return
		}
	}
	s.counts[EndpointOther]++
	// Vault checks the token before routing: without a valid token every
	// path is denied; with one, an unknown mount has no handler.
	if s.authLocked(w, r, nsName) == nil {
		return
	}
	writeErrors(w, http.StatusNotFound, fmt.Sprintf("no handler for route %q. route entry not found.", rest))
}

// loginMount returns <mount> for "auth/<mount>/login".
func loginMount(rest string) (string, bool) {
	p, ok := strings.CutPrefix(rest, "auth/")
	if !ok {
		return "", false
	}
	mount, ok := strings.CutSuffix(p, "/login")
	if !ok || mount == "" || strings.Contains(mount, "/") {
		return "", false
	}
	return mount, true
}

// authLocked returns the request's live token in namespace ns, or writes
// Vault's 403 and returns nil.
func (s *Server) authLocked(w http.ResponseWriter, r *http.Request, ns string) *token {
	t, ok := s.tokens[r.Header.Get("X-Vault-Token")]
	// Tokens are bound to the namespace they were issued in (Vault also
	// lets a parent namespace's token into child namespaces; not modelled).
	if !ok || !s.liveLocked(t) || t.ns != ns {
		writeErrors(w, http.StatusForbidden, msgDenied)
		return nil
	}
	return t
}

func (s *Server) appRoleLogin(w http.ResponseWriter, r *http.Request, ns, mount string, roles map[string]AppRole) {
	var body struct {
		RoleID   string `json:"role_id"`
		SecretID string `json:"secret_id"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		writeErrors(w, http.StatusBadRequest, "failed to parse JSON input")
		return
	}
	if body.RoleID == "" {
		// Vault answers "missing role_id" (as a 400 here; the exact
		// status code is not documented).
		writeErrors(w, http.StatusBadRequest, "missing role_id")
		return
	}
	role, ok := roles[body.RoleID]
	if !ok || body.SecretID != role.SecretID {
		writeErrors(w, http.StatusBadRequest, "invalid role or secret ID")
		return
	}
	t := s.issueLocked(ns, role.Token, "auth/"+mount+"/login", map[string]string{"role_name": role.Name})
	writeJSON(w, http.StatusOK, envelope{
		RequestID: randomUUID(),
		Auth:      s.authSection(t, t.id),
		MountType: "approle",
	})
}

// authSection is the "auth" object of login and renew responses.
func (s *Server) authSection(t *token, clientToken string) map[string]any {
	policies := append([]string{"default"}, t.spec.Policies...)
	return map[string]any{
		"client_token":    clientToken,
		"accessor":        t.accessor,
		"policies":        policies,
		"token_policies":  policies,
		"metadata":        t.meta,
		"lease_duration":  s.ttlSeconds(t),
		"renewable":       t.spec.Renewable,
		"entity_id":       "",
		"token_type":      "service",
		"orphan":          true,
		"mfa_requirement": nil,
		"num_uses":        0,
	}
}

// ttlSeconds is the token's remaining lease in whole seconds; 0 when it
// never expires.
func (s *Server) ttlSeconds(t *token) int {
	if t.expires.IsZero() {
		return 0
	}
	d := t.expires.Sub(s.clock.Now())
	if d < 0 {
		return 0
	}
	return int(d / time.Second)
}

func (s *Server) lookupSelf(w http.ResponseWriter, t *token) {
	policies := append([]string{"default"}, t.spec.Policies...)
	var expire any
	if !t.expires.IsZero() {
		expire = t.expires.UTC().Format(time.RFC3339Nano)
	}
	data := map[string]any{
		"accessor":         t.accessor,
		"creation_time":    t.issued.Unix(),
		"creation_ttl":     int(t.spec.TTL / time.Second),
		"display_name":     "token",
		"entity_id":        "",
		"expire_time":      expire,
		"explicit_max_ttl": int(t.spec.MaxTTL / time.Second),
		"id":               t.id,
		"issue_time":       t.issued.UTC().Format(time.RFC3339Nano),
		"meta":             t.meta,
		"num_uses":         0,
		"orphan":           true,
		"path":             t.path,
		"policies":         policies,
		"renewable":        t.spec.Renewable,
		"ttl":              s.ttlSeconds(t),
		"type":             "service",
	}
	writeJSON(w, http.StatusOK, envelope{RequestID: randomUUID(), Data: data, MountType: "token"})
}

func (s *Server) renewSelf(w http.ResponseWriter, r *http.Request, t *token) {
	var body struct {
		Increment json.RawMessage `json:"increment"`
	}
	if r.ContentLength != 0 {
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			writeErrors(w, http.StatusBadRequest, "failed to parse JSON input")
			return
		}
	}
	incr, err := parseIncrement(body.Increment)
	if err != nil {
		writeErrors(w, http.StatusBadRequest, err.Error())
		return
	}
	if !t.spec.Renewable || t.expires.IsZero() {
		// Vault's expiration manager: "lease is not renewable" with
		// logical.ErrInvalidRequest, i.e. 400. Unsure: what Vault
		// answers for a token without TTL (root); we answer the same.
		writeErrors(w, http.StatusBadRequest, "lease is not renewable")
		return
	}
	if incr == 0 {
		incr = t.spec.TTL // "If not supplied, Vault will use the default TTL"
	}
	now := s.clock.Now()
	var warnings []string
	exp := now.Add(incr)
	if !t.maxExpires.IsZero() && exp.After(t.maxExpires) {
		exp = t.maxExpires
		// Wording as Vault's TTL capping warning, to the best of our
		// knowledge; clients must not depend on it.
		warnings = append(warnings, fmt.Sprintf("TTL of %q exceeded the effective max_ttl of %q; TTL value is capped accordingly",
			incr.String(), t.maxExpires.Sub(now).Truncate(time.Second).String()))
	}
	t.expires = exp
	writeJSON(w, http.StatusOK, envelope{
		RequestID: randomUUID(),
		Warnings:  warnings,
		Auth:      s.authSection(t, t.id),
		MountType: "token",
	})
}

// parseIncrement accepts what Vault's parseutil.ParseDurationSecond does:
// a JSON number of seconds, or a string holding seconds ("3600") or a
// duration ("1h", "3600s").
func parseIncrement(raw json.RawMessage) (time.Duration, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err == nil {
		if secs, err := n.Int64(); err == nil {
			return time.Duration(secs) * time.Second, nil
		}
	}
	var str string
	if err := json.Unmarshal(raw, &str); err != nil {
		return 0, fmt.Errorf("invalid increment")
	}
	if str == "" {
		return 0, nil
	}
	if secs, err := strconv.ParseInt(str, 10, 64); err == nil {
		return time.Duration(secs) * time.Second, nil
	}
	d, err := time.ParseDuration(str)
	if err != nil {
		return 0, fmt.Errorf("invalid increment")
	}
	return d, nil
}

func (s *Server) kvRead(w http.ResponseWriter, r *http.Request, t *token, mount string, escaped []string, kv *kvMount) {
	// Vault does not treat an escaped slash (%2F) as a separator: such a
	// path names no secret (hashicorp/vault#31721, vault-client-go#267).
	for _, seg := range escaped {
		if strings.Contains(strings.ToUpper(seg), "%2F") {
			writeErrors(w, http.StatusNotFound)
			return
		}
	}
	segs := make([]string, len(escaped))
	for i, seg := range escaped {
		u, err := url.PathUnescape(seg)
		if err != nil || u == "" {
			writeErrors(w, http.StatusNotFound)
			return
		}
		segs[i] = u
	}
	path := strings.Join(segs, "/")
	if !aclAllows(t.spec.ReadPaths, mount+"/data/"+path) {
		writeErrors(w, http.StatusForbidden, msgACLDenied)
		return
	}
	versions := kv.secrets[path]
	if len(versions) == 0 {
		writeErrors(w, http.StatusNotFound)
		return
	}
	n := len(versions)
	if q := r.URL.Query().Get("version"); q != "" && q != "0" {
		v, err := strconv.Atoi(q)
		if err != nil || v < 0 {
			writeErrors(w, http.StatusBadRequest, "invalid version")
			return
		}
		if v > len(versions) {
			writeErrors(w, http.StatusNotFound)
			return
		}
		n = v
	}
	ver := versions[n-1]
	writeJSON(w, http.StatusOK, envelope{
		RequestID: randomUUID(),
		Data: map[string]any{
			"data": ver.data,
			"metadata": map[string]any{
				"created_time":    ver.created.UTC().Format(time.RFC3339Nano),
				"custom_metadata": nil,
				"deletion_time":   "",
				"destroyed":       false,
				"version":         n,
			},
		},
		MountType: "kv",
	})
}

// kvWrite stores {"data": {...}} as a new version (no check-and-set).
func (s *Server) kvWrite(w http.ResponseWriter, r *http.Request, t *token, mount string, escaped []string, kv *kvMount) {
	segs := make([]string, len(escaped))
	for i, seg := range escaped {
		u, err := url.PathUnescape(seg)
		if err != nil || u == "" || strings.Contains(strings.ToUpper(seg), "%2F") {
			writeErrors(w, http.StatusBadRequest, "invalid path")
			return
		}
		segs[i] = u
	}
	path := strings.Join(segs, "/")
	if t.spec.WritePaths == nil || !aclAllows(t.spec.WritePaths, mount+"/data/"+path) {
		writeErrors(w, http.StatusForbidden, msgACLDenied)
		return
	}
	var body struct {
		Data map[string]any `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&body); err != nil || body.Data == nil {
		writeErrors(w, http.StatusBadRequest, "no data provided")
		return
	}
	now := s.clock.Now()
	kv.secrets[path] = append(kv.secrets[path], kvVersion{data: body.Data, created: now})
	writeJSON(w, http.StatusOK, envelope{
		RequestID: randomUUID(),
		Data: map[string]any{
			"created_time": now.UTC().Format(time.RFC3339Nano), "custom_metadata": nil,
			"deletion_time": "", "destroyed": false, "version": len(kv.secrets[path]),
		},
	})
}

// Get returns the data of the latest version of mount/path in namespace
// ns (nil when there is none).
func (s *Server) Get(ns, mount, path string) map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.mustNS(ns).kv[mount]
	if !ok || len(m.secrets[path]) == 0 {
		return nil
	}
	return m.secrets[path][len(m.secrets[path])-1].data
}

func aclAllows(paths []string, p string) bool {
	if paths == nil {
		return true
	}
	for _, a := range paths {
		if prefix, ok := strings.CutSuffix(a, "*"); ok {
			if strings.HasPrefix(p, prefix) {
				return true
			}
		} else if a == p {
			return true
		}
	}
	return false
}

const alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

func randomString(n int) string {
	b := make([]byte, n)
	for i := range b {
		k, err := rand.Int(rand.Reader, big.NewInt(int64(len(alnum))))
		if err != nil {
			panic(err)
		}
		b[i] = alnum[k.Int64()]
	}
	return string(b)
}

func randomUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
