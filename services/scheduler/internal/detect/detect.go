// Package detect finds the fleet's servers in their sources and merges
// them into Postgres every tick (seed 000's detector manager).
//
// Each source is a Detector (inventory, time4vps, ec2 in the packages
// below); servers inserted into the servers table by hand are the source
// "manual" and need none. The Manager lists the sources one after another
// in precedence order, merges each streamed listing into a snapshot of the
// fleet and hands each source's share to its fleet.SourceSync.
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
	// Detect calls yield with every server the source has now, as it reads
	// them (a provider's pages stream through without being held). An
	// error, its own or yield's, means the listing is unknown (never "no
	// servers"): nothing of the source changes.
	Detect(ctx context.Context, yield func(fleet.Detected) error) error
}

// A ChangeDetector is a Detector that can tell what changed: each of its
// servers has a version, a number (never 0) that changes whenever what the
// source says of the server does (a generation, a provider's change
// marker, a hash of the raw record). The Manager asks known(handle,
// version) first: when it answers true, it holds the server as listed at
// that version in an earlier tick, with nothing changed in the fleet
// since, and the detector goes on to the next server without building this
// one; otherwise the detector hands the server over with yield. Such a
// tick costs per unchanged server a handle and a number, not a check,
// a fingerprint and a merge. Servers listed unchanged in this way are not
// checked against the address guard again: every server is, after a
// restart and at each full read of the fleet (fleet.Snapshot, at least
// every 10 minutes), and whenever its version changes.
type ChangeDetector interface {
	Detector
	DetectChanges(ctx context.Context, known func(handle string, version uint64) bool,
		yield func(s fleet.Detected, version uint64) error) error
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

// Manager merges the sources into the fleet. Its Sync is called by one
// goroutine at a time (the reconcile loop's tick): it reuses its snapshot
// and claims from tick to tick.
type Manager struct {
	fleet     *fleet.Store
	detectors []Detector
	opts      Options
	m         *metrics
	// Reused from tick to tick: the fleet as the tick began, and the
	// handles and addresses claimed so far in the tick (precedence).
	snap   *fleet.Snapshot
	claims claims
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
	return &Manager{fleet: f, detectors: detectors, opts: opts, m: newMetrics(opts.Registerer),
		snap: fleet.NewSnapshot(), claims: newClaims()}, nil
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

// Sync lists every source in precedence order and applies each listing as
// it streams in (fleet.SourceSync): a server is compared with the fleet as
// the tick began and written only when it changed, so a tick costs about a
// lookup per unchanged server and memory does not hold any listing.
// Each source's changes commit together at the end of the tick, after every
// source has listed (a server another source lists is not orphaned), or not
// at all: a failing source changes nothing. It returns a report per source;
// the error is for the fleet's own failures (Postgres).
func (m *Manager) Sync(ctx context.Context) (Report, error) {
	var rep Report
	if len(m.detectors) == 0 {
		return rep, nil
	}
	if err := m.fleet.LoadSnapshot(ctx, m.snap); err != nil {
		return rep, err
	}
	manual, err := m.manualServers(ctx)
	if err != nil {
		return rep, err
	}
	m.claims.reset()
	for h, a := range manual {
		m.snap.ClaimHandle(h, ownerManual)
		m.claims.claimAddress(a.address, a.port)
	}
	defer m.snap.EndTick()
	known := m.snap.Sources()
	reports := make([]SourceReport, len(m.detectors))
	syncs := make([]*fleet.SourceSync, len(m.detectors))
	defer func() {
		for _, ss := range syncs {
			if ss != nil {
				ss.Rollback(ctx)
			}
		}
	}()
	for i, d := range m.detectors {
		r := &reports[i]
		r.Source = d.Name()
		ss, err := m.fleet.BeginSync(ctx, m.snap, m.request(i, known))
		if err != nil {
			return rep, err
		}
		start := time.Now()
		err = m.list(ctx, i, r, ss)
		r.Took = time.Since(start)
		if ctx.Err() != nil {
			ss.Rollback(ctx)
			return rep, ctx.Err()
		}
		if err != nil {
			ss.Rollback(ctx)
			r.Err = err
			continue
		}
		syncs[i] = ss
	}
	for i, d := range m.detectors {
		r := &reports[i]
		if ss := syncs[i]; ss != nil {
			syncs[i] = nil
			r.Stats, r.Err = ss.Finish(ctx)
			if errors.Is(r.Err, fleet.ErrTooManyOrphans) {
				r.Err = fmt.Errorf("%w; nothing of it was changed: fix the source, or, if the servers are really gone, "+
					"remove them fewer at a time or set MAX_ORPHAN_FRACTION=1 for one tick", r.Err)
			}
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

// pageSize is how many servers a source hands over at a time.
const pageSize = 512

// progressEvery is how many servers of a long listing go by between two
// progress lines in the log.
const progressEvery = 100_000

// listed is a server as the source's reader hands it over: prepared, or
// invalid, or refused.
type listed struct {
	p       fleet.Prepared
	invalid error
	refusal *Refusal
}

// list runs detector i and admits what it lists. The source lists in its
// own goroutine, which also checks and fingerprints each server
// (fleet.Snapshot.Prepare), and hands the servers over a page at a time to
// this one, which merges them: reading a source and merging use two cores,
// with a few pages in flight at most.
func (m *Manager) list(ctx context.Context, i int, r *SourceReport, ss *fleet.SourceSync) error {
	dctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
	defer cancel()
	pages := make(chan []listed, 2)
	free := make(chan []listed, 3)
	var srcErr error
	go func() {
		defer close(pages)
		page := make([]listed, 0, pageSize)
		send := func() error {
			select {
			case pages <- page:
			case <-dctx.Done():
				return dctx.Err()
			}
			select {
			case page = <-free:
			default:
				page = make([]listed, 0, pageSize)
			}
			return nil
		}
		pr := m.snap.Preparer(m.detectors[i].Name())
		emit := func(l listed) error {
			page = append(page, l)
			if len(page) < pageSize {
				return nil
			}
			return send()
		}
		if cd, ok := m.detectors[i].(ChangeDetector); ok {
			srcErr = cd.DetectChanges(dctx, func(handle string, version uint64) bool {
				p, known := pr.Known(handle, version)
				// A page that cannot be sent (the listing ends) is
				// left to the next yield to report.
				return known && emit(listed{p: p}) == nil
			}, func(s fleet.Detected, version uint64) error {
				l := m.prepare(pr, s)
				l.p.Version = version
				return emit(l)
			})
		} else {
			srcErr = m.detectors[i].Detect(dctx, func(s fleet.Detected) error { return emit(m.prepare(pr, s)) })
		}
		if srcErr == nil && len(page) > 0 {
			srcErr = send()
		}
	}()
	var err error
	seen, start := 0, time.Now()
	for page := range pages {
		for j := 0; j < len(page) && err == nil; j++ {
			err = m.admit(dctx, i, r, ss, &page[j])
		}
		if seen/progressEvery != (seen+len(page))/progressEvery {
			m.opts.Logger.Info().Str("source", m.detectors[i].Name()).Int("listed", seen+len(page)).
				Dur("took", time.Since(start)).Msg("source listing in progress")
		}
		seen += len(page)
		if err != nil {
			cancel() // the source stops at its next server
			continue
		}
		clear(page) // no strings or maps kept alive by a reused page
		select {
		case free <- page[:0]:
		default:
		}
	}
	if err == nil {
		err = srcErr
	}
	if err == nil && dctx.Err() != nil {
		err = dctx.Err()
	}
	return err
}

// prepare checks one listed server: its fields, its address.
func (m *Manager) prepare(pr *fleet.Preparer, s fleet.Detected) listed {
	p, err := pr.Prepare(s)
	if err != nil {
		return listed{invalid: err}
	}
	return listed{p: p, refusal: m.refusal(p.Server)}
}

// admit merges one server of detector i into the tick: an invalid or
// refused one, or one a source of higher precedence (or manual) has by
// handle or by address, is skipped and counted; the rest go to the
// source's sync.
func (m *Manager) admit(ctx context.Context, i int, r *SourceReport, ss *fleet.SourceSync, l *listed) error {
	name := m.detectors[i].Name()
	if l.invalid != nil {
		r.Invalid++
		m.opts.Logger.Warn().Str("source", name).Err(l.invalid).Msg("server skipped: invalid")
		return nil
	}
	if rf := l.refusal; rf != nil {
		r.Refused = append(r.Refused, *rf)
		m.m.refused.WithLabelValues(name, rf.Class).Inc()
		m.opts.Logger.Warn().Str("source", name).Str("server", rf.Handle).Str("address", rf.Address).
			Str("class", rf.Class).Str("reason", rf.Reason).Msg("server refused: its address may not be a target; the rest of the source goes on")
		return nil
	}
	s := &l.p.Server // normalized: the port is set (only the handle, when known)
	if !l.p.Known() {
		l.p.Endpoint = m.claims.addressKey(s.Address, s.SSHPort)
	}
	if owner, claimed := m.snap.ClaimedBy(&l.p); claimed {
		if owner != i {
			r.Duplicates++
			m.opts.Logger.Debug().Str("source", name).Str("server", s.Handle).Str("owner", m.ownerName(owner)).
				Msg("duplicate: the server belongs to a source of higher precedence")
		} else {
			r.Invalid++
			m.opts.Logger.Warn().Str("source", name).Str("server", s.Handle).Msg("server listed twice by its source: skipped")
		}
		return nil
	}
	if m.claims.claim(l.p.Endpoint) {
		r.Duplicates++
		m.opts.Logger.Debug().Str("source", name).Str("server", s.Handle).Str("address", s.Address).Int("port", s.SSHPort).
			Msg("duplicate: another server has this address and port")
		return nil
	}
	m.snap.Claim(&l.p, i)
	return ss.Add(ctx, &l.p)
}

func (m *Manager) ownerName(owner int) string {
	if owner == ownerManual {
		return fleet.SourceManual
	}
	return m.detectors[owner].Name()
}

// request is detector i's sync request: a source may take servers over
// from sources of lower precedence and from sources no longer configured,
// never from manual.
func (m *Manager) request(i int, known []string) fleet.SyncRequest {
	name := m.detectors[i].Name()
	takeOver := []string{}
	configured := m.Sources()
	for _, s := range known {
		idx := slices.Index(configured, s)
		if s != fleet.SourceManual && s != name && (idx < 0 || idx > i) {
			takeOver = append(takeOver, s)
		}
	}
	slices.Sort(takeOver)
	return fleet.SyncRequest{Source: name, TakeOverFrom: takeOver,
		MaxOrphanFraction: m.opts.MaxOrphanFraction, Actor: "detector:" + name}
}

type endpoint struct {
	address string
	port    int
}

// manualServers returns the manual servers' handles with address and port.
func (m *Manager) manualServers(ctx context.Context) (map[string]endpoint, error) {
	rows, err := m.fleet.DB().Query(ctx, `SELECT handle, address, ssh_port FROM servers WHERE source = 'manual'`)
	if err != nil {
		return nil, fmt.Errorf("manual servers: %w", err)
	}
	defer rows.Close()
	out := map[string]endpoint{}
	for rows.Next() {
		var h, a string
		var p int
		if err := rows.Scan(&h, &a, &p); err != nil {
			return nil, fmt.Errorf("manual servers: %w", err)
		}
		out[h] = endpoint{a, p}
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
