-- +goose Up

-- Servers belong to projects (issue 31): projects lists the projects whose
-- deployments and Ansible jobs may target the server (lower-case UUIDs,
-- sorted, no duplicates); empty means a fleet-only server, which no
-- project-bound API key may target. projects_from_source says the server's
-- source (an inventory's autoprov_projects variable, an EC2 tag) sets them:
-- a sync then writes them and an operator cannot; otherwise an operator
-- does (pkg/fleet's SetProjects). Existing servers start fleet-only.
ALTER TABLE servers
    ADD COLUMN projects             text[]  NOT NULL DEFAULT '{}',
    ADD COLUMN projects_from_source boolean NOT NULL DEFAULT false;

-- The servers of a project (GET /servers?project=, the key-sharing check).
CREATE INDEX servers_projects_idx ON servers USING gin (projects);

-- +goose Down
DROP INDEX servers_projects_idx;
ALTER TABLE servers DROP COLUMN projects_from_source, DROP COLUMN projects;
