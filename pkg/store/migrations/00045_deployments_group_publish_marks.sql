-- +goose Up

-- Publish marks per commit group instead of per deployment. The deployer
-- stores concurrent submits as one group (one multi-row INSERT) and
-- publishes them in one pipeline; marking each deployment published then
-- rewrote every row of the group (an UPDATE per row, mostly not heap-only
-- since a page's free space holds few new versions), as much Postgres work
-- as the INSERT itself. Now each deployment remembers its group and its
-- position in it, and one row per group records the stream entry ids once
-- the group is published: a deployment is published when its own marks
-- (request_id, published_at: set by the republisher and by single submits)
-- or its group's row say so. Neither column is indexed and deployments has
-- no foreign key to the groups, so the INSERT costs no more than before.
ALTER TABLE deployments ADD COLUMN publish_group uuid, ADD COLUMN publish_pos integer;

CREATE TABLE deployment_publish_groups (
    id           uuid PRIMARY KEY,
    -- entries[i] is the stream entry id of the deployment at publish_pos i
    -- ('' for a position whose row was refused and never stored).
    entries      text[] NOT NULL,
    published_at timestamptz NOT NULL DEFAULT now()
);

-- Marks no longer update deployments rows at submit: the room that 00044
-- left on each page for them is not needed.
ALTER TABLE deployments RESET (fillfactor);

-- +goose Down
ALTER TABLE deployments SET (fillfactor = 80);
DROP TABLE deployment_publish_groups;
ALTER TABLE deployments DROP COLUMN publish_group, DROP COLUMN publish_pos;
