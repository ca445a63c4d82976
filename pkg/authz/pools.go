package authz

import (
	"fmt"
	"slices"
	"strings"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// PoolsSetting is the setting of the pools' grants, read by the deployer
// (checked at submit) and by infra (checked again before a job runs).
const PoolsSetting = "JOB_POOL_PROJECTS"

// PoolConfig is the operator's grant of Ansible job pools to projects, as
// both services read it.
type PoolConfig struct {
	Projects string `env:"JOB_POOL_PROJECTS" desc:"which projects may send Ansible jobs to which pool: pool=project|project,... (project ids; * for every project), e.g. gpu=*,tenant-b=8c5e...; a job naming a pool not granted to its project is refused (the default pool, no options.pool, is every project's); give the deployer and infra the same value"`
}

// Pools is the parsed PoolConfig: which projects may use which named pool.
// A pool belongs to the operator: a job of project P may name pool X only
// when X is granted to P or to every project ("*"). The default pool (no
// name) is every project's. The zero value grants no named pool.
type Pools struct {
	grants map[string][]string // pool -> canonical project ids, or "*"
}

// ParsePools reads a PoolConfig's value: entries pool=project|project
// separated by commas (blanks around them ignored). Its errors do not
// name the setting; PoolConfig.Pools's do.
func ParsePools(s string) (Pools, error) {
	p := Pools{grants: map[string][]string{}}
	for _, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		pool, projects, ok := strings.Cut(entry, "=")
		pool = strings.TrimSpace(pool)
		if !ok || strings.TrimSpace(projects) == "" {
			return Pools{}, fmt.Errorf("%q: want pool=project|project (or pool=*)", entry)
		}
		if err := checkPoolName(pool); err != nil {
			return Pools{}, err
		}
		if _, dup := p.grants[pool]; dup {
			return Pools{}, fmt.Errorf("pool %q is granted twice: name its projects in one entry", pool)
		}
		var ids []string
		for _, proj := range strings.Split(projects, "|") {
			proj = strings.TrimSpace(proj)
			if proj == "*" {
				ids = append(ids, proj)
				continue
			}
			id, ok := messages.CanonicalProjectID(proj)
			if !ok {
				return Pools{}, fmt.Errorf("pool %q: %q is not a project id (a UUID) or *", pool, proj)
			}
			ids = append(ids, id)
		}
		p.grants[pool] = ids
	}
	return p, nil
}

// Pools parses the configuration; its errors name the setting.
func (c PoolConfig) Pools() (Pools, error) {
	p, err := ParsePools(c.Projects)
	if err != nil {
		return Pools{}, fmt.Errorf("%s: %w", PoolsSetting, err)
	}
	return p, nil
}

// checkPoolName refuses what is not a pool's name: default and none are
// JOB_POOLS's words for the default pool and for no pool.
func checkPoolName(pool string) error {
	switch {
	case pool == "default" || pool == "none":
		return fmt.Errorf("%q is not a pool's name (leave the pool out for the default pool)", pool)
	case !messages.ValidPool(pool):
		return fmt.Errorf("%q is not a pool's name: it must match %s", pool, messages.PoolPattern)
	}
	return nil
}

// Check tells whether a job of project may name pool: nil for the default
// pool ("") and for a pool granted to the project, else an error for the
// requester (of options.pool) that names the setting, never other
// projects.
func (p Pools) Check(pool, project string) error {
	if pool == "" {
		return nil
	}
	if err := checkPoolName(pool); err != nil {
		return err
	}
	id, _ := messages.CanonicalProjectID(project)
	if grants := p.grants[pool]; id != "" && (slices.Contains(grants, "*") || slices.Contains(grants, id)) {
		return nil
	}
	return fmt.Errorf("project %s may not use pool %q: the operator grants pools to projects (%s)", project, pool, PoolsSetting)
}

// Names returns the named pools granted to any project, sorted.
func (p Pools) Names() []string {
	out := make([]string, 0, len(p.grants))
	for pool, grants := range p.grants {
		if len(grants) > 0 {
			out = append(out, pool)
		}
	}
	slices.Sort(out)
	return out
}

// Granted reports whether any project may use pool.
func (p Pools) Granted(pool string) bool { return len(p.grants[pool]) > 0 }
