package messages

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
)

// CommitPattern is the shape of a resolved commit: a full SHA-1 or SHA-256
// object name in lower-case hex.
const CommitPattern = `^([0-9a-f]{40}|[0-9a-f]{64})$`

var commitRE = regexp.MustCompile(CommitPattern)

// AnsibleJobResult is the result of an AnsibleJobMessage, published on
// StreamJobResults. hosts holds the recap of every host the job ran on (a
// host that could not be reached counts unreachable tasks there, and the
// others go on); playbooks the outcome of each playbook in order.
//
// A job in which every host was unreachable ends unreachable
// (hosts_unreachable); one in which a task failed ends failed
// (playbook_failed); one in which some hosts were unreachable and the
// others succeeded ends failed with kind hosts_unreachable, so that a
// caller sees the job did not reach everything it was asked to.
type AnsibleJobResult struct {
	Outcome
	// project_id of the request, echoed.
	ProjectID string `msgpack:"project_id,omitempty"`
	// options.pool of the request, echoed (absent: the default pool).
	Pool string `msgpack:"pool,omitempty"`
	// Commit source.repository was checked out at (ref resolved), when a
	// repository was used.
	Commit string `msgpack:"commit,omitempty"`
	// Commit of inventory.repository the inventory was read at, for a git
	// inventory.
	InventoryCommit string `msgpack:"inventory_commit,omitempty"`
	// Each playbook of the job in order, with its outcome: those that ran,
	// then those skipped after one that did not succeed. A role or
	// collection_role job has one (the generated play). Absent when no
	// playbook ran.
	Playbooks []PlaybookOutcome `msgpack:"playbooks,omitempty"`
	// The job's artifacts: the set_stats data (per_host: false) of its
	// playbooks, merged in order (a later playbook's key wins), secrets
	// redacted. Names are variable names (not ansible_*), and the whole
	// at most MaxArtifactsBytes encoded: a workflow hands them to its
	// next steps as extra vars. Absent when no playbook set any.
	Artifacts Vars `msgpack:"artifacts,omitempty"`
}

// MaxArtifactsBytes bounds a job result's artifacts, msgpack-encoded.
const MaxArtifactsBytes = 64 << 10

// artifactsFit reports whether v encodes to at most MaxArtifactsBytes.
func artifactsFit(v Vars) bool {
	b, err := msgpack.Marshal(v)
	return err == nil && len(b) <= MaxArtifactsBytes
}

// SetArtifacts sets r's artifacts to the entries of vars whose names a
// workflow can pass on as extra vars, and returns the names left out. If
// the kept entries encode to more than MaxArtifactsBytes, none are kept
// and every name is returned.
func (r *AnsibleJobResult) SetArtifacts(vars Vars) (dropped []string) {
	kept := Vars{}
	for _, k := range sortedKeys(vars) {
		if !varNameRE.MatchString(k) || strings.HasPrefix(strings.ToLower(k), "ansible_") {
			dropped = append(dropped, k)
			continue
		}
		kept[k] = vars[k]
	}
	if len(kept) == 0 {
		r.Artifacts = nil
		return dropped
	}
	if !artifactsFit(kept) {
		r.Artifacts = nil
		return sortedKeys(vars)
	}
	r.Artifacts = kept
	return dropped
}

// NewAnsibleJobResult starts the result of msg, read from the stream entry
// requestID, like NewProvisionerResult; it copies the project id and pool.
func NewAnsibleJobResult(msg *AnsibleJobMessage, requestID string) *AnsibleJobResult {
	if msg == nil {
		return &AnsibleJobResult{Outcome: newOutcome(nil, requestID)}
	}
	r := &AnsibleJobResult{Outcome: newOutcome(&msg.RequestMeta, requestID), ProjectID: echo(msg.ProjectID)}
	if poolRE.MatchString(msg.Options.Pool) {
		r.Pool = msg.Options.Pool
	}
	return r
}

// Validate checks r against the contract and returns a *ValidationError
// listing every problem, or nil.
func (r *AnsibleJobResult) Validate() error {
	var c checker
	r.Outcome.validate(&c)
	if r.Pool != "" && !poolRE.MatchString(r.Pool) {
		c.add("pool", "must match "+PoolPattern)
	}
	if r.Commit != "" && !commitRE.MatchString(r.Commit) {
		c.add("commit", "must be a full commit id in lower-case hex")
	}
	if r.InventoryCommit != "" && !commitRE.MatchString(r.InventoryCommit) {
		c.add("inventory_commit", "must be a full commit id in lower-case hex")
	}
	validatePlaybooks(&c, r.Playbooks)
	varNames(&c, "artifacts", r.Artifacts)
	if len(r.Artifacts) > 0 && !artifactsFit(r.Artifacts) {
		c.add("artifacts", fmt.Sprintf("must encode to at most %d bytes", MaxArtifactsBytes))
	}
	return c.err()
}

func (r *AnsibleJobResult) normalize() { r.Outcome.normalize() }

// DecodeAnsibleJobResult decodes and validates an AnsibleJobResult. Errors
// are as for DecodeProvisionerMessage.
func DecodeAnsibleJobResult(data []byte) (*AnsibleJobResult, error) {
	return decodeMessage[AnsibleJobResult](data)
}
