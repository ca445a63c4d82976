-- +goose Up

-- servers is the fleet's source of truth. A server can be registered with
--   INSERT INTO servers (handle, address, ssh_port) VALUES (...)
-- and every other column takes its default.
CREATE TABLE servers (
    handle             text PRIMARY KEY
                       CHECK (handle ~ '^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$'),
    address            text NOT NULL CHECK (address <> ''),
    ssh_port           integer NOT NULL DEFAULT 22 CHECK (ssh_port BETWEEN 1 AND 65535),
    ssh_user           text NOT NULL DEFAULT 'root' CHECK (ssh_user <> ''),
    status             text NOT NULL DEFAULT 'NEW'
                       CHECK (status IN ('NEW', 'QUEUED', 'PROVISIONING', 'READY',
                                         'FAILED', 'UNREACHABLE', 'ORPHANED')),
    labels             jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- source names where the server came from: 'manual', 'static:<file>', 'time4vps'.
    source             text NOT NULL DEFAULT 'manual',
    -- provider_id is the server's id at its provider (the Time4VPS server id).
    provider_id        text,
    -- ssh_key_ref is the secret reference (never the value) of the SSH
    -- private key; NULL means the service's default key.
    ssh_key_ref        text,
    -- host_key is the pinned SSH host key in authorized_keys format (trust on
    -- first use); a different key presented later fails the connection.
    host_key           text,
    host_key_pinned_at timestamptz,
    attempts           integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error         text,
    last_job_id        text,
    -- notified_status is the terminal status last notified about, so that each
    -- terminal state is notified once.
    notified_status    text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    status_changed_at  timestamptz NOT NULL DEFAULT now(),
    -- version increases on every update; writers compare and set on it.
    version            bigint NOT NULL DEFAULT 1
);

CREATE INDEX servers_address_idx ON servers (address);
CREATE INDEX servers_status_idx ON servers (status);

-- +goose StatementBegin
CREATE FUNCTION servers_touch() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.version := OLD.version + 1;
    NEW.updated_at := now();
    IF NEW.status IS DISTINCT FROM OLD.status THEN
        NEW.status_changed_at := now();
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER servers_touch BEFORE UPDATE ON servers
    FOR EACH ROW EXECUTE FUNCTION servers_touch();

-- runs holds one row per processed request, keyed by its job id, so that a
-- redelivered request is recognised: a finished one has its stored result
-- re-published, a running one is left to its owner.
CREATE TABLE runs (
    job_id        text PRIMARY KEY CHECK (job_id <> ''),
    kind          text NOT NULL CHECK (kind IN ('provision', 'deploy')),
    stream        text NOT NULL,
    request_id    text NOT NULL,
    -- target is the lock key of the run: the server handle, or address:port
    -- for a deploy to an unregistered server.
    target        text NOT NULL,
    server_handle text REFERENCES servers (handle) ON DELETE SET NULL ON UPDATE CASCADE,
    playbook      text,
    state         text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'done')),
    status        text CHECK (status IN ('succeeded', 'failed', 'unreachable', 'rejected', 'cancelled')),
    error_kind    text,
    -- result is the msgpack-encoded (redacted) result as published.
    result        bytea,
    -- checkpoint records progress that must not be repeated when another
    -- instance takes the run over (for example a provider reinstall task id).
    checkpoint    jsonb NOT NULL DEFAULT '{}'::jsonb,
    owner         text,
    attempt       integer NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    created_at    timestamptz NOT NULL DEFAULT now(),
    started_at    timestamptz,
    finished_at   timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CHECK ((state = 'done') = (status IS NOT NULL))
);

CREATE INDEX runs_target_idx ON runs (target, created_at DESC);
CREATE INDEX runs_server_idx ON runs (server_handle, created_at DESC) WHERE server_handle IS NOT NULL;
CREATE INDEX runs_running_idx ON runs (updated_at) WHERE state = 'running';

-- host_keys pins the SSH host keys of deploy targets that are not
-- registered servers (registered servers pin theirs in servers.host_key).
CREATE TABLE host_keys (
    address    text NOT NULL,
    ssh_port   integer NOT NULL CHECK (ssh_port BETWEEN 1 AND 65535),
    host_key   text NOT NULL,
    pinned_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (address, ssh_port)
);

-- +goose Down
DROP TABLE host_keys;
DROP TABLE runs;
DROP TABLE servers;
DROP FUNCTION servers_touch();
