-- +goose Up

-- A fleet of a million (issue 35): what a tick writes should cost what
-- changed. 00067 tracked changes in an indexed column of servers
-- (change_xid), so every update a sync made touched every index of the
-- table (no HOT update), and each row went through a PL/pgSQL trigger. Now
-- changes go, a statement at a time, into a log of their own: an update of
-- a server's labels or fingerprint touches no index of servers and can be
-- HOT. The log holds, per transaction, the handles whose snapshot fields
-- (handle, source, source_hash, whether ORPHANED) changed, were inserted
-- or deleted; a NULL handle says the table was truncated. The snapshot
-- (fleet.Store.LoadSnapshot) reads the handles logged from its last
-- horizon on and looks each up in servers: found, its row is read again;
-- gone, it was deleted or renamed away.
DROP TRIGGER servers_truncated ON servers;
DROP TRIGGER servers_deleted ON servers;
DROP TRIGGER servers_changed ON servers;
DROP FUNCTION autoprov_server_deleted();
DROP FUNCTION autoprov_server_changed();
DROP TABLE server_tombstones;
ALTER TABLE servers DROP COLUMN change_xid;

CREATE TABLE server_changes (
    handle text,
    xid    xid8 NOT NULL DEFAULT pg_current_xact_id(),
    at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX server_changes_xid ON server_changes (xid);
CREATE INDEX server_changes_at ON server_changes (at);

-- +goose StatementBegin
CREATE FUNCTION autoprov_servers_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO server_changes (handle) SELECT handle FROM new_rows;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- The transition tables have no statistics: without hash joins forced, the
-- planner may join them in a nested loop, quadratic in the rows updated.
CREATE FUNCTION autoprov_servers_updated() RETURNS trigger
LANGUAGE plpgsql SET enable_nestloop = off AS $$
BEGIN
    -- Rows are matched by handle: a renamed row is its new handle (no
    -- old row) and its old one (no new row), both logged. Plain status
    -- changes are not.
    INSERT INTO server_changes (handle)
    SELECT n.handle FROM new_rows n LEFT JOIN old_rows o USING (handle)
     WHERE o.handle IS NULL
        OR o.source IS DISTINCT FROM n.source
        OR o.source_hash IS DISTINCT FROM n.source_hash
        OR (o.status = 'ORPHANED') IS DISTINCT FROM (n.status = 'ORPHANED')
    UNION ALL
    SELECT o.handle FROM old_rows o LEFT JOIN new_rows n USING (handle) WHERE n.handle IS NULL;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION autoprov_servers_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        INSERT INTO server_changes (handle) VALUES (NULL);
    ELSE
        INSERT INTO server_changes (handle) SELECT handle FROM old_rows;
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER servers_inserted AFTER INSERT ON servers REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION autoprov_servers_inserted();
CREATE TRIGGER servers_updated AFTER UPDATE ON servers REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION autoprov_servers_updated();
CREATE TRIGGER servers_deleted AFTER DELETE ON servers REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION autoprov_servers_deleted();
CREATE TRIGGER servers_truncated AFTER TRUNCATE ON servers
    FOR EACH STATEMENT EXECUTE FUNCTION autoprov_servers_deleted();

-- The canonical address (00010) without a PL/pgSQL call a row for the
-- common case: a dotted-decimal IPv4 address without leading zeros is its
-- own canonical form, so the trigger and the check need not ask the
-- function. Anything else goes through autoprov_canonical_address as before.
DROP TRIGGER servers_address ON servers;
CREATE TRIGGER servers_address BEFORE INSERT OR UPDATE OF address ON servers FOR EACH ROW
    WHEN (NEW.address !~ '^(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}$')
    EXECUTE FUNCTION autoprov_canonicalize_address();
ALTER TABLE servers DROP CONSTRAINT servers_address_canonical;
ALTER TABLE servers ADD CONSTRAINT servers_address_canonical CHECK (
    address ~ '^(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}$'
    OR NOT autoprov_canonical_address(address) IS DISTINCT FROM address);

-- The handle pattern of messages.ServerHandlePattern, in a form the regex
-- engine checks in one pass (a bounded repeat of {0,127} costs several
-- times more a row).
ALTER TABLE servers DROP CONSTRAINT servers_handle_check;
ALTER TABLE servers ADD CONSTRAINT servers_handle_check CHECK (
    length(handle) <= 128 AND handle ~ '^[A-Za-z0-9][A-Za-z0-9._:@-]*$');

-- +goose Down
ALTER TABLE servers DROP CONSTRAINT servers_handle_check;
ALTER TABLE servers ADD CONSTRAINT servers_handle_check CHECK (handle ~ '^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$');
ALTER TABLE servers DROP CONSTRAINT servers_address_canonical;
ALTER TABLE servers ADD CONSTRAINT servers_address_canonical CHECK (NOT autoprov_canonical_address(address) IS DISTINCT FROM address);
DROP TRIGGER servers_address ON servers;
CREATE TRIGGER servers_address BEFORE INSERT OR UPDATE OF address ON servers
    FOR EACH ROW EXECUTE FUNCTION autoprov_canonicalize_address();
DROP TRIGGER servers_truncated ON servers;
DROP TRIGGER servers_deleted ON servers;
DROP TRIGGER servers_updated ON servers;
DROP TRIGGER servers_inserted ON servers;
DROP FUNCTION autoprov_servers_deleted();
DROP FUNCTION autoprov_servers_updated();
DROP FUNCTION autoprov_servers_inserted();
DROP TABLE server_changes;
ALTER TABLE servers ADD COLUMN change_xid xid8 NOT NULL DEFAULT '0';
ALTER TABLE servers ALTER COLUMN change_xid SET DEFAULT pg_current_xact_id();
CREATE INDEX servers_change_xid ON servers (change_xid);
-- 00067's tombstones and triggers, as it made them.
CREATE TABLE server_tombstones (
    handle     text,
    xid        xid8 NOT NULL DEFAULT pg_current_xact_id(),
    deleted_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX server_tombstones_xid ON server_tombstones (xid);

-- +goose StatementBegin
CREATE FUNCTION autoprov_server_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.handle <> NEW.handle THEN
        INSERT INTO server_tombstones (handle) VALUES (OLD.handle);
    END IF;
    NEW.change_xid := pg_current_xact_id();
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- Only changes a snapshot holds: status changes other than to and from
-- ORPHANED (most of them) keep their HOT updates.
CREATE TRIGGER servers_changed BEFORE UPDATE ON servers FOR EACH ROW
    WHEN (OLD.handle IS DISTINCT FROM NEW.handle OR OLD.source IS DISTINCT FROM NEW.source
       OR OLD.source_hash IS DISTINCT FROM NEW.source_hash
       OR (OLD.status = 'ORPHANED') IS DISTINCT FROM (NEW.status = 'ORPHANED'))
    EXECUTE FUNCTION autoprov_server_changed();

-- +goose StatementBegin
CREATE FUNCTION autoprov_server_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_LEVEL = 'STATEMENT' THEN
        INSERT INTO server_tombstones (handle) VALUES (NULL);
    ELSE
        INSERT INTO server_tombstones (handle) VALUES (OLD.handle);
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER servers_deleted AFTER DELETE ON servers FOR EACH ROW
    EXECUTE FUNCTION autoprov_server_deleted();
CREATE TRIGGER servers_truncated AFTER TRUNCATE ON servers FOR EACH STATEMENT
    EXECUTE FUNCTION autoprov_server_deleted();

