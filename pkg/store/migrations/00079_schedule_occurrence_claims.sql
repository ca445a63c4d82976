-- +goose Up

-- A deployer's Launcher claims a schedule occurrence for a while
-- (claimed_until) instead of holding a transaction open on it while it
-- launches: a launch takes connections of its own (the template, the job,
-- its Idempotency-Key), and launchers that each held one for their claim
-- could take the whole pool and wait on each other for good (issue 36's
-- benchmark of 10,000 occurrences). A claim whose launcher died lapses;
-- the next claim launches the occurrence again under the same
-- Idempotency-Key, which replays the job stored, so it is still one job.
ALTER TABLE schedule_occurrences ADD COLUMN claimed_until timestamptz;

-- +goose Down
ALTER TABLE schedule_occurrences DROP COLUMN claimed_until;
