// Package runlog keeps the full output of every run, already redacted by
// its writer, keyed by the run's job id: the third tier of a deployment's
// record, after the live progress events and the result.
//
// The infra service writes a run's output once the run ends (Put); the
// deployer serves it (Open) and applies the retention (DeleteBefore). Three
// backends implement Store: Postgres (the default: gzip-compressed rows of
// run_logs), a directory on disk, and S3-compatible object storage through
// minio-go. Open picks one from a Config.
//
// A log longer than Config.MaxBytes keeps its first and last halves with a
// marker line between them, so that both the start of a run and its end
// (where failures are) survive.
package runlog

import (
	"context"
	"errors"
	"io"
	"time"
)

// ErrNotFound is returned by Open when no log is stored for a job.
var ErrNotFound = errors.New("run log not found")

// Info describes a stored log.
type Info struct {
	// JobID is the job whose output it is.
	JobID string
	// Size is the stored log's length in bytes (after truncation).
	Size int64
	// Truncated says that the output was longer than the limit and its
	// middle was left out.
	Truncated bool
	// CreatedAt is when the log was stored.
	CreatedAt time.Time
}

// Store keeps run logs. Implementations are safe for concurrent use.
type Store interface {
	// Put stores the output read from r as the log of jobID, replacing a
	// log stored before (a later attempt of the same job). It reads r to
	// its end, keeping at most the configured limit.
	Put(ctx context.Context, jobID string, r io.Reader) (Info, error)
	// Open returns the log of jobID; ErrNotFound when there is none. The
	// caller closes the reader.
	Open(ctx context.Context, jobID string) (io.ReadCloser, Info, error)
	// Delete removes the log of jobID; no error when there is none.
	Delete(ctx context.Context, jobID string) error
	// DeleteBefore removes the logs stored before t and returns how many.
	DeleteBefore(ctx context.Context, t time.Time) (int, error)
	// Backend names the backend: "postgres", "dir" or "s3".
	Backend() string
}
