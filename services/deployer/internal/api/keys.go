package api

import (
	"errors"
	"net/http"
	"net/netip"
	"regexp"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
)

var (
	uuidRE         = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	serverHandleRE = regexp.MustCompile(messages.ServerHandlePattern)
	entryIDRE      = regexp.MustCompile(`^[0-9]{1,20}-[0-9]{1,20}$`)
)

func netipParse(s string) (string, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return "", errors.New("not an address")
	}
	return a.String(), nil
}

// KeyView is an API key as the API shows it (never its secret).
type KeyView struct {
	ID        string   `json:"id"`
	Name      string   `json:"name"`
	Prefix    string   `json:"prefix"`
	Scopes    []string `json:"scopes"`
	RateLimit int      `json:"rate_limit,omitempty"`
	// Projects are the projects the key acts for; empty when FleetWide.
	Projects []string `json:"projects"`
	// FleetWide keys act for every project.
	FleetWide bool `json:"fleet_wide"`
	// LegacyFleetWide marks a key made before keys were bound to projects,
	// fleet-wide until it is narrowed.
	LegacyFleetWide bool       `json:"legacy_fleet_wide,omitempty"`
	CreatedAt       time.Time  `json:"created_at"`
	LastUsedAt      *time.Time `json:"last_used_at,omitempty"`
	RevokedAt       *time.Time `json:"revoked_at,omitempty"`
}

func viewKey(k *auth.Key) KeyView {
	v := KeyView{ID: k.ID, Name: k.Name, Prefix: k.Prefix, RateLimit: k.RateLimit, CreatedAt: k.CreatedAt,
		Projects: append([]string{}, k.Projects...), FleetWide: k.FleetWide, LegacyFleetWide: k.Legacy}
	for _, s := range k.Scopes {
		v.Scopes = append(v.Scopes, string(s))
	}
	if !k.LastUsedAt.IsZero() {
		t := k.LastUsedAt
		v.LastUsedAt = &t
	}
	if !k.RevokedAt.IsZero() {
		t := k.RevokedAt
		v.RevokedAt = &t
	}
	return v
}

// CreatedKey is the answer to a key creation: the only time the key (and
// its webhook secret) are shown.
type CreatedKey struct {
	KeyView
	Key           string `json:"key"`
	WebhookSecret string `json:"webhook_secret,omitempty"`
}

type createKeyRequest struct {
	Name      string   `json:"name"`
	Scopes    []string `json:"scopes"`
	RateLimit int      `json:"rate_limit,omitempty"`
	Projects  []string `json:"projects,omitempty"`
	FleetWide bool     `json:"fleet_wide,omitempty"`
}

func (a *API) createKey(w http.ResponseWriter, r *http.Request) {
	var req createKeyRequest
	if !decodeJSON(w, r, a.cfg.MaxBody, &req) {
		return
	}
	var fields []FieldProblem
	if !auth.ValidName(req.Name) {
		fields = append(fields, FieldProblem{Field: "name", Message: "must match " + auth.NamePattern})
	}
	scopes, err := auth.ParseScopes(req.Scopes)
	if err != nil {
		fields = append(fields, FieldProblem{Field: "scopes", Message: "must list known scopes: deployments:read, deployments:write, servers:read, servers:write, admin"})
	}
	if err == nil {
		if _, _, berr := auth.Binding(scopes, req.Projects, req.FleetWide); berr != nil {
			fields = append(fields, FieldProblem{Field: "projects", Message: berr.Error()})
		}
	}
	if req.RateLimit < 0 || req.RateLimit > 100000 {
		fields = append(fields, FieldProblem{Field: "rate_limit", Message: "must be between 1 and 100000 requests per second (0 or absent: the default)"})
	}
	if len(fields) > 0 {
		writeProblem(w, r, http.StatusUnprocessableEntity, ProbInvalidRequest, "the key request is invalid: see errors", fields...)
		return
	}
	k, secret, err := a.deps.Keys.Create(r.Context(), auth.NewKey{Name: req.Name, Scopes: scopes, RateLimit: req.RateLimit,
		Projects: req.Projects, FleetWide: req.FleetWide})
	if errors.Is(err, auth.ErrNameTaken) {
		writeProblem(w, r, http.StatusConflict, ProbConflict, "a live key already has this name; revoke it first or choose another",
			FieldProblem{Field: "name", Message: "already used by a live key"})
		return
	}
	if err != nil {
		a.internal(w, r, "create key", err)
		return
	}
	out := CreatedKey{KeyView: viewKey(k), Key: secret}
	if a.deps.WebhookSecret != nil {
		out.WebhookSecret = a.deps.WebhookSecret(k.ID)
	}
	a.log.Info().Str("request_id", requestID(r.Context())).Str("created_key", k.Name).Str("created_key_id", k.ID).
		Strs("scopes", out.Scopes).Strs("projects", out.Projects).Bool("fleet_wide", out.FleetWide).Msg("API key created")
	w.Header().Set("Location", "/api/v1/keys/"+k.ID)
	writeJSON(w, http.StatusCreated, out)
}

func (a *API) listKeys(w http.ResponseWriter, r *http.Request) {
	keys, err := a.deps.Keys.List(r.Context())
	if err != nil {
		a.internal(w, r, "list keys", err)
		return
	}
	items := make([]KeyView, len(keys))
	for i, k := range keys {
		items[i] = viewKey(k)
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
}

func (a *API) getKey(w http.ResponseWriter, r *http.Request) {
	k, err := a.deps.Keys.Get(r.Context(), chi.URLParam(r, "id"))
	if errors.Is(err, auth.ErrNotFound) {
		writeProblem(w, r, http.StatusNotFound, ProbNotFound, "no API key has this id")
		return
	}
	if err != nil {
		a.internal(w, r, "read key", err)
		return
	}
	writeJSON(w, http.StatusOK, viewKey(k))
}

func (a *API) revokeKey(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	if !uuidRE.MatchString(id) {
		writeProblem(w, r, http.StatusNotFound, ProbNotFound, "no API key has this id")
		return
	}
	k, err := a.deps.Keys.Revoke(r.Context(), id)
	if errors.Is(err, auth.ErrNotFound) {
		writeProblem(w, r, http.StatusNotFound, ProbNotFound, "no live API key has this id")
		return
	}
	if err != nil {
		a.internal(w, r, "revoke key", err)
		return
	}
	if a.deps.Forget != nil {
		a.deps.Forget(k.ID)
	}
	a.log.Info().Str("request_id", requestID(r.Context())).Str("revoked_key", k.Name).Str("revoked_key_id", k.ID).Msg("API key revoked")
	writeJSON(w, http.StatusOK, viewKey(k))
}

func (a *API) me(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, viewKey(authedKey(r.Context())))
}
