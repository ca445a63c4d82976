-- +goose Up

-- credentials are the deployer's named credentials (issue 23): a name, per
-- project, for a secret reference that a job's request may name instead of
-- the reference itself. Only references are stored, never a value: a value
-- posted to the API is written to Vault KV under the project's path and its
-- reference (version pinned) is stored (vault_written). A project's keys see
-- and use only their project's credentials.
CREATE TABLE credentials (
    project_id    text NOT NULL
                  CHECK (project_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'),
    name          text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    ref           text NOT NULL CHECK (ref ~ '^(vault|env|file):[!-~]+$' AND length(ref) <= 1024),
    vault_written boolean NOT NULL DEFAULT false,
    description   text NOT NULL DEFAULT '' CHECK (length(description) <= 200),
    api_key_id    uuid REFERENCES api_keys (id) ON DELETE SET NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, name)
);

-- Ansible jobs (issue 23) are deployments of another kind: they share the
-- table, and with it idempotency keys, publishing, results, webhooks,
-- cancel and retention. A job's request (JSON, references only) is
-- job_request; queue is the stream it was published to (its pool's).
ALTER TABLE deployments
    ADD COLUMN kind        text NOT NULL DEFAULT 'deploy' CHECK (kind IN ('deploy', 'job')),
    ADD COLUMN job_request jsonb,
    ADD COLUMN queue       text;
CREATE INDEX deployments_kind_idx ON deployments (kind, created_at DESC, id DESC);

-- infra's runs of jobs (and the deployer's record of a job cancelled
-- before it started).
ALTER TABLE runs DROP CONSTRAINT IF EXISTS runs_kind_check;
ALTER TABLE runs ADD CONSTRAINT runs_kind_check CHECK (kind IN ('provision', 'deploy', 'job'));

-- +goose Down
ALTER TABLE runs DROP CONSTRAINT IF EXISTS runs_kind_check;
ALTER TABLE runs ADD CONSTRAINT runs_kind_check CHECK (kind IN ('provision', 'deploy'));
DROP INDEX deployments_kind_idx;
ALTER TABLE deployments DROP COLUMN queue, DROP COLUMN job_request, DROP COLUMN kind;
DROP TABLE credentials;
