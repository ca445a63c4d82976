// Package detect finds the fleet's servers in their sources and merges
// them into Postgres every tick (seed 000's detector manager).
//
// Each source is a Detector (inventory, time4vps, ec2 in the packages
// below); servers inserted into the servers table by hand are the source
// "manual" and need none. The Manager runs every detector, merges their
// listings and hands each source's share to fleet.Sync.
//
// Merge rules (documented in docs/scheduler.md):
//
//   - A server is identified by its handle. When several sources list the
//     same handle, or the same address and SSH port under different handles,
//     the source configured first wins (precedence is the order of the
//     sources); the others' entries are skipped and counted as duplicates.
//     Manual servers always win: a detector never takes over or changes a
//     manual server, nor lists another server at a manual server's address.
//   - A server that vanishes from its source becomes ORPHANED (never
//     deleted) unless another source lists it in the same tick, which then
//     takes it over. An ORPHANED server listed again returns to the status
//     it had.
//   - A source that fails (API down, unreadable file, timeout) changes
//     nothing: its servers are neither updated nor orphaned nor taken over.
//   - Provider data is input: a server whose address is malformed or
//     special (loopback, link-local, cloud metadata, multicast,
//     unspecified, broadcast, reserved, this host's own; authz.Guard) is
//     refused: skipped, counted (autoprov_scheduler_source_refused_total)
//     and logged, while the rest of its source registers. The operator's
//     SPECIAL_ALLOW_NETWORKS lets test targets through.
//   - A source that answers but would orphan more than MaxOrphanFraction of
//     its servers at once, or all of them, is treated as failing (a wrong
//     filter or an empty file must not orphan a fleet, small ones included;
//     see fleet.OrphanLimit); fix the source, or raise the limit.
package detect

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
)

// Detector lists the servers of one source.
type Detector interface {
	// Name is the source's name, stored in servers.source: "static:<path>",
	// "time4vps", "ec2".
	Name() string
	// Detect returns every server the source has now. An error means the
	// listing is unknown (never "no servers").
	Detect(ctx context.Context) ([]fleet.Detected, error)
}

// Options configure a Manager.
type Options struct {
	// Timeout bounds one detector's Detect (default 2m).
	Timeout time.Duration
	// MaxOrphanFraction is the share of a source's servers one tick may
	// orphan (default 0.5), applied at every size by fleet.OrphanLimit: a
	// source never orphans all of its servers at once unless it is 1.
	MaxOrphanFraction float64
	Logger            zerolog.Logger
	// Guard refuses servers at special addresses (default: one without
	// allow-list, over this host's addresses).
	Guard *authz.Guard
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Manager merges the sources into the fleet.
type Manager struct {
	fleet     *fleet.Store
	detectors []Detector
	opts      Options
	m         *metrics
}

// NewManager returns a Manager over detectors, in precedence order (first
// wins). Two detectors may not share a name.
func NewManager(f *fleet.Store, detectors []Detector, opts Options) (*Manager, error) {
	seen := map[string]bool{}
	for _, d := range detectors {
		if d.Name() == "" || d.Name() == fleet.SourceManual || seen[d.Name()] {
			return nil, fmt.Errorf("detector name %q is empty, reserved or used twice", d.Name())
		}
		seen[d.Name()] = true
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 2 * time.Minute
	}
	if opts.MaxOrphanFraction <= 0 {
		opts.MaxOrphanFraction = 0.5
	}
	if opts.Guard == nil {
		g, err := authz.NewGuard(authz.SpecialConfig{}, authz.Options{})
		if err != nil {
			return nil, err
		}
		opts.Guard = g
	}
	return &Manager{fleet: f, detectors: detectors, opts: opts, m: newMetrics(opts.Registerer)}, nil
}

// Sources returns the names of the detectors, in precedence order.
func (m *Manager) Sources() []string {
	out := make([]string, len(m.detectors))
	for i, d := range m.detectors {
		out[i] = d.Name()
	}
	return out
}

// SourceReport is what a tick did with one source.
type SourceReport struct {
	Source     string
	Err        error
	Stats      fleet.SyncStats
	Duplicates int
	Invalid    int
	// Refused are the servers skipped for their address.
	Refused []Refusal
	Took    time.Duration
}

// Refusal is a server a source listed at an address no run may reach.
type Refusal struct {
	Handle, Address string
	// Class is an authz class (loopback, metadata, ...) or
	// "invalid_address" for an address the store does not accept.
	Class  string
	Reason string
}

// ClassInvalidAddress is the class of an address that is neither an IP
// address nor a host name the store accepts.
const ClassInvalidAddress = "invalid_address"

// refusal says why the server s may not be registered, or nil.
func (m *Manager) refusal(s fleet.Detected) *Refusal {
	addr, err := store.CanonicalAddress(s.Address)
	if err != nil {
		return &Refusal{Handle: s.Handle, Address: s.Address, Class: ClassInvalidAddress, Reason: err.Error()}
	}
	var ae *authz.AddressError
	if errors.As(m.opts.Guard.Check(addr), &ae) {
		return &Refusal{Handle: s.Handle, Address: s.Address, Class: ae.Class, Reason: ae.Reason}
	}
	return nil
}

// Report is what Sync did, source by source.
type Report struct {
	Sources []SourceReport
}

// Err joins the sources' errors.
func (r Report) Err() error {
	var errs []error
	for _, s := range r.Sources {
		if s.Err != nil {
			errs = append(errs, fmt.Errorf("source %s: %w", s.Source, s.Err))
		}
	}
	return errors.Join(errs...)
}

type listing struct {
	servers []fleet.Detected
	err     error
	took    time.Duration
}

// Sync runs every detector at once, merges their listings and applies them.
// It returns a report per source; a failing source does not stop the
// others. The error is for the fleet's own failures (Postgres).
func (m *Manager) Sync(ctx context.Context) (Report, error) {
	var rep Report
	if len(m.detectors) == 0 {
		return rep, nil
	}
	lists := make([]listing, len(m.detectors))
	var wg sync.WaitGroup
	for i, d := range m.detectors {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
			defer cancel()
			start := time.Now()
			servers, err := d.Detect(dctx)
			if err == nil && dctx.Err() != nil {
				err = dctx.Err()
			}
			lists[i] = listing{servers: servers, err: err, took: time.Since(start)}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}

	manual, err := m.manualServers(ctx)
	if err != nil {
		return rep, err
	}
	// Merge in precedence order: the first source to claim a handle or an
	// address wins.
	// Sized up front: with a large fleet, growing the maps and the winners'
	// lists step by step was about 40 % of the bytes a tick allocated.
	listed := len(manual)
	for _, l := range lists {
		listed += len(l.servers)
	}
	handleOwner := make(map[string]string, listed)
	addrOwner := make(map[string]string, listed) // address:port -> handle
	for h, a := range manual {
		handleOwner[h] = fleet.SourceManual
		addrOwner[a] = h
	}
	winners := make([][]fleet.Detected, len(m.detectors))
	reports := make([]SourceReport, len(m.detectors))
	for i, d := range m.detectors {
		r := &reports[i]
		r.Source, r.Err, r.Took = d.Name(), lists[i].err, lists[i].took
		if r.Err != nil {
			continue
		}
		winners[i] = make([]fleet.Detected, 0, len(lists[i].servers))
		for _, s := range lists[i].servers {
			if err := s.Validate(); err != nil {
				r.Invalid++
				m.opts.Logger.Warn().Str("source", d.Name()).Err(err).Msg("server skipped: invalid")
				continue
			}
			if rf := m.refusal(s); rf != nil {
				r.Refused = append(r.Refused, *rf)
				m.m.refused.WithLabelValues(d.Name(), rf.Class).Inc()
				m.opts.Logger.Warn().Str("source", d.Name()).Str("server", rf.Handle).Str("address", rf.Address).
					Str("class", rf.Class).Str("reason", rf.Reason).Msg("server refused: its address may not be a target; the rest of the source goes on")
				continue
			}
			port := s.SSHPort
			if port == 0 {
				port = 22
			}
			addr := s.Address + ":" + strconv.Itoa(port)
			if owner, ok := handleOwner[s.Handle]; ok {
				if owner != d.Name() {
					r.Duplicates++
					m.opts.Logger.Debug().Str("source", d.Name()).Str("server", s.Handle).Str("owner", owner).
						Msg("duplicate: the server belongs to a source of higher precedence")
				} else {
					r.Invalid++
					m.opts.Logger.Warn().Str("source", d.Name()).Str("server", s.Handle).Msg("server listed twice by its source: skipped")
				}
				continue
			}
			if h, ok := addrOwner[addr]; ok {
				r.Duplicates++
				m.opts.Logger.Debug().Str("source", d.Name()).Str("server", s.Handle).Str("same_as", h).
					Msg("duplicate: another server has this address and port")
				continue
			}
			handleOwner[s.Handle], addrOwner[addr] = d.Name(), s.Handle
			winners[i] = append(winners[i], s)
		}
	}

	known, err := m.knownSources(ctx)
	if err != nil {
		return rep, err
	}
	for i, d := range m.detectors {
		r := &reports[i]
		if r.Err == nil {
			r.Stats, r.Err = m.apply(ctx, i, winners[i], handleOwner, known)
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
		}
		m.m.observe(r)
		ev := m.opts.Logger.Info()
		if r.Err != nil {
			ev = m.opts.Logger.Error().Err(r.Err)
		}
		if r.Err != nil || r.Stats.Detected+r.Stats.Updated+r.Stats.Orphaned+r.Stats.Returned > 0 {
			ev.Str("source", d.Name()).Int("listed", r.Stats.Listed).Int("new", r.Stats.Detected).
				Int("updated", r.Stats.Updated).Int("orphaned", r.Stats.Orphaned).Int("returned", r.Stats.Returned).
				Int("duplicates", r.Duplicates).Int("refused", len(r.Refused)).Dur("took", r.Took).Msg("source synced")
		}
	}
	rep.Sources = reports
	return rep, nil
}

// apply syncs detector i's winning servers.
func (m *Manager) apply(ctx context.Context, i int, servers []fleet.Detected, owners map[string]string, known []string) (fleet.SyncStats, error) {
	name := m.detectors[i].Name()
	keep := map[string]bool{}
	for h, owner := range owners {
		if owner != name {
			keep[h] = true
		}
	}
	// A source may take servers over from sources of lower precedence and
	// from sources no longer configured, never from manual.
	var takeOver []string
	configured := m.Sources()
	for _, s := range known {
		idx := slices.Index(configured, s)
		if s != fleet.SourceManual && s != name && (idx < 0 || idx > i) {
			takeOver = append(takeOver, s)
		}
	}
	st, err := m.fleet.Sync(ctx, fleet.SyncRequest{
		Source: name, Servers: servers, Keep: keep, TakeOverFrom: takeOver,
		MaxOrphanFraction: m.opts.MaxOrphanFraction, Actor: "detector:" + name,
	})
	if errors.Is(err, fleet.ErrTooManyOrphans) {
		err = fmt.Errorf("%w; nothing of it was changed: fix the source, or, if the servers are really gone, "+
			"remove them fewer at a time or set MAX_ORPHAN_FRACTION=1 for one tick", err)
	}
	return st, err
}

// manualServers returns the manual servers' handles with address:port.
func (m *Manager) manualServers(ctx context.Context) (map[string]string, error) {
	rows, err := m.fleet.DB().Query(ctx, `SELECT handle, address, ssh_port FROM servers WHERE source = 'manual'`)
	if err != nil {
		return nil, fmt.Errorf("manual servers: %w", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var h, a string
		var p int
		if err := rows.Scan(&h, &a, &p); err != nil {
			return nil, fmt.Errorf("manual servers: %w", err)
		}
		out[h] = a + ":" + strconv.Itoa(p)
	}
	return out, rows.Err()
}

// knownSources returns the sources present in the servers table.
func (m *Manager) knownSources(ctx context.Context) ([]string, error) {
	rows, err := m.fleet.DB().Query(ctx, `WITH RECURSIVE s AS (
			(SELECT source FROM servers ORDER BY source LIMIT 1)
			UNION ALL
			SELECT (SELECT source FROM servers WHERE source > s.source ORDER BY source LIMIT 1) FROM s WHERE s.source IS NOT NULL
		) SELECT source FROM s WHERE source IS NOT NULL`)
	if err != nil {
		return nil, fmt.Errorf("known sources: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, fmt.Errorf("known sources: %w", err)
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

type metrics struct {
	servers    *prometheus.GaugeVec
	errors     *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	lastOK     *prometheus.GaugeVec
	duplicates *prometheus.CounterVec
	changes    *prometheus.CounterVec
	refused    *prometheus.CounterVec
	guarded    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		servers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "autoprov_scheduler_source_servers", Help: "Servers listed by a source in its last successful listing.",
		}, []string{"source"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "autoprov_scheduler_source_errors_total", Help: "Failed listings of a source (nothing of it was changed).",
		}, []string{"source"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "autoprov_scheduler_source_duration_seconds", Help: "Time a source took to list its servers.",
			Buckets: prometheus.ExponentialBuckets(0.01, 3, 10),
		}, []string{"source"}),
		lastOK: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "autoprov_scheduler_source_last_success_timestamp_seconds", Help: "When a source last listed its servers successfully.",
		}, []string{"source"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "autoprov_scheduler_source_duplicates_total", Help: "Servers skipped because a source of higher precedence has them.",
		}, []string{"source"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "autoprov_scheduler_source_changes_total", Help: "Servers a source's sync created, updated, orphaned or returned.",
		}, []string{"source", "change"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "autoprov_scheduler_source_refused_total", Help: "Servers a source listed at an address that may not be a target (loopback, metadata, this host...), skipped; reason is the address's class.",
		}, []string{"source", "reason"}),
		guarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "autoprov_scheduler_source_orphan_guard_refusals_total",
			Help: "Listings refused because they would orphan too many of a source's servers (MAX_ORPHAN_FRACTION).",
		}, []string{"source"}),
	}
	if reg != nil {
		reg.MustRegister(m.servers, m.errors, m.duration, m.lastOK, m.duplicates, m.changes, m.refused, m.guarded)
	}
	return m
}

func (m *metrics) observe(r *SourceReport) {
	m.duration.WithLabelValues(r.Source).Observe(r.Took.Seconds())
	if r.Err != nil {
		m.errors.WithLabelValues(r.Source).Inc()
		if errors.Is(r.Err, fleet.ErrTooManyOrphans) {
			m.guarded.WithLabelValues(r.Source).Inc()
		}
		return
	}
	m.servers.WithLabelValues(r.Source).Set(float64(r.Stats.Listed))
	m.lastOK.WithLabelValues(r.Source).SetToCurrentTime()
	m.duplicates.WithLabelValues(r.Source).Add(float64(r.Duplicates))
	for change, n := range map[string]int{"created": r.Stats.Detected, "updated": r.Stats.Updated,
		"orphaned": r.Stats.Orphaned, "returned": r.Stats.Returned} {
		m.changes.WithLabelValues(r.Source, change).Add(float64(n))
	}
}
