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

-- +goose Down
DROP TABLE credentials;
