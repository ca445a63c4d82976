-- +goose Up

-- job_triggers launch a job template when git hosting calls their URL on
-- a push or a tag (issue 36): GitHub, GitLab or Gitea, verified as each
-- signs its webhooks, with the pushed commit as the job's ref. A
-- trigger's secret is derived from the deployer's signing key, the
-- trigger's id and secret_version (so a rotation bumps it): no row holds
-- it. It launches as the API key that made it, checked at each delivery.
-- launch holds the launch's overrides and survey answers (never a
-- secret), as a schedule's.
CREATE TABLE job_triggers (
    id             uuid PRIMARY KEY,
    project_id     text NOT NULL
                   CHECK (project_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'),
    template_id    uuid NOT NULL REFERENCES job_templates (id) ON DELETE CASCADE,
    name           text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    provider       text NOT NULL CHECK (provider IN ('github', 'gitlab', 'gitea')),
    branches       text[] NOT NULL DEFAULT '{}' CHECK (cardinality(branches) <= 20),
    tags           text[] NOT NULL DEFAULT '{}' CHECK (cardinality(tags) <= 20),
    launch         jsonb NOT NULL DEFAULT '{}',
    secret_version integer NOT NULL DEFAULT 1 CHECK (secret_version > 0),
    api_key_id     uuid REFERENCES api_keys (id) ON DELETE SET NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (project_id, name)
);
CREATE INDEX job_triggers_template_idx ON job_triggers (template_id);

-- trigger_deliveries are the verified deliveries a trigger received, one
-- per body: a body seen before is a replay and is refused (the providers'
-- delivery ids are not signed, the body is). A delivery is pending while
-- its job is being launched; launched with the job's id, ignored (no
-- filter matched, a deleted branch) or refused with the reason.
CREATE TABLE trigger_deliveries (
    trigger_id  uuid NOT NULL REFERENCES job_triggers (id) ON DELETE CASCADE,
    digest      bytea NOT NULL CHECK (length(digest) = 32),
    delivery_id text NOT NULL DEFAULT '' CHECK (length(delivery_id) <= 100),
    event       text NOT NULL CHECK (length(event) <= 100),
    ref         text NOT NULL DEFAULT '' CHECK (length(ref) <= 300),
    commit      text NOT NULL DEFAULT '' CHECK (length(commit) <= 64),
    outcome     text NOT NULL CHECK (outcome IN ('pending', 'launched', 'ignored', 'refused')),
    job_id      uuid,
    reason      text NOT NULL DEFAULT '' CHECK (length(reason) <= 1000),
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (trigger_id, digest)
);
CREATE INDEX trigger_deliveries_recent_idx ON trigger_deliveries (trigger_id, received_at DESC);

-- +goose Down
DROP TABLE trigger_deliveries;
DROP TABLE job_triggers;
