package fleet

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"hash/maphash"
	"time"

	"github.com/jackc/pgx/v5"
)

// A Snapshot is what the fleet knew of its servers' sources when a tick
// began: per server its source, the fingerprint of what that source last
// said (servers.source_hash) and whether it is ORPHANED. A source's sync
// compares its listing with it server by server as the listing streams in, so a
// server that did not change costs a map lookup and no write, and memory
// grows with the fleet by about 60 bytes a server, in a few pointer-free
// arrays the garbage collector does not walk. A Snapshot is reused from tick
// to tick (Load keeps its arrays); it is not safe for concurrent use.
type Snapshot struct {
	seeds   [2]maphash.Seed
	index   map[snapKey]int32
	rows    []snapRow
	text    []byte   // the handles, one after another
	ends    []uint32 // handle i is text[ends[i-1]:ends[i]]
	sources []string
	srcIdx  map[string]uint16
	// claims of handles the snapshot does not hold (new servers).
	claims map[snapKey]int16
}

// snapKey identifies a handle by two independent 64-bit hashes: two
// handles share a key with a probability of about 2^-128 a pair.
type snapKey [2]uint64

type snapRow struct {
	fp       [16]byte
	src      uint16
	hasFP    bool
	orphaned bool
	// seen: listed by some source this tick (so not vanished).
	seen bool
	// claim is 1 + the owner that claimed the handle this tick, 0 for none.
	claim int16
}

// NewSnapshot returns an empty Snapshot; Store.LoadSnapshot fills it.
func NewSnapshot() *Snapshot {
	return &Snapshot{seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		index: map[snapKey]int32{}, srcIdx: map[string]uint16{}, claims: map[snapKey]int16{}}
}

func (s *Snapshot) key(handle string) snapKey {
	return snapKey{maphash.String(s.seeds[0], handle), maphash.String(s.seeds[1], handle)}
}

func (s *Snapshot) handle(i int32) string {
	start := uint32(0)
	if i > 0 {
		start = s.ends[i-1]
	}
	return string(s.text[start:s.ends[i]])
}

// source returns the index of the source name, adding it.
func (s *Snapshot) source(name []byte) uint16 {
	if i, ok := s.srcIdx[string(name)]; ok {
		return i
	}
	i := uint16(len(s.sources))
	s.sources = append(s.sources, string(name))
	s.srcIdx[string(name)] = i
	return i
}

// Sources returns the sources that have servers, in no particular order.
func (s *Snapshot) Sources() []string { return append([]string(nil), s.sources...) }

// Keep marks the server handle as listed this tick by a source other than
// its own: its source's sync will not orphan it (the other source takes it
// over, or, if it may not, the server stays as it is).
func (s *Snapshot) Keep(handle string) {
	if i, ok := s.index[s.key(handle)]; ok {
		s.rows[i].seen = true
	}
}

// Prepared is a listed server checked, normalized and fingerprinted, and
// found in the snapshot: what Claim and SourceSync.Add need.
type Prepared struct {
	Server Detected
	fp     [16]byte
	key    snapKey
	row    int32 // -1: not in the snapshot
}

// Prepare checks d (Detected.Validate) and readies it for Claim and Add.
// It only reads the snapshot's index, so it may run in another goroutine
// than the one claiming and adding (a source's reader, say).
func (s *Snapshot) Prepare(d Detected) (Prepared, error) {
	d.normalize()
	if err := d.Validate(); err != nil {
		return Prepared{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	p := Prepared{Server: d, fp: d.fingerprint(), key: s.key(d.Handle), row: -1}
	if i, ok := s.index[p.key]; ok {
		p.row = i
	}
	return p, nil
}

// ClaimedBy returns the owner that claimed p's handle this tick, if one did.
func (s *Snapshot) ClaimedBy(p *Prepared) (owner int, claimed bool) {
	if p.row >= 0 {
		c := s.rows[p.row].claim
		return int(c) - 1, c != 0
	}
	c, ok := s.claims[p.key]
	return int(c) - 1, ok
}

// Claim records that owner (a number of the caller's, 0 to 32766: the
// index of a source in precedence order, say) lists p's handle this tick,
// unless an owner did before: the first claim stands. Claims cost nothing
// for the servers the snapshot holds.
func (s *Snapshot) Claim(p *Prepared, owner int) {
	if p.row >= 0 {
		if r := &s.rows[p.row]; r.claim == 0 {
			r.claim = int16(owner) + 1
		}
		return
	}
	if _, ok := s.claims[p.key]; !ok {
		s.claims[p.key] = int16(owner) + 1
	}
}

// ClaimHandle is Claim by handle (manual servers, which no source lists).
func (s *Snapshot) ClaimHandle(handle string, owner int) {
	p := Prepared{key: s.key(handle), row: -1}
	if i, ok := s.index[p.key]; ok {
		p.row = i
	}
	s.Claim(&p, owner)
}

// LoadSnapshot reads every server's source, fingerprint and orphaned state
// into snap, replacing what it held.
func (s *Store) LoadSnapshot(ctx context.Context, snap *Snapshot) error {
	clear(snap.index)
	// The claims of new servers are few from one tick to the next, except
	// on a first listing: a new map does not keep that one's size.
	snap.claims = map[snapKey]int16{}
	snap.rows, snap.text, snap.ends = snap.rows[:0], snap.text[:0], snap.ends[:0]
	// Every column is text, whose binary and text forms are the same bytes:
	// the raw values are read without an allocation a row.
	rows, err := s.db.Query(ctx, `SELECT handle, source, COALESCE(source_hash, ''), status FROM servers`)
	if err != nil {
		return fmt.Errorf("fleet snapshot: %w", err)
	}
	defer rows.Close()
	orphaned := []byte(StatusOrphaned)
	for rows.Next() {
		v := rows.RawValues()
		if len(v) != 4 {
			return fmt.Errorf("fleet snapshot: %d columns", len(v))
		}
		r := snapRow{src: snap.source(v[1]), orphaned: bytes.Equal(v[3], orphaned)}
		if len(v[2]) == 2*len(r.fp) {
			_, err := hex.Decode(r.fp[:], v[2])
			r.hasFP = err == nil
		}
		snap.text = append(snap.text, v[0]...)
		snap.ends = append(snap.ends, uint32(len(snap.text)))
		snap.index[snapKey{maphash.Bytes(snap.seeds[0], v[0]), maphash.Bytes(snap.seeds[1], v[0])}] = int32(len(snap.rows))
		snap.rows = append(snap.rows, r)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("fleet snapshot: %w", err)
	}
	return nil
}

// syncBatch is how many servers a SourceSync writes in one statement.
const syncBatch = 5000

// A SourceSync applies one source's listing, server by server as the
// listing streams in, inside one transaction: nothing of it is visible
// until Finish commits, and Rollback (a failing listing, a refused one)
// leaves the fleet as it was. New servers are created NEW, changed ones
// updated (address, port, user, labels, provider id, owners), ORPHANED ones
// listed again return to the status they had, and at Finish the servers of
// the source that no source listed become ORPHANED (never deleted), unless
// that would orphan more than the guard allows. Every status change has its
// history row. Syncs of several sources may be open at once over one
// Snapshot, provided no two Add the same handle (the caller merges the
// sources: see the scheduler's detect package).
type SourceSync struct {
	s    *Store
	snap *Snapshot
	req  SyncRequest
	src  int // the source's index in the snapshot, -1 when it has no servers there
	tx   pgx.Tx
	now  time.Time

	fresh, changed []Prepared
	returned       []string
	hist           historyBatch
	st             SyncStats
}

// BeginSync opens the sync of req.Source over snap (loaded this tick).
// req.Servers and req.Keep are not used: the listing comes through Add,
// and servers other sources list through Snapshot.Keep.
func (s *Store) BeginSync(ctx context.Context, snap *Snapshot, req SyncRequest) (*SourceSync, error) {
	if req.Source == "" || req.Source == SourceManual {
		return nil, fmt.Errorf("%w: sync needs a detector source, not %q", ErrInvalid, req.Source)
	}
	if err := checkActor(req.Actor); err != nil {
		return nil, err
	}
	if req.TakeOverFrom == nil {
		req.TakeOverFrom = []string{}
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("sync of %s: %w", req.Source, err)
	}
	src := -1
	if i, ok := snap.srcIdx[req.Source]; ok {
		src = int(i)
	}
	return &SourceSync{s: s, snap: snap, req: req, src: src, tx: tx, now: s.now()}, nil
}

// Add applies one server of the listing (written in batches), prepared
// over the sync's snapshot.
func (ss *SourceSync) Add(ctx context.Context, p *Prepared) error {
	d := &p.Server
	ss.st.Listed++
	switch {
	case p.row < 0:
		ss.fresh = append(ss.fresh, *p)
	case int(ss.snap.rows[p.row].src) != ss.src:
		// Another source's server: taken over if the source may (upsert).
		ss.snap.rows[p.row].seen = true
		ss.fresh = append(ss.fresh, *p)
	default:
		r := &ss.snap.rows[p.row]
		r.seen = true
		if !r.hasFP || r.fp != p.fp {
			ss.changed = append(ss.changed, *p)
		} else {
			ss.st.Unchanged++
		}
		if r.orphaned {
			ss.returned = append(ss.returned, d.Handle)
		}
	}
	if len(ss.fresh)+len(ss.changed)+len(ss.returned) >= syncBatch {
		return ss.flush(ctx)
	}
	return nil
}

// flush writes the batched servers.
func (ss *SourceSync) flush(ctx context.Context) error {
	req, tx := ss.req, ss.tx
	if len(ss.fresh) > 0 {
		n, skipped, orphans, err := ss.s.upsert(ctx, tx, req, ss.fresh, &ss.hist)
		if err != nil {
			return err
		}
		ss.st.Detected += n
		ss.st.Skipped += skipped
		ss.returned = append(ss.returned, orphans...)
	}
	if len(ss.changed) > 0 {
		a := newDetectedArrays(ss.changed)
		tag, err := tx.Exec(ctx, `UPDATE servers s SET address = x.address, ssh_port = x.port, ssh_user = x.usr,
				labels = x.labels::jsonb, provider_id = COALESCE(NULLIF(x.provider, ''), s.provider_id),
				ssh_key_ref = COALESCE(NULLIF(x.keyref, ''), s.ssh_key_ref), source_hash = x.hash, last_seen_at = $9,
				projects = CASE WHEN x.has_projects THEN string_to_array(x.projects, ',')
					WHEN s.projects_from_source THEN '{}' ELSE s.projects END,
				projects_from_source = x.has_projects
			FROM unnest($1::text[], $2::text[], $3::int[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
					$11::text[], $12::boolean[])
				AS x(handle, address, port, usr, labels, provider, keyref, hash, projects, has_projects)
			WHERE s.handle = x.handle AND s.source = $10`,
			a.handles, a.addresses, a.ports, a.users, a.labels, a.providers, a.keyrefs, a.hashes, ss.now, req.Source,
			a.projects, a.hasProjects)
		if err != nil {
			return fmt.Errorf("update servers of %s: %w", req.Source, err)
		}
		ss.st.Updated += int(tag.RowsAffected())
	}
	if len(ss.returned) > 0 {
		rows, err := tx.Query(ctx, `UPDATE servers SET
				status = CASE WHEN orphaned_from IN ('READY', 'FAILED', 'UNREACHABLE') THEN orphaned_from
					WHEN orphaned_from IN ('QUEUED', 'PROVISIONING') AND pending_job_id IS NOT NULL THEN orphaned_from
					ELSE 'NEW' END,
				orphaned_from = NULL, last_seen_at = $2
			WHERE handle = ANY($1) AND status = 'ORPHANED' AND source = $3 RETURNING handle, status`, ss.returned, ss.now, req.Source)
		if err != nil {
			return fmt.Errorf("return servers of %s: %w", req.Source, err)
		}
		var h, to string
		if _, err := pgx.ForEachRow(rows, []any{&h, &to}, func() error {
			ss.st.Returned++
			ss.hist.add(History{Handle: h, Event: EventReturned, From: StatusOrphaned, To: to,
				Reason: "listed by " + req.Source + " again", Actor: req.Actor})
			return nil
		}); err != nil {
			return fmt.Errorf("return servers of %s: %w", req.Source, err)
		}
	}
	if err := ss.hist.write(ctx, tx, ss.now); err != nil {
		return err
	}
	ss.fresh, ss.changed, ss.returned, ss.hist = ss.fresh[:0], ss.changed[:0], ss.returned[:0], historyBatch{}
	return nil
}

// Finish writes what is left, orphans the source's servers no source
// listed this tick and commits. A listing that would orphan more than the
// guard allows is refused (ErrTooManyOrphans) and changes nothing.
func (ss *SourceSync) Finish(ctx context.Context) (SyncStats, error) {
	defer ss.Rollback(ctx)
	fail := func(err error) (SyncStats, error) { return SyncStats{Listed: ss.st.Listed}, err }
	var vanished []string
	live := 0
	if ss.src >= 0 {
		for i := range ss.snap.rows {
			r := &ss.snap.rows[i]
			if int(r.src) != ss.src || r.orphaned {
				continue
			}
			live++
			if !r.seen {
				vanished = append(vanished, ss.snap.handle(int32(i)))
			}
		}
	}
	req := ss.req
	if req.MaxOrphanFraction > 0 {
		if limit := OrphanLimit(live, req.MaxOrphanFraction); len(vanished) > limit {
			return fail(fmt.Errorf("source %s no longer lists %d of its %d servers (limit %d at fraction %g): %w",
				req.Source, len(vanished), live, limit, req.MaxOrphanFraction, ErrTooManyOrphans))
		}
	}
	if err := ss.flush(ctx); err != nil {
		return fail(err)
	}
	if len(vanished) > 0 {
		rows, err := ss.tx.Query(ctx, `UPDATE servers s SET orphaned_from = s.status, status = 'ORPHANED'
			FROM servers old WHERE old.handle = s.handle
			  AND s.handle = ANY($1) AND s.source = $2 AND s.status <> 'ORPHANED'
			RETURNING s.handle, old.status`, vanished, req.Source)
		if err != nil {
			return fail(fmt.Errorf("orphan servers of %s: %w", req.Source, err))
		}
		var h, from string
		if _, err := pgx.ForEachRow(rows, []any{&h, &from}, func() error {
			ss.st.Orphaned++
			ss.hist.add(History{Handle: h, Event: EventOrphaned, From: from, To: StatusOrphaned,
				Reason: req.Source + " no longer lists it", Actor: req.Actor})
			return nil
		}); err != nil {
			return fail(fmt.Errorf("orphan servers of %s: %w", req.Source, err))
		}
		if err := ss.hist.write(ctx, ss.tx, ss.now); err != nil {
			return fail(err)
		}
	}
	if err := ss.tx.Commit(ctx); err != nil {
		return fail(fmt.Errorf("sync of %s: %w", req.Source, err))
	}
	return ss.st, nil
}

// Rollback drops everything the sync wrote (a no-op after Finish).
func (ss *SourceSync) Rollback(ctx context.Context) {
	_ = ss.tx.Rollback(context.WithoutCancel(ctx))
}
