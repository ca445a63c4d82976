-- +goose Up

-- A fleet of a million (issue 35): a first listing writes a history row
-- ("detected") for each new server, in the transaction that inserted it.
-- The foreign key of server_history checked each such row with a
-- SELECT ... FOR KEY SHARE on the server just inserted, which locks (and
-- so writes) the server's tuple a second time: about a sixth of the first
-- listing's time in Postgres, for a check that cannot fail. Every history
-- row is written by pkg/fleet in the transaction that holds the server's
-- row (locked by its update or insert), so the server exists when the row
-- commits. What the key did besides checking, following a deleted or
-- renamed server, the triggers below do (servers are never deleted or
-- renamed by the services; an operator may, by hand).
ALTER TABLE server_history DROP CONSTRAINT server_history_handle_fkey;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION autoprov_servers_deleted() RETURNS trigger
LANGUAGE plpgsql SET enable_nestloop = off AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        INSERT INTO server_changes (handle) VALUES (NULL);
        DELETE FROM server_history;
    ELSE
        INSERT INTO server_changes (handle) SELECT handle FROM old_rows;
        DELETE FROM server_history h USING old_rows o WHERE h.handle = o.handle;
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION autoprov_server_renamed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE server_history SET handle = NEW.handle WHERE handle = OLD.handle;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER servers_renamed AFTER UPDATE OF handle ON servers FOR EACH ROW
    WHEN (OLD.handle IS DISTINCT FROM NEW.handle)
    EXECUTE FUNCTION autoprov_server_renamed();

-- +goose Down
DROP TRIGGER servers_renamed ON servers;
DROP FUNCTION autoprov_server_renamed();
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION autoprov_servers_deleted() RETURNS trigger
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
DELETE FROM server_history h WHERE NOT EXISTS (SELECT 1 FROM servers s WHERE s.handle = h.handle);
ALTER TABLE server_history ADD CONSTRAINT server_history_handle_fkey
    FOREIGN KEY (handle) REFERENCES servers (handle) ON DELETE CASCADE ON UPDATE CASCADE;
