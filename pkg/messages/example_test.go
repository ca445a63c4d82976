package messages_test

import (
	"fmt"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// A producer fills a request, validates it and encodes it for the "data"
// field of a stream entry. The encoding is canonical: sorted keys, compact
// integers, empty optional keys left out.
func ExampleEncode() {
	msg := &messages.ProvisionerMessage{
		RequestMeta:  messages.RequestMeta{JobID: "job-1"},
		ServerHandle: "web-1",
	}
	if err := msg.Validate(); err != nil {
		panic(err)
	}
	data, err := messages.Encode(msg)
	if err != nil {
		panic(err)
	}
	fmt.Printf("XADD %s * %s <%d bytes>\n", messages.StreamProvisionerQueue, messages.DataField, len(data))
	fmt.Printf("% x\n", data)
	// Output:
	// XADD provisioner:queue * data <34 bytes>
	// 82 a6 6a 6f 62 5f 69 64 a5 6a 6f 62 2d 31 ad 73 65 72 76 65 72 5f 68 61 6e 64 6c 65 a5 77 65 62 2d 31
}

// A consumer decodes the "data" field: defaults are filled in, identifiers
// put in canonical form, and the rules checked.
func ExampleDecodeAnsibleDeployMessage() {
	// What a producer in another language may send: any key order, no
	// branch, no schema_version, an address in a non-canonical form, an
	// unknown key.
	data, _ := msgpack.Marshal(map[string]any{
		"server_ip":      "2001:DB8:0::1",
		"port":           22,
		"project_id":     "9B2F4C6E-1D3A-4E5B-8C7D-0A1B2C3D4E5F",
		"repo_full_name": "acme/shop",
		"priority":       "high",
	})
	msg, err := messages.DecodeAnsibleDeployMessage(data)
	if err != nil {
		panic(err)
	}
	fmt.Println(msg.SchemaVersion, msg.ProjectID, msg.Branch, msg.ServerIP, msg.Port)
	fmt.Println("job id:", msg.JobIDOr("1714564800000-0"))
	// Output:
	// 1 9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f main 2001:db8::1 22
	// job id: 1714564800000-0
}

// Bad input gives an error for which IsInvalid is true: reject the request,
// never retry it. Field errors name the wire keys.
func ExampleIsInvalid() {
	wrongType, _ := msgpack.Marshal(map[string]any{"server_handle": "web-1", "force_reinstall": "yes"})
	_, err := messages.DecodeProvisionerMessage(wrongType)
	fmt.Println(messages.IsInvalid(err), err)

	invalid, _ := msgpack.Marshal(map[string]any{"server_handle": "web 1", "job_id": "job-7"})
	msg, err := messages.DecodeProvisionerMessage(invalid)
	fmt.Println(messages.IsInvalid(err), err)
	fmt.Println("echo job id:", msg.JobID)

	_, err = messages.DecodeProvisionerMessage([]byte(`{"server_handle":"web-1"}`))
	fmt.Println(messages.IsInvalid(err), err)
	// Output:
	// true undecodable message: force_reinstall: must be a boolean (got string)
	// true invalid message: server_handle: must match ^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$
	// echo job id: job-7
	// true undecodable message: not a msgpack map (got integer)
}

// The infra service starts the result from the request and the id of its
// stream entry, fills in the outcome and publishes it.
func ExampleNewProvisionerResult() {
	msg := &messages.ProvisionerMessage{
		RequestMeta:  messages.RequestMeta{JobID: "job-1", CorrelationID: "agent-7"},
		ServerHandle: "web-1",
	}
	res := messages.NewProvisionerResult(msg, "1714564800000-0")
	started := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	res.Playbook = "provision.yml"
	res.Hosts = map[string]messages.HostRecap{"web-1": {Ok: 10, Changed: 4}}
	res.Fail(messages.StatusFailed, messages.KindPlaybookFailed, "a task failed")
	res.SetTimes(started, started.Add(1500*time.Millisecond))
	if err := res.Validate(); err != nil {
		panic(err)
	}
	data, err := messages.Encode(res)
	if err != nil {
		panic(err)
	}
	got, err := messages.DecodeProvisionerResult(data)
	if err != nil {
		panic(err)
	}
	fmt.Println(got.JobID, got.RequestID, got.CorrelationID, got.ServerHandle)
	fmt.Println(got.Status, got.Status.Terminal(), got.Error.Kind, got.StartedAt, got.DurationMS)
	// Output:
	// job-1 1714564800000-0 agent-7 web-1
	// failed true playbook_failed 2024-05-01T12:00:00.000Z 1500
}

// A request that could not be decoded still gets a result, so that its
// producer learns why; the job id is then the entry id.
func ExampleOutcome_Reject() {
	_, err := messages.DecodeProvisionerMessage([]byte{0xc1})
	res := messages.NewProvisionerResult(nil, "1714564800000-0")
	res.Reject(err)
	fmt.Println(res.JobID, res.Status, res.Error.Kind, res.Error.Message)
	// Output:
	// 1714564800000-0 rejected invalid_message undecodable message: not a msgpack map (got invalid code 0xc1)
}

// Progress events of a job go to a stream of its own.
func ExampleProgressStream() {
	ev := &messages.ProgressEvent{
		JobID: "job-1",
		Seq:   1,
		Time:  messages.FormatTime(time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)),
		Type:  messages.EventRunStarted,
	}
	fmt.Println(messages.ProgressStream(messages.JobKindDeploy, ev.JobID), ev.Time, ev.Validate() == nil)
	// Output:
	// job:deploy:job-1:events 2024-05-01T12:00:00.000Z true
}
