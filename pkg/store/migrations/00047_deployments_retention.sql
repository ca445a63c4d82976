-- +goose Up

-- Retention of deployments (DEPLOYMENT_RETENTION): finished deployments are
-- deleted in batches. A commit group's row (its publish marks) goes once
-- none of its deployments is left; rather than index deployments by group
-- (an index every submit would pay for), each group counts its deployments
-- deleted so far and is deleted when the count reaches its stored members
-- (its non-empty entries).
ALTER TABLE deployment_publish_groups ADD COLUMN pruned integer NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE deployment_publish_groups DROP COLUMN pruned;
