package messages

import (
	"cmp"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern"
)

// Status is the outcome of a job, as published in its result.
//
// Every valid status is terminal: a result is published once per job, when
// the job is over, and no later result of the same job changes it (a
// redelivered request gets the same result again). Progress while a job runs
// is published as ProgressEvents, never as a result. Trying again after
// failed, unreachable or cancelled means sending a new request with a new
// job_id; rejected input fails the same way every time.
type Status string

// The statuses of a result.
const (
	// StatusSucceeded: the job did everything it was asked; error is absent.
	StatusSucceeded Status = "succeeded"
	// StatusFailed: the job ran and failed (a task failed, a secret or the
	// provider was unavailable, a timeout); see error.kind.
	StatusFailed Status = "failed"
	// StatusUnreachable: the target could not be reached over SSH, or every
	// host was unreachable.
	StatusUnreachable Status = "unreachable"
	// StatusRejected: the request was invalid (or named an unknown server)
	// and nothing was run; error.fields lists the problems.
	StatusRejected Status = "rejected"
	// StatusCancelled: the job was cancelled before it finished.
	StatusCancelled Status = "cancelled"
)

// Statuses returns every valid status.
func Statuses() []Status {
	return []Status{StatusSucceeded, StatusFailed, StatusUnreachable, StatusRejected, StatusCancelled}
}

// Valid reports whether s is one of the statuses of the contract.
func (s Status) Valid() bool {
	switch s {
	case StatusSucceeded, StatusFailed, StatusUnreachable, StatusRejected, StatusCancelled:
		return true
	}
	return false
}

// Terminal reports whether s ends its job, which every valid status does
// (see Status): a consumer that sees a result with a valid status can stop
// following the job.
func (s Status) Terminal() bool { return s.Valid() }

// ErrorKind is the machine-readable class of a job's error. Consumers branch
// on it; the message is for humans. New kinds may be added without a new
// schema_version: a consumer treats a kind it does not know like
// KindInternal.
type ErrorKind string

// The error kinds, with the status they usually come with.
const (
	// KindInvalidMessage: the request could not be decoded or broke a rule
	// of the contract; error.fields says which keys. Status rejected.
	KindInvalidMessage ErrorKind = "invalid_message"
	// KindServerNotFound: server_handle names no registered server. Status
	// rejected.
	KindServerNotFound ErrorKind = "server_not_found"
	// KindSSHUnreachable: no SSH session could be opened to the target
	// (connection refused or timed out, no SSH banner). Status unreachable.
	KindSSHUnreachable ErrorKind = "ssh_unreachable"
	// KindSSHAuthFailed: the target answered SSH but refused our key; nothing
	// was run. Retrying does not help until the key is fixed. Status failed.
	KindSSHAuthFailed ErrorKind = "ssh_auth_failed"
	// KindHostKeyMismatch: the target presented an SSH host key other than
	// the one pinned for it; nothing was run. Status failed.
	KindHostKeyMismatch ErrorKind = "host_key_mismatch"
	// KindSecretUnavailable: a referenced secret could not be resolved (no
	// such secret, backend down, access denied). Status failed.
	KindSecretUnavailable ErrorKind = "secret_unavailable"
	// KindProviderError: the hosting provider's API (Time4VPS) failed or
	// refused the operation. Status failed.
	KindProviderError ErrorKind = "provider_error"
	// KindPlaybookFailed: a task of the playbook failed; failed_task says
	// which. Status failed.
	KindPlaybookFailed ErrorKind = "playbook_failed"
	// KindHostsUnreachable: Ansible reached no host (or lost them during the
	// run); hosts has the per-host recap. Status unreachable.
	KindHostsUnreachable ErrorKind = "hosts_unreachable"
	// KindTimeout: the job ran longer than its time limit and was stopped.
	// Status failed.
	KindTimeout ErrorKind = "timeout"
	// KindIdleTimeout: the run printed nothing for longer than the idle limit
	// and was stopped as stuck. Status failed.
	KindIdleTimeout ErrorKind = "idle_timeout"
	// KindCancelled: the job was cancelled (by an operator or at shutdown)
	// before it finished. Status cancelled.
	KindCancelled ErrorKind = "cancelled"
	// KindInternal: a fault of the service itself; the message has details.
	// Status failed.
	KindInternal ErrorKind = "internal"
)

// ErrorKinds returns the error kinds this version of the contract defines.
func ErrorKinds() []ErrorKind {
	return []ErrorKind{
		KindInvalidMessage, KindServerNotFound, KindSSHUnreachable, KindSSHAuthFailed, KindHostKeyMismatch,
		KindSecretUnavailable, KindProviderError, KindPlaybookFailed, KindHostsUnreachable,
		KindTimeout, KindIdleTimeout, KindCancelled, KindInternal,
	}
}

// Known reports whether k is one of the kinds of this version of the
// contract.
func (k ErrorKind) Known() bool {
	for _, known := range ErrorKinds() {
		if k == known {
			return true
		}
	}
	return false
}

// errorKindRE is the shape of every error kind, known or added later.
var errorKindRE = pattern.MustCompile(`^[a-z][a-z0-9_]*$`, 64)

// ErrorInfo is the error of a job that did not succeed.
type ErrorInfo struct {
	// Machine-readable class of the error (see the error kinds).
	Kind ErrorKind `msgpack:"kind"`
	// What went wrong, for humans (redacted).
	Message string `msgpack:"message,omitempty"`
	// For rejected input: each key that was wrong and why.
	Fields []FieldError `msgpack:"fields,omitempty"`
}

// HostRecap counts the task results of one host, as in Ansible's play recap.
type HostRecap struct {
	// Tasks that succeeded without changes.
	Ok int `msgpack:"ok,omitempty"`
	// Tasks that succeeded and changed something.
	Changed int `msgpack:"changed,omitempty"`
	// Tasks that failed.
	Failed int `msgpack:"failed,omitempty"`
	// Tasks for which the host could not be reached.
	Unreachable int `msgpack:"unreachable,omitempty"`
	// Tasks skipped on the host.
	Skipped int `msgpack:"skipped,omitempty"`
	// Failed tasks recovered by a rescue block.
	Rescued int `msgpack:"rescued,omitempty"`
	// Failed tasks whose failure was ignored.
	Ignored int `msgpack:"ignored,omitempty"`
}

// FailedTask describes the task that failed a run.
type FailedTask struct {
	// Name of the task.
	Name string `msgpack:"name,omitempty"`
	// Host the task failed on.
	Host string `msgpack:"host,omitempty"`
	// Name of the play the task belongs to.
	Play string `msgpack:"play,omitempty"`
	// The task's error message (redacted).
	Message string `msgpack:"message,omitempty"`
}

// MaxOutputTail is the most bytes SetOutputTail keeps of a run's output.
const MaxOutputTail = 32 << 10

// MaxErrorMessage is the longest error message Fail and Reject keep, in
// bytes; a longer one is cut at a character boundary and ends in
// CutMarker. Redact before calling them: the cut comes after.
const MaxErrorMessage = 8 << 10

// MaxEcho is the longest request value a result echoes (server_handle,
// project_id, server_ip); a longer one, which the request's own rules
// refuse anyway, is not echoed.
const MaxEcho = 255

// CutMarker ends a text that was cut to its limit.
const CutMarker = " …[cut]"

// Outcome holds the keys every result carries.
type Outcome struct {
	// Version of the message format; absent or 0 means 1.
	SchemaVersion int `msgpack:"schema_version,omitempty"`
	// Job id of the request: its job_id, or its stream entry id when it had
	// none.
	JobID string `msgpack:"job_id"`
	// Stream entry id of the request.
	RequestID string `msgpack:"request_id"`
	// correlation_id of the request, echoed.
	CorrelationID string `msgpack:"correlation_id,omitempty"`
	// Outcome of the job; every status is final.
	Status Status `msgpack:"status"`
	// Why the job did not succeed; absent on success, present otherwise.
	Error *ErrorInfo `msgpack:"error,omitempty"`
	// Play recap per host.
	Hosts map[string]HostRecap `msgpack:"hosts,omitempty"`
	// The task that failed the run, when one did.
	FailedTask *FailedTask `msgpack:"failed_task,omitempty"`
	// Name of the playbook run; empty when none ran.
	Playbook string `msgpack:"playbook,omitempty"`
	// When the job started: RFC 3339 in UTC with milliseconds.
	StartedAt string `msgpack:"started_at,omitempty"`
	// When the job finished: RFC 3339 in UTC with milliseconds.
	FinishedAt string `msgpack:"finished_at,omitempty"`
	// finished_at minus started_at, in milliseconds.
	DurationMS int64 `msgpack:"duration_ms,omitempty"`
	// The last lines of the run's output, with secrets redacted.
	OutputTail string `msgpack:"output_tail,omitempty"`
	// Which attempt at the job this was, from 1.
	Attempt int `msgpack:"attempt,omitempty"`
	TraceContext
}

// SetTimes sets started_at and finished_at (RFC 3339, UTC, milliseconds)
// and duration_ms.
func (o *Outcome) SetTimes(started, finished time.Time) {
	o.StartedAt = FormatTime(started)
	o.FinishedAt = FormatTime(finished)
	o.DurationMS = max(0, finished.Sub(started).Milliseconds())
}

// Succeed sets status succeeded and clears the error.
func (o *Outcome) Succeed() {
	o.Status = StatusSucceeded
	o.Error = nil
}

// Fail sets the status (any but succeeded) and the error. A message longer
// than MaxErrorMessage is cut.
func (o *Outcome) Fail(status Status, kind ErrorKind, message string) {
	o.Status = status
	o.Error = &ErrorInfo{Kind: kind, Message: cutText(message, MaxErrorMessage)}
}

// cutText returns s as valid UTF-8 of at most limit bytes: s itself, or
// its start cut at a character boundary followed by CutMarker.
func cutText(s string, limit int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= limit {
		return s
	}
	n := limit - len(CutMarker)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + CutMarker
}

// echo returns a request value to echo in a result: v, or "" when it is
// longer than MaxEcho or not valid UTF-8.
func echo(v string) string {
	if len(v) > MaxEcho || !utf8.ValidString(v) {
		return ""
	}
	return v
}

// Reject marks the result of a request that could not be decoded or was
// invalid: status rejected, kind invalid_message, the error's text as
// message (cut to MaxErrorMessage) and its field errors (from a
// *DecodeError or *ValidationError: at most MaxFieldErrors, the message
// counts the others) as fields.
func (o *Outcome) Reject(err error) {
	o.Status = StatusRejected
	fields := fieldErrors(err)
	if len(fields) > MaxFieldErrors {
		fields = fields[:MaxFieldErrors]
	}
	for i := range fields {
		fields[i].Field = cutText(fields[i].Field, 256)
		fields[i].Message = cutText(fields[i].Message, 512)
	}
	o.Error = &ErrorInfo{Kind: KindInvalidMessage, Message: cutText(err.Error(), MaxErrorMessage), Fields: fields}
}

// SetOutputTail stores the end of the (already redacted) output s: its last
// MaxOutputTail bytes, cut at a line start when one is near, else at a
// UTF-8 character boundary. Bytes that are not UTF-8 become U+FFFD.
func (o *Outcome) SetOutputTail(s string) {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) > MaxOutputTail {
		s = s[len(s)-MaxOutputTail:]
		if i := strings.IndexByte(s, '\n'); i >= 0 && i < 1024 {
			s = s[i+1:]
		}
		for len(s) > 0 && !utf8.RuneStart(s[0]) {
			s = s[1:]
		}
	}
	o.OutputTail = s
}

func (o *Outcome) validate(c *checker) {
	c.version(o.SchemaVersion)
	c.id("job_id", o.JobID, true)
	switch {
	case o.RequestID == "":
		c.add("request_id", msgRequired)
	case !entryIDRE.MatchString(o.RequestID):
		c.add("request_id", "must be a stream entry id like 1700000000000-0")
	}
	c.id("correlation_id", o.CorrelationID, false)
	o.TraceContext.validate(c)
	switch {
	case o.Status == "":
		c.add("status", msgRequired)
	case !o.Status.Valid():
		c.add("status", "must be one of succeeded, failed, unreachable, rejected, cancelled")
	}
	switch {
	case o.Status == StatusSucceeded && o.Error != nil:
		c.add("error", "must be absent when status is succeeded")
	case o.Status != StatusSucceeded && o.Status.Valid() && o.Error == nil:
		c.add("error", "required when status is "+string(o.Status))
	case o.Error != nil:
		switch {
		case o.Error.Kind == "":
			c.add("error.kind", msgRequired)
		case !errorKindRE.MatchString(string(o.Error.Kind)):
			c.add("error.kind", "must match ^[a-z][a-z0-9_]{0,63}$")
		}
		for i, f := range o.Error.Fields {
			if f.Field == "" {
				c.add("error.fields["+strconv.Itoa(i)+"].field", msgRequired)
			}
		}
	}
	for _, host := range slices.Sorted(maps.Keys(o.Hosts)) {
		r := o.Hosts[host]
		if host == "" {
			c.add("hosts", "host names must not be empty")
		}
		p := "hosts[" + host + "]."
		c.nonNegative(p+"ok", int64(r.Ok))
		c.nonNegative(p+"changed", int64(r.Changed))
		c.nonNegative(p+"failed", int64(r.Failed))
		c.nonNegative(p+"unreachable", int64(r.Unreachable))
		c.nonNegative(p+"skipped", int64(r.Skipped))
		c.nonNegative(p+"rescued", int64(r.Rescued))
		c.nonNegative(p+"ignored", int64(r.Ignored))
	}
	c.time("started_at", o.StartedAt, false)
	c.time("finished_at", o.FinishedAt, false)
	c.nonNegative("duration_ms", o.DurationMS)
	c.nonNegative("attempt", int64(o.Attempt))
}

func (o *Outcome) normalize() {
	o.SchemaVersion = cmp.Or(o.SchemaVersion, SchemaVersion)
}

// entryIDRE is the shape of a Redis stream entry id.
var entryIDRE = pattern.MustCompileParts(`^[0-9]+-[0-9]+$`, "-", 20)

// PlaybookStatus is how one playbook of a job ended (see PlaybookOutcome).
type PlaybookStatus string

// The statuses of a playbook.
const (
	PlaybookSucceeded   PlaybookStatus = "succeeded"
	PlaybookFailed      PlaybookStatus = "failed"
	PlaybookUnreachable PlaybookStatus = "unreachable"
	PlaybookCancelled   PlaybookStatus = "cancelled"
	// PlaybookSkipped: not run, because a playbook before it did not
	// succeed.
	PlaybookSkipped PlaybookStatus = "skipped"
)

// PlaybookStatuses returns every valid playbook status.
func PlaybookStatuses() []PlaybookStatus {
	return []PlaybookStatus{PlaybookSucceeded, PlaybookFailed, PlaybookUnreachable, PlaybookCancelled, PlaybookSkipped}
}

// Valid reports whether s is one of the playbook statuses of the contract.
func (s PlaybookStatus) Valid() bool { return slices.Contains(PlaybookStatuses(), s) }

// PlaybookOutcome is how one playbook of a provisioning job ended.
type PlaybookOutcome struct {
	// File name of the playbook.
	Playbook string `msgpack:"playbook"`
	// How it ended: succeeded, failed, unreachable, cancelled, or skipped
	// (not run because a playbook before it did not succeed).
	Status PlaybookStatus `msgpack:"status"`
	// Why a playbook that ran did not succeed (see the error kinds).
	ErrorKind ErrorKind `msgpack:"error_kind,omitempty"`
	// How long the playbook ran, in milliseconds.
	DurationMS int64 `msgpack:"duration_ms,omitempty"`
}

// ProvisionerResult is the result of a ProvisionerMessage, published on
// StreamProvisionerResults.
type ProvisionerResult struct {
	Outcome
	// server_handle of the request, echoed (as received, even when invalid,
	// unless longer than MaxEcho).
	ServerHandle string `msgpack:"server_handle,omitempty"`
	// Each playbook of the job in order, with its outcome: the playbooks
	// that ran (the base playbook, then the extra playbooks of the
	// request), then the extra playbooks skipped after one that did not
	// succeed. A job that some playbooks completed before a later one
	// failed shows it here. Absent when no playbook ran.
	Playbooks []PlaybookOutcome `msgpack:"playbooks,omitempty"`
}

// NewProvisionerResult starts the result of msg, read from the stream entry
// requestID: job id, request id, correlation id and server handle are
// copied, schema_version and attempt (1) set. msg may be nil when the
// request could not be decoded at all; the job id is then requestID.
func NewProvisionerResult(msg *ProvisionerMessage, requestID string) *ProvisionerResult {
	if msg == nil {
		return &ProvisionerResult{Outcome: newOutcome(nil, requestID)}
	}
	return &ProvisionerResult{Outcome: newOutcome(&msg.RequestMeta, requestID), ServerHandle: echo(msg.ServerHandle)}
}

// Validate checks r against the contract and returns a *ValidationError
// listing every problem, or nil.
func (r *ProvisionerResult) Validate() error {
	var c checker
	r.Outcome.validate(&c)
	validatePlaybooks(&c, r.Playbooks)
	return c.err()
}

// validatePlaybooks checks the per-playbook outcomes of a result.
func validatePlaybooks(c *checker, playbooks []PlaybookOutcome) {
	for i, p := range playbooks {
		field := "playbooks[" + strconv.Itoa(i) + "]."
		if p.Playbook == "" {
			c.add(field+"playbook", msgRequired)
		}
		switch {
		case p.Status == "":
			c.add(field+"status", msgRequired)
		case !p.Status.Valid():
			c.add(field+"status", "must be one of succeeded, failed, unreachable, cancelled, skipped")
		}
		if p.ErrorKind != "" && !errorKindRE.MatchString(string(p.ErrorKind)) {
			c.add(field+"error_kind", "must match ^[a-z][a-z0-9_]{0,63}$")
		}
		c.nonNegative(field+"duration_ms", p.DurationMS)
	}
}

func (r *ProvisionerResult) normalize() { r.Outcome.normalize() }

// DecodeProvisionerResult decodes and validates a ProvisionerResult. Errors
// are as for DecodeProvisionerMessage.
func DecodeProvisionerResult(data []byte) (*ProvisionerResult, error) {
	return decodeMessage[ProvisionerResult](data)
}

// AnsibleDeployResult is the result of an AnsibleDeployMessage, published
// on StreamDeployResults.
type AnsibleDeployResult struct {
	Outcome
	// project_id of the request, echoed.
	ProjectID string `msgpack:"project_id,omitempty"`
	// server_ip of the request, echoed.
	ServerIP string `msgpack:"server_ip,omitempty"`
	// port of the request, echoed.
	Port int `msgpack:"port,omitempty"`
}

// NewAnsibleDeployResult starts the result of msg, read from the stream
// entry requestID, like NewProvisionerResult; it copies project id, server
// address and port.
func NewAnsibleDeployResult(msg *AnsibleDeployMessage, requestID string) *AnsibleDeployResult {
	if msg == nil {
		return &AnsibleDeployResult{Outcome: newOutcome(nil, requestID)}
	}
	r := &AnsibleDeployResult{
		Outcome:   newOutcome(&msg.RequestMeta, requestID),
		ProjectID: echo(msg.ProjectID),
		ServerIP:  echo(msg.ServerIP),
	}
	// An out-of-range port (a rejected request) is not echoed: the result
	// must stay valid.
	if msg.Port >= 0 && msg.Port <= 65535 {
		r.Port = msg.Port
	}
	return r
}

// Validate checks r against the contract and returns a *ValidationError
// listing every problem, or nil.
func (r *AnsibleDeployResult) Validate() error {
	var c checker
	r.Outcome.validate(&c)
	if r.Port < 0 || r.Port > 65535 {
		c.add("port", "must be between 0 and 65535")
	}
	return c.err()
}

func (r *AnsibleDeployResult) normalize() { r.Outcome.normalize() }

// DecodeAnsibleDeployResult decodes and validates an AnsibleDeployResult.
// Errors are as for DecodeProvisionerMessage.
func DecodeAnsibleDeployResult(data []byte) (*AnsibleDeployResult, error) {
	return decodeMessage[AnsibleDeployResult](data)
}

// newOutcome starts the outcome of the request meta (nil when the request
// was undecodable) read from entry requestID. An invalid job_id or
// correlation_id of a rejected request is not echoed, so that the result
// stays valid: the job id is then the entry id.
func newOutcome(meta *RequestMeta, requestID string) Outcome {
	o := Outcome{SchemaVersion: SchemaVersion, JobID: requestID, RequestID: requestID, Attempt: 1}
	if meta == nil {
		return o
	}
	if idRE.MatchString(meta.JobID) {
		o.JobID = meta.JobID
	}
	if idRE.MatchString(meta.CorrelationID) {
		o.CorrelationID = meta.CorrelationID
	}
	return o
}

// EncodeResult encodes a *ProvisionerResult, *AnsibleDeployResult or
// *AnsibleJobResult like
// Encode. When the result cannot be encoded as it is (larger than
// MaxMessageSize, or a text that is not UTF-8), it encodes a minimal result
// instead: the same job, request, status and error kind with a short
// message, without hosts, failed task, output tail or field errors. So a
// job's outcome always reaches its requester, even when its details cannot.
func EncodeResult(result any) ([]byte, error) {
	data, err := Encode(result)
	if err == nil {
		return data, nil
	}
	var min any
	switch r := result.(type) {
	case *ProvisionerResult:
		if r == nil {
			return nil, err
		}
		min = &ProvisionerResult{Outcome: r.Outcome.minimal(err), ServerHandle: echo(r.ServerHandle)}
	case *AnsibleDeployResult:
		if r == nil {
			return nil, err
		}
		min = &AnsibleDeployResult{Outcome: r.Outcome.minimal(err), ProjectID: echo(r.ProjectID), ServerIP: echo(r.ServerIP), Port: r.Port}
	case *AnsibleJobResult:
		if r == nil {
			return nil, err
		}
		min = &AnsibleJobResult{Outcome: r.Outcome.minimal(err), ProjectID: echo(r.ProjectID), Pool: r.Pool, Commit: r.Commit}
	default:
		return nil, err
	}
	data, merr := Encode(min)
	if merr != nil {
		return nil, errors.Join(err, merr)
	}
	return data, nil
}

// minimal returns the parts of o that always fit in a message, with an
// error saying why the details were left out.
func (o *Outcome) minimal(cause error) Outcome {
	m := Outcome{
		SchemaVersion: o.SchemaVersion,
		JobID:         o.JobID,
		RequestID:     o.RequestID,
		Status:        o.Status,
		Playbook:      cutText(o.Playbook, 256),
		StartedAt:     o.StartedAt,
		FinishedAt:    o.FinishedAt,
		DurationMS:    o.DurationMS,
		Attempt:       o.Attempt,
	}
	if idRE.MatchString(o.CorrelationID) {
		m.CorrelationID = o.CorrelationID
	}
	if !idRE.MatchString(m.JobID) {
		m.JobID = m.RequestID
	}
	note := "result details left out: " + cause.Error()
	switch {
	case o.Error != nil:
		m.Error = &ErrorInfo{Kind: o.Error.Kind, Message: cutText(o.Error.Message, 1024) + " (" + cutText(note, 512) + ")"}
	case o.Status != StatusSucceeded:
		m.Error = &ErrorInfo{Kind: KindInternal, Message: cutText(note, 1024)}
	}
	return m
}
