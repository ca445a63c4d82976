-- +goose Up

-- 00069 made autoprov_servers_deleted delete the history of the deleted
-- servers with enable_nestloop off, copied from the update trigger, whose
-- join is of two transition tables without indexes. This join is of the
-- deleted rows with server_history, which has an index on handle: a
-- nested loop over it is what a delete of a few servers wants, and without
-- it the delete of one server read the whole history.
ALTER FUNCTION autoprov_servers_deleted() RESET enable_nestloop;

-- +goose Down
ALTER FUNCTION autoprov_servers_deleted() SET enable_nestloop = off;
