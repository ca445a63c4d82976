// Package messages holds the wire contract of the system: the requests read
// from the provisioner and deploy queues, the results published when a job
// ends, and the progress events of a running job, with their msgpack
// encoding, defaults and validation.
//
// Producers may be written in any language, so the format is a documented
// contract (docs/wire-contract.md, JSON Schemas in schema/), not a Go detail:
// every stream entry has the field "data", holding a msgpack map with
// snake_case string keys, and optionally "sig", the producer's signature
// (see Sign). Readers accept keys in any order, integers of any
// width, and ignore unknown keys; schema_version (1 when absent) lets the
// format evolve.
//
// Consumers call DecodeProvisionerMessage, DecodeAnsibleDeployMessage,
// DecodeAnsibleJobMessage, DecodeProvisionerResult,
// DecodeAnsibleDeployResult, DecodeAnsibleJobResult or DecodeProgressEvent;
// a bad input gives an error for which IsInvalid is true, to be rejected and
// never retried. Producers fill the types and call Encode, whose output is
// canonical (sorted keys, compact integers).
//
// The package is a leaf and a Go module of its own: it imports only the
// standard library and msgpack, and its module requires nothing else, so
// that a producer importing it pulls nothing of the services' stack.
package messages

import (
	"fmt"
	"regexp"
	"time"
)

// Stream names. Each entry of these streams has the field DataField, and
// optionally SigField.
const (
	// StreamProvisionerQueue carries ProvisionerMessage requests.
	StreamProvisionerQueue = "provisioner:queue"
	// StreamAnsibleDeployQueue carries AnsibleDeployMessage requests.
	StreamAnsibleDeployQueue = "ansible:deploy:queue"
	// StreamProvisionerResults carries a ProvisionerResult per finished job.
	StreamProvisionerResults = "provisioner:results"
	// StreamDeployResults carries an AnsibleDeployResult per finished job.
	StreamDeployResults = "deploy:results"
)

// DataField is the field of every stream entry whose value is the
// msgpack-encoded message.
const DataField = "data"

// SchemaVersion is the newest schema_version this package reads and the one
// it writes. A message with a greater schema_version is invalid; an absent
// (or 0) schema_version means 1.
const SchemaVersion = 1

// MaxMessageSize is the largest encoded message, in bytes, that is accepted
// (1 MiB).
const MaxMessageSize = 1 << 20

// JobKind is the kind of a job: which queue its request came from. It
// namespaces the job's progress stream and cancel key, so that each
// producer's Redis user reaches only the keys of its own kind (the deployer
// those of deploys, never of provisioning jobs). Every name starts with
// "job:<kind>:", so one pattern (job:*) still covers all kinds for infra.
type JobKind string

// Job kinds. Ansible jobs (StreamAnsibleJobQueue) are JobKindJob, in
// job.go: job:job:<job_id>:events.
const (
	// JobKindProvision is a job of StreamProvisionerQueue.
	JobKindProvision JobKind = "provision"
	// JobKindDeploy is a job of StreamAnsibleDeployQueue.
	JobKindDeploy JobKind = "deploy"
)

// JobKinds returns every job kind, in a fixed order (a new slice each call).
func JobKinds() []JobKind { return []JobKind{JobKindProvision, JobKindDeploy, JobKindJob} }

// ProgressStream returns the name of the stream that carries the
// ProgressEvents of job jobID of kind kind: "job:<kind>:<job_id>:events".
func ProgressStream(kind JobKind, jobID string) string {
	return "job:" + string(kind) + ":" + jobID + ":events"
}

// CancelKey returns the Redis key whose existence asks the running job
// jobID of kind kind to stop: "job:<kind>:<job_id>:cancel". Any value will
// do; set it with an expiry (for example SET job:deploy:<id>:cancel 1 EX
// 86400). The job then ends with status cancelled; a job that has not
// started yet is not affected until it starts.
func CancelKey(kind JobKind, jobID string) string {
	return "job:" + string(kind) + ":" + jobID + ":cancel"
}

// timeLayout writes times as RFC 3339 in UTC with milliseconds.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// timeRE is the shape of the times accepted on the wire: RFC 3339 with a
// 'T', optional fraction, in UTC ("Z" or "+00:00").
var timeRE = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|\+00:00)$`)

// FormatTime formats t as the wire writes times: RFC 3339 in UTC with
// millisecond precision, e.g. "2024-05-01T12:00:00.250Z".
func FormatTime(t time.Time) string {
	return t.UTC().Format(timeLayout)
}

// ParseTime parses a wire time: RFC 3339 in UTC ("Z" or "+00:00"), with any
// number of fraction digits.
func ParseTime(s string) (time.Time, error) {
	if !timeRE.MatchString(s) {
		return time.Time{}, fmt.Errorf("parse time %q: not an RFC 3339 time in UTC", s)
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("parse time %q: %w", s, err)
	}
	return t.UTC(), nil
}
