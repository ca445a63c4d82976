package cli

import (
	"fmt"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// deployCmd enqueues an AnsibleDeployMessage straight on
// ansible:deploy:queue, as the deployer does for POST /deployments. The
// deployer's observer of that queue records it as a deployment (source
// "stream"), so it shows in the deployer's API too.
type deployCmd struct {
	Project   string        `arg:"" name:"project-id" help:"the project's id (a UUID)"`
	Repo      string        `arg:"" name:"repo" help:"the project's GitHub repository, owner/repo"`
	ServerIP  string        `arg:"" name:"server-ip" help:"address of the target server (IPv4 or IPv6 literal)"`
	Port      int           `required:"" help:"the application's port: where the project's stack is published on the target, handed to the deploy playbook as its port (not the SSH port)"`
	SSHPort   int           `name:"ssh-port" help:"SSH port of a target that is not a registered server (default 22); a registered server is reached on the SSH port it is registered with"`
	Branch    string        `help:"branch to deploy (default: main)"`
	Module    []string      `name:"module" short:"m" help:"a module (role) to apply; repeat for more (default: the playbook's set)"`
	TokenRef  string        `name:"github-token-ref" help:"secret reference of the GitHub token (vault:..., env:..., file:...), never the token"`
	Secrets   string        `name:"secrets-ref" help:"secret reference of the project's deploy secrets, never the secrets"`
	TimeLimit time.Duration `name:"time-limit" help:"wall-clock limit of the run (1s to 24h, whole seconds; default: infra's own limit)"`
	JobID     string        `name:"job-id" help:"the job id (default: a new UUID); the same id twice is one job"`
	Corr      string        `name:"correlation-id" help:"an id of yours, echoed in the result"`
	Follow    bool          `help:"print the job's progress live and exit with its status (0 succeeded, 1 otherwise)"`
	Timeout   time.Duration `default:"1h" help:"with --follow: give up waiting after this long"`
}

func (c *deployCmd) Run(g *globals) error {
	if c.TimeLimit < 0 || c.TimeLimit%time.Second != 0 {
		return usageError{fmt.Errorf("--time-limit %s: must be whole seconds", c.TimeLimit)}
	}
	msg := &messages.AnsibleDeployMessage{
		RequestMeta: newMeta(c.JobID, c.Corr),
		ProjectID:   c.Project, RepoFullName: c.Repo, Branch: c.Branch, ServerIP: c.ServerIP, Port: c.Port, SSHPort: c.SSHPort,
		Modules: c.Module, GitHubTokenRef: c.TokenRef, SecretsRef: c.Secrets,
		TimeoutSeconds: int(c.TimeLimit / time.Second),
	}
	// The wire decoder itself checks (and normalizes) what infra will read.
	data, err := messages.Encode(msg)
	if err != nil {
		return usageError{err}
	}
	if msg, err = messages.DecodeAnsibleDeployMessage(data); err != nil {
		return usageError{err}
	}
	return enqueue(g, request{
		kind: messages.JobKindDeploy, queue: messages.StreamAnsibleDeployQueue,
		jobID: msg.JobID, what: fmt.Sprintf("deploy %s to %s", msg.RepoFullName, msg.ServerIP), follow: c.Follow, timeout: c.Timeout,
		encode: func(tc messages.TraceContext) ([]byte, error) {
			msg.TraceContext = tc
			return messages.Encode(msg)
		},
	})
}
