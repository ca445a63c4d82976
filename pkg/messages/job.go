package messages

import (
	"fmt"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern"
)

// Ansible jobs: a general request to run a playbook, a role or a
// collection's role from a repository or a Galaxy server on an inventory,
// read from StreamAnsibleJobQueue (or one of its pools, see
// AnsibleJobQueue) and answered on StreamJobResults.

// Streams of Ansible jobs.
const (
	// StreamAnsibleJobQueue carries AnsibleJobMessage requests of the
	// default pool; a job with options.pool goes to AnsibleJobQueue(pool).
	StreamAnsibleJobQueue = "ansible:job:queue"
	// StreamJobResults carries an AnsibleJobResult per finished job, of
	// every pool.
	StreamJobResults = "job:results"
)

// JobKindJob is a job of StreamAnsibleJobQueue or one of its pools: its
// progress stream is job:job:<job_id>:events and its cancel key
// job:job:<job_id>:cancel.
const JobKindJob JobKind = "job"

// ResultsStream returns the stream of the results of the jobs of kind
// kind.
func ResultsStream(kind JobKind) string {
	switch kind {
	case JobKindDeploy:
		return StreamDeployResults
	case JobKindJob:
		return StreamJobResults
	}
	return StreamProvisionerResults
}

// PoolPattern is the shape of a pool name (options.pool).
const PoolPattern = `^[a-z0-9][a-z0-9-]{0,31}$`

// AnsibleJobQueue returns the stream of the jobs of pool: StreamAnsibleJobQueue
// for the default pool (""), "ansible:job:queue:<pool>" for another.
func AnsibleJobQueue(pool string) string {
	if pool == "" {
		return StreamAnsibleJobQueue
	}
	return StreamAnsibleJobQueue + ":" + pool
}

// Limits of an AnsibleJobMessage.
const (
	// MaxJobPlaybooks is the most playbooks source.paths may list.
	MaxJobPlaybooks = 32
	// MaxJobPathLen is the longest path in a repository, in bytes.
	MaxJobPathLen = 1024
	// MaxJobHosts is the most hosts an inline inventory may list (infra
	// may set a lower limit of its own, which also bounds the hosts of
	// git, url and dynamic inventories).
	MaxJobHosts = 1000
	// MaxJobGroups is the most groups an inline inventory may list.
	MaxJobGroups = 1000
	// MaxJobTags is the most entries tags and skip_tags may each list.
	MaxJobTags = 64
	// MaxJobLimitLen is the longest limit pattern, in bytes.
	MaxJobLimitLen = 4096
	// MaxJobVerbosity is the highest verbosity (-vvvv).
	MaxJobVerbosity = 4
	// MaxJobSecretVars bounds options.secret_vars.
	MaxJobSecretVars = 32
	// MaxJobForks is the most forks a job may ask for.
	MaxJobForks = 200
	// MaxURLLen is the longest URL, in bytes.
	MaxURLLen = 2048
	// MaxRefLen is the longest git ref (branch, tag or commit), in bytes.
	MaxRefLen = 255
)

// SourceType says what a job runs.
type SourceType string

// The source types.
const (
	// SourcePlaybook runs the playbooks source.paths of source.repository.
	SourcePlaybook SourceType = "playbook"
	// SourceRole runs the role at source.role_path of source.repository
	// through a generated play on all hosts, with source.role_vars.
	SourceRole SourceType = "role"
	// SourceCollectionRole installs source.collection (source.version)
	// from source.galaxy_server and runs its role source.role through a
	// generated play on all hosts, with source.role_vars.
	SourceCollectionRole SourceType = "collection_role"
)

// SourceTypes returns every source type.
func SourceTypes() []SourceType {
	return []SourceType{SourcePlaybook, SourceRole, SourceCollectionRole}
}

// InventoryType says where a job's hosts come from.
type InventoryType string

// The inventory types.
const (
	// InventoryInline: the hosts and groups are in the message.
	InventoryInline InventoryType = "inline"
	// InventoryGit: a file (inventory.path) of a repository.
	InventoryGit InventoryType = "git"
	// InventoryURL: a file fetched by infra from inventory.url (YAML, INI
	// or JSON), with a time and size limit.
	InventoryURL InventoryType = "url"
	// InventoryDynamic: an inventory plugin (inventory.plugin) with its
	// configuration (inventory.config) and the cloud credential.
	InventoryDynamic InventoryType = "dynamic"
)

// InventoryTypes returns every inventory type.
func InventoryTypes() []InventoryType {
	return []InventoryType{InventoryInline, InventoryGit, InventoryURL, InventoryDynamic}
}

// Vars is free-form Ansible data (variables): keys are strings, values are
// nil, booleans, integers, floats, strings, arrays and maps of them. It is
// encoded as a msgpack map; decoded integers are int64, floats float64,
// arrays []any and maps map[string]any. Infra hands every string to
// Ansible tagged !unsafe: a value is data, never a template.
type Vars map[string]any

// JobSource is what a job runs.
type JobSource struct {
	// What to run: playbook, role or collection_role.
	Type SourceType `msgpack:"type"`
	// Git repository of a playbook or role: an https (or http) URL without
	// user name, password, query or fragment. Required for playbook and
	// role.
	Repository string `msgpack:"repository,omitempty"`
	// Branch, tag or commit of repository to check out; absent: its
	// default branch. The result reports the commit it resolved to.
	Ref string `msgpack:"ref,omitempty"`
	// Playbooks to run, in order, each only when every one before it
	// succeeded: paths relative to the repository's root (no "..", not
	// absolute). Required for playbook, and only for playbook.
	Paths []string `msgpack:"paths,omitempty"`
	// Reference to the token that reads repository (vault:..., env:... or
	// file:...), never the token itself.
	GitCredential string `msgpack:"git_credential,omitempty"`
	// Path of the role's directory in repository. Required for role.
	RolePath string `msgpack:"role_path,omitempty"`
	// Variables of the role (role and collection_role), as the role's
	// parameters.
	RoleVars Vars `msgpack:"role_vars,omitempty"`
	// Collection of a collection_role, "namespace.name". Required for it.
	Collection string `msgpack:"collection,omitempty"`
	// Role of collection to run. Required for collection_role.
	Role string `msgpack:"role,omitempty"`
	// Version constraint of collection ("1.2.3", ">=1.0.0,<2.0.0"); absent:
	// the newest.
	Version string `msgpack:"version,omitempty"`
	// Galaxy server to install collection from: an https (or http) URL that
	// infra must allow; absent: infra's default server. Its token is
	// credentials.galaxy.
	GalaxyServer string `msgpack:"galaxy_server,omitempty"`
}

// InventoryGroup is a group of an inline inventory.
type InventoryGroup struct {
	// Hosts of the group, by name (each a key of inventory.hosts).
	Hosts []string `msgpack:"hosts,omitempty"`
	// Groups that are children of this one, by name.
	Children []string `msgpack:"children,omitempty"`
	// Variables of the group's hosts.
	Vars Vars `msgpack:"vars,omitempty"`
}

// JobInventory is where a job's hosts come from. Every host, whatever the
// inventory type, is authorized by infra before any connection: a
// registered server or an address of infra's allow-list, never a
// loopback, link-local, metadata or own address.
type JobInventory struct {
	// Where the hosts come from: inline, git, url or dynamic.
	Type InventoryType `msgpack:"type"`
	// Hosts of an inline inventory: host name to its variables. A host is
	// reached at ansible_host (an address literal or a name), else at its
	// name; ansible_port and ansible_user may be set, other connection
	// variables may not.
	Hosts map[string]Vars `msgpack:"hosts,omitempty"`
	// Groups of an inline inventory, by name.
	Groups map[string]InventoryGroup `msgpack:"groups,omitempty"`
	// Git repository of a git inventory (an https or http URL, as
	// source.repository).
	Repository string `msgpack:"repository,omitempty"`
	// Branch, tag or commit of repository; absent: its default branch.
	Ref string `msgpack:"ref,omitempty"`
	// Path of the inventory file in repository (git).
	Path string `msgpack:"path,omitempty"`
	// URL of a url inventory (https or http, without user name or
	// password).
	URL string `msgpack:"url,omitempty"`
	// Reference to the credential of repository (git, a token) or url
	// (sent as a bearer token).
	Credential string `msgpack:"credential,omitempty"`
	// Inventory plugin of a dynamic inventory, by its fully qualified name
	// ("namespace.collection.plugin").
	Plugin string `msgpack:"plugin,omitempty"`
	// Configuration of plugin (the keys of its YAML file but "plugin").
	Config Vars `msgpack:"config,omitempty"`
}

// JobCredentials are the secrets of a job, each a reference (vault:...,
// env:... or file:...), never a value. Infra resolves them within the
// job's project and hands them to Ansible through its environment, never
// its arguments or files.
type JobCredentials struct {
	// SSH private key for the hosts without a key of the job's project
	// (a registered server the project owns uses its own, when every
	// server holding that key is the project's); required when the
	// inventory has such a host: infra never lends its own key to a job.
	SSH string `msgpack:"ssh,omitempty"`
	// Password for become (sudo).
	BecomePassword string `msgpack:"become_password,omitempty"`
	// Password of vault-encrypted variables and files.
	VaultPassword string `msgpack:"vault_password,omitempty"`
	// Credential of a dynamic inventory's cloud (handed to the plugin's
	// environment).
	Cloud string `msgpack:"cloud,omitempty"`
	// Token of the Galaxy server.
	Galaxy string `msgpack:"galaxy,omitempty"`
}

// JobOptions tune a job's run.
type JobOptions struct {
	// Extra variables (ansible-playbook -e), as data: every string is
	// tagged !unsafe, so nothing in them is templated. Names must be valid
	// variable names not starting with "ansible_".
	ExtraVars Vars `msgpack:"extra_vars,omitempty"`
	// Secret variables: variable name to a secret reference. Infra
	// resolves each (within the job's project) and hands its value to the
	// play as that extra variable through the environment only: never in
	// arguments, files or the result. Names follow extra_vars' rules and
	// must not be extra_vars too; at most MaxJobSecretVars.
	SecretVars map[string]string `msgpack:"secret_vars,omitempty"`
	// Run only the tasks with these tags.
	Tags []string `msgpack:"tags,omitempty"`
	// Skip the tasks with these tags.
	SkipTags []string `msgpack:"skip_tags,omitempty"`
	// Host pattern limiting the run (ansible-playbook --limit).
	Limit string `msgpack:"limit,omitempty"`
	// Dry run (--check).
	Check bool `msgpack:"check,omitempty"`
	// Show the differences of changed files (--diff).
	Diff bool `msgpack:"diff,omitempty"`
	// Verbosity 0-4 (-v to -vvvv); redaction applies at every level.
	Verbosity int `msgpack:"verbosity,omitempty"`
	// Parallel hosts (--forks), 1-200; absent: infra's default.
	Forks int `msgpack:"forks,omitempty"`
	// Wall-clock limit of the job in seconds, 1-86400; absent (0) means the
	// service's own limit, which also caps a longer one.
	TimeoutSeconds int `msgpack:"timeout_seconds,omitempty"`
	// Pool of infra replicas to run on: the job is read from
	// AnsibleJobQueue(pool). Absent: the default pool.
	Pool string `msgpack:"pool,omitempty"`
	// URL the producer notifies when the job ends (the deployer's signed
	// webhook); infra does not call it.
	CallbackURL string `msgpack:"callback_url,omitempty"`
}

// AnsibleJobMessage asks the infra service to run a playbook, a role or a
// collection's role on an inventory. It is read from StreamAnsibleJobQueue
// or AnsibleJobQueue(options.pool); its result goes to StreamJobResults.
type AnsibleJobMessage struct {
	RequestMeta
	// Project the job belongs to: a UUID in canonical 8-4-4-4-12 form (read
	// case insensitively, written in lower case). Secret references are
	// resolved within it.
	ProjectID string `msgpack:"project_id"`
	// What to run.
	Source JobSource `msgpack:"source"`
	// Where to run it.
	Inventory JobInventory `msgpack:"inventory"`
	// Secrets, by reference.
	Credentials JobCredentials `msgpack:"credentials,omitempty"`
	// Options of the run.
	Options JobOptions `msgpack:"options,omitempty"`
}

var (
	poolRE       = pattern.MustCompile(`^[a-z0-9][a-z0-9-]*$`, 32) // PoolPattern
	varNameRE    = pattern.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`, 128)
	hostNameRE   = pattern.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.:-]*$`, 253)
	groupNameRE  = pattern.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`, 128)
	collectionRE = pattern.MustCompileParts(`^[a-z0-9][a-z0-9_]*\.[a-z0-9][a-z0-9_]*$`, ".", 64)
	roleNameRE   = pattern.MustCompile(`^[a-z0-9][a-z0-9_]*$`, 64)
	pluginRE     = pattern.MustCompileParts(`^[a-z0-9][a-z0-9_]*\.[a-z0-9][a-z0-9_]*\.[a-z0-9][a-z0-9_]*$`, ".", 64)
	versionRE    = pattern.MustCompile(`^[A-Za-z0-9.,<>=!*+ -]+$`, 128)
	tagRE        = pattern.MustCompile(`^[A-Za-z0-9_.:-]+$`, 128)
	limitRE      = regexp.MustCompile(`^[A-Za-z0-9_.:,!&*\[\]~-]+$`)
	refRE        = regexp.MustCompile(`^[A-Za-z0-9._/-]+$`)
)

// ValidPool reports whether name has the shape of a job pool name
// (PoolPattern).
func ValidPool(name string) bool { return poolRE.MatchString(name) }

// Patterns of the job keys (the JSON Schemas use the same).
const (
	VarNamePattern    = `^[A-Za-z_][A-Za-z0-9_]{0,127}$`
	HostNamePattern   = `^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,252}$`
	GroupNamePattern  = `^[A-Za-z_][A-Za-z0-9_]{0,127}$`
	CollectionPattern = `^[a-z0-9][a-z0-9_]{0,63}\.[a-z0-9][a-z0-9_]{0,63}$`
	RoleNamePattern   = `^[a-z0-9][a-z0-9_]{0,63}$`
	PluginPattern     = `^[a-z0-9][a-z0-9_]{0,63}\.[a-z0-9][a-z0-9_]{0,63}\.[a-z0-9][a-z0-9_]{0,63}$`
	VersionPattern    = `^[A-Za-z0-9.,<>=!*+ -]{1,128}$`
	TagPattern        = `^[A-Za-z0-9_.:-]{1,128}$`
	LimitPattern      = `^[A-Za-z0-9_.:,!&*\[\]~-]+$`
	RefPattern        = `^[A-Za-z0-9._/-]+$`
)

// InventoryConnectionVars returns the connection variables an inventory's
// hosts and groups may set; every other ansible_* variable is refused in
// an inline inventory (and in git, url and dynamic inventories by infra),
// so that a request cannot change how or where infra connects
// (ansible_connection, ansible_ssh_common_args, ...).
func InventoryConnectionVars() []string {
	return []string{"ansible_host", "ansible_port", "ansible_user", "ansible_python_interpreter",
		"ansible_become", "ansible_become_user", "ansible_become_method"}
}

// AllowedInventoryVar reports whether an inventory (host or group) may set
// the variable name: any name that does not start with "ansible_", and a
// few connection variables that only say where and as whom to connect.
func AllowedInventoryVar(name string) bool {
	return !strings.HasPrefix(strings.ToLower(name), "ansible_") || slices.Contains(InventoryConnectionVars(), name)
}

// Validation messages of the job keys.
const (
	msgJobURL       = "must be an http or https URL without user, password, query or fragment"
	msgJobPath      = "must be a relative path inside the repository (no '..', not absolute)"
	msgJobRef       = "must use only ASCII letters, digits and . _ / - and be a valid git ref"
	msgVarName      = "must be a variable name matching " + VarNamePattern
	msgReservedVar  = "must not start with ansible_ (connection variables cannot be set here)"
	msgOnlyFor      = "only allowed when %s is %s"
	msgInventoryVar = "is a connection variable an inventory may not set"
)

// Validate checks m against the contract and returns a *ValidationError
// listing every problem, or nil. Zero values stand for absent keys.
func (m *AnsibleJobMessage) Validate() error {
	var c checker
	m.RequestMeta.validate(&c)
	switch {
	case m.ProjectID == "":
		c.add("project_id", msgRequired)
	case !uuidRE.MatchString(m.ProjectID):
		c.add("project_id", msgUUID)
	}
	m.Source.validate(&c)
	m.Inventory.validate(&c)
	for _, ref := range []struct{ field, v string }{
		{"credentials.ssh", m.Credentials.SSH},
		{"credentials.become_password", m.Credentials.BecomePassword},
		{"credentials.vault_password", m.Credentials.VaultPassword},
		{"credentials.cloud", m.Credentials.Cloud},
		{"credentials.galaxy", m.Credentials.Galaxy},
	} {
		secretRef(&c, ref.field, ref.v)
	}
	m.Options.validate(&c)
	return c.err()
}

func (s *JobSource) validate(c *checker) {
	only := func(field string, set bool, types ...SourceType) {
		if set && !slices.Contains(types, s.Type) {
			names := make([]string, len(types))
			for i, t := range types {
				names[i] = string(t)
			}
			c.add(field, fmt.Sprintf(msgOnlyFor, "source.type", strings.Join(names, " or ")))
		}
	}
	need := func(field string, set bool, t SourceType) {
		if !set && s.Type == t {
			c.add(field, "required when source.type is "+string(t))
		}
	}
	switch {
	case s.Type == "":
		c.add("source.type", msgRequired)
	case !slices.Contains(SourceTypes(), s.Type):
		c.add("source.type", "must be one of playbook, role, collection_role")
	}
	need("source.repository", s.Repository != "", SourcePlaybook)
	need("source.repository", s.Repository != "", SourceRole)
	only("source.repository", s.Repository != "", SourcePlaybook, SourceRole)
	jobURL(c, "source.repository", s.Repository)
	only("source.ref", s.Ref != "", SourcePlaybook, SourceRole)
	gitRef(c, "source.ref", s.Ref)
	need("source.paths", len(s.Paths) > 0, SourcePlaybook)
	only("source.paths", len(s.Paths) > 0, SourcePlaybook)
	c.names("source.paths", s.Paths, MaxJobPlaybooks, validRepoPath, msgJobPath)
	only("source.git_credential", s.GitCredential != "", SourcePlaybook, SourceRole)
	secretRef(c, "source.git_credential", s.GitCredential)
	need("source.role_path", s.RolePath != "", SourceRole)
	only("source.role_path", s.RolePath != "", SourceRole)
	if s.RolePath != "" && !validRepoPath(s.RolePath) {
		c.add("source.role_path", msgJobPath)
	}
	only("source.role_vars", len(s.RoleVars) > 0, SourceRole, SourceCollectionRole)
	varNames(c, "source.role_vars", s.RoleVars)
	need("source.collection", s.Collection != "", SourceCollectionRole)
	only("source.collection", s.Collection != "", SourceCollectionRole)
	if s.Collection != "" && !collectionRE.MatchString(s.Collection) {
		c.add("source.collection", "must be namespace.name matching "+CollectionPattern)
	}
	need("source.role", s.Role != "", SourceCollectionRole)
	only("source.role", s.Role != "", SourceCollectionRole)
	if s.Role != "" && !roleNameRE.MatchString(s.Role) {
		c.add("source.role", "must match "+RoleNamePattern)
	}
	only("source.version", s.Version != "", SourceCollectionRole)
	if s.Version != "" && !versionRE.MatchString(s.Version) {
		c.add("source.version", "must be a version or version constraint matching "+VersionPattern)
	}
	only("source.galaxy_server", s.GalaxyServer != "", SourceCollectionRole)
	jobURL(c, "source.galaxy_server", s.GalaxyServer)
}

func (inv *JobInventory) validate(c *checker) {
	only := func(field string, set bool, types ...InventoryType) {
		if set && !slices.Contains(types, inv.Type) {
			names := make([]string, len(types))
			for i, t := range types {
				names[i] = string(t)
			}
			c.add(field, fmt.Sprintf(msgOnlyFor, "inventory.type", strings.Join(names, " or ")))
		}
	}
	need := func(field string, set bool, t InventoryType) {
		if !set && inv.Type == t {
			c.add(field, "required when inventory.type is "+string(t))
		}
	}
	switch {
	case inv.Type == "":
		c.add("inventory.type", msgRequired)
	case !slices.Contains(InventoryTypes(), inv.Type):
		c.add("inventory.type", "must be one of inline, git, url, dynamic")
	}
	need("inventory.hosts", len(inv.Hosts) > 0, InventoryInline)
	only("inventory.hosts", len(inv.Hosts) > 0, InventoryInline)
	only("inventory.groups", len(inv.Groups) > 0, InventoryInline)
	if len(inv.Hosts) > MaxJobHosts {
		c.add("inventory.hosts", fmt.Sprintf("must have at most %d hosts", MaxJobHosts))
	} else {
		for _, h := range sortedKeys(inv.Hosts) {
			field := "inventory.hosts[" + h + "]"
			if !hostNameRE.MatchString(h) {
				c.add(field, "host names must match "+HostNamePattern)
				continue
			}
			inventoryVars(c, field, inv.Hosts[h])
		}
	}
	if len(inv.Groups) > MaxJobGroups {
		c.add("inventory.groups", fmt.Sprintf("must have at most %d groups", MaxJobGroups))
	} else {
		for _, g := range sortedKeys(inv.Groups) {
			field := "inventory.groups[" + g + "]"
			if !groupNameRE.MatchString(g) {
				c.add(field, "group names must match "+GroupNamePattern)
				continue
			}
			grp := inv.Groups[g]
			for i, h := range grp.Hosts {
				if _, ok := inv.Hosts[h]; !ok {
					c.add(field+".hosts["+strconv.Itoa(i)+"]", "must be a host of inventory.hosts")
				}
			}
			for i, child := range grp.Children {
				if _, ok := inv.Groups[child]; !ok || child == g {
					c.add(field+".children["+strconv.Itoa(i)+"]", "must be another group of inventory.groups")
				}
			}
			inventoryVars(c, field+".vars", grp.Vars)
		}
	}
	need("inventory.repository", inv.Repository != "", InventoryGit)
	only("inventory.repository", inv.Repository != "", InventoryGit)
	jobURL(c, "inventory.repository", inv.Repository)
	only("inventory.ref", inv.Ref != "", InventoryGit)
	gitRef(c, "inventory.ref", inv.Ref)
	need("inventory.path", inv.Path != "", InventoryGit)
	only("inventory.path", inv.Path != "", InventoryGit)
	if inv.Path != "" && !validRepoPath(inv.Path) {
		c.add("inventory.path", msgJobPath)
	}
	need("inventory.url", inv.URL != "", InventoryURL)
	only("inventory.url", inv.URL != "", InventoryURL)
	jobURL(c, "inventory.url", inv.URL)
	only("inventory.credential", inv.Credential != "", InventoryGit, InventoryURL)
	secretRef(c, "inventory.credential", inv.Credential)
	need("inventory.plugin", inv.Plugin != "", InventoryDynamic)
	only("inventory.plugin", inv.Plugin != "", InventoryDynamic)
	if inv.Plugin != "" && !pluginRE.MatchString(inv.Plugin) {
		c.add("inventory.plugin", "must be a fully qualified plugin name matching "+PluginPattern)
	}
	only("inventory.config", len(inv.Config) > 0, InventoryDynamic)
	if _, ok := inv.Config["plugin"]; ok {
		c.add("inventory.config[plugin]", "must not be set: the plugin is inventory.plugin")
	}
}

func (o *JobOptions) validate(c *checker) {
	varNames(c, "options.extra_vars", o.ExtraVars)
	if len(o.SecretVars) > MaxJobSecretVars {
		c.add("options.secret_vars", fmt.Sprintf("at most %d", MaxJobSecretVars))
	}
	for _, k := range sortedKeys(o.SecretVars) {
		field := "options.secret_vars[" + k + "]"
		switch _, dup := o.ExtraVars[k]; {
		case !varNameRE.MatchString(k):
			c.add(field, msgVarName)
		case strings.HasPrefix(strings.ToLower(k), "ansible_"):
			c.add(field, msgReservedVar)
		case dup:
			c.add(field, "is an extra variable too")
		case o.SecretVars[k] == "":
			c.add(field, "must be a secret reference")
		default:
			secretRef(c, field, o.SecretVars[k])
		}
	}
	c.names("options.tags", o.Tags, MaxJobTags, tagRE.MatchString, "must match "+TagPattern)
	c.names("options.skip_tags", o.SkipTags, MaxJobTags, tagRE.MatchString, "must match "+TagPattern)
	switch {
	case o.Limit == "":
	case len(o.Limit) > MaxJobLimitLen:
		c.add("options.limit", fmt.Sprintf("must be at most %d bytes", MaxJobLimitLen))
	case !limitRE.MatchString(o.Limit) || strings.HasPrefix(o.Limit, "@"):
		c.add("options.limit", "must be a host pattern matching "+LimitPattern)
	}
	if o.Verbosity < 0 || o.Verbosity > MaxJobVerbosity {
		c.add("options.verbosity", fmt.Sprintf("must be between 0 and %d", MaxJobVerbosity))
	}
	if o.Forks < 0 || o.Forks > MaxJobForks {
		c.add("options.forks", fmt.Sprintf("must be between 1 and %d", MaxJobForks))
	}
	if o.TimeoutSeconds < 0 || o.TimeoutSeconds > MaxTimeoutSeconds {
		c.add("options.timeout_seconds", fmt.Sprintf("must be between 1 and %d (seconds)", MaxTimeoutSeconds))
	}
	if o.Pool != "" && !poolRE.MatchString(o.Pool) {
		c.add("options.pool", "must match "+PoolPattern)
	}
	jobURL(c, "options.callback_url", o.CallbackURL)
}

// normalize writes the project id in its canonical form.
func (m *AnsibleJobMessage) normalize() {
	m.RequestMeta.normalize()
	if id, ok := CanonicalProjectID(m.ProjectID); ok {
		m.ProjectID = id
	}
}

// DecodeAnsibleJobMessage decodes, normalizes and validates an
// AnsibleJobMessage. Errors are as for DecodeProvisionerMessage.
func DecodeAnsibleJobMessage(data []byte) (*AnsibleJobMessage, error) {
	return decodeMessage[AnsibleJobMessage](data)
}

// jobURL checks an optional URL key.
func jobURL(c *checker, field, v string) {
	if v == "" {
		return
	}
	if len(v) > MaxURLLen {
		c.add(field, fmt.Sprintf("must be at most %d bytes", MaxURLLen))
		return
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil ||
		u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(v, " \t\r\n#?") {
		c.add(field, msgJobURL)
	}
}

// gitRef checks an optional git ref by the rules branches follow.
func gitRef(c *checker, field, v string) {
	if v == "" {
		return
	}
	if len(v) > MaxRefLen || !refRE.MatchString(v) || branchProblem(v) != "" {
		c.add(field, msgJobRef)
	}
}

// validRepoPath reports whether p is a clean relative path that stays in
// its repository.
func validRepoPath(p string) bool {
	if p == "" || len(p) > MaxJobPathLen || strings.ContainsAny(p, "\\\x00") || strings.HasPrefix(p, "/") {
		return false
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	clean := path.Clean(p)
	return clean != "." && clean != ".." && !strings.HasPrefix(clean, "../") && !slices.Contains(strings.Split(p, "/"), "..")
}

// varNames checks the names of free-form variables (extra_vars,
// role_vars).
func varNames(c *checker, field string, vars Vars) {
	for _, k := range sortedKeys(vars) {
		switch {
		case !varNameRE.MatchString(k):
			c.add(field+"["+k+"]", msgVarName)
		case strings.HasPrefix(strings.ToLower(k), "ansible_"):
			c.add(field+"["+k+"]", msgReservedVar)
		}
	}
}

// inventoryVars checks the variables of an inline host or group.
func inventoryVars(c *checker, field string, vars Vars) {
	for _, k := range sortedKeys(vars) {
		switch {
		case !varNameRE.MatchString(k):
			c.add(field+"["+k+"]", msgVarName)
		case !AllowedInventoryVar(k):
			c.add(field+"["+k+"]", msgInventoryVar)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
