package api

import (
	_ "embed"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
)

// openAPIDocument is the API's OpenAPI 3.1 document.
//
//go:embed openapi.json
var openAPIDocument []byte

// OpenAPIDocument returns the checked-in OpenAPI document.
func OpenAPIDocument() []byte { return openAPIDocument }

func (a *API) routes(duration *prometheus.HistogramVec) chi.Router {
	r := chi.NewRouter()
	r.Use(withRequestID, logRequests(a.log, duration), recoverPanics(a.log))
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, http.StatusNotFound, ProbNotFound, "no such resource; see /api/v1/openapi.json")
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, http.StatusMethodNotAllowed, ProbMethodNotAllowed, "see /api/v1/openapi.json for the methods")
	})
	r.Route("/api/v1", func(r chi.Router) {
		r.Get("/openapi.json", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Cache-Control", "public, max-age=300")
			_, _ = w.Write(openAPIDocument)
		})
		read, write := auth.ScopeDeploymentsRead, auth.ScopeDeploymentsWrite
		r.With(a.authenticate("")).Get("/me", a.me)
		r.Route("/deployments", func(r chi.Router) {
			r.With(a.authenticate(write)).Post("/", a.createDeployment)
			r.With(a.authenticate(read)).Get("/", a.listDeployments)
			// An Ansible job's id answers here too, with the jobs scopes.
			read, write := []auth.Scope{read, auth.ScopeJobsRead}, []auth.Scope{write, auth.ScopeJobsWrite}
			r.Route("/{id}", func(r chi.Router) {
				r.With(a.authenticate(read...)).Get("/", a.getDeployment)
				r.With(a.authenticate(write...)).Delete("/", a.cancelDeployment)
				r.With(a.authenticate(read...)).Get("/events", a.deploymentEvents)
				r.With(a.authenticate(read...)).Get("/log", a.deploymentLog)
				r.With(a.authenticate(read...)).Get("/webhooks", a.deploymentWebhooks)
				r.With(a.authenticate(write...)).Post("/relaunch", a.relaunch(deploymentView))
			})
		})
		// Ansible jobs; a deployment's id answers here too (with the
		// deployments scopes), so one client follows both.
		jread, jwrite := jobScopes(false), jobScopes(true)
		r.Route("/jobs", func(r chi.Router) {
			r.With(a.authenticate(auth.ScopeJobsWrite)).Post("/", a.createJob)
			r.With(a.authenticate(auth.ScopeJobsRead)).Get("/", a.listJobs)
			r.Route("/{id}", func(r chi.Router) {
				r.With(a.authenticate(jread...)).Get("/", a.getJob)
				r.With(a.authenticate(jwrite...)).Delete("/", a.cancelJob)
				r.With(a.authenticate(jread...)).Get("/stream", a.deploymentEvents)
				r.With(a.authenticate(jread...)).Get("/logs", a.deploymentLog)
				r.With(a.authenticate(jwrite...)).Post("/relaunch", a.relaunch(jobView))
			})
		})
		r.Route("/templates", func(r chi.Router) {
			tread, twrite := auth.ScopeTemplatesRead, auth.ScopeTemplatesWrite
			r.With(a.authenticate(twrite)).Post("/", a.createTemplate)
			r.With(a.authenticate(tread)).Get("/", a.listTemplates)
			r.Route("/{id}", func(r chi.Router) {
				r.With(a.authenticate(tread)).Get("/", a.getTemplate)
				r.With(a.authenticate(twrite)).Put("/", a.updateTemplate)
				r.With(a.authenticate(twrite)).Delete("/", a.deleteTemplate)
				r.With(a.authenticate(tread)).Get("/versions", a.templateVersions)
				r.With(a.authenticate(auth.ScopeTemplatesLaunch)).Post("/launch", a.launchTemplate)
				r.With(a.authenticate(twrite)).Post("/schedules", a.createSchedule)
				r.With(a.authenticate(tread)).Get("/schedules", a.listSchedules)
				r.With(a.authenticate(twrite)).Post("/triggers", a.createTrigger)
				r.With(a.authenticate(tread)).Get("/triggers", a.listTriggers)
				r.With(a.authenticate(twrite)).Post("/notifications", a.createRule)
				r.With(a.authenticate(tread)).Get("/notifications", a.listRules)
			})
		})
		r.Route("/notifications", func(r chi.Router) {
			tread, twrite := auth.ScopeTemplatesRead, auth.ScopeTemplatesWrite
			r.With(a.authenticate(twrite)).Post("/", a.createRule)
			r.With(a.authenticate(tread)).Get("/", a.listRules)
			r.With(a.authenticate(tread)).Get("/{id}", a.getRule)
			r.With(a.authenticate(twrite)).Put("/{id}", a.updateRule)
			r.With(a.authenticate(twrite)).Delete("/{id}", a.deleteRule)
		})
		a.workflowRoutes(r)
		r.Route("/triggers/{id}", func(r chi.Router) {
			tread, twrite := auth.ScopeTemplatesRead, auth.ScopeTemplatesWrite
			r.With(a.authenticate(tread)).Get("/", a.getTrigger)
			r.With(a.authenticate(twrite)).Delete("/", a.deleteTrigger)
			r.With(a.authenticate(twrite)).Post("/rotate", a.rotateTrigger)
		})
		// Git hosting's webhooks: the trigger's secret proves the sender.
		r.Post("/hooks/{id}", a.hook)
		r.Route("/schedules/{id}", func(r chi.Router) {
			tread, twrite := auth.ScopeTemplatesRead, auth.ScopeTemplatesWrite
			r.With(a.authenticate(tread)).Get("/", a.getSchedule)
			r.With(a.authenticate(twrite)).Delete("/", a.deleteSchedule)
			r.With(a.authenticate(twrite)).Post("/pause", a.pauseSchedule(true))
			r.With(a.authenticate(twrite)).Post("/resume", a.pauseSchedule(false))
		})
		r.Route("/credentials", func(r chi.Router) {
			r.With(a.authenticate(auth.ScopeCredentialsWrite)).Post("/", a.createCredential)
			r.With(a.authenticate(auth.ScopeCredentialsRead)).Get("/", a.listCredentials)
			r.With(a.authenticate(auth.ScopeCredentialsWrite)).Delete("/{name}", a.deleteCredential)
		})
		r.Route("/keys", func(r chi.Router) {
			r.Use(a.authenticate(auth.ScopeAdmin))
			r.Post("/", a.createKey)
			r.Get("/", a.listKeys)
			r.Get("/{id}", a.getKey)
			r.Delete("/{id}", a.revokeKey)
		})
		r.Route("/servers", func(r chi.Router) {
			r.With(a.authenticate(auth.ScopeServersRead)).Get("/", a.listServers)
			r.With(a.authenticate(auth.ScopeServersRead)).Get("/{handle}", a.getServer)
			for _, op := range Operations() {
				r.With(a.authenticate(auth.ScopeServersWrite)).Post("/{handle}/"+string(op), a.serverOperation(op))
			}
			r.With(a.authenticate(auth.ScopeServersWrite)).Put("/{handle}/projects", a.setServerProjects)
		})
	})
	return r
}
