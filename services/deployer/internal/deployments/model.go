// Package deployments holds the deployer's deployments: the model and
// their store, submitting one (validated by the wire contract's rules,
// stored and handed to a Publisher for ansible:deploy:queue, with
// Idempotency-Key support), reading and listing them with their progress,
// waiting for their end, cancelling them, and recording their results from
// deploy:results. Publishing (group commit, publish marks, republisher)
// lives in the package publishing, the queue observer in observer.
package deployments

import (
	"encoding/json"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// Status is a deployment's state. queued and running are transient; the
// others are the wire contract's final statuses.
type Status string

// The statuses.
const (
	StatusQueued  Status = "queued"
	StatusRunning Status = "running"
	// The final statuses are the wire contract's.
	StatusSucceeded   = Status(messages.StatusSucceeded)
	StatusFailed      = Status(messages.StatusFailed)
	StatusUnreachable = Status(messages.StatusUnreachable)
	StatusRejected    = Status(messages.StatusRejected)
	StatusCancelled   = Status(messages.StatusCancelled)
)

// Statuses returns every status.
func Statuses() []Status {
	return []Status{StatusQueued, StatusRunning, StatusSucceeded, StatusFailed, StatusUnreachable, StatusRejected, StatusCancelled}
}

// Terminal reports whether s is final.
func (s Status) Terminal() bool {
	return s != StatusQueued && s != StatusRunning && s != ""
}

// Valid reports whether s is a known status.
func (s Status) Valid() bool {
	for _, k := range Statuses() {
		if s == k {
			return true
		}
	}
	return false
}

// Request is what a client asks for: the keys of an AnsibleDeployMessage
// and the deployer's options.
type Request struct {
	ProjectID      string   `json:"project_id"`
	RepoFullName   string   `json:"repo_full_name"`
	Branch         string   `json:"branch,omitempty"`
	ServerIP       string   `json:"server_ip"`
	Port           int      `json:"port"`
	Modules        []string `json:"modules,omitempty"`
	GitHubTokenRef string   `json:"github_token_ref,omitempty"`
	SecretsRef     string   `json:"secrets_ref,omitempty"`
	CorrelationID  string   `json:"correlation_id,omitempty"`
	Options        Options  `json:"options"`
}

// Options are the deployer's own settings of a deployment.
type Options struct {
	// TimeoutSeconds limits the run (1-86400); 0 means infra's own limit.
	TimeoutSeconds int `json:"timeout_seconds,omitempty"`
	// CallbackURL receives a signed POST when the deployment ends.
	CallbackURL string `json:"callback_url,omitempty"`
}

// Deployment is a deployment as the API shows it.
type Deployment struct {
	ID    string `json:"id"`
	JobID string `json:"job_id"`
	// Kind is deploy or job (an Ansible job: see Job).
	Kind   string `json:"kind"`
	Source string `json:"source"` // "api" or "stream" (another producer)
	Status Status `json:"status"`
	// Request holds what was asked; callback_url is shown without its path
	// and query, which often hold the receiver's tokens.
	Request           Request    `json:"request"`
	RequestID         string     `json:"request_id,omitempty"`
	CreatedAt         time.Time  `json:"created_at"`
	StartedAt         *time.Time `json:"started_at,omitempty"`
	FinishedAt        *time.Time `json:"finished_at,omitempty"`
	CancelRequestedAt *time.Time `json:"cancel_requested_at,omitempty"`
	Progress          *Progress  `json:"progress,omitempty"`
	Result            *Result    `json:"result,omitempty"`
	Links             Links      `json:"links"`
	// Job is an Ansible job's request, credentials as references (kind
	// job); Request then holds only its project and correlation id.
	Job *JobRequest `json:"job,omitempty"`

	queue       string // the stream a job was published to
	apiKeyID    string
	callbackURL string
	publishedAt *time.Time
}

// ProgressKind is the wire kind of the job's progress stream and cancel
// key.
func (d *Deployment) ProgressKind() messages.JobKind {
	if d.Kind == KindJob {
		return messages.JobKindJob
	}
	return messages.JobKindDeploy
}

// Queue is the stream a job was published to ("" for a deploy: the
// deploy queue).
func (d *Deployment) Queue() string { return d.queue }

// APIKeyID returns the id of the key that made the deployment ("" for one
// from another producer).
func (d *Deployment) APIKeyID() string { return d.apiKeyID }

// PublishedAt is when the deployment's request was marked published (on
// its own or with its commit group); nil while it is not.
func (d *Deployment) PublishedAt() *time.Time { return d.publishedAt }

// Links are the deployment's related resources.
type Links struct {
	Self     string `json:"self"`
	Events   string `json:"events"`
	Log      string `json:"log"`
	Webhooks string `json:"webhooks"`
}

func linksFor(id, kind string) Links {
	if kind == KindJob {
		base := "/api/v1/jobs/" + id
		return Links{Self: base, Events: base + "/stream", Log: base + "/logs", Webhooks: "/api/v1/deployments/" + id + "/webhooks"}
	}
	base := "/api/v1/deployments/" + id
	return Links{Self: base, Events: base + "/events", Log: base + "/log", Webhooks: base + "/webhooks"}
}

// Result is the job's result, from deploy:results.
type Result struct {
	Status     string               `json:"status"`
	Error      *ResultError         `json:"error,omitempty"`
	Hosts      map[string]HostRecap `json:"hosts,omitempty"`
	FailedTask *FailedTask          `json:"failed_task,omitempty"`
	Playbook   string               `json:"playbook,omitempty"`
	StartedAt  string               `json:"started_at,omitempty"`
	FinishedAt string               `json:"finished_at,omitempty"`
	DurationMS int64                `json:"duration_ms,omitempty"`
	Attempt    int                  `json:"attempt,omitempty"`
	// OutputTail is kept in the database as a fallback log; the API
	// leaves it out (GET .../log has the full output).
	OutputTail string `json:"output_tail,omitempty"`
	// An Ansible job's: the commits its source and inventory were read at,
	// and each playbook's outcome in order.
	Commit          string           `json:"commit,omitempty"`
	InventoryCommit string           `json:"inventory_commit,omitempty"`
	Playbooks       []PlaybookResult `json:"playbooks,omitempty"`
	// Pool is the pool whose replica ran the job (options.pool; absent:
	// the default pool).
	Pool string `json:"pool,omitempty"`
	// Artifacts are an Ansible job's set_stats data (per_host: false),
	// secrets redacted: a workflow passes them to its next steps.
	Artifacts map[string]any `json:"artifacts,omitempty"`
}

// PlaybookResult is the outcome of one playbook of an Ansible job.
type PlaybookResult struct {
	Playbook   string `json:"playbook"`
	Status     string `json:"status"`
	ErrorKind  string `json:"error_kind,omitempty"`
	DurationMS int64  `json:"duration_ms,omitempty"`
}

// ResultError is the error of a job that did not succeed.
type ResultError struct {
	Kind    string       `json:"kind"`
	Message string       `json:"message,omitempty"`
	Fields  []FieldError `json:"fields,omitempty"`
}

// FieldError names a bad key and what is wrong with it.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// HostRecap is the play recap of one host.
type HostRecap struct {
	OK          int `json:"ok"`
	Changed     int `json:"changed"`
	Failed      int `json:"failed"`
	Unreachable int `json:"unreachable"`
	Skipped     int `json:"skipped"`
	Rescued     int `json:"rescued"`
	Ignored     int `json:"ignored"`
}

// FailedTask is the task that failed the run.
type FailedTask struct {
	Name    string `json:"name,omitempty"`
	Host    string `json:"host,omitempty"`
	Play    string `json:"play,omitempty"`
	Message string `json:"message,omitempty"`
}

// resultFrom converts a wire result.
func resultFrom(r *messages.Outcome) *Result {
	out := &Result{
		Status: string(r.Status), Playbook: r.Playbook, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt,
		DurationMS: r.DurationMS, Attempt: r.Attempt, OutputTail: r.OutputTail,
	}
	if r.Error != nil {
		out.Error = &ResultError{Kind: string(r.Error.Kind), Message: r.Error.Message}
		for _, f := range r.Error.Fields {
			out.Error.Fields = append(out.Error.Fields, FieldError{Field: f.Field, Message: f.Message})
		}
	}
	if len(r.Hosts) > 0 {
		out.Hosts = make(map[string]HostRecap, len(r.Hosts))
		for h, rc := range r.Hosts {
			out.Hosts[h] = HostRecap{OK: rc.Ok, Changed: rc.Changed, Failed: rc.Failed, Unreachable: rc.Unreachable,
				Skipped: rc.Skipped, Rescued: rc.Rescued, Ignored: rc.Ignored}
		}
	}
	if r.FailedTask != nil {
		out.FailedTask = &FailedTask{Name: r.FailedTask.Name, Host: r.FailedTask.Host, Play: r.FailedTask.Play, Message: r.FailedTask.Message}
	}
	return out
}

// WebhookBody is the JSON body of a deployment's webhook.
type WebhookBody struct {
	Event      string      `json:"event"`
	SentFor    string      `json:"deployment_id"`
	Deployment *Deployment `json:"deployment"`
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only plain data types are marshalled
	}
	return b
}

// DeployMessage is the queue request of deployment jobID, asked for with
// r at at. It is the one builder of the request: the submit path builds
// it from the client's request (then normalised by toMessage, and stored
// as normalised), the republisher (package publishing) from the stored
// deployment, so that a republished request is the submitted one, apart
// from its trace context.
func DeployMessage(r *Request, jobID string, at time.Time) *messages.AnsibleDeployMessage {
	return &messages.AnsibleDeployMessage{
		RequestMeta: messages.RequestMeta{
			SchemaVersion: messages.SchemaVersion, JobID: jobID, CorrelationID: r.CorrelationID,
			CreatedAt: messages.FormatTime(at),
		},
		ProjectID: r.ProjectID, RepoFullName: r.RepoFullName, Branch: r.Branch, ServerIP: r.ServerIP,
		Port: r.Port, Modules: r.Modules, GitHubTokenRef: r.GitHubTokenRef, SecretsRef: r.SecretsRef,
		TimeoutSeconds: r.Options.TimeoutSeconds,
	}
}
