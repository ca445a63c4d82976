-- +goose Up

-- A submit's publish mark (request_id, published_at set once its XADD is
-- done) used to change a column of deployments_unpublished_idx's predicate,
-- which made every mark a full update: a new row version and a new entry
-- in each of the table's seven indexes, about half of Postgres's work per
-- submit. Without that index the mark touches no indexed column, and with
-- room left on each page (fillfactor) Postgres writes it as a heap-only
-- (HOT) update. The republisher finds unpublished deployments through
-- deployments_status_idx instead (status 'queued', by created_at): only
-- queued deployments can be unpublished.
DROP INDEX deployments_unpublished_idx;
ALTER TABLE deployments SET (fillfactor = 80);

-- +goose Down
ALTER TABLE deployments RESET (fillfactor);
CREATE INDEX deployments_unpublished_idx ON deployments (created_at) WHERE published_at IS NULL AND source = 'api';
