-- +goose Up

-- A fleet of a million (issue 35): a first listing inserts every server
-- of its source in one transaction, and the insert trigger of 00068 logged
-- each of their handles in server_changes (a heap row and two index
-- entries a server: about a tenth of the listing's time in Postgres). A
-- snapshot that finds that many changes reads every row of servers anyway
-- (fleet.Store.LoadSnapshot), so the handles are never read. A
-- transaction that sets autoprov.change_log to 'summary' (set_config(...,
-- true): its own, until it ends) logs its inserts as one NULL handle a
-- statement instead, which makes the next load of every snapshot read
-- every row, as a truncation does. pkg/fleet sets it once a sync has
-- inserted more servers than a load would look up one by one. Updates and
-- deletes are always logged handle by handle.

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION autoprov_servers_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('autoprov.change_log', true) = 'summary' THEN
        INSERT INTO server_changes (handle) VALUES (NULL);
    ELSE
        INSERT INTO server_changes (handle) SELECT handle FROM new_rows;
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION autoprov_servers_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO server_changes (handle) SELECT handle FROM new_rows;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
