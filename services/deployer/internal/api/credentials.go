package api

import (
	"errors"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/credentials"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// CredentialRequest is the body of POST /credentials: a reference, or a
// value the deployer writes to Vault (it keeps only the reference).
type CredentialRequest struct {
	ProjectID   string        `json:"project_id"`
	Name        string        `json:"name"`
	Ref         string        `json:"ref,omitempty"`
	Value       secrets.Value `json:"value,omitempty"`
	Description string        `json:"description,omitempty"`
}

// CredentialList is the answer of GET /credentials.
type CredentialList struct {
	Items []*credentials.Credential `json:"items"`
}

// keyProject is the project a request names, or the key's only project
// when it names none.
func keyProject(key *auth.Key, given string) string {
	if given == "" && key != nil && !key.FleetWide && len(key.Projects) == 1 {
		return key.Projects[0]
	}
	return given
}

func (a *API) createCredential(w http.ResponseWriter, r *http.Request) {
	if a.deps.Credentials == nil {
		writeProblem(w, r, http.StatusServiceUnavailable, ProbUnavailable, "credentials are not served by this deployer")
		return
	}
	var req CredentialRequest
	if !decodeJSON(w, r, a.cfg.MaxBody, &req) {
		return
	}
	key := authedKey(r.Context())
	c, err := a.deps.Credentials.Create(r.Context(), key.ID, visibility(key), credentials.New{
		ProjectID: keyProject(key, req.ProjectID), Name: req.Name, Ref: req.Ref, Value: req.Value, Description: req.Description})
	req.Value.Wipe()
	switch {
	case errors.Is(err, credentials.ErrExists):
		writeProblem(w, r, http.StatusConflict, ProbConflict, "a credential of this name exists in the project; delete it first to replace it",
			FieldProblem{Field: "name", Message: "taken in this project"})
		return
	case err != nil && a.credentialError(w, r, err):
		return
	}
	w.Header().Set("Location", "/api/v1/credentials/"+c.Name+"?project_id="+c.ProjectID)
	writeJSON(w, http.StatusCreated, c)
}

// credentialError answers err (a project the key lacks, invalid fields,
// an unknown credential, Vault unavailable) and reports whether it did.
func (a *API) credentialError(w http.ResponseWriter, r *http.Request, err error) bool {
	var invalid *deployments.InvalidError
	var se *secrets.Error
	switch {
	case err == nil:
		return false
	case errors.Is(err, deployments.ErrForbiddenProject):
		writeProblemValue(w, r, Problem{Type: ProbForbidden, Status: http.StatusForbidden,
			Title:  "The API key does not act for this project",
			Detail: "this API key is not bound to the request's project_id",
			Errors: []FieldProblem{{Field: "project_id", Message: "not a project of this API key"}}})
	case errors.As(err, &invalid):
		fields := make([]FieldProblem, len(invalid.Fields))
		for i, f := range invalid.Fields {
			fields[i] = FieldProblem{Field: f.Field, Message: f.Message}
		}
		writeProblem(w, r, http.StatusUnprocessableEntity, ProbInvalidRequest, "the request is invalid: see errors", fields...)
	case errors.Is(err, credentials.ErrNotFound):
		writeProblem(w, r, http.StatusNotFound, ProbNotFound, "no credential of this name in the project")
	case errors.As(err, &se):
		// Vault's answer (never the value): the operator reads the log.
		// Vault away (down, sealed, overloaded) passes: retry later; a
		// refusal (a token without the right) does not.
		a.log.Error().Err(err).Str("request_id", requestID(r.Context())).Msg("write credential to vault")
		detail := "the credential's value could not be written to Vault; nothing was stored"
		if secrets.IsUnavailable(err) {
			retryLater(w, r, detail+"; retry after the Retry-After delay")
			break
		}
		writeProblem(w, r, http.StatusServiceUnavailable, ProbUnavailable, detail)
	default:
		a.internal(w, r, "credentials", err)
	}
	return true
}

func (a *API) listCredentials(w http.ResponseWriter, r *http.Request) {
	if a.deps.Credentials == nil {
		writeProblem(w, r, http.StatusServiceUnavailable, ProbUnavailable, "credentials are not served by this deployer")
		return
	}
	if !onlyProjectQuery(w, r) {
		return
	}
	key := authedKey(r.Context())
	list, err := a.deps.Credentials.List(r.Context(), visibility(key), r.URL.Query().Get("project_id"))
	if a.credentialError(w, r, err) {
		return
	}
	if list == nil {
		list = []*credentials.Credential{}
	}
	writeJSON(w, http.StatusOK, CredentialList{Items: list})
}

func (a *API) deleteCredential(w http.ResponseWriter, r *http.Request) {
	if a.deps.Credentials == nil {
		writeProblem(w, r, http.StatusServiceUnavailable, ProbUnavailable, "credentials are not served by this deployer")
		return
	}
	key := authedKey(r.Context())
	project := keyProject(key, r.URL.Query().Get("project_id"))
	if project == "" {
		msg := "required: the project of the credential (this key holds several)"
		writeProblem(w, r, http.StatusBadRequest, ProbInvalidParameter, msg, FieldProblem{Field: "project_id", Message: msg})
		return
	}
	_, err := a.deps.Credentials.Delete(r.Context(), visibility(key), project, chi.URLParam(r, "name"))
	if a.credentialError(w, r, err) {
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// onlyProjectQuery answers 400 for a query parameter other than
// project_id (the lists of a project's things) and reports whether it
// did not.
func onlyProjectQuery(w http.ResponseWriter, r *http.Request) bool {
	for name := range r.URL.Query() {
		if name != "project_id" {
			writeProblem(w, r, http.StatusBadRequest, ProbInvalidParameter, "unknown query parameter",
				FieldProblem{Field: "query", Message: "only project_id is known"})
			return false
		}
	}
	return true
}
