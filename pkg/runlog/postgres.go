package runlog

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Postgres keeps logs gzip-compressed in the run_logs table.
type Postgres struct {
	db       *pgxpool.Pool
	maxBytes int64
}

var _ Store = (*Postgres)(nil)

// NewPostgres returns a Store on db's run_logs table keeping at most
// maxBytes of each log.
func NewPostgres(db *pgxpool.Pool, maxBytes int64) *Postgres {
	return &Postgres{db: db, maxBytes: maxBytes}
}

// Backend implements Store.
func (p *Postgres) Backend() string { return BackendPostgres }

// Put implements Store.
func (p *Postgres) Put(ctx context.Context, jobID string, r io.Reader) (Info, error) {
	data, truncated, err := capture(r, p.maxBytes)
	if err != nil {
		return Info{}, err
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	if _, err := zw.Write(data); err != nil {
		return Info{}, fmt.Errorf("compress run log: %w", err)
	}
	if err := zw.Close(); err != nil {
		return Info{}, fmt.Errorf("compress run log: %w", err)
	}
	info := Info{JobID: jobID, Size: int64(len(data)), Truncated: truncated}
	err = p.db.QueryRow(ctx, `
		INSERT INTO run_logs (job_id, size, truncated, content) VALUES ($1, $2, $3, $4)
		ON CONFLICT (job_id) DO UPDATE
			SET size = EXCLUDED.size, truncated = EXCLUDED.truncated, content = EXCLUDED.content, created_at = now()
		RETURNING created_at`, jobID, info.Size, truncated, z.Bytes()).Scan(&info.CreatedAt)
	if err != nil {
		return Info{}, fmt.Errorf("store run log of %s: %w", jobID, err)
	}
	return info, nil
}

// Open implements Store.
func (p *Postgres) Open(ctx context.Context, jobID string) (io.ReadCloser, Info, error) {
	info := Info{JobID: jobID}
	var content []byte
	err := p.db.QueryRow(ctx, `SELECT size, truncated, content, created_at FROM run_logs WHERE job_id = $1`, jobID).
		Scan(&info.Size, &info.Truncated, &content, &info.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, Info{}, ErrNotFound
	}
	if err != nil {
		return nil, Info{}, fmt.Errorf("read run log of %s: %w", jobID, err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(content))
	if err != nil {
		return nil, Info{}, fmt.Errorf("read run log of %s: %w", jobID, err)
	}
	return zr, info, nil
}

// Delete implements Store.
func (p *Postgres) Delete(ctx context.Context, jobID string) error {
	if _, err := p.db.Exec(ctx, `DELETE FROM run_logs WHERE job_id = $1`, jobID); err != nil {
		return fmt.Errorf("delete run log of %s: %w", jobID, err)
	}
	return nil
}

// DeleteBefore implements Store.
func (p *Postgres) DeleteBefore(ctx context.Context, t time.Time) (int, error) {
	tag, err := p.db.Exec(ctx, `DELETE FROM run_logs WHERE created_at < $1`, t)
	if err != nil {
		return 0, fmt.Errorf("delete old run logs: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
