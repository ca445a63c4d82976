package messages

import "strings"

// EventType is the kind of a ProgressEvent.
type EventType string

// The progress event types, in the order a run emits them.
const (
	// EventRunStarted: the job started (first event, seq 1).
	EventRunStarted EventType = "run_started"
	// EventPlayStarted: a play started; play names it.
	EventPlayStarted EventType = "play_started"
	// EventTaskStarted: a task started; play and task name it.
	EventTaskStarted EventType = "task_started"
	// EventHostOK: a task succeeded on host without changes.
	EventHostOK EventType = "host_ok"
	// EventHostChanged: a task succeeded on host and changed something.
	EventHostChanged EventType = "host_changed"
	// EventHostFailed: a task failed on host; message says why (redacted).
	EventHostFailed EventType = "host_failed"
	// EventHostUnreachable: host could not be reached for a task.
	EventHostUnreachable EventType = "host_unreachable"
	// EventHostSkipped: a task was skipped on host.
	EventHostSkipped EventType = "host_skipped"
	// EventRunFinished: the job is over (last event); status is the
	// result's status.
	EventRunFinished EventType = "run_finished"
)

// EventTypes returns every event type.
func EventTypes() []EventType {
	return []EventType{
		EventRunStarted, EventPlayStarted, EventTaskStarted, EventHostOK, EventHostChanged,
		EventHostFailed, EventHostUnreachable, EventHostSkipped, EventRunFinished,
	}
}

// Valid reports whether t is one of the event types of the contract.
func (t EventType) Valid() bool {
	for _, known := range EventTypes() {
		if t == known {
			return true
		}
	}
	return false
}

// HostEvent reports whether events of type t are about one host (and carry
// host).
func (t EventType) HostEvent() bool {
	return strings.HasPrefix(string(t), "host_") && t.Valid()
}

// ProgressEvent is one step of a running job, published on the job's own
// stream, ProgressStream(job_id), for followers such as the deployer. Events
// are informative: the result on the results stream is authoritative.
type ProgressEvent struct {
	// Version of the message format; absent or 0 means 1.
	SchemaVersion int `msgpack:"schema_version,omitempty"`
	// Job the event belongs to.
	JobID string `msgpack:"job_id"`
	// Position of the event in its job's stream: 1, 2, 3, ...
	Seq int64 `msgpack:"seq"`
	// When it happened: RFC 3339 in UTC with milliseconds.
	Time string `msgpack:"time"`
	// What happened.
	Type EventType `msgpack:"type"`
	// Name of the current play, when there is one.
	Play string `msgpack:"play,omitempty"`
	// Name of the current task, when there is one.
	Task string `msgpack:"task,omitempty"`
	// Host of a host_* event.
	Host string `msgpack:"host,omitempty"`
	// Details for humans (redacted); may be empty.
	Message string `msgpack:"message,omitempty"`
	// Status of the job, only on run_finished.
	Status Status `msgpack:"status,omitempty"`
}

// Validate checks e against the contract and returns a *ValidationError
// listing every problem, or nil.
func (e *ProgressEvent) Validate() error {
	var c checker
	c.version(e.SchemaVersion)
	c.id("job_id", e.JobID, true)
	if e.Seq < 1 {
		c.add("seq", "must be at least 1")
	}
	c.time("time", e.Time, true)
	switch {
	case e.Type == "":
		c.add("type", msgRequired)
	case !e.Type.Valid():
		c.add("type", "must be one of "+joinEventTypes())
	}
	if e.Type.HostEvent() && e.Host == "" {
		c.add("host", "required for "+string(e.Type)+" events")
	}
	switch {
	case e.Type == EventRunFinished && e.Status == "":
		c.add("status", "required for run_finished events")
	case e.Type == EventRunFinished && !e.Status.Valid():
		c.add("status", "must be one of succeeded, failed, unreachable, rejected, cancelled")
	case e.Type != EventRunFinished && e.Status != "":
		c.add("status", "only allowed on run_finished events")
	}
	return c.err()
}

func (e *ProgressEvent) normalize() {
	if e.SchemaVersion == 0 {
		e.SchemaVersion = SchemaVersion
	}
}

// DecodeProgressEvent decodes and validates a ProgressEvent. Errors are as
// for DecodeProvisionerMessage.
func DecodeProgressEvent(data []byte) (*ProgressEvent, error) {
	return decodeMessage[ProgressEvent](data)
}

func joinEventTypes() string {
	types := EventTypes()
	names := make([]string, len(types))
	for i, t := range types {
		names[i] = string(t)
	}
	return strings.Join(names, ", ")
}
