-- +goose Up

-- run_logs holds the full (redacted) output of runs when pkg/runlog's
-- postgres backend is used: gzip-compressed, one row per job.
CREATE TABLE run_logs (
    job_id     text PRIMARY KEY,
    size       bigint NOT NULL CHECK (size >= 0),
    truncated  boolean NOT NULL DEFAULT false,
    content    bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX run_logs_created_idx ON run_logs (created_at);

-- +goose Down
DROP TABLE run_logs;
