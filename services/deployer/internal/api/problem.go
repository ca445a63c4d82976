// Package api is the deployer's HTTP API (/api/v1): the chi router and its
// middleware (request ids, request logs, panic recovery, API key
// authentication, per-key rate limits, body limits), the handlers, errors as
// RFC 9457 problem details, and the OpenAPI 3.1 document, which is checked
// in (openapi.json), served at /api/v1/openapi.json and tested against the
// routes in both directions.
package api

import (
	"encoding/json"
	"net/http"
)

// ProblemBase prefixes the type URIs of the API's problems; each type is
// documented in the OpenAPI document.
const ProblemBase = "https://autoprovisioner.dev/problems/"

// Problem is an RFC 9457 problem details object.
type Problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	// Errors lists the fields of the request that were wrong (invalid
	// input only). Messages never repeat the rejected values.
	Errors []FieldProblem `json:"errors,omitempty"`
	// RequestID is the id of the request, as logged.
	RequestID string `json:"request_id,omitempty"`
	// Extra members for some problems (a deployment's current status).
	DeploymentStatus string `json:"deployment_status,omitempty"`
}

// FieldProblem names one bad field.
type FieldProblem struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// The problem types.
const (
	ProbInvalidJSON      = "invalid-json"
	ProbInvalidRequest   = "invalid-request"
	ProbInvalidParameter = "invalid-parameter"
	ProbTooLarge         = "body-too-large"
	ProbUnsupportedMedia = "unsupported-media-type"
	ProbUnauthorized     = "unauthorized"
	ProbForbidden        = "forbidden"
	ProbNotFound         = "not-found"
	ProbMethodNotAllowed = "method-not-allowed"
	ProbConflict         = "conflict"
	ProbIdempotency      = "idempotency-key-reused"
	ProbRateLimited      = "rate-limited"
	ProbUnavailable      = "unavailable"
	ProbInternal         = "internal"
)

var problemTitles = map[string]string{
	ProbInvalidJSON:      "The request body is not valid JSON for this operation",
	ProbInvalidRequest:   "The request is invalid",
	ProbInvalidParameter: "A parameter is invalid",
	ProbTooLarge:         "The request body is too large",
	ProbUnsupportedMedia: "The request body must be JSON",
	ProbUnauthorized:     "Authentication required",
	ProbForbidden:        "The API key lacks a scope",
	ProbNotFound:         "Not found",
	ProbMethodNotAllowed: "Method not allowed",
	ProbConflict:         "The request conflicts with the resource's state",
	ProbIdempotency:      "The Idempotency-Key was used with a different request",
	ProbRateLimited:      "Too many requests",
	ProbUnavailable:      "The service is unavailable",
	ProbInternal:         "Internal error",
}

// writeProblem writes a problem response.
func writeProblem(w http.ResponseWriter, r *http.Request, status int, typ, detail string, fields ...FieldProblem) {
	writeProblemValue(w, r, Problem{Type: typ, Status: status, Detail: detail, Errors: fields})
}

func writeProblemValue(w http.ResponseWriter, r *http.Request, p Problem) {
	if p.Title == "" {
		p.Title = problemTitles[p.Type]
	}
	p.Type = ProblemBase + p.Type
	p.Instance = r.URL.Path
	p.RequestID = requestID(r.Context())
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// writeJSON writes v as a JSON response.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
