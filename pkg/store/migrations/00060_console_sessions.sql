-- +goose Up

-- console_sessions holds the web console's sessions (deployer /ui/): an API
-- key exchanged for a session at sign-in. Only the SHA-256 of the session's
-- random token is stored; the session dies when it expires, at sign-out,
-- and with its key (revoked: checked on each request; deleted: cascade).
CREATE TABLE console_sessions (
    token_hash bytea PRIMARY KEY,
    key_id     uuid NOT NULL REFERENCES api_keys (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX console_sessions_expires_idx ON console_sessions (expires_at);
CREATE INDEX console_sessions_key_idx ON console_sessions (key_id);

-- The console's runs list pages the fleet's runs newest first.
CREATE INDEX runs_created_idx ON runs (created_at DESC, job_id DESC);

-- +goose Down
DROP INDEX runs_created_idx;
DROP TABLE console_sessions;
