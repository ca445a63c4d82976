-- +goose Up

-- An API key belongs to projects: it may submit, read, list, follow and
-- cancel the deployments of those projects only. A fleet-wide key sees every
-- project: admin keys, operator keys for the servers, and keys created with
-- --fleet-wide. Keys made before the binding existed are marked fleet-wide
-- (they could act for any project already) and legacy, so that
-- `deployer keys list` flags them until they are narrowed.
ALTER TABLE api_keys
    ADD COLUMN projects   text[] NOT NULL DEFAULT '{}',
    ADD COLUMN fleet_wide boolean NOT NULL DEFAULT true,
    ADD COLUMN legacy     boolean NOT NULL DEFAULT true;
ALTER TABLE api_keys
    ALTER COLUMN fleet_wide SET DEFAULT false,
    ALTER COLUMN legacy SET DEFAULT false,
    -- A key is fleet-wide or bound to projects (lower-case UUIDs, the rule
    -- of a request's project_id), never both and never neither.
    ADD CONSTRAINT api_keys_binding_check CHECK (
        (fleet_wide AND cardinality(projects) = 0)
        OR (NOT fleet_wide AND NOT legacy AND cardinality(projects) > 0
            AND array_to_string(projects, ',') ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}(,[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})*$'));

-- +goose Down
ALTER TABLE api_keys DROP CONSTRAINT api_keys_binding_check,
    DROP COLUMN legacy, DROP COLUMN fleet_wide, DROP COLUMN projects;
