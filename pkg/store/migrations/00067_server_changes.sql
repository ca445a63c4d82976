-- +goose Up

-- What a tick's fleet snapshot needs to read only what changed since the
-- last one (issue 35; fleet.Store.LoadSnapshot). Each server row carries
-- the id of the transaction that last changed what the snapshot holds of
-- it (handle, source, source_hash, whether it is ORPHANED); deleted rows
-- leave a tombstone with theirs. A snapshot taken at a point where every
-- transaction older than xmin had ended re-reads, next time, the rows and
-- tombstones of transactions from xmin on: those in flight then included,
-- whatever order they commit in. Rows that existed before carry 0: a
-- scheduler's first snapshot reads every row.
ALTER TABLE servers ADD COLUMN change_xid xid8 NOT NULL DEFAULT '0';
ALTER TABLE servers ALTER COLUMN change_xid SET DEFAULT pg_current_xact_id();
CREATE INDEX servers_change_xid ON servers (change_xid);

-- handle NULL: the table was truncated, every snapshot reads it all again.
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

-- +goose Down
DROP TRIGGER servers_truncated ON servers;
DROP TRIGGER servers_deleted ON servers;
DROP TRIGGER servers_changed ON servers;
DROP FUNCTION autoprov_server_deleted();
DROP FUNCTION autoprov_server_changed();
DROP TABLE server_tombstones;
ALTER TABLE servers DROP COLUMN change_xid;
