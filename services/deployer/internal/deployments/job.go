package deployments

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// The kinds of a deployment row: a deploy of a project (AnsibleDeployMessage)
// or an Ansible job (AnsibleJobMessage, issue 23). Both share the store,
// publishing, results, webhooks, cancel and retention.
const (
	KindDeploy = "deploy"
	KindJob    = "job"
)

// JobRequest is the body of POST /api/v1/jobs: the keys of an
// AnsibleJobMessage, in JSON, with the deployer's options. Credential
// fields hold a stored credential's name or a secret reference; as stored
// (and shown) they hold the reference the name resolved to.
type JobRequest struct {
	ProjectID     string         `json:"project_id"`
	CorrelationID string         `json:"correlation_id,omitempty"`
	Source        JobSource      `json:"source"`
	Inventory     JobInventory   `json:"inventory"`
	Credentials   JobCredentials `json:"credentials"`
	Options       JobOptions     `json:"options"`
	// Template is the template (and its version) a launch made the job
	// from; a job submitted whole has none, and a client cannot set it.
	Template *TemplateRef `json:"template,omitempty"`
	// RelaunchOf is the job a relaunch ran again; set by a relaunch only.
	RelaunchOf string `json:"relaunch_of,omitempty"`
}

// TemplateRef names the version of a job template a job was launched from.
type TemplateRef struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Version int    `json:"version"`
}

// JobSource is what a job runs (messages.JobSource).
type JobSource struct {
	Type          string         `json:"type"`
	Repository    string         `json:"repository,omitempty"`
	Ref           string         `json:"ref,omitempty"`
	Paths         []string       `json:"paths,omitempty"`
	GitCredential string         `json:"git_credential,omitempty"`
	RolePath      string         `json:"role_path,omitempty"`
	RoleVars      map[string]any `json:"role_vars,omitempty"`
	Collection    string         `json:"collection,omitempty"`
	Role          string         `json:"role,omitempty"`
	Version       string         `json:"version,omitempty"`
	GalaxyServer  string         `json:"galaxy_server,omitempty"`
}

// JobInventory is where a job's hosts come from (messages.JobInventory).
type JobInventory struct {
	Type       string              `json:"type"`
	Hosts      JobHosts            `json:"hosts,omitempty"`
	Groups     map[string]JobGroup `json:"groups,omitempty"`
	Repository string              `json:"repository,omitempty"`
	Ref        string              `json:"ref,omitempty"`
	Path       string              `json:"path,omitempty"`
	URL        string              `json:"url,omitempty"`
	Credential string              `json:"credential,omitempty"`
	Plugin     string              `json:"plugin,omitempty"`
	Config     map[string]any      `json:"config,omitempty"`
}

// JobHosts are an inline inventory's hosts: host name to its variables.
// A client may also send a list of names.
type JobHosts map[string]map[string]any

// UnmarshalJSON accepts {"host": {vars}} or ["host", ...].
func (h *JobHosts) UnmarshalJSON(b []byte) error {
	if t := bytes.TrimSpace(b); len(t) > 0 && t[0] == '[' {
		var names []string
		if err := json.Unmarshal(t, &names); err != nil {
			return err
		}
		m := make(JobHosts, len(names))
		for _, n := range names {
			m[n] = nil
		}
		*h = m
		return nil
	}
	var m map[string]map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	*h = m
	return nil
}

// JobGroup is a group of an inline inventory.
type JobGroup struct {
	Hosts    []string       `json:"hosts,omitempty"`
	Children []string       `json:"children,omitempty"`
	Vars     map[string]any `json:"vars,omitempty"`
}

// JobCredentials are a job's secrets: each a credential's name or a
// secret reference, never a value.
type JobCredentials struct {
	SSH            string `json:"ssh,omitempty"`
	BecomePassword string `json:"become_password,omitempty"`
	VaultPassword  string `json:"vault_password,omitempty"`
	Cloud          string `json:"cloud,omitempty"`
	Galaxy         string `json:"galaxy,omitempty"`
}

// JobOptions tune a job's run; callback_url is the deployer's webhook.
type JobOptions struct {
	ExtraVars map[string]any `json:"extra_vars,omitempty"`
	// SecretVars are variables given by credential name or secret
	// reference (never a value): infra hands their values to the play
	// through its environment only.
	SecretVars map[string]string `json:"secret_vars,omitempty"`
	Tags       []string          `json:"tags,omitempty"`
	SkipTags   []string          `json:"skip_tags,omitempty"`
	Limit      string            `json:"limit,omitempty"`
	Check      bool              `json:"check,omitempty"`
	Diff       bool              `json:"diff,omitempty"`
	Verbosity  int               `json:"verbosity,omitempty"`
	Forks      int               `json:"forks,omitempty"`
	// Timeout is the job's wall-clock limit in seconds (1-86400).
	Timeout     int    `json:"timeout,omitempty"`
	Pool        string `json:"pool,omitempty"`
	CallbackURL string `json:"callback_url,omitempty"`
}

// credentialFields lists the request's credential fields with their JSON
// paths, for resolving names and checking references.
func (r *JobRequest) credentialFields() []struct {
	field string
	value *string
} {
	return []struct {
		field string
		value *string
	}{
		{"source.git_credential", &r.Source.GitCredential},
		{"inventory.credential", &r.Inventory.Credential},
		{"credentials.ssh", &r.Credentials.SSH},
		{"credentials.become_password", &r.Credentials.BecomePassword},
		{"credentials.vault_password", &r.Credentials.VaultPassword},
		{"credentials.cloud", &r.Credentials.Cloud},
		{"credentials.galaxy", &r.Credentials.Galaxy},
	}
}

// HostNames returns an inline inventory's host names, sorted (nil for
// other inventories).
func (r *JobRequest) HostNames() []string {
	names := make([]string, 0, len(r.Inventory.Hosts))
	for h := range r.Inventory.Hosts {
		names = append(names, h)
	}
	sort.Strings(names)
	return names
}

// JobMessage is the queue request of job jobID asked for with r at at:
// the one builder of it, for submit and the republisher.
func JobMessage(r *JobRequest, jobID string, at time.Time) *messages.AnsibleJobMessage {
	m := &messages.AnsibleJobMessage{
		RequestMeta: messages.RequestMeta{
			SchemaVersion: messages.SchemaVersion, JobID: jobID, CorrelationID: r.CorrelationID,
			CreatedAt: messages.FormatTime(at),
		},
		ProjectID: r.ProjectID,
		Source: messages.JobSource{
			Type: messages.SourceType(r.Source.Type), Repository: r.Source.Repository, Ref: r.Source.Ref,
			Paths: r.Source.Paths, GitCredential: r.Source.GitCredential, RolePath: r.Source.RolePath,
			RoleVars: vars(r.Source.RoleVars), Collection: r.Source.Collection, Role: r.Source.Role,
			Version: r.Source.Version, GalaxyServer: r.Source.GalaxyServer,
		},
		Inventory: messages.JobInventory{
			Type: messages.InventoryType(r.Inventory.Type), Repository: r.Inventory.Repository, Ref: r.Inventory.Ref,
			Path: r.Inventory.Path, URL: r.Inventory.URL, Credential: r.Inventory.Credential,
			Plugin: r.Inventory.Plugin, Config: vars(r.Inventory.Config),
		},
		Credentials: messages.JobCredentials{
			SSH: r.Credentials.SSH, BecomePassword: r.Credentials.BecomePassword,
			VaultPassword: r.Credentials.VaultPassword, Cloud: r.Credentials.Cloud, Galaxy: r.Credentials.Galaxy,
		},
		Options: messages.JobOptions{
			ExtraVars: vars(r.Options.ExtraVars), SecretVars: r.Options.SecretVars, Tags: r.Options.Tags, SkipTags: r.Options.SkipTags,
			Limit: r.Options.Limit, Check: r.Options.Check, Diff: r.Options.Diff, Verbosity: r.Options.Verbosity,
			Forks: r.Options.Forks, TimeoutSeconds: r.Options.Timeout, Pool: r.Options.Pool,
			// callback_url stays with the deployer, which sends the signed
			// webhook: its path and query often hold the receiver's tokens.
		},
	}
	if r.Inventory.Hosts != nil {
		m.Inventory.Hosts = make(map[string]messages.Vars, len(r.Inventory.Hosts))
		for h, v := range r.Inventory.Hosts {
			m.Inventory.Hosts[h] = vars(v)
		}
	}
	if r.Inventory.Groups != nil {
		m.Inventory.Groups = make(map[string]messages.InventoryGroup, len(r.Inventory.Groups))
		for g, v := range r.Inventory.Groups {
			m.Inventory.Groups[g] = messages.InventoryGroup{Hosts: v.Hosts, Children: v.Children, Vars: vars(v.Vars)}
		}
	}
	return m
}

// vars converts JSON variables for the wire: a whole number (JSON has
// only floats) becomes an integer, so that port 8080 reaches Ansible as
// 8080, not 8080.0.
func vars(m map[string]any) messages.Vars {
	if m == nil {
		return nil
	}
	out := make(messages.Vars, len(m))
	for k, v := range m {
		out[k] = jsonValue(v)
	}
	return out
}

func jsonValue(v any) any {
	switch x := v.(type) {
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return int64(x)
		}
		return x
	case map[string]any:
		return map[string]any(vars(x))
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonValue(e)
		}
		return out
	}
	return v
}

// jobQueue is the stream of the jobs of pool: base for the default pool,
// "<base>:<pool>" for another (messages.AnsibleJobQueue on the default
// base).
func jobQueue(base, pool string) string {
	if pool == "" {
		return base
	}
	return base + ":" + pool
}

// JobRequestOf decodes a stored job request.
func JobRequestOf(data []byte) (*JobRequest, error) {
	var r JobRequest
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("stored job request: %w", err)
	}
	return &r, nil
}
