package jobs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sources"
)

// JobGalaxy installs collections and roles from the operator's Galaxy
// servers into a job's own directories (package sources).
type JobGalaxy interface {
	Install(ctx context.Context, runDir, scope, reqFile string, tokens map[string]string) (sources.Installed, error)
	InstallCollection(ctx context.Context, runDir, scope, collection, version, server string, tokens map[string]string) (sources.Installed, error)
}

// requirementFiles are where a repository lists what its plays need, as
// AWX reads them.
var requirementFiles = []string{"requirements.yml", "collections/requirements.yml", "roles/requirements.yml"}

// galaxyTokens hands the job's Galaxy credential to one server: server (a
// name or URL of an allowed server; "" the default, the first of
// AnsibleJobsConfig.GalaxyServers). No other server sees it.
func (aj *ansibleJob) galaxyTokens(ctx context.Context, server string) (map[string]string, error) {
	token, err := aj.secret(ctx, "credentials.galaxy", aj.m.Credentials.Galaxy)
	if err != nil || token == "" {
		return nil, err
	}
	for i, s := range aj.cfg.GalaxyServers {
		if (server == "" && i == 0) || server == s.Name || strings.TrimSuffix(server, "/") == strings.TrimSuffix(s.URL, "/") {
			return map[string]string{s.Name: token}, nil
		}
	}
	return nil, nil
}

// installRequirements installs the checkout's requirements files, and the
// collection of a collection_role job, into the job's own paths (from the
// project's cache of installs when the same set was installed lately); it returns
// the environment that points Ansible at them (never at the service's own
// roles).
func (aj *ansibleJob) installRequirements(ctx context.Context, src string) (map[string]string, error) {
	env := map[string]string{
		"ANSIBLE_ROLES_PATH":       filepath.Join(aj.dir, "roles"),
		"ANSIBLE_COLLECTIONS_PATH": filepath.Join(aj.dir, "collections"),
	}
	for _, d := range env {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("job dir: %w", err)
		}
	}
	s := aj.m.Source
	var reqs []string
	if src != "" {
		for _, f := range requirementFiles {
			p, err := aj.cfg.Sources.SafePath(src, f)
			if err != nil {
				return nil, &messages.ValidationError{Fields: []messages.FieldError{{Field: "source.repository", Message: err.Error()}}}
			}
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
				reqs = append(reqs, p)
			}
		}
	}
	if (len(reqs) > 0 || s.Type == messages.SourceCollectionRole) && aj.cfg.Galaxy == nil {
		return nil, &messages.ValidationError{Fields: []messages.FieldError{{Field: "source",
			Message: "needs a Galaxy server, and none is configured on this infra service (GALAXY_SERVERS)"}}}
	}
	for _, req := range reqs {
		tokens, err := aj.galaxyTokens(ctx, "")
		if err != nil {
			return nil, err
		}
		if _, err := aj.cfg.Galaxy.Install(ctx, aj.dir, aj.m.ProjectID, req, tokens); err != nil {
			return nil, aj.galaxyError(ctx, "source.repository", err)
		}
	}
	if s.Type == messages.SourceCollectionRole {
		tokens, err := aj.galaxyTokens(ctx, s.GalaxyServer)
		if err != nil {
			return nil, err
		}
		if _, err := aj.cfg.Galaxy.InstallCollection(ctx, aj.dir, aj.m.ProjectID, s.Collection, s.Version, s.GalaxyServer, tokens); err != nil {
			return nil, aj.galaxyError(ctx, "source.collection", err)
		}
	}
	return env, nil
}

// galaxyError is the outcome of a failed install: the request's fault
// (a server or source not allowed, a malformed requirements file) rejects
// it; anything else fails the job.
func (aj *ansibleJob) galaxyError(ctx context.Context, field string, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	msg := aj.red.RedactString(err.Error())
	if errors.Is(err, sources.ErrGalaxy) {
		return &messages.ValidationError{Fields: []messages.FieldError{{Field: field, Message: msg}}}
	}
	return fail(messages.StatusFailed, messages.KindInternal, "galaxy install: %s", msg)
}
