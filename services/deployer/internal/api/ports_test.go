package api_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
)

// TestOpenAPIPortIsTheAppPort: the document says what the wire contract
// says of a deployment's port (the application's port, handed to the
// deploy playbook, never the SSH port), and a server's ssh_port is the SSH
// port deployments use.
func TestOpenAPIPortIsTheAppPort(t *testing.T) {
	t.Parallel()
	type prop struct {
		Description string `json:"description"`
	}
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]prop `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(api.OpenAPIDocument(), &doc); err != nil {
		t.Fatal(err)
	}
	req := doc.Components.Schemas["DeploymentRequest"].Properties
	for _, want := range []string{"The application's port", "deploy playbook", "Not the SSH port", "registered ssh_port"} {
		if !strings.Contains(req["port"].Description, want) {
			t.Errorf("DeploymentRequest.port description %q lacks %q", req["port"].Description, want)
		}
	}
	if _, ok := req["ssh_port"]; ok {
		t.Errorf("DeploymentRequest has ssh_port, which the API does not take")
	}
	for name, s := range doc.Components.Schemas {
		if p, ok := s.Properties["ssh_port"]; ok && !strings.Contains(p.Description, "SSH port") {
			t.Errorf("%s.ssh_port description %q does not say it is the SSH port", name, p.Description)
		}
	}
}

// TestSubmitPortIsTheAppPort: POST /deployments hands port to the queue
// as the application's port, without an ssh_port (a registered server's
// own is used), and refuses an ssh_port key by name.
func TestSubmitPortIsTheAppPort(t *testing.T) {
	t.Parallel()
	e := dt.Start(t, dt.Options{NoInfra: true})
	r := dt.Request()
	r["port"] = 8080
	r["ssh_port"] = 2222
	resp, body := e.Do("POST", "/api/v1/deployments", e.CI, r)
	if resp.StatusCode != 400 {
		t.Fatalf("ssh_port in a request: status %d, want 400: %s", resp.StatusCode, body)
	}
	if p := dt.JSON[api.Problem](t, body); len(p.Errors) != 1 || p.Errors[0].Field != "ssh_port" {
		t.Errorf("the refusal does not name ssh_port: %s", body)
	}

	delete(r, "ssh_port")
	if resp, body := e.Do("POST", "/api/v1/deployments", e.CI, r); resp.StatusCode != 202 {
		t.Fatalf("submit: status %d: %s", resp.StatusCode, body)
	}
	entries, err := e.Redis.XRange(context.Background(), e.Streams.Queue, "-", "+").Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("queue: %d entries, %v", len(entries), err)
	}
	m, err := messages.DecodeAnsibleDeployMessage((&stream.Message{Values: entries[0].Values}).Data())
	if err != nil || m.Port != 8080 || m.SSHPort != 0 {
		t.Fatalf("queued %+v (%v), want port 8080 and no ssh_port", m, err)
	}
}
