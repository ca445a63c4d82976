package api_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/webhooks"
)

type openAPIDoc struct {
	OpenAPI string `json:"openapi"`
	Servers []struct {
		URL string `json:"url"`
	} `json:"servers"`
	Paths map[string]map[string]json.RawMessage `json:"paths"`
}

// TestOpenAPIMatchesRoutes checks both ways that every route of the router
// is in the OpenAPI document and every operation of the document is a
// route; response bodies are checked against the document's schemas in the
// other tests (CheckSchema).
func TestOpenAPIMatchesRoutes(t *testing.T) {
	t.Parallel()
	a, err := api.New(api.Config{}, api.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	routes := map[string]bool{}
	err = chi.Walk(a.Router(), func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		if route != "/" {
			route = strings.TrimSuffix(route, "/")
		}
		routes[method+" "+route] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPIDoc
	if err := json.Unmarshal(api.OpenAPIDocument(), &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	if doc.OpenAPI != "3.1.0" || len(doc.Servers) != 1 {
		t.Fatalf("openapi %q, servers %v", doc.OpenAPI, doc.Servers)
	}
	documented := map[string]bool{}
	for path, item := range doc.Paths {
		for method := range item {
			if method == "parameters" {
				continue
			}
			documented[strings.ToUpper(method)+" "+doc.Servers[0].URL+path] = true
		}
	}
	for r := range routes {
		if !documented[r] {
			t.Errorf("route %s is not in openapi.json", r)
		}
	}
	for d := range documented {
		if !routes[d] {
			t.Errorf("openapi.json documents %s, which is no route", d)
		}
	}
	if len(routes) < 15 {
		t.Errorf("only %d routes walked", len(routes))
	}
	keys := make([]string, 0, len(routes))
	for r := range routes {
		keys = append(keys, r)
	}
	slices.Sort(keys)
	t.Logf("%d routes: %s", len(keys), strings.Join(keys, ", "))
}

func TestOpenAPIServedAndValid(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true})
	resp, body := e.Do("GET", "/api/v1/openapi.json", "", nil)
	if resp.StatusCode != 200 || string(body) != string(api.OpenAPIDocument()) {
		t.Fatalf("served document: %d, %d bytes", resp.StatusCode, len(body))
	}
	// Every schema compiles (CheckSchema fails on a broken one), and real
	// answers match theirs.
	_, body = e.Do("POST", "/api/v1/deployments", e.CI, dt.Request())
	dt.CheckSchema(t, "Deployment", body)
	_, body = e.Do("GET", "/api/v1/deployments", e.CI, nil)
	dt.CheckSchema(t, "DeploymentList", body)
	_, body = e.Do("POST", "/api/v1/deployments", e.CI, `{"port": "x"}`)
	dt.CheckSchema(t, "Problem", body)
	_, body = e.Do("POST", "/api/v1/keys", e.Admin, map[string]any{"name": "doc", "scopes": []string{"servers:read"}})
	dt.CheckSchema(t, "CreatedKey", body)
	_, body = e.Do("GET", "/api/v1/keys", e.Admin, nil)
	dt.CheckSchema(t, "KeyList", body)
	_, body = e.Do("GET", "/api/v1/me", e.CI, nil)
	dt.CheckSchema(t, "Key", body)
	_, body = e.Do("GET", "/api/v1/servers", e.Admin, nil)
	dt.CheckSchema(t, "ServerList", body)
}

// TestOpenAPIWebhookErrorClasses: the document lists exactly the classes a
// webhook attempt's error can take (webhooks.Classes), for last_error and
// for each attempt.
func TestOpenAPIWebhookErrorClasses(t *testing.T) {
	t.Parallel()
	var doc struct {
		Components struct {
			Schemas struct {
				Delivery struct {
					Properties struct {
						LastError struct {
							Enum []string `json:"enum"`
						} `json:"last_error"`
						History struct {
							Items struct {
								Properties struct {
									Error struct {
										Enum []string `json:"enum"`
									} `json:"error"`
								} `json:"properties"`
							} `json:"items"`
						} `json:"history"`
					} `json:"properties"`
				} `json:"Delivery"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(api.OpenAPIDocument(), &doc); err != nil {
		t.Fatal(err)
	}
	p := doc.Components.Schemas.Delivery.Properties
	for name, enum := range map[string][]string{"last_error": p.LastError.Enum, "history[].error": p.History.Items.Properties.Error.Enum} {
		if !slices.Equal(enum, webhooks.Classes) {
			t.Errorf("Delivery %s enum %v, want %v", name, enum, webhooks.Classes)
		}
	}
}

// TestOpenAPIDescribesOrderAndTasks: the document says in which order the
// lists with a history come and what progress.tasks holds (the answers'
// order is checked in TestServers, TestWebhooks and TestSubmitAndGet).
func TestOpenAPIDescribesOrderAndTasks(t *testing.T) {
	t.Parallel()
	type described struct {
		Description string `json:"description"`
	}
	var doc struct {
		Components struct {
			Schemas struct {
				ServerDetail struct {
					Properties struct {
						History described `json:"history"`
						Runs    described `json:"runs"`
					} `json:"properties"`
				} `json:"ServerDetail"`
				Delivery struct {
					Properties struct {
						History described `json:"history"`
					} `json:"properties"`
				} `json:"Delivery"`
				Progress struct {
					Properties struct {
						Tasks described `json:"tasks"`
					} `json:"properties"`
				} `json:"Progress"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(api.OpenAPIDocument(), &doc); err != nil {
		t.Fatal(err)
	}
	s := doc.Components.Schemas
	for name, c := range map[string]struct{ got, want string }{
		"ServerDetail.history": {s.ServerDetail.Properties.History.Description, "newest first"},
		"ServerDetail.runs":    {s.ServerDetail.Properties.Runs.Description, "newest first"},
		"Delivery.history":     {s.Delivery.Properties.History.Description, "oldest first"},
		"Progress.tasks":       {s.Progress.Properties.Tasks.Description, "per host"},
	} {
		if !strings.Contains(c.got, c.want) {
			t.Errorf("%s: description %q does not say %q", name, c.got, c.want)
		}
	}
}
