-- +goose Up

-- The scheduler's side of the fleet (pkg/fleet): what the reconcile loop,
-- the detectors, the health checks and operators need on each server, the
-- history of every change, the transactional outbox of ProvisionerMessages
-- and the durable queue of notifications.

ALTER TABLE servers
    -- paused servers are left out of the reconcile loop and the health
    -- checks; a job already in flight finishes.
    ADD COLUMN paused           boolean NOT NULL DEFAULT false,
    -- requested_action is an operator's (or the health checks') request,
    -- turned into a ProvisionerMessage by the reconcile loop once no job of
    -- the server is in flight: provision, recovery (is_recovery) or rebuild
    -- (force_reinstall).
    ADD COLUMN requested_action text CHECK (requested_action IN ('provision', 'recovery', 'rebuild')),
    ADD COLUMN requested_by     text,
    ADD COLUMN requested_at     timestamptz,
    -- pending_job_id is the job the server waits for (QUEUED or
    -- PROVISIONING): at most one per server. Results of other jobs are
    -- recorded in history and ignored.
    ADD COLUMN pending_job_id   text,
    ADD COLUMN pending_action   text CHECK (pending_action IN ('provision', 'recovery', 'rebuild')),
    ADD COLUMN queued_at        timestamptz,
    -- next_attempt_at is the earliest time the loop acts on the server by
    -- itself again (retry backoff of FAILED, cool-down of UNREACHABLE).
    ADD COLUMN next_attempt_at  timestamptz,
    -- retries_exhausted: FAILED with no retry budget left; the loop leaves
    -- it until an operator asks again.
    ADD COLUMN retries_exhausted boolean NOT NULL DEFAULT false,
    -- last_recovery_at starts the health checks' recovery cool-down.
    ADD COLUMN last_recovery_at timestamptz,
    -- last_seen_at is when the server's source last listed it;
    -- orphaned_from the status it had when its source dropped it, restored
    -- when it comes back.
    ADD COLUMN last_seen_at     timestamptz,
    ADD COLUMN orphaned_from    text,
    -- source_hash fingerprints what the source said (address, port, user,
    -- labels, provider id), so an unchanged server costs no write.
    ADD COLUMN source_hash      text;

-- The reconcile loop's work list: servers that may need a message.
CREATE INDEX servers_due_idx ON servers (status, next_attempt_at)
    WHERE NOT paused AND pending_job_id IS NULL
      AND (status IN ('NEW', 'UNREACHABLE') OR (status = 'FAILED' AND NOT retries_exhausted)
           OR requested_action IS NOT NULL);
CREATE INDEX servers_pending_idx ON servers (queued_at) WHERE pending_job_id IS NOT NULL;
CREATE INDEX servers_source_idx ON servers (source);

-- server_history records every change of a server: status transitions
-- (from, to), requests, pauses, results (also stale ones), with when, why,
-- the job and who did it.
CREATE TABLE server_history (
    id          bigserial PRIMARY KEY,
    handle      text NOT NULL REFERENCES servers (handle) ON DELETE CASCADE ON UPDATE CASCADE,
    event       text NOT NULL,
    from_status text,
    to_status   text NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    reason      text NOT NULL DEFAULT '',
    job_id      text,
    actor       text NOT NULL
);
CREATE INDEX server_history_handle_idx ON server_history (handle, id DESC);
CREATE INDEX server_history_job_idx ON server_history (job_id, event) WHERE job_id IS NOT NULL;

-- outbox holds messages written in the same transaction as the state
-- change that needs them; a relay publishes them to Redis and marks them.
-- A crash between the two publishes again (same job_id: infra runs it once).
CREATE TABLE outbox (
    id           bigserial PRIMARY KEY,
    stream       text NOT NULL,
    handle       text,
    job_id       text NOT NULL,
    payload      bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,
    entry_id     text
);
CREATE INDEX outbox_unpublished_idx ON outbox (id) WHERE published_at IS NULL;
CREATE INDEX outbox_job_idx ON outbox (job_id);

-- notifications: one row per notifiable state change of a server, written
-- in the same transaction as the change; notification_deliveries records
-- which channel delivered which, so a restart neither repeats nor drops one.
CREATE TABLE notifications (
    id         bigserial PRIMARY KEY,
    handle     text NOT NULL REFERENCES servers (handle) ON DELETE CASCADE ON UPDATE CASCADE,
    status     text NOT NULL,
    error      text,
    job_id     text,
    attempts   integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- notify_channels: a channel receives the notifications created after it
-- was first seen (since_id), never the backlog of before.
CREATE TABLE notify_channels (
    channel    text PRIMARY KEY,
    since_id   bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE notification_deliveries (
    notification_id bigint NOT NULL REFERENCES notifications (id) ON DELETE CASCADE,
    channel         text NOT NULL,
    delivered_at    timestamptz NOT NULL DEFAULT now(),
    message_count   integer NOT NULL DEFAULT 1,
    PRIMARY KEY (channel, notification_id)
);

-- +goose Down
DROP TABLE notification_deliveries;
DROP TABLE notify_channels;
DROP TABLE notifications;
DROP TABLE outbox;
DROP TABLE server_history;
DROP INDEX servers_source_idx;
DROP INDEX servers_pending_idx;
DROP INDEX servers_due_idx;
ALTER TABLE servers
    DROP COLUMN paused, DROP COLUMN requested_action, DROP COLUMN requested_by, DROP COLUMN requested_at,
    DROP COLUMN pending_job_id, DROP COLUMN pending_action, DROP COLUMN queued_at, DROP COLUMN next_attempt_at,
    DROP COLUMN retries_exhausted, DROP COLUMN last_recovery_at, DROP COLUMN last_seen_at,
    DROP COLUMN orphaned_from, DROP COLUMN source_hash;
