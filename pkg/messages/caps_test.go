package messages_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// TestHostileInvalidMessageGivesSmallRejection: a 12 KB deploy request
// holding thousands of wrong-typed modules entries gets a rejection that
// lists the first MaxFieldErrors problems, counts the others, and encodes
// to a few KiB: publishable, never over the message limit.
func TestHostileInvalidMessageGivesSmallRejection(t *testing.T) {
	modules := make([]any, 4000)
	for i := range modules {
		modules[i] = i // integers where strings belong
	}
	data, err := msgpack.Marshal(map[string]any{
		"job_id": "hostile-1", "project_id": "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", "repo_full_name": "a/b",
		"server_ip": "192.0.2.1", "port": 22, "modules": modules,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > 16<<10 {
		t.Fatalf("input is %d bytes, want a small message", len(data))
	}
	m, err := messages.DecodeAnsibleDeployMessage(data)
	var de *messages.DecodeError
	if !errors.As(err, &de) {
		t.Fatalf("err = %v, want *DecodeError", err)
	}
	if len(de.Fields) != messages.MaxFieldErrors || de.Omitted != 4000-messages.MaxFieldErrors {
		t.Fatalf("fields = %d, omitted = %d; want %d and %d", len(de.Fields), de.Omitted, messages.MaxFieldErrors, 4000-messages.MaxFieldErrors)
	}
	if !strings.HasSuffix(err.Error(), "and 3980 more") {
		t.Fatalf("error does not count the omitted problems: ...%s", err.Error()[max(0, len(err.Error())-80):])
	}
	res := messages.NewAnsibleDeployResult(m, "1714564800000-0")
	res.Reject(err)
	out, err := messages.EncodeResult(res)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) > 8<<10 {
		t.Fatalf("rejection is %d bytes, want a few KiB", len(out))
	}
	back, err := messages.DecodeAnsibleDeployResult(out)
	if err != nil {
		t.Fatalf("the rejection is not a valid result: %v", err)
	}
	if back.JobID != "hostile-1" || back.Status != messages.StatusRejected || len(back.Error.Fields) != messages.MaxFieldErrors {
		t.Fatalf("rejection = %+v", back)
	}
}

// TestValidationErrorsCapped: a decodable request with more rule
// violations than MaxFieldErrors lists the first ones and counts the rest.
func TestValidationErrorsCapped(t *testing.T) {
	mods := make([]string, messages.MaxModules)
	for i := range mods {
		mods[i] = "BAD"
	}
	m := &messages.AnsibleDeployMessage{ProjectID: "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", RepoFullName: "a/b",
		ServerIP: "192.0.2.1", Port: 22, Modules: mods}
	var ve *messages.ValidationError
	if err := m.Validate(); !errors.As(err, &ve) {
		t.Fatalf("err = %v", err)
	}
	if len(ve.Fields) != messages.MaxFieldErrors || ve.Omitted != messages.MaxModules-messages.MaxFieldErrors {
		t.Fatalf("fields = %d, omitted = %d", len(ve.Fields), ve.Omitted)
	}
}

// TestEchoOfHugeValuesLeftOut: a rejected request whose server_handle is
// almost a MiB is not echoed, so the rejection stays small.
func TestEchoOfHugeValuesLeftOut(t *testing.T) {
	huge := strings.Repeat("h", messages.MaxMessageSize-100)
	data, err := msgpack.Marshal(map[string]any{"job_id": "big-1", "server_handle": huge})
	if err != nil {
		t.Fatal(err)
	}
	m, err := messages.DecodeProvisionerMessage(data)
	if err == nil {
		t.Fatal("a 1 MiB handle was accepted")
	}
	res := messages.NewProvisionerResult(m, "1714564800000-0")
	res.Reject(err)
	out, err := messages.EncodeResult(res)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) > 4<<10 || res.ServerHandle != "" {
		t.Fatalf("rejection is %d bytes, handle echoed: %v", len(out), res.ServerHandle != "")
	}
	ok := messages.NewProvisionerResult(&messages.ProvisionerMessage{ServerHandle: "web:1@dc"}, "1-0")
	if ok.ServerHandle != "web:1@dc" {
		t.Fatalf("a normal handle is not echoed: %q", ok.ServerHandle)
	}
}

// TestEncodeResultFallsBackToMinimal: a result too large to publish (here a
// recap of 100,000 hosts) is replaced by a minimal one with the same job,
// status and error kind, so that the requester still hears of the outcome.
func TestEncodeResultFallsBackToMinimal(t *testing.T) {
	res := messages.NewAnsibleDeployResult(&messages.AnsibleDeployMessage{
		RequestMeta: messages.RequestMeta{JobID: "deploy-9", CorrelationID: "c-9"},
		ProjectID:   "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", ServerIP: "192.0.2.1", Port: 22,
	}, "1714564800000-0")
	res.Fail(messages.StatusFailed, messages.KindPlaybookFailed, strings.Repeat("x", 100<<10))
	if n := len(res.Error.Message); n > messages.MaxErrorMessage || !strings.HasSuffix(res.Error.Message, messages.CutMarker) {
		t.Fatalf("message of %d bytes not cut", n)
	}
	res.Hosts = map[string]messages.HostRecap{}
	for i := range 100_000 {
		res.Hosts[strings.Repeat("h", 8)+strconv.Itoa(i)] = messages.HostRecap{Ok: 1}
	}
	if _, err := messages.Encode(res); err == nil {
		t.Fatal("the oversized result encoded: the test does not exercise the fallback")
	}
	out, err := messages.EncodeResult(res)
	if err != nil {
		t.Fatal(err)
	}
	back, err := messages.DecodeAnsibleDeployResult(out)
	if err != nil {
		t.Fatal(err)
	}
	if back.JobID != "deploy-9" || back.CorrelationID != "c-9" || back.Status != messages.StatusFailed ||
		back.Error.Kind != messages.KindPlaybookFailed || back.Hosts != nil || back.ProjectID != res.ProjectID ||
		!strings.Contains(back.Error.Message, "result details left out") {
		t.Fatalf("minimal result = %+v", back)
	}
}

// TestServerIPReadInCanonicalForm: every spelling of one address reads as
// the same server_ip, so that the service finds the registered server, its
// pinned host key and its lock under it; an IPv4-mapped IPv6 address is
// its IPv4 address.
func TestServerIPReadInCanonicalForm(t *testing.T) {
	for in, want := range map[string]string{
		"::ffff:192.0.2.1":        "192.0.2.1",
		"::FFFF:c000:0201":        "192.0.2.1",
		"0:0:0:0:0:ffff:c000:201": "192.0.2.1",
		"fd00:5ec:0:0::2":         "fd00:5ec::2",
		"2001:DB8:0:0:0:0:0:1":    "2001:db8::1",
		"192.0.2.1":               "192.0.2.1",
	} {
		data, err := msgpack.Marshal(map[string]any{"project_id": "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f",
			"repo_full_name": "a/b", "server_ip": in, "port": 22})
		if err != nil {
			t.Fatal(err)
		}
		m, err := messages.DecodeAnsibleDeployMessage(data)
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if m.ServerIP != want {
			t.Errorf("server_ip %q read as %q, want %q", in, m.ServerIP, want)
		}
	}
}
