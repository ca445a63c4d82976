-- +goose Up

-- workflows are templates of templates (issue 36): a graph of nodes, each
-- a job template's launch or an approval, joined by edges taken on
-- success, on failure or always. graph holds the nodes and edges
-- (services/deployer/internal/workflows), checked when saved: no cycle,
-- every template of the project. version counts its changes; a run keeps
-- the graph it started with.
CREATE TABLE workflows (
    id          uuid PRIMARY KEY,
    project_id  text NOT NULL
                CHECK (project_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'),
    name        text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    description text NOT NULL DEFAULT '' CHECK (length(description) <= 1000),
    graph       jsonb NOT NULL,
    version     integer NOT NULL DEFAULT 1 CHECK (version > 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (project_id, name)
);

-- workflow_runs are the launches of a workflow, run by the deployers'
-- workflow engines (one at a time per run: FOR UPDATE SKIP LOCKED). A run
-- launches its jobs as the API key that launched it (checked at each
-- launch). extra_vars are the launch's, given to every job node.
CREATE TABLE workflow_runs (
    id              uuid PRIMARY KEY,
    workflow_id     uuid NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    project_id      text NOT NULL,
    version         integer NOT NULL,
    graph           jsonb NOT NULL,
    extra_vars      jsonb NOT NULL DEFAULT '{}',
    api_key_id      uuid REFERENCES api_keys (id) ON DELETE SET NULL,
    idempotency_key text CHECK (length(idempotency_key) <= 255),
    status          text NOT NULL CHECK (status IN ('running', 'cancelling', 'succeeded', 'failed', 'cancelled')),
    error           text NOT NULL DEFAULT '' CHECK (length(error) <= 2000),
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    UNIQUE (workflow_id, idempotency_key)
);
CREATE INDEX workflow_runs_active_idx ON workflow_runs (created_at) WHERE status IN ('running', 'cancelling');
CREATE INDEX workflow_runs_recent_idx ON workflow_runs (workflow_id, created_at DESC);

-- workflow_nodes are the nodes of a run: pending until their parents are
-- done, then running (a job), waiting (an approval, until deadline), and
-- at last succeeded, failed, skipped (no edge led to it) or cancelled.
-- outcome says why a node ended as it did (the job's status, approved,
-- denied, timed_out); artifacts are its job's set_stats data.
CREATE TABLE workflow_nodes (
    run_id      uuid NOT NULL REFERENCES workflow_runs (id) ON DELETE CASCADE,
    node        text NOT NULL,
    status      text NOT NULL CHECK (status IN ('pending', 'running', 'waiting', 'succeeded', 'failed', 'skipped', 'cancelled')),
    outcome     text NOT NULL DEFAULT '' CHECK (length(outcome) <= 100),
    job_id      uuid,
    artifacts   jsonb,
    deadline    timestamptz,
    decided_by  uuid,
    reason      text NOT NULL DEFAULT '' CHECK (length(reason) <= 1000),
    error       text NOT NULL DEFAULT '' CHECK (length(error) <= 2000),
    started_at  timestamptz,
    finished_at timestamptz,
    PRIMARY KEY (run_id, node)
);

-- +goose Down
DROP TABLE workflow_nodes;
DROP TABLE workflow_runs;
DROP TABLE workflows;
