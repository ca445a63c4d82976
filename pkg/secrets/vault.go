package secrets

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/vault-client-go"
	"github.com/hashicorp/vault-client-go/schema"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock"
)

// VaultEventKind says what happened to the Vault token.
type VaultEventKind int

// Token events, reported to [VaultOptions.OnEvent].
const (
	// VaultLoggedIn: a token was obtained (AppRole login, or a token from
	// configuration or its file checked with lookup-self).
	VaultLoggedIn VaultEventKind = iota + 1
	// VaultRenewed: the token was renewed (renew-self).
	VaultRenewed
	// VaultRenewFailed: renew-self failed.
	VaultRenewFailed
	// VaultLoginFailed: obtaining a new token failed.
	VaultLoginFailed
)

func (k VaultEventKind) String() string {
	switch k {
	case VaultLoggedIn:
		return "logged-in"
	case VaultRenewed:
		return "renewed"
	case VaultRenewFailed:
		return "renew-failed"
	case VaultLoginFailed:
		return "login-failed"
	}
	return "unknown"
}

// VaultEvent reports a change of the Vault token. It never holds the token.
type VaultEvent struct {
	Kind VaultEventKind
	// TTL is the token's time to live after the event; 0 when it does not
	// expire (or on failure).
	TTL time.Duration
	// Err is the failure, for VaultRenewFailed and VaultLoginFailed.
	Err error
}

// VaultOptions are the dependencies of a [Vault] backend; the zero value
// works.
type VaultOptions struct {
	// Logger receives token events; it never receives a token or value.
	Logger zerolog.Logger
	// Clock drives the renewal loop; nil means the system clock.
	Clock clock.Clock
	// HTTPClient replaces vault-client-go's default pooled client. With
	// VaultConfig.CACert its Transport must be an *http.Transport.
	HTTPClient *http.Client
	// Redactor, when set, masks the Vault token (and AppRole secret_id)
	// in everything it redacts.
	Redactor *Redactor
	// OnEvent, when set, is called (synchronously) on every token event.
	OnEvent func(VaultEvent)
	// RetryMax is how often vault-client-go retries a request that got a
	// 5xx, 412 or 429 answer: 0 means its default (2), negative means never.
	RetryMax int
	// RetryInterval is the longest wait after a failed renewal or login
	// before the next attempt; 0 means 10s.
	RetryInterval time.Duration
}

type authMethod int

const (
	authToken authMethod = iota + 1
	authTokenFile
	authAppRole
)

// Vault is the vault: backend: it reads KV v2 secrets through
// vault-client-go and keeps its token alive. The library does not renew
// tokens: [Vault.Start] runs a loop that renews the token (renew-self) at
// about half its TTL while it is renewable, and logs in again with AppRole
// (or re-reads VAULT_TOKEN_FILE) when renewal fails, the token is not
// renewable, or renewal hit the token's max TTL. The token stays inside the
// client: it is never logged, never part of an error, never put in any
// environment.
type Vault struct {
	client        *vault.Client
	cfg           VaultConfig
	method        authMethod
	log           zerolog.Logger
	clock         clock.Clock
	red           *Redactor
	onEvent       func(VaultEvent)
	retryInterval time.Duration

	authMu sync.Mutex // serialises logins and renewals

	mu  sync.Mutex // guards tok
	tok tokenState

	runMu  sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// tokenState is what is known about the current token.
type tokenState struct {
	secret    []byte        // the token, to unregister it from the redactor
	gen       uint64        // bumped on every new token
	ttl       time.Duration // lease granted at obtained; 0: never expires
	obtained  time.Time
	renewable bool
	increment time.Duration // TTL asked for on renewal (the login TTL)
	capped    bool          // the last renewal was cut short by the max TTL
}

// NewVault validates cfg, builds the client and obtains a token (AppRole
// login, or lookup-self of the configured token). Call Start to keep the
// token alive and Close when done.
func NewVault(ctx context.Context, cfg VaultConfig, opts VaultOptions) (*Vault, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Addr == "" {
		return nil, errors.New("vault: VAULT_ADDR is empty")
	}
	v := &Vault{
		cfg:           cfg,
		log:           opts.Logger.With().Str("component", "secrets.vault").Logger(),
		clock:         cmp.Or(opts.Clock, clock.System()),
		red:           opts.Redactor,
		onEvent:       opts.OnEvent,
		retryInterval: cmp.Or(max(opts.RetryInterval, 0), 10*time.Second),
	}
	switch {
	case cfg.RoleID != "":
		v.method = authAppRole
	case cfg.TokenFile != "":
		v.method = authTokenFile
	default:
		v.method = authToken
	}

	retry := vault.RetryConfiguration{
		RetryWaitMin: 500 * time.Millisecond,
		RetryWaitMax: 1500 * time.Millisecond,
		RetryMax:     2,
	}
	switch {
	case opts.RetryMax > 0:
		retry.RetryMax = opts.RetryMax
	case opts.RetryMax < 0:
		retry.RetryMax = 0
	}
	copts := []vault.ClientOption{
		vault.WithAddress(cfg.Addr),
		vault.WithRequestTimeout(cfg.Timeout),
		vault.WithRetryConfiguration(retry),
	}
	if opts.HTTPClient != nil {
		copts = append(copts, vault.WithHTTPClient(opts.HTTPClient))
	}
	if cfg.CACert != "" {
		copts = append(copts, vault.WithTLS(vault.TLSConfiguration{
			ServerCertificate: vault.ServerCertificateEntry{FromFile: cfg.CACert},
		}))
	}
	client, err := vault.New(copts...)
	if err != nil {
		// Configuration errors name files and addresses, never secrets.
		return nil, fmt.Errorf("vault: new client: %w", err)
	}
	if cfg.Namespace != "" {
		if err := client.SetNamespace(cfg.Namespace); err != nil {
			return nil, fmt.Errorf("vault: namespace: %w", err)
		}
	}
	v.client = client
	if v.red != nil && !cfg.SecretID.IsZero() {
		v.red.AddValue(cfg.SecretID)
	}
	if strings.HasPrefix(cfg.Addr, "http://") {
		v.log.Warn().Str("addr", cfg.Addr).Msg("vault address is plain http: tokens and secrets cross the network unencrypted")
	}
	if err := v.login(ctx); err != nil {
		v.closeIdle()
		return nil, err
	}
	return v, nil
}

// Start runs the token renewal loop until Stop or ctx ends. It returns an
// error when the loop already runs.
func (v *Vault) Start(ctx context.Context) error {
	v.runMu.Lock()
	defer v.runMu.Unlock()
	if v.done != nil {
		return errors.New("vault: token renewal already running")
	}
	ctx, cancel := context.WithCancel(ctx)
	v.cancel, v.done = cancel, make(chan struct{})
	go v.run(ctx, v.done)
	return nil
}

// Stop ends the renewal loop and waits for it. It is idempotent and safe to
// call concurrently, and without Start.
func (v *Vault) Stop() {
	v.runMu.Lock()
	cancel, done := v.cancel, v.done
	v.runMu.Unlock()
	if done == nil {
		return
	}
	cancel()
	<-done
	v.runMu.Lock()
	if v.done == done {
		v.cancel, v.done = nil, nil
	}
	v.runMu.Unlock()
}

// Close stops the renewal loop and closes idle connections. The Vault must
// not be used afterwards.
func (v *Vault) Close() error {
	v.Stop()
	v.closeIdle()
	return nil
}

func (v *Vault) closeIdle() {
	if v.client != nil {
		if hc := v.client.Configuration().HTTPClient; hc != nil {
			hc.CloseIdleConnections()
		}
	}
}

// TokenTTL returns the current token's TTL as last granted and whether it
// is renewable; a TTL of 0 means the token does not expire.
func (v *Vault) TokenTTL() (time.Duration, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.tok.ttl, v.tok.renewable
}

func (v *Vault) state() tokenState {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.tok
}

func (v *Vault) canRelogin() bool { return v.method != authToken }

func (v *Vault) emit(ev VaultEvent) {
	if v.onEvent != nil {
		v.onEvent(ev)
	}
}

// run is the renewal loop.
func (v *Vault) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	var retry time.Duration
	failures := 0
	for {
		var timer <-chan time.Time
		if wait, ok := v.nextWait(retry); ok {
			timer = v.clock.After(wait)
		}
		select {
		case <-ctx.Done():
			return
		case <-timer:
		}
		if err := v.refresh(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			retry = v.retryDelay(failures)
		} else {
			failures, retry = 0, 0
		}
	}
}

// nextWait returns how long to wait before the next refresh, or false when
// nothing is scheduled (the token never expires, or nothing can be done).
func (v *Vault) nextWait(retry time.Duration) (time.Duration, bool) {
	if retry > 0 {
		return retry, true
	}
	st := v.state()
	if st.ttl == 0 {
		return 0, false
	}
	if (!st.renewable || st.capped) && !v.canRelogin() {
		return 0, false
	}
	wait := st.obtained.Add(st.ttl / 2).Sub(v.clock.Now())
	if wait < 0 {
		wait = 0
	}
	return wait, true
}

// retryDelay is the wait after the n-th failed refresh in a row:
// RetryInterval, or less (not under a second) while the token is alive
// and expires sooner; once it has expired, RetryInterval doubled per
// further failure, up to 5 minutes.
func (v *Vault) retryDelay(n int) time.Duration {
	st := v.state()
	d := v.retryInterval
	if st.ttl > 0 {
		remaining := st.obtained.Add(st.ttl).Sub(v.clock.Now())
		if remaining <= 0 {
			return min(v.retryInterval<<min(n-1, 10), 5*time.Minute)
		}
		if half := remaining / 2; half < d {
			d = max(half, time.Second)
		}
	}
	return d
}

// refresh renews the token, or obtains a new one when renewal is not
// possible or fails.
func (v *Vault) refresh(ctx context.Context) error {
	st := v.state()
	if st.renewable && !st.capped {
		err := v.renew(ctx)
		if err == nil {
			return nil
		}
		v.log.Warn().Err(err).Msg("vault token renewal failed")
		v.emit(VaultEvent{Kind: VaultRenewFailed, Err: err})
		if !v.canRelogin() {
			return err
		}
	}
	if !v.canRelogin() {
		return nil
	}
	return v.login(ctx)
}

// renew renews the token with renew-self, asking for the login TTL again.
func (v *Vault) renew(ctx context.Context) error {
	v.authMu.Lock()
	defer v.authMu.Unlock()
	st := v.state()
	incr := st.increment
	if incr <= 0 {
		incr = st.ttl
	}
	resp, err := v.client.Auth.TokenRenewSelf(ctx, schema.TokenRenewSelfRequest{
		Increment: strconv.FormatInt(int64(incr/time.Second), 10) + "s",
	})
	if err != nil {
		return vaultFailure("token renew-self", err, false)
	}
	if resp == nil || resp.Auth == nil {
		return &Error{Kind: ErrUnavailable, Detail: "vault token renew-self: response has no auth section"}
	}
	ttl := time.Duration(resp.Auth.LeaseDuration) * time.Second
	v.mu.Lock()
	v.tok.ttl = ttl
	v.tok.obtained = v.clock.Now()
	v.tok.renewable = resp.Auth.Renewable
	v.tok.capped = ttl < incr
	capped := v.tok.capped
	v.mu.Unlock()
	ev := v.log.Info()
	if capped {
		ev = v.log.Warn()
	}
	ev.Dur("ttl", ttl).Bool("capped_by_max_ttl", capped).Msg("vault token renewed")
	v.emit(VaultEvent{Kind: VaultRenewed, TTL: ttl})
	return nil
}

// login obtains a token with the configured method and installs it.
func (v *Vault) login(ctx context.Context) error {
	v.authMu.Lock()
	defer v.authMu.Unlock()
	return v.loginAndReport(ctx)
}

// loginAndReport is login with authMu held.
func (v *Vault) loginAndReport(ctx context.Context) error {
	err := v.loginLocked(ctx)
	if err != nil {
		v.log.Error().Err(err).Msg("vault login failed")
		v.emit(VaultEvent{Kind: VaultLoginFailed, Err: err})
		return err
	}
	st := v.state()
	ev := v.log.Info().Dur("ttl", st.ttl).Bool("renewable", st.renewable).Str("method", v.methodName())
	ev.Msg("vault token obtained")
	if st.ttl > 0 && !st.renewable && !v.canRelogin() {
		v.log.Warn().Dur("ttl", st.ttl).Msg("vault token is not renewable: reads fail once it expires")
	}
	v.emit(VaultEvent{Kind: VaultLoggedIn, TTL: st.ttl})
	return nil
}

func (v *Vault) methodName() string {
	switch v.method {
	case authAppRole:
		return "approle"
	case authTokenFile:
		return "token-file"
	}
	return "token"
}

func (v *Vault) loginLocked(ctx context.Context) error {
	switch v.method {
	case authAppRole:
		secretID, err := v.secretID()
		if err != nil {
			return err
		}
		defer secretID.Wipe()
		resp, err := v.client.Auth.AppRoleLogin(ctx, schema.AppRoleLoginRequest{
			RoleId:   v.cfg.RoleID,
			SecretId: secretID.Reveal(),
		}, vault.WithMountPath(v.cfg.AppRoleMount))
		if err != nil {
			return vaultFailure("approle login", err, true)
		}
		if resp == nil || resp.Auth == nil || resp.Auth.ClientToken == "" {
			return &Error{Kind: ErrUnavailable, Detail: "vault approle login: response has no auth section"}
		}
		ttl := time.Duration(resp.Auth.LeaseDuration) * time.Second
		return v.install(resp.Auth.ClientToken, ttl, ttl, resp.Auth.Renewable)
	case authTokenFile:
		b, err := os.ReadFile(v.cfg.TokenFile)
		if err != nil {
			return &Error{Kind: ErrUnavailable, Detail: "vault: read VAULT_TOKEN_FILE", Err: pathOnly(err)}
		}
		tok := string(bytes.TrimSpace(b))
		clear(b)
		if tok == "" {
			return &Error{Kind: ErrPermission, Detail: "vault: VAULT_TOKEN_FILE is empty"}
		}
		return v.installLookedUp(ctx, tok)
	default:
		return v.installLookedUp(ctx, v.cfg.Token.Reveal())
	}
}

// secretID returns the AppRole secret_id, re-reading its file each time so
// that a rotated secret_id is picked up.
func (v *Vault) secretID() (Value, error) {
	if v.cfg.SecretIDFile == "" {
		return ValueFromString(v.cfg.SecretID.Reveal()), nil
	}
	b, err := os.ReadFile(v.cfg.SecretIDFile)
	if err != nil {
		return Value{}, &Error{Kind: ErrUnavailable, Detail: "vault: read VAULT_SECRET_ID_FILE", Err: pathOnly(err)}
	}
	t := bytes.TrimSpace(b)
	if len(t) == 0 {
		return Value{}, &Error{Kind: ErrPermission, Detail: "vault: VAULT_SECRET_ID_FILE is empty"}
	}
	out := make([]byte, len(t))
	copy(out, t)
	clear(b)
	if v.red != nil {
		v.red.Add(out)
	}
	return NewValue(out), nil
}

// installLookedUp installs a given token and learns its TTL with
// lookup-self.
func (v *Vault) installLookedUp(ctx context.Context, tok string) error {
	if err := v.setClientToken(tok); err != nil {
		return err
	}
	resp, err := v.client.Auth.TokenLookUpSelf(ctx)
	if err != nil {
		return vaultFailure("token lookup-self", err, true)
	}
	if resp == nil {
		return &Error{Kind: ErrUnavailable, Detail: "vault token lookup-self: empty response"}
	}
	ttl := time.Duration(jsonInt(resp.Data["ttl"])) * time.Second
	incr := time.Duration(jsonInt(resp.Data["creation_ttl"])) * time.Second
	renewable, _ := resp.Data["renewable"].(bool)
	return v.install(tok, ttl, incr, renewable)
}

func (v *Vault) setClientToken(tok string) error {
	if err := v.client.SetToken(tok); err != nil {
		// vault-client-go's message says "non-printable characters" and
		// holds no token; still, use our own words.
		return &Error{Kind: ErrBadRef, Detail: "vault: token contains non-printable characters"}
	}
	return nil
}

// install makes tok the client's token and records its lease.
func (v *Vault) install(tok string, ttl, incr time.Duration, renewable bool) error {
	if err := v.setClientToken(tok); err != nil {
		return err
	}
	secret := []byte(tok)
	if v.red != nil {
		v.red.Add(secret)
	}
	v.mu.Lock()
	old := v.tok.secret
	v.tok = tokenState{
		secret:    secret,
		gen:       v.tok.gen + 1,
		ttl:       ttl,
		obtained:  v.clock.Now(),
		renewable: renewable,
		increment: incr,
	}
	v.mu.Unlock()
	if old != nil && !bytes.Equal(old, secret) {
		if v.red != nil {
			v.red.Remove(old)
		}
		clear(old)
	}
	return nil
}

// reloginAfterDenied handles a 403 on a read: when the token itself is no
// longer valid (lookup-self is denied too) it obtains a new one. It reports
// whether the read should be tried again.
func (v *Vault) reloginAfterDenied(ctx context.Context, gen uint64) bool {
	if !v.canRelogin() {
		return false
	}
	v.authMu.Lock()
	defer v.authMu.Unlock()
	if v.state().gen != gen {
		return true // someone installed a new token meanwhile
	}
	_, err := v.client.Auth.TokenLookUpSelf(ctx)
	if err == nil || !vault.IsErrorStatus(err, http.StatusForbidden) {
		return false // the token is fine: the policy denies the path
	}
	v.log.Warn().Msg("vault token no longer valid: logging in again")
	return v.loginAndReport(ctx) == nil
}

// Resolve reads the secret a vault: reference names. With a #field it
// returns that field; without, the whole data map rendered as dotenv text
// (see [RenderDotenv]).
func (v *Vault) Resolve(ctx context.Context, ref Ref) (Value, error) {
	val, _, err := v.resolve(ctx, ref)
	return val, err
}

// resolve also returns the individual field values, to be registered with a
// redactor on their own.
func (v *Vault) resolve(ctx context.Context, ref Ref) (Value, [][]byte, error) {
	if ref.Scheme != SchemeVault {
		return Value{}, nil, &Error{Ref: ref.String(), Kind: ErrBadRef, Detail: "not a vault: reference"}
	}
	data, err := v.read(ctx, ref)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			e.Ref = ref.String()
		}
		return Value{}, nil, err
	}
	fields := make(map[string]string, len(data))
	for k, x := range data {
		s, err := kvString(x)
		if err != nil {
			return Value{}, nil, &Error{Ref: ref.String(), Kind: ErrBadRef, Detail: err.Error()}
		}
		fields[k] = s
	}
	defer clear(fields)
	if ref.Field != "" {
		s, ok := fields[ref.Field]
		if !ok {
			return Value{}, nil, &Error{Ref: ref.String(), Kind: ErrNotFound, Detail: "no such field in the secret"}
		}
		return ValueFromString(s), nil, nil
	}
	text, err := RenderDotenv(fields)
	if err != nil {
		return Value{}, nil, &Error{Ref: ref.String(), Kind: ErrBadRef, Detail: "whole secret as dotenv", Err: err}
	}
	parts := make([][]byte, 0, len(fields))
	for _, s := range fields {
		parts = append(parts, []byte(s))
	}
	return NewValue(text), parts, nil
}

// read returns the data map of a KV v2 secret. It sends the path itself
// (client.Read) rather than using Secrets.KvV2Read, which escapes the
// slashes of nested paths (hashicorp/vault-client-go#267).
func (v *Vault) read(ctx context.Context, ref Ref) (map[string]any, error) {
	segs := strings.Split(ref.Path, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	p := "/" + url.PathEscape(ref.Mount) + "/data/" + strings.Join(segs, "/")
	var ropts []vault.RequestOption
	if ref.Version > 0 {
		ropts = append(ropts, vault.WithQueryParameters(url.Values{"version": {strconv.Itoa(ref.Version)}}))
	}
	gen := v.state().gen
	resp, err := v.client.Read(ctx, p, ropts...)
	if err != nil && vault.IsErrorStatus(err, http.StatusForbidden) && v.reloginAfterDenied(ctx, gen) {
		resp, err = v.client.Read(ctx, p, ropts...)
	}
	op := "read " + ref.Mount + "/data/" + ref.Path
	if err != nil {
		return nil, vaultFailure(op, err, false)
	}
	if resp == nil {
		return nil, &Error{Kind: ErrNotFound, Detail: "vault " + op + ": empty response"}
	}
	data, ok := resp.Data["data"].(map[string]any)
	if !ok {
		return nil, &Error{Kind: ErrNotFound, Detail: "vault " + op + ": no data (deleted or destroyed version, or not a KV v2 mount)"}
	}
	return data, nil
}

// vaultFailure turns an error from vault-client-go into one of ours, built
// from the status code and Vault's error list only: the library's
// ResponseError and RedirectError hold the original request, token header
// included, and are never wrapped or printed.
func vaultFailure(op string, err error, login bool) error {
	var re *vault.ResponseError
	if errors.As(err, &re) {
		ve := &VaultError{Op: op, Status: re.StatusCode}
		for _, m := range re.Errors {
			if len(m) > 200 {
				m = m[:200]
			}
			ve.Errors = append(ve.Errors, m)
		}
		return &Error{Kind: statusKind(re.StatusCode, login), Err: ve}
	}
	var rde *vault.RedirectError
	if errors.As(err, &rde) {
		return &Error{Kind: ErrUnavailable, Detail: fmt.Sprintf("vault %s: redirect (status %d) not followed", op, rde.StatusCode)}
	}
	for _, ctxErr := range []error{context.Canceled, context.DeadlineExceeded} {
		if errors.Is(err, ctxErr) {
			return &Error{Kind: ErrUnavailable, Detail: "vault " + op, Err: ctxErr}
		}
	}
	// Transport errors (url.Error, retryablehttp's "giving up after")
	// carry the method and URL (path only; net/http strips passwords),
	// never the headers.
	return &Error{Kind: ErrUnavailable, Detail: "vault " + op, Err: err}
}

func statusKind(status int, login bool) error {
	switch {
	case status == http.StatusNotFound:
		return ErrNotFound
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return ErrPermission
	case status == http.StatusTooManyRequests || status == http.StatusPreconditionFailed || status >= 500:
		return ErrUnavailable
	case status == http.StatusBadRequest && login:
		return ErrPermission // "invalid role or secret ID"
	}
	return ErrBadRef
}

// jsonInt reads an integer that vault-client-go decoded as json.Number.
func jsonInt(v any) int64 {
	switch x := v.(type) {
	case json.Number:
		n, err := x.Int64()
		if err != nil {
			f, _ := x.Float64()
			return int64(f)
		}
		return n
	case float64:
		return int64(x)
	case int64:
		return x
	case int:
		return int64(x)
	}
	return 0
}

// pathOnly keeps the operation and path of a file error, dropping nothing
// secret (file errors hold no content) but giving a stable message.
func pathOnly(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s %s: %w", pe.Op, pe.Path, pe.Err)
	}
	return err
}
