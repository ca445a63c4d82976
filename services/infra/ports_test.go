package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestDeployPorts walks the two ports of a deploy with the real infra
// binary: port is the application's port, handed to the deploy playbook as
// its variable port; the SSH port is the registered server's (servers
// .ssh_port), or the request's ssh_port (22 when absent) for an
// unregistered target. The loopback sshd listens on a port other than 22 and
// other than port, so only a run that dials the right one reaches it.
func TestDeployPorts(t *testing.T) {
	t.Parallel()
	sshd := testenv.StartSSHD(t, testenv.SSHDOptions{})
	e := newE2E(t, sshd)
	// Unregistered loopback targets are let through for this test only.
	e.infra("DEPLOY_ALLOW_NETWORKS=127.0.0.0/8")
	const project = "3f1c9f2e-8a57-4d6b-9a0e-2b1f4c5d6e7f"
	deploy := func(jobID string, port, sshPort int) *messages.AnsibleDeployResult {
		t.Helper()
		e.publish(messages.StreamAnsibleDeployQueue, &messages.AnsibleDeployMessage{
			RequestMeta: messages.RequestMeta{JobID: jobID}, ProjectID: project, RepoFullName: "acme/shop",
			ServerIP: sshd.Host, Port: port, SSHPort: sshPort,
		})
		return e.waitDeploy(jobID)
	}
	// played returns what the deploy playbook received on host, and
	// removes the record for the next run.
	played := func(host string) map[string]any {
		t.Helper()
		path := filepath.Join(e.ansibleDir, "out", host+".deploy.json")
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("the deploy playbook did not run on %s: %v", host, err)
		}
		os.Remove(path)
		var got map[string]any
		if err := json.Unmarshal(data, &got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	wantPorts := func(got map[string]any, app, ssh int) {
		t.Helper()
		if got["port"] != float64(app) || got["ansible_port"] != float64(ssh) {
			t.Errorf("playbook got port %v over ansible_port %v, want the app port %d over SSH port %d",
				got["port"], got["ansible_port"], app, ssh)
		}
	}
	rejected := func(r *messages.AnsibleDeployResult, field, msg string) {
		t.Helper()
		if r.Status != messages.StatusRejected || r.Error == nil || r.Error.Kind != messages.KindInvalidMessage ||
			len(r.Error.Fields) != 1 || r.Error.Fields[0].Field != field || !strings.Contains(r.Error.Fields[0].Message, msg) {
			t.Fatalf("result %s %+v, want rejected with one field error on %s saying %q", r.Status, r.Error, field, msg)
		}
	}

	// An unregistered target is dialed on ssh_port, and its error names it.
	closed := testenv.FreePort(t)
	r := deploy("unreg-closed", 8080, closed)
	expect(t, r, messages.StatusUnreachable, messages.KindSSHUnreachable, fmt.Sprintf("%s:%d did not answer SSH", sshd.Host, closed), true)

	r = deploy("unreg-ok", 8080, sshd.Port)
	if r.Status != messages.StatusSucceeded || r.Port != 8080 {
		t.Fatalf("unregistered deploy: %s %+v, port echoed %d", r.Status, r.Error, r.Port)
	}
	wantPorts(played(sshd.Host), 8080, sshd.Port)

	// An application port that is the SSH port (what a producer that read
	// port as the SSH port sends) is refused before anything is dialed.
	r = deploy("unreg-22", 22, 0)
	rejected(r, "port", "must not be the target's SSH port (ssh_port, 22 when absent)")
	r = deploy("unreg-same", sshd.Port, sshd.Port)
	rejected(r, "port", "must not be the target's SSH port")

	// A registered server is reached on its own SSH port, whatever port
	// (the application's) says.
	e.addServer("web-1", sshd)
	r = deploy("reg-ok", 8080, 0)
	if r.Status != messages.StatusSucceeded || r.Port != 8080 {
		t.Fatalf("registered deploy: %s %+v, port echoed %d", r.Status, r.Error, r.Port)
	}
	wantPorts(played("web-1"), 8080, sshd.Port)
	r = deploy("reg-same-ssh", 8081, sshd.Port) // naming the server's own SSH port is fine
	if r.Status != messages.StatusSucceeded {
		t.Fatalf("registered deploy with its ssh_port: %s %+v", r.Status, r.Error)
	}
	wantPorts(played("web-1"), 8081, sshd.Port)

	r = deploy("reg-other-ssh", 8080, 22)
	rejected(r, "ssh_port", fmt.Sprintf("must be absent or %d: the target is registered server web-1", sshd.Port))
	r = deploy("reg-port-is-ssh", sshd.Port, 0)
	rejected(r, "port", "must not be the target's SSH port (registered server web-1's)")

	// Nothing ran for the rejected requests: the playbook ran twice on
	// web-1 (both records were removed above) and on no other host.
	if left, _ := filepath.Glob(filepath.Join(e.ansibleDir, "out", "*.deploy.json")); len(left) != 0 {
		t.Errorf("deploy playbook records left by refused requests: %v", left)
	}
}
