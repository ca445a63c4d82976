-- +goose Up

-- The console's overview counts a day of runs per hour and status
-- (deployments and Ansible jobs in deployments, provisioning runs in runs).
-- Its queries read only these columns: covering indexes let them scan the
-- index alone instead of every wide row of the day (issue 34: 269 ms to
-- about 60 ms for 112,000 rows of a day, under load).
CREATE INDEX deployments_hourly_idx ON deployments (created_at, kind) INCLUDE (status, project_id);
CREATE INDEX runs_hourly_idx ON runs (kind, created_at) INCLUDE (status);

-- +goose Down
DROP INDEX runs_hourly_idx;
DROP INDEX deployments_hourly_idx;
