package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// defaultLease is the lease of the services' consumers (stream.Config's
// default; infra's is STREAM_LEASE).
const defaultLease = 30 * time.Second

// staleRule explains in the help which consumers are stale.
const staleRule = `A consumer is stale when it has been idle longer than the lease (STREAM_LEASE,
infra's setting, or 30s, the other services' lease, whichever is longer;
--stale-after overrides): a running replica reads every second and renews
its entries every quarter lease, so its idle time stays within seconds. A
stale consumer is a replica that is gone (or hung): it is no live replica,
and its pending entries are claimed by live replicas once idle beyond the
lease. "autoprov consumers prune" deletes stale consumers that hold no
pending entries (the services also delete them after a day).

Redis before 7.2 resets a consumer's idle time only when a read gets
entries, not at every read: there a live replica on a quiet stream shows as
stale too (status says so). Deleting it is harmless all the same: it holds
no pending entries, and it reappears at its next read.`

// staleAfter returns the stale threshold: flag when set, else the longest
// lease of the services.
func (g *globals) staleAfter(flag time.Duration) (time.Duration, error) {
	if flag < 0 {
		return 0, usageError{fmt.Errorf("--stale-after %s: must not be negative", flag)}
	}
	if flag > 0 {
		return flag, nil
	}
	var s struct {
		Lease time.Duration `env:"STREAM_LEASE" envDefault:"30s"`
	}
	if err := service.Load(g.getenv, &s); err != nil {
		return 0, err
	}
	return max(s.Lease, defaultLease), nil
}

// staleNote is printed by status on a Redis whose idle times count only
// reads that got entries ("" on Redis 7.2 and later, or when the version
// cannot be read).
func staleNote(ctx context.Context, rdb redis.UniversalClient) string {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(info, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:")
		if !ok {
			continue
		}
		var major, minor int
		if _, err := fmt.Sscanf(v, "%d.%d", &major, &minor); err == nil && (major < 7 || major == 7 && minor < 2) {
			return "Redis " + v + " resets a consumer's idle time only when a read gets entries: a live replica on a quiet stream shows as stale too (Redis 7.2 tells them apart)"
		}
		return ""
	}
	return ""
}

// consumersCmd groups the commands on the consumers of the groups.
type consumersCmd struct {
	Prune consumersPruneCmd `cmd:"" help:"delete stale consumers (replicas that are gone) that hold no pending entries; those that hold some are kept and named, with their count"`
}

type consumersPruneCmd struct {
	Streams []string      `name:"stream" short:"s" help:"stream whose groups to prune (repeatable; default: the request and result streams)"`
	Group   string        `name:"group" short:"g" help:"prune this group only (default: every group)"`
	Idle    time.Duration `name:"idle" help:"delete consumers idle longer than this (default: the stale threshold of status: the lease, STREAM_LEASE or 30s, whichever is longer)"`
	DryRun  bool          `name:"dry-run" help:"only print what would be deleted"`
}

// Help is the long help of autoprov consumers prune.
func (c *consumersPruneCmd) Help() string {
	return staleRule + `

A consumer is deleted only when it holds no pending entries, checked and
deleted in one step: deleting one that holds some would lose them from the
group. One that holds some is kept and named with their count; the live
replicas claim them once idle beyond the lease, after which prune deletes
it. The exit status is 1 when some stale consumer was kept.`
}

// pruned is a consumer prune deleted or kept (--json: durations in
// seconds).
type pruned struct {
	Stream   string  `json:"stream"`
	Group    string  `json:"group"`
	Consumer string  `json:"consumer"`
	IdleSec  float64 `json:"idle_seconds"`
	Pending  int64   `json:"pending,omitempty"`
}

func (c *consumersPruneCmd) Run(g *globals) error {
	idle, err := g.staleAfter(c.Idle)
	if err != nil {
		return err
	}
	rdb, err := g.redis()
	if err != nil {
		return err
	}
	defer rdb.Close()
	names := c.Streams
	if len(names) == 0 {
		names = defaultStreams
	}
	ins := stream.NewInspector(rdb)
	deleted, kept := []pruned{}, []pruned{}
	for _, name := range names {
		info, err := ins.Stream(g.ctx, name)
		if errors.Is(err, stream.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		for _, gi := range info.Groups {
			if c.Group != "" && gi.Group != c.Group {
				continue
			}
			for _, ci := range gi.Consumers {
				if ci.Idle <= idle {
					continue
				}
				p := pruned{Stream: name, Group: gi.Group, Consumer: ci.Name, IdleSec: ci.Idle.Seconds(), Pending: ci.Pending}
				ok := ci.Pending == 0
				if ok && !c.DryRun {
					if ok, err = ins.DeleteConsumer(g.ctx, name, gi.Group, ci.Name); err != nil {
						return err
					}
					if !ok && p.Pending == 0 {
						p.Pending = -1 // took entries since it was read
					}
				}
				if ok {
					deleted = append(deleted, p)
				} else {
					kept = append(kept, p)
				}
			}
		}
	}
	if g.json {
		if err := writeJSON(g.env.Stdout, struct {
			IdleSec float64  `json:"idle_seconds"`
			DryRun  bool     `json:"dry_run"`
			Deleted []pruned `json:"deleted"`
			Kept    []pruned `json:"kept"`
		}{idle.Seconds(), c.DryRun, deleted, kept}); err != nil {
			return err
		}
	} else {
		verb := "deleted"
		if c.DryRun {
			verb = "would delete"
		}
		for _, p := range deleted {
			fmt.Fprintf(g.env.Stdout, "%s consumer %s of %s/%s (idle %s, no pending entries)\n", verb, p.Consumer, p.Stream, p.Group, seconds(p.IdleSec))
		}
		for _, p := range kept {
			n := fmt.Sprintf("%d pending entries", p.Pending)
			if p.Pending < 0 {
				n = "pending entries taken while pruning"
			}
			fmt.Fprintf(g.env.Stdout, "kept consumer %s of %s/%s (idle %s): %s; live replicas claim them once idle beyond the lease, then prune again\n",
				p.Consumer, p.Stream, p.Group, seconds(p.IdleSec), n)
		}
		if len(deleted)+len(kept) == 0 {
			fmt.Fprintf(g.env.Stdout, "no consumer idle longer than %s\n", idle)
		}
	}
	if len(kept) > 0 {
		return &problemsFound{len(kept)}
	}
	return nil
}
