package fleet

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// A Snapshot is what the fleet knew of its servers' sources when a tick
// began: per server its source, the fingerprint of what that source last
// said (servers.source_hash) and whether it is ORPHANED. A source's sync
// compares its listing with it server by server as the listing streams in, so a
// server that did not change costs a lookup and no write, and memory
// grows with the fleet by about 60 bytes a server, in a few pointer-free
// arrays the garbage collector does not walk. A Snapshot is kept from tick
// to tick: Store.LoadSnapshot reads only the rows changed since its last
// load (see there). It is not safe for concurrent use.
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
	// xmin is the horizon of the last load: every transaction before it
	// had ended (pg_snapshot_xmin); 0 before the first load.
	xmin uint64
	// fullAt is when every row was last read; dead counts the rows of
	// deleted servers (out of the index) since then.
	fullAt time.Time
	dead   int
	// listed holds the rows the last tick's listings claimed, in the order
	// they came; misses counts those a Preparer did not find at the row
	// after the last one (see Preparer). Many misses reorder the rows.
	listed []int32
	misses int
}

// snapFullEvery is how often a Snapshot reads every row again although
// the changes say nothing else changed: a bound on what a change the
// triggers cannot see (a restore of the table, say) costs.
const snapFullEvery = 10 * time.Minute

// snapManyChanges is the least number of changes since the last load
// that, when they are also over a quarter of the rows, make a load read
// every row instead.
const snapManyChanges = 10_000

// changeKeep is how long the log of changes (server_changes) keeps a
// change: longer than snapFullEvery, so that a snapshot that reads only
// changes since its last load never misses one.
const changeKeep = time.Hour

// snapKey identifies a handle by two independent 64-bit hashes: two
// handles share a key with a probability of about 2^-128 a pair.
type snapKey [2]uint64

type snapRow struct {
	// ver is the source's version of the server (Prepared.Version) when
	// a sync of this process last found it unchanged, 0 for none; read
	// by a Preparer while the sync writes it, so through sync/atomic.
	ver uint64
	// endpoint is the caller's key of the server's endpoint then
	// (Prepared.Endpoint).
	endpoint [2]uint64
	fp       [16]byte
	src      uint16
	hasFP    bool
	orphaned bool
	// seen: listed by some source this tick (so not vanished).
	seen bool
	// dead: the server was deleted (the row is out of the index).
	dead bool
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

func (s *Snapshot) keyBytes(handle []byte) snapKey {
	return snapKey{maphash.Bytes(s.seeds[0], handle), maphash.Bytes(s.seeds[1], handle)}
}

func (s *Snapshot) handleBytes(i int32) []byte {
	start := uint32(0)
	if i > 0 {
		start = s.ends[i-1]
	}
	return s.text[start:s.ends[i]]
}

func (s *Snapshot) handle(i int32) string { return string(s.handleBytes(i)) }

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
	// Version is what the source says is the version of its listing of
	// the server (0: it says none), Endpoint a key of the server's address
	// and port of the caller's choosing: a server added unchanged with a
	// version is known by them in the ticks after (Preparer.Known), so
	// that its source need not build it nor the caller check it again.
	Version  uint64
	Endpoint [2]uint64
	// known: found by Preparer.Known; Server holds only the handle.
	known bool
	fp    [16]byte
	key   snapKey
	row   int32 // -1: not in the snapshot
	// next: found at the row after the one the Preparer found before.
	next bool
}

// Prepare checks d (Detected.Validate) and readies it for Claim and Add.
// It only reads the snapshot, so it may run in another goroutine than the
// one claiming and adding (a source's reader, say). A Preparer does the
// same faster for a listing in the order of the snapshot's rows.
func (s *Snapshot) Prepare(d Detected) (Prepared, error) {
	return (&Preparer{snap: s, next: -1, src: -1}).Prepare(d)
}

// A Preparer prepares one listing's servers over a snapshot. Sources list
// in a stable order, mostly the order their servers were first listed in,
// which is the order of the snapshot's rows: a Preparer tries the row
// after the one it found last before it hashes the handle, so that an
// unchanged listing reads the snapshot from start to end instead of a
// lookup at random in a map of the whole fleet. Like Prepare, it only
// reads the snapshot; one Preparer is for one goroutine.
type Preparer struct {
	snap *Snapshot
	next int32 // the row to try first; -1: none
	src  int   // the listing's source in the snapshot, -1 when it has no servers there
}

// Preparer returns a Preparer over s, for one listing of the source.
func (s *Snapshot) Preparer(source string) *Preparer {
	pr := &Preparer{snap: s, src: -1}
	if i, ok := s.srcIdx[source]; ok {
		pr.src = int(i)
	}
	return pr
}

// find returns the row of handle, or -1.
func (pr *Preparer) find(handle string) (row int32, next bool, key snapKey) {
	s := pr.snap
	if i := pr.next; i >= 0 && int(i) < len(s.rows) && !s.rows[i].dead && string(s.handleBytes(i)) == handle {
		// (The key is for claims of handles the snapshot does not hold.)
		pr.next = i + 1
		return i, true, key
	}
	key = s.key(handle)
	if i, ok := s.index[key]; ok {
		pr.next = i + 1
		return i, false, key
	}
	return -1, false, key
}

// Known reports whether the listing's source said version of handle in
// an earlier tick of this process, and a sync found the server unchanged
// then, and nothing changed it in the fleet since (a load of the snapshot
// that reads its row again forgets the version). Then p stands for the
// server as listed then: its source need not build it, and Claim and
// SourceSync.Add take it as unchanged. Version 0 is never known.
func (pr *Preparer) Known(handle string, version uint64) (p Prepared, known bool) {
	if version == 0 || pr.src < 0 {
		return Prepared{}, false
	}
	row, next, _ := pr.find(handle)
	if row < 0 {
		return Prepared{}, false
	}
	r := &pr.snap.rows[row]
	if atomic.LoadUint64(&r.ver) != version || int(r.src) != pr.src || r.orphaned {
		return Prepared{}, false
	}
	return Prepared{Server: Detected{Handle: handle}, Version: version, Endpoint: r.endpoint, known: true,
		fp: r.fp, row: row, next: next}, true
}

// Known reports whether p was found by Preparer.Known (only its handle
// is set).
func (p *Prepared) Known() bool { return p.known }

// Prepare is Snapshot.Prepare.
func (pr *Preparer) Prepare(d Detected) (Prepared, error) {
	d.normalize()
	if err := d.Validate(); err != nil {
		return Prepared{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	p := Prepared{Server: d, fp: d.fingerprint()}
	p.row, p.next, p.key = pr.find(d.Handle)
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
			s.listed = append(s.listed, p.row)
			if !p.next {
				s.misses++
			}
		}
		return
	}
	if _, ok := s.claims[p.key]; !ok {
		s.claims[p.key] = int16(owner) + 1
	}
}

// EndTick lets go of what only the tick needed: the claims of handles the
// snapshot does not hold (on a first listing, the whole fleet's), which
// would otherwise stay until the next load.
func (s *Snapshot) EndTick() { s.claims = map[snapKey]int16{} }

// ClaimHandle is Claim by handle (manual servers, which no source lists).
func (s *Snapshot) ClaimHandle(handle string, owner int) {
	p := Prepared{key: s.key(handle), row: -1, next: true} // (not a listing's order)
	if i, ok := s.index[p.key]; ok {
		p.row = i
	}
	s.Claim(&p, owner)
}

// LoadSnapshot brings snap up to the fleet as it is now. A snapshot loaded
// before reads only what changed since (the handles that statement
// triggers log in server_changes, from the last load's horizon on, so that transactions still in flight then are read
// once they committed, in whatever order); every snapFullEvery, after a
// truncation, when a quarter of its rows are dead or when the transaction
// ids went back (another cluster), it reads every row again. The claims and
// marks of the last tick are cleared.
func (s *Store) LoadSnapshot(ctx context.Context, snap *Snapshot) error {
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("fleet snapshot: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var horizon string
	if err := tx.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text`).Scan(&horizon); err != nil {
		return fmt.Errorf("fleet snapshot: %w", err)
	}
	xmin, err := strconv.ParseUint(horizon, 10, 64)
	if err != nil {
		return fmt.Errorf("fleet snapshot: horizon %q: %w", horizon, err)
	}
	now := time.Now() // the snapshot's age, not the fleet's clock
	full := snap.xmin == 0 || xmin < snap.xmin || now.Sub(snap.fullAt) >= snapFullEvery || snap.dead > len(snap.rows)/4
	if !full {
		// A NULL handle in the log is a truncation, or inserts logged
		// without their handles (a first listing, see
		// SourceSync.summarize): read everything. So are many changes:
		// one read of the table in
		// its order costs less than as many lookups, and keeps the rows
		// in the order they were listed (Preparer).
		var changes int
		var truncated bool
		if err := tx.QueryRow(ctx, `SELECT count(*), COALESCE(bool_or(handle IS NULL), false) FROM server_changes WHERE xid >= $1::text::xid8`,
			strconv.FormatUint(snap.xmin, 10)).Scan(&changes, &truncated); err != nil {
			return fmt.Errorf("fleet snapshot: changes: %w", err)
		}
		full = truncated || changes > max(snapManyChanges, len(snap.rows)/4)
	}
	query := `SELECT handle, source, COALESCE(source_hash, ''), status FROM servers`
	var args []any
	if full {
		clear(snap.index)
		snap.rows, snap.text, snap.ends, snap.dead = snap.rows[:0], snap.text[:0], snap.ends[:0], 0
	} else {
		// The handles logged from the horizon on, each looked up: one
		// servers no longer holds was deleted or renamed away (no source).
		query = `SELECT c.handle, s.source, COALESCE(s.source_hash, ''), s.status
			FROM (SELECT DISTINCT handle FROM server_changes WHERE xid >= $1::text::xid8 AND handle IS NOT NULL) c
			LEFT JOIN servers s ON s.handle = c.handle`
		args = append(args, strconv.FormatUint(snap.xmin, 10))
	}
	// Every column is text, whose binary and text forms are the same bytes:
	// the raw values are read without an allocation a row.
	rows, err := tx.Query(ctx, query, args...)
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
		k := snap.keyBytes(v[0])
		if v[1] == nil { // (changes only) deleted, or renamed away
			if i, ok := snap.index[k]; ok {
				delete(snap.index, k)
				snap.rows[i].dead = true
				snap.dead++
			}
			continue
		}
		r := snapRow{src: snap.source(v[1]), orphaned: bytes.Equal(v[3], orphaned)}
		if len(v[2]) == 2*len(r.fp) {
			_, err := hex.Decode(r.fp[:], v[2])
			r.hasFP = err == nil
		}
		if i, ok := snap.index[k]; ok && !full {
			// A change read again (the horizon held back by a transaction
			// anywhere in the cluster) or undone finds the row as the
			// snapshot has it: what its source's version said still holds.
			if o := &snap.rows[i]; o.src == r.src && o.fp == r.fp && o.hasFP == r.hasFP && o.orphaned == r.orphaned {
				r.ver, r.endpoint = atomic.LoadUint64(&o.ver), o.endpoint
			}
			snap.rows[i] = r
			continue
		}
		snap.text = append(snap.text, v[0]...)
		snap.ends = append(snap.ends, uint32(len(snap.text)))
		snap.index[k] = int32(len(snap.rows))
		snap.rows = append(snap.rows, r)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("fleet snapshot: %w", err)
	}
	rows.Close()
	if !full && snap.misses > len(snap.rows)/8 {
		snap.reorder()
	}
	if !full {
		for i := range snap.rows {
			snap.rows[i].seen, snap.rows[i].claim = false, 0
		}
	}
	snap.listed, snap.misses = snap.listed[:0], 0
	// The claims of new servers are few from one tick to the next, except
	// on a first listing: a new map does not keep that one's size.
	snap.claims = map[snapKey]int16{}
	snap.xmin = xmin
	if full {
		snap.fullAt = now
		// Changes no snapshot needs any more (each reads all again within
		// snapFullEvery).
		if _, err := s.db.Exec(ctx, `DELETE FROM server_changes WHERE at < now() - $1::interval`,
			changeKeep.String()); err != nil {
			return fmt.Errorf("fleet snapshot: prune changes: %w", err)
		}
	}
	return nil
}

// reorder puts the rows in the order the last tick's listings claimed
// them, the rows no listing claimed after them in their order, and drops
// the dead ones: the next listings in the same order find each row right
// after the one before (Preparer). It costs about what a load of every row
// costs, once, when a tick found many rows out of order (the table's
// order after a first load, which updates change, or a source that
// reordered its listing).
func (s *Snapshot) reorder() {
	n := len(s.rows)
	placed := make([]bool, n)
	order := make([]int32, 0, n-s.dead)
	for _, i := range s.listed {
		if int(i) < n && !placed[i] && !s.rows[i].dead {
			placed[i] = true
			order = append(order, i)
		}
	}
	for i := range s.rows {
		if !placed[i] && !s.rows[i].dead {
			order = append(order, int32(i))
		}
	}
	rows := make([]snapRow, 0, len(order))
	text := make([]byte, 0, len(s.text))
	ends := make([]uint32, 0, len(order))
	clear(s.index)
	for _, i := range order {
		h := s.handleBytes(i)
		text = append(text, h...)
		ends = append(ends, uint32(len(text)))
		s.index[s.keyBytes(h)] = int32(len(rows))
		rows = append(rows, s.rows[i])
	}
	s.rows, s.text, s.ends, s.dead = rows, text, ends, 0
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
	// logged counts the servers the sync inserted or took over, each a
	// change in server_changes, until summarized: then its inserts log
	// one NULL handle a statement instead (see summarize).
	logged     int
	summarized bool
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
			if p.Version != 0 && atomic.LoadUint64(&r.ver) != p.Version {
				// As the fleet holds it, whether or not the sync commits:
				// known from the next tick on (Preparer.Known, which reads
				// the endpoint only once it saw this version stored).
				r.endpoint = p.Endpoint
				atomic.StoreUint64(&r.ver, p.Version)
			}
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
		ss.logged += n
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
	return ss.summarize(ctx)
}

// summarize stops logging the sync's inserts handle by handle once it
// made more changes than a load of the snapshot looks up one by one (a
// first listing): the next load reads every row anyway, so the rest of
// its inserts log one NULL handle a statement, which says so (migration
// 00072), and cost no row of server_changes a server.
func (ss *SourceSync) summarize(ctx context.Context) error {
	if ss.summarized || ss.logged <= max(snapManyChanges, len(ss.snap.rows)/4) {
		return nil
	}
	if _, err := ss.tx.Exec(ctx, `SELECT set_config('autoprov.change_log', 'summary', true)`); err != nil {
		return fmt.Errorf("sync of %s: %w", ss.req.Source, err)
	}
	ss.summarized = true
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
			if int(r.src) != ss.src || r.orphaned || r.dead {
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
