-- +goose Up

-- Ansible jobs (ansible:job:queue) are runs of kind 'job': one row per job
-- id, as for provisioning and deploys, so that a redelivered job is
-- recognised and its stored result published again. Their target is the
-- sorted, space-separated list of their hosts' lock keys.
ALTER TABLE runs DROP CONSTRAINT runs_kind_check,
    ADD CONSTRAINT runs_kind_check CHECK (kind IN ('provision', 'deploy', 'job'));

-- +goose Down
DELETE FROM runs WHERE kind = 'job';
ALTER TABLE runs DROP CONSTRAINT runs_kind_check,
    ADD CONSTRAINT runs_kind_check CHECK (kind IN ('provision', 'deploy'));
