-- +goose Up

-- Leases behind the run locks (issue 33): a run's session advisory locks
-- (job and targets, pkg/store's RunLocks) end with their Postgres session,
-- so a Postgres restart used to stop every running play. Each lock key the
-- run holds also has a row here, written while the advisory lock is held:
-- holder is the RunLocks instance, epoch the pg_postmaster_start_time() it
-- was written in, expires_at how long it stands without renewal. After a
-- restart (a new epoch) no one may take a key whose lease has not expired;
-- the holder renews it once Postgres is back and its play goes on. Within
-- one epoch, taking the advisory lock proves the writer's session ended,
-- so a crashed holder's lease is taken at once. Release deletes the rows.
CREATE TABLE run_leases (
    key        bigint      PRIMARY KEY,
    holder     text        NOT NULL,
    job        text        NOT NULL,
    epoch      timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE run_leases;
