package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// WaitStale is how long a waiter that stopped looking at its targets keeps
// its place in their lines (see JoinLines): a waiting run looks every
// second or so, so one not seen for this long is gone (a cancelled one
// leaves at once, LeaveLines).
const WaitStale = 15 * time.Second

// Waiter is a job waiting in the lines of its targets, with the stream
// entry of its request (empty when unknown), which a run that frees one of
// the targets hands its slot to (LineHeads, stream.HandOff).
type Waiter struct {
	Job    string
	Stream string
	Entry  string
}

// JoinLines puts job w.Job in the line of each of targets, all with one
// number, its arrival (a job keeps its number across looks), and marks it
// seen; stale waiters of any job are deleted on the way. A run that found
// a target busy (ErrTargetBusy) joins, so that AcquireAll lets it start
// before any run that arrived after it (migrations 00064, 00066). It
// reports whether a fresh waiter that came before it is in one of the
// lines: such a waiter starts first, and hands its slot on when it ends
// (LineHeads), so a waiter behind others need not look often.
func JoinLines(ctx context.Context, db Querier, w Waiter, targets []string) (behind bool, err error) {
	err = db.QueryRow(ctx, `
		WITH stale AS (DELETE FROM run_waits WHERE seen_at < now() - make_interval(secs => $3) AND job <> $1),
		num AS (SELECT coalesce((SELECT min(seq) FROM run_waits WHERE job = $1), nextval('run_wait_seq')) AS seq),
		joined AS (INSERT INTO run_waits (target, job, seq, stream, entry)
			SELECT t, $1, num.seq, NULLIF($4, ''), NULLIF($5, '') FROM unnest($2::text[]) AS t, num
			ON CONFLICT (target, job) DO UPDATE SET seen_at = now(), stream = excluded.stream, entry = excluded.entry)
		SELECT EXISTS (SELECT 1 FROM run_waits o, num WHERE o.target = ANY($2) AND o.job <> $1
			AND o.seen_at > now() - make_interval(secs => $3) AND o.seq < num.seq)`,
		w.Job, targets, WaitStale.Seconds(), w.Stream, w.Entry).Scan(&behind)
	if err != nil {
		return false, fmt.Errorf("job %s joins the lines of its targets: %w", w.Job, err)
	}
	return behind, nil
}

// LeaveLines takes job out of every line it waits in: a job that ended
// without taking its locks (cancelled while it waited, done elsewhere) no
// longer holds back the runs behind it until its place goes stale.
func LeaveLines(ctx context.Context, db Querier, job string) error {
	if _, err := db.Exec(ctx, `DELETE FROM run_waits WHERE job = $1`, job); err != nil {
		return fmt.Errorf("job %s leaves its lines: %w", job, err)
	}
	return nil
}

// LineHeads returns the first fresh waiter, other than job except, in the
// line of each of targets whose entry is known, each job once, in arrival
// order: the runs that may start when a run frees targets (a waiter also
// waiting for a target still held finds it busy and waits on).
func LineHeads(ctx context.Context, db Querier, targets []string, except string) ([]Waiter, error) {
	rows, err := db.Query(ctx, `
		SELECT job, stream, entry FROM (
			SELECT DISTINCT ON (w.target) w.job, w.stream, w.entry, w.seq FROM run_waits w
			WHERE w.target = ANY($1) AND w.job <> $2 AND w.seen_at > now() - make_interval(secs => $3)
			ORDER BY w.target, w.seq) heads
		WHERE stream IS NOT NULL AND entry IS NOT NULL
		GROUP BY job, stream, entry ORDER BY min(seq)`, targets, except, WaitStale.Seconds())
	if err != nil {
		return nil, fmt.Errorf("heads of the lines of %v: %w", targets, err)
	}
	heads, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Waiter])
	if err != nil {
		return nil, fmt.Errorf("heads of the lines of %v: %w", targets, err)
	}
	return heads, nil
}

// aheadInLine returns a job that waits, fresh, in the line of one of
// targets with a smaller number than jobID ("" when none: jobID may go).
func aheadInLine(ctx context.Context, db Querier, jobID string, targets []string) (string, error) {
	var ahead []string
	err := db.QueryRow(ctx, `
		SELECT ARRAY(SELECT w.job FROM run_waits w
		WHERE w.target = ANY($1) AND w.job <> $2 AND w.seen_at > now() - make_interval(secs => $3)
		  AND w.seq < coalesce((SELECT min(seq) FROM run_waits WHERE job = $2), 9223372036854775807)
		ORDER BY w.seq LIMIT 1)`, targets, jobID, WaitStale.Seconds()).Scan(&ahead)
	if err != nil || len(ahead) == 0 {
		return "", err
	}
	return ahead[0], nil
}

// LinePlace is where a waiting job stands in the line of one of its
// targets.
type LinePlace struct {
	Target string    `json:"target"`
	Ahead  int       `json:"ahead"` // fresh waiters before it
	Busy   bool      `json:"busy"`  // a run holds the target now
	Since  time.Time `json:"since"` // when it joined
}

// JobLines returns where job jobID waits, per target in target order
// (none when it does not wait). A target is busy when a run holds its
// lease (run_leases, keyed by TargetLockKey, computed here in SQL).
func JobLines(ctx context.Context, db Querier, jobID string) ([]LinePlace, error) {
	rows, err := db.Query(ctx, `
		SELECT w.target, w.since,
			(SELECT count(*) FROM run_waits o WHERE o.target = w.target AND o.seq < w.seq
				AND o.seen_at > now() - make_interval(secs => $2)),
			EXISTS (SELECT 1 FROM run_leases l WHERE l.expires_at > now() AND l.key =
				('x' || substr(encode(sha256(convert_to('target:' || w.target, 'UTF8')), 'hex'), 1, 16))::bit(64)::bigint)
		FROM run_waits w WHERE w.job = $1 AND w.seen_at > now() - make_interval(secs => $2)
		ORDER BY w.target`, jobID, WaitStale.Seconds())
	if err != nil {
		return nil, fmt.Errorf("lines of job %s: %w", jobID, err)
	}
	defer rows.Close()
	var out []LinePlace
	for rows.Next() {
		var p LinePlace
		if err := rows.Scan(&p.Target, &p.Since, &p.Ahead, &p.Busy); err != nil {
			return nil, fmt.Errorf("lines of job %s: %w", jobID, err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("lines of job %s: %w", jobID, err)
	}
	return out, nil
}
