package messages_test

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

func TestNewResults(t *testing.T) {
	const entry = "1714564800000-0"
	tests := []struct {
		name string
		got  any
		want any
	}{
		{"provisioner, job_id given", messages.NewProvisionerResult(&messages.ProvisionerMessage{
			RequestMeta:  messages.RequestMeta{JobID: "job-1", CorrelationID: "c-1", CreatedAt: "2024-05-01T12:00:00Z"},
			ServerHandle: "web-1", ForceReinstall: true,
		}, entry), &messages.ProvisionerResult{
			Outcome:      messages.Outcome{SchemaVersion: 1, JobID: "job-1", RequestID: entry, CorrelationID: "c-1", Attempt: 1},
			ServerHandle: "web-1",
		}},
		{"provisioner, no job_id: the entry id", messages.NewProvisionerResult(&messages.ProvisionerMessage{ServerHandle: "web-1"}, entry),
			&messages.ProvisionerResult{
				Outcome:      messages.Outcome{SchemaVersion: 1, JobID: entry, RequestID: entry, Attempt: 1},
				ServerHandle: "web-1",
			}},
		{"provisioner, undecodable request", messages.NewProvisionerResult(nil, entry),
			&messages.ProvisionerResult{Outcome: messages.Outcome{SchemaVersion: 1, JobID: entry, RequestID: entry, Attempt: 1}}},
		{"deploy, invalid ids and an out-of-range port are not echoed", messages.NewAnsibleDeployResult(&messages.AnsibleDeployMessage{
			RequestMeta: messages.RequestMeta{JobID: "job 1", CorrelationID: strings.Repeat("c", 300)},
			ProjectID:   "p", ServerIP: "not an ip", Port: 70000,
		}, entry), &messages.AnsibleDeployResult{
			Outcome:   messages.Outcome{SchemaVersion: 1, JobID: entry, RequestID: entry, Attempt: 1},
			ProjectID: "p", ServerIP: "not an ip",
		}},
		{"deploy, undecodable request", messages.NewAnsibleDeployResult(nil, entry),
			&messages.AnsibleDeployResult{Outcome: messages.Outcome{SchemaVersion: 1, JobID: entry, RequestID: entry, Attempt: 1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := diff(tc.want, tc.got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			// A rejection built from any request must itself be valid.
			r := tc.got.(interface {
				Reject(error)
				Validate() error
			})
			r.Reject(errors.New("bad request"))
			if err := r.Validate(); err != nil {
				t.Errorf("rejected result is invalid: %v", err)
			}
		})
	}
}

func TestOutcomeHelpers(t *testing.T) {
	start := time.Date(2024, 5, 1, 14, 0, 0, 123456789, time.FixedZone("CEST", 2*3600))
	res := messages.NewProvisionerResult(&messages.ProvisionerMessage{ServerHandle: "web-1"}, "1-0")
	res.SetTimes(start, start.Add(90*time.Second+500*time.Millisecond))
	if res.StartedAt != "2024-05-01T12:00:00.123Z" || res.FinishedAt != "2024-05-01T12:01:30.623Z" || res.DurationMS != 90500 {
		t.Errorf("SetTimes: %q %q %d", res.StartedAt, res.FinishedAt, res.DurationMS)
	}
	res.SetTimes(start, start.Add(-time.Second))
	if res.DurationMS != 0 {
		t.Errorf("SetTimes with the clock going back: duration %d, want 0", res.DurationMS)
	}

	res.Fail(messages.StatusUnreachable, messages.KindSSHUnreachable, "connection refused")
	if err := res.Validate(); err != nil {
		t.Errorf("failed result: %v", err)
	}
	res.Succeed()
	if res.Status != messages.StatusSucceeded || res.Error != nil {
		t.Errorf("Succeed: status %s, error %+v", res.Status, res.Error)
	}

	_, err := messages.DecodeAnsibleDeployMessage(mp(t, "port", "22", "server_ip", 1))
	res.Reject(err)
	want := &messages.ErrorInfo{
		Kind:    messages.KindInvalidMessage,
		Message: "undecodable message: port: must be an integer (got string); server_ip: must be a string (got integer)",
		Fields: []messages.FieldError{
			{Field: "port", Message: "must be an integer (got string)"},
			{Field: "server_ip", Message: "must be a string (got integer)"},
		},
	}
	if diff := diff(want, res.Error); diff != "" || res.Status != messages.StatusRejected {
		t.Errorf("Reject: status %s, error (-want +got):\n%s", res.Status, diff)
	}
	if err := res.Validate(); err != nil {
		t.Errorf("rejected result: %v", err)
	}
	res.Reject(errors.New("decode: boom"))
	if res.Error.Fields != nil || res.Error.Message != "decode: boom" {
		t.Errorf("Reject of a plain error: %+v", res.Error)
	}
}

func TestSetOutputTail(t *testing.T) {
	var o messages.Outcome
	o.SetOutputTail("short\n")
	if o.OutputTail != "short\n" {
		t.Errorf("short output changed: %q", o.OutputTail)
	}
	o.SetOutputTail("bad \xff byte")
	if o.OutputTail != "bad \uFFFD byte" {
		t.Errorf("invalid UTF-8 kept: %q", o.OutputTail)
	}
	lines := strings.Repeat("line of output\n", 5000) + "last line\n"
	o.SetOutputTail(lines)
	if len(o.OutputTail) > messages.MaxOutputTail || !strings.HasPrefix(o.OutputTail, "line of output\n") ||
		!strings.HasSuffix(o.OutputTail, "last line\n") {
		t.Errorf("tail of lines: %d bytes, starts %q", len(o.OutputTail), o.OutputTail[:20])
	}
	o.SetOutputTail(strings.Repeat("é", messages.MaxOutputTail)) // no newline, 2-byte runes
	if len(o.OutputTail) > messages.MaxOutputTail || !utf8.ValidString(o.OutputTail) {
		t.Errorf("tail cut inside a character: %d bytes, valid %v", len(o.OutputTail), utf8.ValidString(o.OutputTail))
	}
	if _, err := messages.Encode(&messages.ProvisionerResult{Outcome: o}); err != nil {
		t.Errorf("Encode after SetOutputTail: %v", err)
	}
}

func TestRequestMeta(t *testing.T) {
	m := messages.RequestMeta{}
	if got := m.JobIDOr("1-0"); got != "1-0" {
		t.Errorf("JobIDOr without job_id = %q", got)
	}
	m.JobID = "job-1"
	if got := m.JobIDOr("1-0"); got != "job-1" {
		t.Errorf("JobIDOr with job_id = %q", got)
	}
	if _, ok := m.CreatedTime(); ok {
		t.Error("CreatedTime without created_at is ok")
	}
	m.CreatedAt = "2024-05-01T12:00:00.5+00:00"
	if got, ok := m.CreatedTime(); !ok || !got.Equal(time.Date(2024, 5, 1, 12, 0, 0, 5e8, time.UTC)) || got.Location() != time.UTC {
		t.Errorf("CreatedTime = %v, %v", got, ok)
	}
	m.CreatedAt = "2024-05-01T14:00:00+02:00"
	if _, ok := m.CreatedTime(); ok {
		t.Error("CreatedTime accepts a time not in UTC")
	}
}

func TestTimes(t *testing.T) {
	ts := time.Date(2024, 5, 1, 12, 0, 0, 999999999, time.UTC)
	if got := messages.FormatTime(ts); got != "2024-05-01T12:00:00.999Z" {
		t.Errorf("FormatTime = %q (milliseconds are truncated, not rounded)", got)
	}
	if got := messages.FormatTime(time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)); got != "2024-05-01T12:00:00.000Z" {
		t.Errorf("FormatTime = %q, want three fraction digits always", got)
	}
	for _, bad := range []string{"", "2024-05-01T12:00:00+01:00", "2024-05-01t12:00:00z", "2024-05-01T24:00:00Z", "2024-02-30T12:00:00Z"} {
		if _, err := messages.ParseTime(bad); err == nil {
			t.Errorf("ParseTime(%q) succeeded", bad)
		}
	}
}

func TestEnums(t *testing.T) {
	for _, s := range messages.Statuses() {
		if !s.Valid() || !s.Terminal() {
			t.Errorf("status %s: Valid %v Terminal %v", s, s.Valid(), s.Terminal())
		}
	}
	if messages.Status("running").Valid() || messages.Status("running").Terminal() || messages.Status("").Valid() {
		t.Error("unknown status is valid")
	}
	if len(messages.ErrorKinds()) != 13 {
		t.Errorf("%d error kinds, want the 13 of the contract", len(messages.ErrorKinds()))
	}
	for _, k := range messages.ErrorKinds() {
		if !k.Known() {
			t.Errorf("kind %s not Known", k)
		}
	}
	if messages.ErrorKind("quota_exceeded").Known() {
		t.Error("unknown kind is Known")
	}
	hostEvents := 0
	for _, e := range messages.EventTypes() {
		if !e.Valid() {
			t.Errorf("event type %s not Valid", e)
		}
		if e.HostEvent() {
			hostEvents++
		}
	}
	if hostEvents != 5 || messages.EventType("host_rescued").HostEvent() || messages.EventRunFinished.HostEvent() {
		t.Errorf("HostEvent: %d host event types", hostEvents)
	}
	for _, c := range []struct{ got, want string }{
		{messages.ProgressStream(messages.JobKindProvision, "job-1"), "job:provision:job-1:events"},
		{messages.ProgressStream(messages.JobKindDeploy, "job-1"), "job:deploy:job-1:events"},
		{messages.CancelKey(messages.JobKindProvision, "job-1"), "job:provision:job-1:cancel"},
		{messages.CancelKey(messages.JobKindDeploy, "job-1"), "job:deploy:job-1:cancel"},
	} {
		if c.got != c.want {
			t.Errorf("name = %q, want %q", c.got, c.want)
		}
	}
}
