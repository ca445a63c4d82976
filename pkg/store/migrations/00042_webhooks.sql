-- +goose Up

-- webhook_deliveries is the durable queue of webhook calls: one row per
-- deployment and event, delivered at least once by any deployer replica
-- (rows are claimed with FOR UPDATE SKIP LOCKED and a lease).
CREATE TABLE webhook_deliveries (
    id              uuid PRIMARY KEY,
    deployment_id   uuid NOT NULL REFERENCES deployments (id) ON DELETE CASCADE,
    api_key_id      uuid REFERENCES api_keys (id) ON DELETE SET NULL,
    event           text NOT NULL,
    url             text NOT NULL,
    -- body is the exact JSON that is signed and sent.
    body            bytea NOT NULL,
    state           text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    locked_until    timestamptz,
    -- give_up_at bounds the retries in time.
    give_up_at      timestamptz NOT NULL,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    UNIQUE (deployment_id, event)
);

CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';

-- webhook_attempts records every attempt of a delivery.
CREATE TABLE webhook_attempts (
    delivery_id  uuid NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    attempt      integer NOT NULL CHECK (attempt >= 1),
    started_at   timestamptz NOT NULL,
    duration_ms  double precision NOT NULL,
    status_code  integer,
    error        text,
    PRIMARY KEY (delivery_id, attempt)
);

-- +goose Down
DROP TABLE webhook_attempts;
DROP TABLE webhook_deliveries;
