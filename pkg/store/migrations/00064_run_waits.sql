-- +goose Up

-- The line of runs waiting for busy targets (issue 33): a run that finds a
-- target held joins the line of each of its targets with one number, its
-- arrival (run_wait_seq), and refreshes seen_at at every look. A run takes
-- its targets only when no fresh waiter with a smaller number is in the
-- line of any of them, so runs start in arrival order per target and a
-- run needing many targets reserves them instead of being starved by runs
-- needing one. A run leaves its lines when it takes its locks; a waiter
-- that stopped looking (cancelled, gone) is ignored once stale, then
-- deleted.
CREATE SEQUENCE run_wait_seq;

CREATE TABLE run_waits (
    target  text        NOT NULL,
    job     text        NOT NULL,
    seq     bigint      NOT NULL,
    since   timestamptz NOT NULL DEFAULT now(),
    seen_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (target, job)
);

CREATE INDEX run_waits_line_idx ON run_waits (target, seq);
CREATE INDEX run_waits_job_idx ON run_waits (job);

-- +goose Down
DROP TABLE run_waits;
DROP SEQUENCE run_wait_seq;
