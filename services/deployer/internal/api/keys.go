package api

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"regexp"

	"github.com/go-chi/chi/v5"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
)

var (
	uuidRE    = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	entryIDRE = regexp.MustCompile(`^[0-9]{1,20}-[0-9]{1,20}$`)
)

func netipParse(s string) (string, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return "", errors.New("not an address")
	}
	return a.String(), nil
}

// viewKey is k as the API shows it (auth.KeyView, the shape `deployer
// keys --json` prints too).
func (a *API) viewKey(k *auth.Key) auth.KeyView { return auth.View(k, a.cfg.Rates) }

type createKeyRequest struct {
	Name      string   `json:"name"`
	Scopes    []string `json:"scopes"`
	RateLimit *int     `json:"rate_limit,omitempty"` // nil: the default
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
		fields = append(fields, FieldProblem{Field: "scopes", Message: "must list known scopes: deployments:read, deployments:write, jobs:read, jobs:write, credentials:read, credentials:write, templates:read, templates:write, templates:launch, servers:read, servers:write, admin"})
	}
	if err == nil {
		if _, _, berr := auth.Binding(scopes, req.Projects, req.FleetWide); berr != nil {
			fields = append(fields, FieldProblem{Field: "projects", Message: berr.Error()})
		}
	}
	rate := 0
	if req.RateLimit != nil {
		rate = *req.RateLimit
		if rate < 1 || rate > auth.MaxRate {
			fields = append(fields, FieldProblem{Field: "rate_limit",
				Message: fmt.Sprintf("must be between 1 and %d requests per second; leave rate_limit out for the deployer's default", auth.MaxRate)})
		}
	}
	if len(fields) > 0 {
		writeProblem(w, r, http.StatusUnprocessableEntity, ProbInvalidRequest, "the key request is invalid: see errors", fields...)
		return
	}
	k, secret, err := a.deps.Keys.Create(r.Context(), auth.NewKey{Name: req.Name, Scopes: scopes, RateLimit: rate,
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
	out := auth.CreatedKey{KeyView: a.viewKey(k), Key: secret}
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
	out := auth.KeyList{Items: make([]auth.KeyView, len(keys))}
	for i, k := range keys {
		out.Items[i] = a.viewKey(k)
	}
	writeJSON(w, http.StatusOK, out)
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
	writeJSON(w, http.StatusOK, a.viewKey(k))
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
	writeJSON(w, http.StatusOK, a.viewKey(k))
}

func (a *API) me(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, a.viewKey(authedKey(r.Context())))
}
