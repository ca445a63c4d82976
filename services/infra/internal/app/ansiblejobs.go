package app

import (
	"cmp"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/inventory"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/jobs"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sources"
)

// serveAnsibleJobs sets the handler up for the Ansible job pools of
// JOB_POOLS and returns their streams ("none": no pool, no streams).
func serveAnsibleJobs(cfg *Config, handler *jobs.Handler, guard *authz.Guard, runner *ansible.Runner, log zerolog.Logger) ([]string, error) {
	pools := slices.DeleteFunc(slices.Clone(cfg.Jobs.Pools), func(p string) bool { return p == "" || p == "none" })
	if len(pools) == 0 {
		return nil, nil
	}
	if sb, err := cfg.Playbook.SandboxConfig(); err == nil {
		if err := cfg.Playbook.checkJobUsersRead(sb); err != nil {
			log.Error().Err(err).Msg("Ansible jobs will fail: the sandbox's job users cannot reach PLAYBOOK_DIR")
		}
		if err := checkJobUsersReach(sb, "PLAYBOOK_RUN_ROOT", cfg.Playbook.RunRoot); err != nil {
			log.Error().Err(err).Msg("Ansible jobs will fail: the sandbox's job users cannot reach their run directories")
		}
	}
	if !runner.Sandboxed() {
		log.Warn().Str("setting", "PLAYBOOK_SANDBOX=off").
			Msg("SERVING ANSIBLE JOBS WITHOUT A SANDBOX: every job runs as one user (PLAYBOOK_USER or infra's own) and can read " +
				"the other jobs running at the same time (their environment, agent, control sockets and checkouts); " +
				"use PLAYBOOK_SANDBOX=bwrap unless every project is trusted (docs/security.md)")
	}
	base := filepath.Dir(cfg.Playbook.RunRoot)
	sourceGuard := guard
	srcCfg := cfg.Sources
	if srcCfg.CacheDir == "" {
		srcCfg.CacheDir = filepath.Join(base, "autoprov-sources")
	}
	if len(srcCfg.AllowNetworks) > 0 {
		// Repositories and URL inventories get their own, wider guard;
		// the hosts a job runs on keep infra's.
		special := authz.SpecialConfig{AllowNetworks: append(slices.Clone(cfg.Authz.Special.AllowNetworks), srcCfg.AllowNetworks...)}
		g, err := authz.NewGuard(special, authz.Options{})
		if err != nil {
			return nil, fmt.Errorf("SOURCES_ALLOW_NETWORKS: %w", err)
		}
		sourceGuard = g
	}
	cache, err := sources.NewCache(srcCfg, log, sources.WithGuard(sourceGuard))
	if err != nil {
		return nil, err
	}
	inventories, err := inventory.NewResolver(cfg.Inventory, cache, sourceGuard, log)
	if err != nil {
		return nil, err
	}
	galaxyCfg := cfg.Galaxy
	if galaxyCfg.CacheDir == "" {
		galaxyCfg.CacheDir = filepath.Join(base, "autoprov-galaxy")
	}
	galaxy, err := sources.NewGalaxy(galaxyCfg, log)
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
	access, err := cfg.Authz.Pools.Pools()
	if err != nil {
		return nil, err
	}
	for _, p := range pools {
		if p != jobs.DefaultPool && !access.Granted(p) {
			log.Warn().Str("pool", p).Str("setting", authz.PoolsSetting).
				Msg("no project may use this pool: its jobs are rejected until the operator grants it")
		}
	}
	if sb, err := cfg.Playbook.SandboxConfig(); err == nil {
		if err := checkJobUsersReach(sb, "JOB_WORK_DIR", workDir); err != nil {
			log.Error().Err(err).Msg("Ansible jobs will fail: the sandbox's job users cannot reach their directories")
		}
	}
	streams, err := handler.ServeAnsibleJobs(jobs.AnsibleJobsConfig{
		Pools:         pools,
		PoolAccess:    access,
		WorkDir:       workDir,
		Prepared:      cfg.Jobs.Prepared,
		PreparedTTL:   cfg.Jobs.PreparedTTL,
		MaxHosts:      cmp.Or(cfg.Inventory.MaxHosts, 500),
		Sources:       jobs.CacheSources{Cache: cache},
		Inventories:   inventories,
		Galaxy:        galaxy,
		OtherUsers:    runner.RunsAsOthers(),
		GalaxyServers: servers,
	})
	if err != nil {
		return nil, err
	}
	log.Info().Strs("job_streams", streams).Str("job_work_dir", workDir).Str("sources_cache", srcCfg.CacheDir).
		Msg("serving Ansible jobs")
	return streams, nil
}
