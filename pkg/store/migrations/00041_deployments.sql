-- +goose Up

-- deployments are the deploy jobs the deployer knows: those it published
-- (source 'api') and those other producers put on ansible:deploy:queue
-- straight away (source 'stream'), matched by job id. The request keys are
-- the wire contract's; secret references are references, never values.
CREATE TABLE deployments (
    id               uuid PRIMARY KEY,
    job_id           text NOT NULL UNIQUE CHECK (job_id ~ '^[!-~]{1,255}$'),
    source           text NOT NULL CHECK (source IN ('api', 'stream')),
    api_key_id       uuid REFERENCES api_keys (id) ON DELETE SET NULL,
    -- status is queued until the result arrives; "running" is derived from
    -- the runs table (infra's row of the job) when read.
    status           text NOT NULL DEFAULT 'queued'
                     CHECK (status IN ('queued', 'succeeded', 'failed', 'unreachable', 'rejected', 'cancelled')),
    project_id       text,
    repo_full_name   text,
    branch           text,
    server_ip        text,
    port             integer,
    modules          text[],
    github_token_ref text,
    secrets_ref      text,
    correlation_id   text,
    timeout_seconds  integer,
    callback_url     text,
    -- request_id is the stream entry id of the request once published.
    request_id       text,
    published_at     timestamptz,
    cancel_requested_at timestamptz,
    error_kind       text,
    -- result is the job's result as JSON (the wire result's keys).
    result           jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX deployments_created_idx ON deployments (created_at DESC, id DESC);
CREATE INDEX deployments_project_idx ON deployments (project_id, created_at DESC, id DESC);
CREATE INDEX deployments_server_idx ON deployments (server_ip, created_at DESC, id DESC);
CREATE INDEX deployments_status_idx ON deployments (status, created_at DESC, id DESC);
CREATE INDEX deployments_unpublished_idx ON deployments (created_at) WHERE published_at IS NULL AND source = 'api';

-- idempotency_keys remember the deployment made by a request with an
-- Idempotency-Key header, per API key, so that a retry gets the first
-- response; request_hash tells a retry from a different request.
CREATE TABLE idempotency_keys (
    api_key_id    uuid NOT NULL REFERENCES api_keys (id) ON DELETE CASCADE,
    key           text NOT NULL,
    request_hash  bytea NOT NULL,
    deployment_id uuid NOT NULL REFERENCES deployments (id) ON DELETE CASCADE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (api_key_id, key)
);

CREATE INDEX idempotency_keys_created_idx ON idempotency_keys (created_at);

-- +goose Down
DROP TABLE idempotency_keys;
DROP TABLE deployments;
