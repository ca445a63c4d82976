package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// SourceManual is the source of servers inserted by hand; detectors never
// sync, orphan or take over manual servers.
const SourceManual = "manual"

// Detected is a server as a source lists it.
type Detected struct {
	Handle  string
	Address string
	// SSHPort defaults to 22, SSHUser to root.
	SSHPort int
	SSHUser string
	Labels  map[string]string
	// ProviderID is the server's id at its provider ("" for none).
	ProviderID string
	// SSHKeyRef is a secret reference of the SSH key ("" keeps the
	// server's, or the default key).
	SSHKeyRef string
	// Projects are the projects that own the server, as the source says
	// (an inventory's autoprov_projects, an EC2 tag): nil when the source
	// says nothing (an operator sets them, SetProjects), empty when it says
	// the server belongs to no project. Project ids, any case.
	Projects []string
}

// validHandle reports whether h matches messages.ServerHandlePattern,
// ^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$, without a regexp (a sync checks
// every server of a source on every tick).
func validHandle(h string) bool {
	if len(h) == 0 || len(h) > 128 {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == ':' || c == '@' || c == '-'):
		default:
			return false
		}
	}
	return true
}

// Validate checks what Postgres would refuse, with a message naming the server.
func (d *Detected) Validate() error {
	var errs []string
	if !validHandle(d.Handle) {
		errs = append(errs, `handle must match ^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$`)
	}
	if strings.TrimSpace(d.Address) == "" {
		errs = append(errs, "address is empty")
	}
	if d.SSHPort < 0 || d.SSHPort > 65535 {
		errs = append(errs, "ssh port "+strconv.Itoa(d.SSHPort)+" not in 1..65535")
	}
	if _, err := CanonicalProjects(d.Projects); err != nil {
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		return fmt.Errorf("server %q: %s", d.Handle, strings.Join(errs, "; "))
	}
	return nil
}

func (d *Detected) normalize() {
	if d.SSHPort == 0 {
		d.SSHPort = 22
	}
	if d.SSHUser == "" {
		d.SSHUser = "root"
	}
	if d.Labels == nil {
		d.Labels = map[string]string{}
	}
	if d.Projects != nil {
		if p, err := CanonicalProjects(d.Projects); err == nil {
			d.Projects = p
		}
	}
}

// fingerprint is what the source says of the server, stored in hex in
// servers.source_hash: the first half of a SHA-256 over the fields, the
// labels in key order.
func (d *Detected) fingerprint() [16]byte {
	var buf [256]byte
	b := buf[:0]
	b = append(b, d.Address...)
	b = append(b, 0)
	b = strconv.AppendInt(b, int64(d.SSHPort), 10)
	for _, s := range []string{d.SSHUser, d.ProviderID, d.SSHKeyRef} {
		b = append(b, 0)
		b = append(b, s...)
	}
	var keyBuf [16]string
	keys := keyBuf[:0]
	for k := range d.Labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b = append(b, 0)
		b = append(b, k...)
		b = append(b, '=')
		b = append(b, d.Labels[k]...)
	}
	if d.Projects != nil {
		// Only when the source says: the hashes of servers whose source
		// says nothing stay what they were before owners existed.
		b = append(b, 0, 0)
		b = append(b, "projects="...)
		for i, p := range d.Projects {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, p...)
		}
	}
	sum := sha256.Sum256(b)
	return [16]byte(sum[:16])
}

// SyncRequest is one source's complete listing, merged by the caller with
// the other sources' (see the scheduler's detect package).
type SyncRequest struct {
	// Source is the source's name: "static:<file>", "time4vps", "ec2:<name>".
	Source  string
	Servers []Detected
	// Keep lists handles other sources listed in the same tick: a server of
	// Source that vanished from it but is in Keep is not orphaned (another
	// source takes it over).
	Keep map[string]bool
	// TakeOverFrom lists the sources this source may take servers over from
	// (those of lower precedence, and sources that no longer exist); servers
	// of other sources with the same handle are left alone (Skipped).
	TakeOverFrom []string
	// MaxOrphanFraction, when positive, guards the source's fleet: a listing
	// that would orphan more than OrphanLimit(live, MaxOrphanFraction) of
	// its live (not ORPHANED) servers is refused (ErrTooManyOrphans) and
	// changes nothing, so a source answering an empty list by mistake does
	// not orphan its fleet, whatever its size. Zero means no guard.
	MaxOrphanFraction float64
	Actor             string
}

// SyncStats counts what Sync did.
type SyncStats struct {
	Listed, Detected, Updated, Unchanged, Returned, Orphaned, Skipped int
}

// ErrTooManyOrphans: a sync would orphan more servers than allowed.
var ErrTooManyOrphans = errors.New("sync would orphan too many servers")

// OrphanLimit is how many of a source's live servers one sync may orphan
// under the guard fraction f (MAX_ORPHAN_FRACTION):
//
//	f >= 1:   live (no guard)
//	live = 0: 0
//	else:     min(live-1, max(1, floor(f*live)))
//
// So a source never orphans all of its servers at once, removing one
// server at a time always works down to the last one, and at the default
// 0.5 the limits are 0 of 1, 1 of 2, 1 of 3, 5 of 10 and 50 of 100: an
// emptied 3-server inventory, or one cut to a single host, orphans nothing.
func OrphanLimit(live int, f float64) int {
	if f >= 1 {
		return live
	}
	if live <= 0 {
		return 0
	}
	// The epsilon keeps 0.29*100 (28.999...) at 29.
	return min(live-1, max(1, int(math.Floor(f*float64(live)+1e-9))))
}

// Sync applies a source's complete listing at once (see SourceSync): new
// servers are created NEW, changed ones updated, ORPHANED ones listed again
// return, and servers of the source no longer listed (and not in Keep)
// become ORPHANED. Unchanged servers cost no write. Call Sync only for a
// source whose listing succeeded: a failing source must change nothing.
// The scheduler streams its sources through BeginSync instead.
func (s *Store) Sync(ctx context.Context, req SyncRequest) (SyncStats, error) {
	snap := NewSnapshot()
	if err := s.LoadSnapshot(ctx, snap); err != nil {
		return SyncStats{}, err
	}
	ss, err := s.BeginSync(ctx, snap, req)
	if err != nil {
		return SyncStats{}, err
	}
	defer ss.Rollback(ctx)
	listed := make(map[string]bool, len(req.Servers))
	for _, d := range req.Servers {
		if listed[d.Handle] {
			return SyncStats{}, fmt.Errorf("%w: server %q listed twice by %s", ErrInvalid, d.Handle, req.Source)
		}
		listed[d.Handle] = true
		p, err := snap.Prepare(d)
		if err != nil {
			return SyncStats{}, err
		}
		if err := ss.Add(ctx, &p); err != nil {
			return SyncStats{}, err
		}
	}
	for h := range req.Keep {
		snap.Keep(h)
	}
	return ss.Finish(ctx)
}

type detectedArrays struct {
	handles, addresses, users, labels, providers, keyrefs, hashes, projects []string
	ports                                                                   []int32
	hasProjects                                                             []bool
}

func newDetectedArrays(list []Prepared) detectedArrays {
	var a detectedArrays
	for i := range list {
		d := &list[i].Server
		lb, _ := json.Marshal(d.Labels) // a map of strings always marshals
		a.handles = append(a.handles, d.Handle)
		a.addresses = append(a.addresses, d.Address)
		a.ports = append(a.ports, int32(d.SSHPort))
		a.users = append(a.users, d.SSHUser)
		a.labels = append(a.labels, string(lb))
		a.providers = append(a.providers, d.ProviderID)
		a.keyrefs = append(a.keyrefs, d.SSHKeyRef)
		a.hashes = append(a.hashes, hex.EncodeToString(list[i].fp[:])) // fingerprinted by Prepare
		// Project ids hold no comma: joined, they fit a text[] of one
		// dimension (unnest cannot take an array of arrays).
		a.projects = append(a.projects, strings.Join(d.Projects, ","))
		a.hasProjects = append(a.hasProjects, d.Projects != nil)
	}
	return a
}

// upsert inserts new servers of the source, or takes over servers of the
// sources it may take over from; others with the same handle are skipped.
// It returns how many it wrote and skipped, and the taken-over servers that
// are ORPHANED (to return).
func (s *Store) upsert(ctx context.Context, tx pgx.Tx, req SyncRequest, list []Prepared, hist *historyBatch) (int, int, []string, error) {
	a := newDetectedArrays(list)
	takeOver := req.TakeOverFrom
	if takeOver == nil {
		takeOver = []string{}
	}
	rows, err := tx.Query(ctx, `INSERT INTO servers (handle, address, ssh_port, ssh_user, labels, provider_id, ssh_key_ref,
			source_hash, source, last_seen_at, projects, projects_from_source)
		SELECT x.handle, x.address, x.port, x.usr, x.labels::jsonb, NULLIF(x.provider, ''), NULLIF(x.keyref, ''), x.hash, $9, $10,
			CASE WHEN x.has_projects THEN string_to_array(x.projects, ',') ELSE '{}' END, x.has_projects
		FROM unnest($1::text[], $2::text[], $3::int[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
				$12::text[], $13::boolean[])
			AS x(handle, address, port, usr, labels, provider, keyref, hash, projects, has_projects)
		ON CONFLICT (handle) DO UPDATE SET source = EXCLUDED.source, address = EXCLUDED.address,
			ssh_port = EXCLUDED.ssh_port, ssh_user = EXCLUDED.ssh_user, labels = EXCLUDED.labels,
			provider_id = COALESCE(EXCLUDED.provider_id, servers.provider_id),
			ssh_key_ref = COALESCE(EXCLUDED.ssh_key_ref, servers.ssh_key_ref),
			source_hash = EXCLUDED.source_hash, last_seen_at = EXCLUDED.last_seen_at,
			projects = CASE WHEN EXCLUDED.projects_from_source THEN EXCLUDED.projects
				WHEN servers.projects_from_source THEN '{}' ELSE servers.projects END,
			projects_from_source = EXCLUDED.projects_from_source
		WHERE servers.source = ANY($11) AND servers.source <> 'manual'
		RETURNING handle, (xmax = 0), status`,
		a.handles, a.addresses, a.ports, a.users, a.labels, a.providers, a.keyrefs, a.hashes, req.Source, s.now(), takeOver,
		a.projects, a.hasProjects)
	if err != nil {
		return 0, 0, nil, fmt.Errorf("insert servers of %s: %w", req.Source, err)
	}
	n := 0
	var orphans []string
	var h, status string
	var inserted bool
	if _, err := pgx.ForEachRow(rows, []any{&h, &inserted, &status}, func() error {
		n++
		if inserted {
			hist.add(History{Handle: h, Event: EventDetected, To: status, Reason: "listed by " + req.Source, Actor: req.Actor})
		} else {
			if status == StatusOrphaned {
				orphans = append(orphans, h)
			}
			hist.add(History{Handle: h, Event: EventDetected, From: status, To: status,
				Reason: "taken over by " + req.Source + " (source precedence)", Actor: req.Actor})
		}
		return nil
	}); err != nil {
		return 0, 0, nil, fmt.Errorf("insert servers of %s: %w", req.Source, err)
	}
	return n, len(list) - n, orphans, nil
}
