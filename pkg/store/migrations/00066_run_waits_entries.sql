-- +goose Up

-- The stream entry of each waiting run (issue 33): a run that frees its
-- targets hands its handler slot to the first waiter in their lines
-- (stream.HandOff), which needs the waiter's entry to claim it. Rows
-- written before have none and are left to their recheck.
ALTER TABLE run_waits ADD COLUMN stream text, ADD COLUMN entry text;

-- +goose Down
ALTER TABLE run_waits DROP COLUMN stream, DROP COLUMN entry;
