package app

import (
	"cmp"
	"path/filepath"
	"slices"
	"strings"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/inventory"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/jobs"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sources"
)

// serveAnsibleJobs sets the handler up for the Ansible job pools of
// JOB_POOLS and returns their streams ("none": no pool, no streams).
func serveAnsibleJobs(cfg *Config, handler *jobs.Handler, guard *authz.Guard, log zerolog.Logger) ([]string, error) {
	pools := slices.DeleteFunc(slices.Clone(cfg.Jobs.Pools), func(p string) bool { return p == "" || p == "none" })
	if len(pools) == 0 {
		return nil, nil
	}
	base := filepath.Dir(cfg.Playbook.RunRoot)
	srcCfg := cfg.Sources
	if srcCfg.CacheDir == "" {
		srcCfg.CacheDir = filepath.Join(base, "autoprov-sources")
	}
	cache, err := sources.NewCache(srcCfg, log)
	if err != nil {
		return nil, err
	}
	inventories, err := inventory.NewResolver(cfg.Inventory, cache, guard, log)
	if err != nil {
		return nil, err
	}
	galaxy, err := sources.NewGalaxy(cfg.Galaxy, log)
	if err != nil {
		return nil, err
	}
	var servers []jobs.GalaxyServer
	for _, s := range cfg.Galaxy.Servers {
		if name, url, ok := strings.Cut(strings.TrimSpace(s), "="); ok {
			servers = append(servers, jobs.GalaxyServer{Name: name, URL: url})
		}
	}
	workDir := cfg.Jobs.WorkDir
	if workDir == "" {
		workDir = filepath.Join(base, "autoprov-jobs")
	}
	streams, err := handler.ServeAnsibleJobs(jobs.AnsibleJobsConfig{
		Pools:         pools,
		WorkDir:       workDir,
		MaxHosts:      cmp.Or(cfg.Inventory.MaxHosts, 500),
		Sources:       jobs.CacheSources{Cache: cache},
		Inventories:   inventories,
		Galaxy:        galaxy,
		GalaxyServers: servers,
	})
	if err != nil {
		return nil, err
	}
	log.Info().Strs("job_streams", streams).Str("job_work_dir", workDir).Str("sources_cache", srcCfg.CacheDir).
		Msg("serving Ansible jobs")
	return streams, nil
}
