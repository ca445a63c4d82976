package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// ownerB is the other tenant of the ownership tests.
const ownerB = "b0b0b0b0-1111-4222-8333-444455556666"

// TestAttackJobOnAnotherProjectsServer is issue 31's first attack at infra:
// signed requests of project A (as a producer, or a deployer with a bug,
// could send them) aimed at project B's registered server, by address and
// port and by handle, and a job host that would need infra's default key.
// Each is refused before anything is dialed (no SSH attempt at all), with
// a field error; A's own server is reached with A's server key, never
// infra's default one.
func TestAttackJobOnAnotherProjectsServer(t *testing.T) {
	t.Parallel()
	w := newJobWorld(t, 3)
	// Only A's own key opens sshd 1 (A's server): a success there proves
	// the job got A's server key, not infra's default one.
	a := w.sshds[1]
	if err := os.WriteFile(filepath.Join(a.Dir, "authorized_keys"), []byte(a.ClientPublicKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, s := range []struct {
		handle, addr string
		port         int
		projects     []string
		keyRef       any
	}{
		{"b-web", w.sshds[0].Host, w.sshds[0].Port, []string{ownerB}, nil},
		{"a-web", a.Host, a.Port, []string{jobProject}, "env:AUTOPROV_SECRET_AKEY"},
		{"a-bare", w.sshds[2].Host, w.sshds[2].Port, []string{jobProject}, nil},
		// A's server whose key also opens one of B's: never lent.
		{"a-shared", "192.0.2.98", 22, []string{jobProject}, "env:AUTOPROV_SECRET_SHARED"},
		{"b-shared", "192.0.2.99", 22, []string{ownerB}, "env:AUTOPROV_SECRET_SHARED"},
		// B's server alone at its address, for a deploy (found by address).
		{"b-deploy", "127.0.0.2", 22, []string{ownerB}, nil},
	} {
		if _, err := w.pool.Exec(ctx, `INSERT INTO servers (handle, address, ssh_port, ssh_user, projects, ssh_key_ref)
			VALUES ($1, $2, $3, $4, $5, $6)`, s.handle, s.addr, s.port, w.sshds[0].User, s.projects, s.keyRef); err != nil {
			t.Fatal(err)
		}
	}
	w.repo.Commit(t, map[string]string{"site.yml": sitePlay})
	p := w.start("AUTOPROV_SECRET_AKEY="+string(a.ClientKey), "AUTOPROV_SECRET_SHARED="+string(a.ClientKey))

	noCreds := func(m *messages.AnsibleJobMessage) *messages.AnsibleJobMessage {
		m.Credentials.SSH = ""
		return m
	}
	for _, tt := range []struct {
		name string
		m    *messages.AnsibleJobMessage
		msg  string
	}{
		{"B's server by address and port",
			w.job("own-b-addr", map[string]messages.Vars{"h": w.host(0)}, "site.yml"), "does not own"},
		{"B's server by handle",
			w.job("own-b-handle", map[string]messages.Vars{"h": {"autoprov_server": "b-web"}}, "site.yml"), "names no registered server"},
		{"an unknown handle",
			w.job("own-unknown", map[string]messages.Vars{"h": {"autoprov_server": "nope"}}, "site.yml"), "names no registered server"},
		{"A's server without a key of its own, no credentials.ssh",
			noCreds(w.job("own-a-bare", map[string]messages.Vars{"h": {"autoprov_server": "a-bare"}}, "site.yml")), "never lent"},
		{"A's server whose key opens B's, no credentials.ssh",
			noCreds(w.job("own-a-shared", map[string]messages.Vars{"h": {"autoprov_server": "a-shared"}}, "site.yml")), "never lent"},
		{"an unregistered host, no credentials.ssh",
			noCreds(w.job("own-unreg", map[string]messages.Vars{"h": w.deadHost(t)}, "site.yml")), "never lent"},
	} {
		w.submit(tt.m)
		r := w.waitJob(tt.m.JobID, 3*time.Minute)
		jobStatus(t, r, messages.StatusRejected, messages.KindInvalidMessage)
		if len(r.Error.Fields) != 1 || r.Error.Fields[0].Field != "inventory.hosts[h]" || !strings.Contains(r.Error.Fields[0].Message, tt.msg) {
			t.Errorf("%s: fields %+v, want inventory.hosts[h] saying %q", tt.name, r.Error.Fields, tt.msg)
		}
		if strings.Contains(r.Error.Message+r.Error.Fields[0].Message, ownerB) {
			t.Errorf("%s: the refusal names B's project", tt.name)
		}
	}
	// A deploy of A's project to B's server.
	w.publish(messages.StreamAnsibleDeployQueue, &messages.AnsibleDeployMessage{
		RequestMeta: messages.RequestMeta{JobID: "own-deploy-b"}, ProjectID: jobProject, RepoFullName: "acme/shop",
		ServerIP: "127.0.0.2", Port: 8080})
	r := w.waitDeploy("own-deploy-b")
	if r.Status != messages.StatusRejected || r.Error == nil || r.Error.Kind != messages.KindInvalidMessage ||
		len(r.Error.Fields) != 1 || r.Error.Fields[0].Field != "server_ip" {
		t.Errorf("deploy to B's server: %+v %+v", r.Status, r.Error)
	}
	if n := p.sshAttempts(t); n != 0 {
		t.Fatalf("%v SSH attempts for refused requests, want none", n)
	}
	for _, h := range []string{"h.a", "h.b"} {
		if _, err := os.Stat(filepath.Join(w.out, h)); err == nil {
			t.Fatalf("a refused job ran (%s written)", h)
		}
	}

	// A's own server, without credentials.ssh: A's server key.
	m := noCreds(w.job("own-a-web", map[string]messages.Vars{"mine": {"autoprov_server": "a-web"}}, "site.yml"))
	w.submit(m)
	jobStatus(t, w.waitJob("own-a-web", 3*time.Minute), messages.StatusSucceeded, "")
	if _, err := os.Stat(filepath.Join(w.out, "mine.a")); err != nil {
		t.Errorf("the job on A's server did not run: %v", err)
	}
}
