-- +goose Up

-- api_keys are the deployer's API keys. Only a SHA-256 hash of each key is
-- stored (keys carry 256 random bits, so a plain hash cannot be reversed);
-- the key itself is shown once, when it is created.
CREATE TABLE api_keys (
    id           uuid PRIMARY KEY,
    name         text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    -- prefix is the start of the key, enough to recognise it in a list.
    prefix       text NOT NULL,
    hash         bytea NOT NULL UNIQUE CHECK (length(hash) = 32),
    scopes       text[] NOT NULL CHECK (cardinality(scopes) > 0),
    -- rate_limit is the key's requests per second; NULL means the default.
    rate_limit   integer CHECK (rate_limit IS NULL OR rate_limit > 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    revoked_at   timestamptz
);

-- A name belongs to one live key at a time; revoked keys keep theirs.
CREATE UNIQUE INDEX api_keys_live_name_idx ON api_keys (name) WHERE revoked_at IS NULL;

-- +goose Down
DROP TABLE api_keys;
