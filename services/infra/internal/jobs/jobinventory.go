package jobs

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path"
	"slices"
	"strings"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/inventory"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sources"
)

// JobInventories resolves git, URL and dynamic inventories to a file and
// its hosts (package inventory).
type JobInventories interface {
	// Resolve returns the inventory's file, its hosts and, for a git
	// inventory, the commit it was read at.
	Resolve(ctx context.Context, spec inventory.Spec, run inventory.Run) (file string, hosts []inventory.Host, commit string, err error)
}

// envCloudCredential holds a dynamic inventory's cloud credential when it
// is one value; a credential of NAME=value lines sets those variables.
const envCloudCredential = "AUTOPROV_CLOUD_CREDENTIAL"

// resolveInventory resolves a git, URL or dynamic inventory and locates
// its hosts. A git or URL inventory's file is read again by the play (it
// cannot change in between: it is in the job's directory); a dynamic one
// is not asked again: the play gets the hosts, groups and host variables
// it listed, so it can never reach a host that was not authorized.
func (aj *ansibleJob) resolveInventory(ctx context.Context) error {
	inv := aj.m.Inventory
	if aj.cfg.Inventories == nil {
		return &messages.ValidationError{Fields: []messages.FieldError{{Field: "inventory.type",
			Message: string(inv.Type) + " inventories are not enabled on this infra service"}}}
	}
	field := inventoryField(inv.Type)
	ri := aj.prep.inv
	if ri == nil {
		var err error
		if ri, err = aj.fetchInventory(ctx, field); err != nil {
			return err
		}
		aj.prep.inv = ri
	}
	file, hosts, commit := ri.file, ri.hosts, ri.commit
	aj.result.InventoryCommit = commit // a git inventory's; "" for the others
	if len(hosts) > aj.cfg.MaxHosts {
		return &messages.ValidationError{Fields: []messages.FieldError{{Field: field,
			Message: fmt.Sprintf("has %d hosts; this infra allows at most %d (INVENTORY_MAX_HOSTS)", len(hosts), aj.cfg.MaxHosts)}}}
	}
	if len(hosts) == 0 {
		return &messages.ValidationError{Fields: []messages.FieldError{{Field: field, Message: "has no hosts"}}}
	}
	var fields []messages.FieldError
	aj.groups = map[string]ansible.JobGroup{}
	for _, ih := range hosts {
		// A dynamic inventory is not read again by the play: its hosts'
		// variables reach it as the job's host variables, each name
		// checked as an inline inventory's (no connection variables).
		var vars map[string]any
		if inv.Type == messages.InventoryDynamic {
			vars = ih.Vars
			if bad := refusedInventoryVars(vars); len(bad) > 0 {
				for _, k := range bad {
					fields = append(fields, messages.FieldError{Field: "inventory.hosts[" + ih.Name + "].vars[" + k + "]", Message: "is a connection variable an inventory may not set"})
				}
				continue
			}
		}
		h, problem, err := aj.locate(ctx, ih.Name, ih.Address, ih.Port, ih.User, vars)
		if err != nil {
			return err
		}
		if problem != "" {
			fields = append(fields, messages.FieldError{Field: "inventory.hosts[" + ih.Name + "]", Message: problem})
			continue
		}
		aj.hosts = append(aj.hosts, h)
		if inv.Type == messages.InventoryDynamic {
			for _, g := range ih.Groups {
				jg := aj.groups[g]
				jg.Hosts = append(jg.Hosts, ih.Name)
				aj.groups[g] = jg
			}
		}
	}
	if len(fields) > 0 {
		return &messages.ValidationError{Fields: fields}
	}
	if inv.Type != messages.InventoryDynamic {
		aj.invFile, aj.invEnabled = file, ri.enabled
	}
	return nil
}

// inventoryField is the request key a problem of an inventory of type t is
// reported on.
func inventoryField(t messages.InventoryType) string {
	switch t {
	case messages.InventoryGit:
		return "inventory.repository"
	case messages.InventoryURL:
		return "inventory.url"
	case messages.InventoryDynamic:
		return "inventory.plugin"
	}
	return "inventory"
}

// fetchInventory resolves a git, URL or dynamic inventory
// (JobInventories.Resolve), once per request (prepared.go); field is where
// its problems are reported.
func (aj *ansibleJob) fetchInventory(ctx context.Context, field string) (*resolvedInventory, error) {
	inv := aj.m.Inventory
	token, err := aj.secret(ctx, "inventory.credential", inv.Credential)
	if err != nil {
		return nil, err
	}
	spec := inventory.Spec{Kind: string(inv.Type)}
	switch inv.Type {
	case messages.InventoryGit:
		spec.Repo, spec.Path = sources.Repo{URL: inv.Repository, Ref: inv.Ref, Token: token}, inv.Path
	case messages.InventoryURL:
		spec.URL, spec.Format = inv.URL, urlFormat(inv.URL)
		if token != "" {
			spec.Header, spec.HeaderValue = "Authorization", "Bearer "+token
		}
	case messages.InventoryDynamic:
		spec.Plugin, spec.PluginConfig = inv.Plugin, inv.Config
		cloud, err := aj.secret(ctx, "credentials.cloud", aj.m.Credentials.Cloud)
		if err != nil {
			return nil, err
		}
		spec.Env = cloudEnv(cloud)
	}
	file, hosts, commit, err := aj.cfg.Inventories.Resolve(ctx, spec, aj.inventoryRun())
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return nil, context.Cause(ctx)
	case errors.Is(err, authz.ErrDenied):
		aj.log.Warn().Str("reason", err.Error()).Msg("inventory URL refused: nothing fetched")
		return nil, &messages.ValidationError{Fields: []messages.FieldError{{Field: field, Message: "is at an address infra may not reach"}}}
	case errors.Is(err, inventory.ErrFetch), errors.Is(err, sources.ErrFetch), errors.Is(err, sources.ErrTooLarge) && inv.Type == messages.InventoryGit:
		return nil, fail(messages.StatusFailed, messages.KindInternal, "inventory: %s", aj.red.RedactString(err.Error()))
	default:
		// The inventory itself is wrong: malformed, too many hosts, too
		// large, connection variables of its own, a path out of its
		// repository.
		return nil, &messages.ValidationError{Fields: []messages.FieldError{{Field: field, Message: aj.red.RedactString(err.Error())}}}
	}
	return &resolvedInventory{file: file, hosts: hosts, commit: commit, enabled: inventory.Enabled(spec, file)}, nil
}

// refusedInventoryVars are the names among vars an inventory may not set
// (messages.AllowedInventoryVar), sorted.
func refusedInventoryVars(vars map[string]any) []string {
	var bad []string
	for k := range vars {
		if !messages.AllowedInventoryVar(k) {
			bad = append(bad, k)
		}
	}
	slices.Sort(bad)
	return bad
}

// urlFormat is the format a URL inventory's name says (its extension):
// yaml, ini or json; "" lets the response's Content-Type say.
func urlFormat(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return ""
	}
	switch strings.ToLower(path.Ext(u.Path)) {
	case ".yml", ".yaml":
		return "yaml"
	case ".ini", ".cfg":
		return "ini"
	case ".json":
		return "json"
	}
	return ""
}

// envNameRE is an environment variable name a cloud credential may set.
var envNameRE = pattern.MustCompile(`^[A-Z_][A-Z0-9_]*$`, 128)

// cloudEnv is the environment a cloud credential gives a dynamic
// inventory's plugin: NAME=value lines as they are, any other value as
// AUTOPROV_CLOUD_CREDENTIAL.
func cloudEnv(cred string) map[string]string {
	if cred == "" {
		return nil
	}
	env := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(cred), "\n") {
		name, value, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok || !envNameRE.MatchString(name) {
			return map[string]string{envCloudCredential: cred}
		}
		env[name] = value
	}
	return env
}

// inventoryRun is where and how the job's inventory is resolved: in the
// job's directory, sandboxed like its play when the runner can.
func (aj *ansibleJob) inventoryRun() inventory.Run {
	run := inventory.Run{Dir: aj.dir, CollectionsPath: aj.env["ANSIBLE_COLLECTIONS_PATH"]}
	if sb, ok := aj.runner.(inventory.Sandbox); ok {
		run.Sandbox = sb
	}
	return run
}
