package messages

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern"
)

// Limits and defaults of the request keys.
const (
	// DefaultBranch is the branch deployed when branch is absent.
	DefaultBranch = "main"
	// MaxBranchLen is the longest branch name, in bytes (the limit of the
	// deploy playbook's own check).
	MaxBranchLen = 200
	// MaxModules is the most entries modules may have.
	MaxModules = 64
	// MaxModuleLen is the longest module name, in bytes (the limit of the
	// deploy playbook's own check).
	MaxModuleLen = 63
	// MaxSecretRefLen is the longest secret reference, in bytes.
	MaxSecretRefLen = 512
	// MaxTimeoutSeconds is the longest run a request may ask for: a day.
	MaxTimeoutSeconds = 86400
	// DefaultSSHPort is the SSH port of an unregistered deploy target when
	// the request has no ssh_port.
	DefaultSSHPort = 22
	// MaxPlaybooks is the most extra playbooks a ProvisionerMessage may
	// ask for.
	MaxPlaybooks = 32
)

// PlaybookNamePattern is the shape of an extra playbook's name: a file name
// (no path) in the ansible directory's playbooks/, ending in .yml or .yaml.
const PlaybookNamePattern = `^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\.ya?ml$`

// ServerHandlePattern is the shape of a server handle, the same as the
// check on servers.handle in pkg/store/migrations.
const ServerHandlePattern = `^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$`

var (
	serverHandleRE = pattern.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@-]*$`, 128) // ServerHandlePattern
	uuidRE         = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	ownerRE        = pattern.MustCompile(`^[A-Za-z0-9][A-Za-z0-9-]*$`, 39)
	repoRE         = pattern.MustCompile(`^[A-Za-z0-9._-]+$`, 100)
	moduleRE       = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)
	secretRefRE    = regexp.MustCompile(`^(vault|env|file):[!-~]+$`)
	playbookRE     = regexp.MustCompile(PlaybookNamePattern)
)

// ValidServerHandle reports whether handle has the shape of a server
// handle (ServerHandlePattern).
func ValidServerHandle(handle string) bool { return serverHandleRE.MatchString(handle) }

// CanonicalProjectID checks a project id by the rule of a request's
// project_id (a UUID in 8-4-4-4-12 form, read case-insensitively) and
// returns its canonical, lower-case form. Whatever else names a project
// (the projects an API key is bound to) uses it, so that both compare
// equal.
func CanonicalProjectID(s string) (string, bool) {
	if !uuidRE.MatchString(s) {
		return "", false
	}
	return strings.ToLower(s), true
}

// Validation messages of the request keys.
const (
	msgServerHandle = "must match " + ServerHandlePattern
	msgExclusive    = "cannot be combined with force_reinstall"
	msgUUID         = "must be a UUID in canonical form (8-4-4-4-12 hex digits)"
	msgRepo         = "must be owner/repo: owner of 1-39 letters, digits or '-' not starting with '-', " +
		"repo of 1-100 letters, digits, '.', '_' or '-' other than '.' and '..'"
	msgIP        = "must be an IPv4 or IPv6 address literal without a zone"
	msgPort      = "must be between 1 and 65535"
	msgModule    = "must match ^[a-z0-9][a-z0-9_-]*$ and be at most 63 bytes"
	msgBranch    = "must use only ASCII letters, digits and . _ / -"
	msgSecretRef = "must be a secret reference (vault:..., env:... or file:..., printable ASCII " +
		"without spaces), never a secret value"
	msgPlaybook = "must be a file name in playbooks/ matching " + PlaybookNamePattern
)

// RequestMeta holds the keys every request may carry.
type RequestMeta struct {
	// Version of the message format; absent or 0 means 1. A version newer
	// than the reader supports is rejected.
	SchemaVersion int `msgpack:"schema_version,omitempty"`
	// Producer-assigned job id, the key of deduplication: requests with the
	// same job_id are one job, run at most once, and their result is
	// published again. When absent, the stream entry id is the job id.
	JobID string `msgpack:"job_id,omitempty"`
	// Opaque id chosen by the producer, echoed in the result.
	CorrelationID string `msgpack:"correlation_id,omitempty"`
	// When the producer created the request: RFC 3339 in UTC.
	CreatedAt string `msgpack:"created_at,omitempty"`
	TraceContext
}

// JobIDOr returns the job id of the request: job_id when the producer set
// it, else entryID, the id of the stream entry that carried the request.
func (m RequestMeta) JobIDOr(entryID string) string {
	if m.JobID != "" {
		return m.JobID
	}
	return entryID
}

// CreatedTime returns created_at as a time, and false when it is absent or
// not a valid wire time.
func (m RequestMeta) CreatedTime() (time.Time, bool) {
	if m.CreatedAt == "" {
		return time.Time{}, false
	}
	t, err := ParseTime(m.CreatedAt)
	return t, err == nil
}

func (m *RequestMeta) validate(c *checker) {
	c.version(m.SchemaVersion)
	c.id("job_id", m.JobID, false)
	c.id("correlation_id", m.CorrelationID, false)
	c.time("created_at", m.CreatedAt, false)
	m.TraceContext.validate(c)
}

func (m *RequestMeta) normalize() {
	if m.SchemaVersion == 0 {
		m.SchemaVersion = SchemaVersion
	}
}

// ProvisionerMessage asks the infra service to provision (install or
// recover) a registered server. It is read from StreamProvisionerQueue.
type ProvisionerMessage struct {
	RequestMeta
	// Handle of the registered server to provision.
	ServerHandle string `msgpack:"server_handle"`
	// Reinstall the operating system even when the server is provisioned.
	ForceReinstall bool `msgpack:"force_reinstall,omitempty"`
	// Recover a server that failed or became unreachable, without a
	// reinstall. Cannot be combined with force_reinstall.
	IsRecovery bool `msgpack:"is_recovery,omitempty"`
	// Extra playbooks to run after the base playbook (setup_server.yml, or
	// recovery.yml when is_recovery), in this order, each only when every
	// playbook before it succeeded: file names in the ansible directory's
	// playbooks/. Absent or empty: none.
	Playbooks []string `msgpack:"playbooks,omitempty"`
}

// Validate checks m against the contract and returns a *ValidationError
// listing every problem, or nil. Zero values stand for absent keys and their
// defaults.
func (m *ProvisionerMessage) Validate() error {
	var c checker
	m.RequestMeta.validate(&c)
	switch {
	case m.ServerHandle == "":
		c.add("server_handle", msgRequired)
	case !serverHandleRE.MatchString(m.ServerHandle):
		c.add("server_handle", msgServerHandle)
	}
	if m.ForceReinstall && m.IsRecovery {
		c.add("is_recovery", msgExclusive)
	}
	c.names("playbooks", m.Playbooks, MaxPlaybooks, playbookRE.MatchString, msgPlaybook)
	return c.err()
}

func (m *ProvisionerMessage) normalize() { m.RequestMeta.normalize() }

// DecodeProvisionerMessage decodes, completes with defaults and validates a
// ProvisionerMessage. Every error it returns is IsInvalid. On a
// *ValidationError, and on a *DecodeError that lists only fields of the
// wrong type, it also returns what it read, so that the rejection can echo
// job_id and correlation_id; on other errors the message is nil.
func DecodeProvisionerMessage(data []byte) (*ProvisionerMessage, error) {
	return decodeMessage[ProvisionerMessage](data)
}

// AnsibleDeployMessage asks the infra service to deploy a project to a
// server with Ansible. It is read from StreamAnsibleDeployQueue.
type AnsibleDeployMessage struct {
	RequestMeta
	// Project to deploy: a UUID in canonical 8-4-4-4-12 form (read case
	// insensitively, written in lower case).
	ProjectID string `msgpack:"project_id"`
	// GitHub repository of the project, "owner/repo".
	RepoFullName string `msgpack:"repo_full_name"`
	// Git branch to deploy; "main" when absent. ASCII letters, digits and
	// . _ / - only, at most 200 bytes, within the rules of git
	// check-ref-format (the deploy playbook checks the same).
	Branch string `msgpack:"branch,omitempty"`
	// Address of the target server: an IPv4 or IPv6 literal (read in any
	// valid form, written in canonical form: an IPv4-mapped IPv6 address
	// becomes its IPv4 address).
	ServerIP string `msgpack:"server_ip"`
	// The application's port: the TCP port the project's stack is to
	// publish on the target, allocated by the producer. The deploy playbook
	// receives it as its variable port; it is never the SSH port (that is
	// ssh_port, or the registered server's).
	Port int `msgpack:"port"`
	// SSH port of a target that is not a registered server (one that
	// infra's DEPLOY_ALLOW_NETWORKS lets through); absent (0) means 22. A
	// registered server is reached on the SSH port it is registered with
	// (servers.ssh_port), and a request naming another one is rejected.
	SSHPort int `msgpack:"ssh_port,omitempty"`
	// Modules (roles) to apply, by name; absent means the playbook's
	// default set.
	Modules []string `msgpack:"modules,omitempty"`
	// Reference to the GitHub token used to clone the repository
	// (vault:..., env:... or file:...), never the token itself.
	GitHubTokenRef string `msgpack:"github_token_ref,omitempty"`
	// Reference to the project's deploy secrets (vault:..., env:... or
	// file:...), never the secrets themselves.
	SecretsRef string `msgpack:"secrets_ref,omitempty"`
	// Wall-clock limit of the run in seconds, 1-86400; absent (0) means the
	// service's own limit, which also caps a longer one.
	TimeoutSeconds int `msgpack:"timeout_seconds,omitempty"`
}

// Validate checks m against the contract and returns a *ValidationError
// listing every problem, or nil. Zero values stand for absent keys and their
// defaults.
func (m *AnsibleDeployMessage) Validate() error {
	var c checker
	m.RequestMeta.validate(&c)
	switch {
	case m.ProjectID == "":
		c.add("project_id", msgRequired)
	case !uuidRE.MatchString(m.ProjectID):
		c.add("project_id", msgUUID)
	}
	switch {
	case m.RepoFullName == "":
		c.add("repo_full_name", msgRequired)
	case !validRepoFullName(m.RepoFullName):
		c.add("repo_full_name", msgRepo)
	}
	if m.Branch != "" {
		if problem := branchProblem(m.Branch); problem != "" {
			c.add("branch", problem)
		}
	}
	switch {
	case m.ServerIP == "":
		c.add("server_ip", msgRequired)
	default:
		if addr, err := netip.ParseAddr(m.ServerIP); err != nil || addr.Zone() != "" {
			c.add("server_ip", msgIP)
		}
	}
	switch {
	case m.Port == 0:
		c.add("port", msgRequired)
	case m.Port < 1 || m.Port > 65535:
		c.add("port", msgPort)
	}
	if m.SSHPort < 0 || m.SSHPort > 65535 {
		c.add("ssh_port", msgPort)
	}
	c.names("modules", m.Modules, MaxModules, func(name string) bool {
		return len(name) <= MaxModuleLen && moduleRE.MatchString(name)
	}, msgModule)
	secretRef(&c, "github_token_ref", m.GitHubTokenRef)
	secretRef(&c, "secrets_ref", m.SecretsRef)
	if m.TimeoutSeconds < 0 || m.TimeoutSeconds > MaxTimeoutSeconds {
		c.add("timeout_seconds", fmt.Sprintf("must be between 1 and %d (seconds)", MaxTimeoutSeconds))
	}
	return c.err()
}

// normalize fills the defaults and writes valid identifiers in their
// canonical form (lower-case UUID, RFC 5952 address), so that equal
// requests compare equal.
func (m *AnsibleDeployMessage) normalize() {
	m.RequestMeta.normalize()
	if m.Branch == "" {
		m.Branch = DefaultBranch
	}
	if id, ok := CanonicalProjectID(m.ProjectID); ok {
		m.ProjectID = id
	}
	if addr, err := netip.ParseAddr(m.ServerIP); err == nil && addr.Zone() == "" {
		m.ServerIP = addr.Unmap().String()
	}
}

// DecodeAnsibleDeployMessage decodes, completes with defaults, normalizes
// and validates an AnsibleDeployMessage. Errors are as for
// DecodeProvisionerMessage.
func DecodeAnsibleDeployMessage(data []byte) (*AnsibleDeployMessage, error) {
	return decodeMessage[AnsibleDeployMessage](data)
}

func validRepoFullName(s string) bool {
	owner, repo, ok := strings.Cut(s, "/")
	return ok && ownerRE.MatchString(owner) && repoRE.MatchString(repo) && repo != "." && repo != ".."
}

// branchProblem returns what makes b unusable as a branch to deploy, or "":
// the rules of git check-ref-format within the character set and length the
// deploy playbook's own check accepts (ansible/roles/project_deploy), so
// that a request the playbook would refuse is rejected here instead.
func branchProblem(b string) string {
	if len(b) > MaxBranchLen {
		return fmt.Sprintf("must be at most %d bytes", MaxBranchLen)
	}
	if strings.ContainsFunc(b, func(r rune) bool { return !branchChar(r) }) {
		return msgBranch
	}
	switch {
	case strings.HasPrefix(b, "-"):
		return "must not start with '-'"
	case strings.HasPrefix(b, "/"):
		return "must not start with '/'"
	case strings.HasSuffix(b, "/"):
		return "must not end with '/'"
	case strings.HasSuffix(b, "."):
		return "must not end with '.'"
	case strings.Contains(b, ".."):
		return `must not contain ".."`
	case strings.Contains(b, "//"):
		return `must not contain "//"`
	}
	for part := range strings.SplitSeq(b, "/") {
		if strings.HasPrefix(part, ".") {
			return "no part between slashes may start with '.'"
		}
		if strings.HasSuffix(part, ".lock") {
			return `no part between slashes may end with ".lock"`
		}
	}
	return ""
}

func branchChar(r rune) bool {
	return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '.' || r == '_' || r == '/' || r == '-'
}

// secretRef checks an optional secret reference. The message never repeats
// the value: a value that is not a reference may be a secret itself.
func secretRef(c *checker, field, v string) {
	switch {
	case v == "":
	case len(v) > MaxSecretRefLen:
		c.add(field, fmt.Sprintf("must be at most %d bytes", MaxSecretRefLen))
	case !secretRefRE.MatchString(v):
		c.add(field, msgSecretRef)
	}
}

// wireMessage is what decodeMessage needs of a message type.
type wireMessage[T any] interface {
	*T
	Validate() error
	normalize()
}

// decodeMessage decodes data into a new T, normalizes and validates it.
func decodeMessage[T any, P wireMessage[T]](data []byte) (*T, error) {
	m := P(new(T))
	if err := decode(data, m); err != nil {
		var de *DecodeError
		if errors.As(err, &de) && de.Reason == "" && len(de.Fields) > 0 {
			m.normalize()
			return m, err
		}
		return nil, err
	}
	m.normalize()
	if err := m.Validate(); err != nil {
		return m, err
	}
	return m, nil
}
