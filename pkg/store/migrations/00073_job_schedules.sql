-- +goose Up

-- job_schedules launch a job template on a cron expression in a time zone
-- (issue 36). The scheduler's leader turns due schedules into occurrences
-- (pkg/schedule.Materialize) in the transaction that moves next_at on; the
-- deployer launches each occurrence once, as the schedule's API key, with
-- an Idempotency-Key naming the occurrence. launch holds the launch's
-- overrides and survey answers (never a secret: a template whose survey
-- asks for one cannot be scheduled).
CREATE TABLE job_schedules (
    id          uuid PRIMARY KEY,
    project_id  text NOT NULL
                CHECK (project_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'),
    template_id uuid NOT NULL REFERENCES job_templates (id) ON DELETE CASCADE,
    name        text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    cron        text NOT NULL CHECK (length(cron) BETWEEN 1 AND 200),
    timezone    text NOT NULL DEFAULT '' CHECK (length(timezone) <= 64),
    missed      text NOT NULL DEFAULT 'skip' CHECK (missed IN ('skip', 'run_once')),
    launch      jsonb NOT NULL DEFAULT '{}',
    paused      boolean NOT NULL DEFAULT false,
    next_at     timestamptz NOT NULL,
    api_key_id  uuid REFERENCES api_keys (id) ON DELETE SET NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (project_id, name)
);
CREATE INDEX job_schedules_due_idx ON job_schedules (next_at) WHERE NOT paused;
CREATE INDEX job_schedules_template_idx ON job_schedules (template_id);

-- schedule_occurrences are the occurrences to launch, one row per
-- (schedule, time): the key is what makes one job per occurrence. The
-- deployer sets launched_at with the job's id, or the error that kept it
-- from launching.
CREATE TABLE schedule_occurrences (
    schedule_id uuid NOT NULL REFERENCES job_schedules (id) ON DELETE CASCADE,
    occurrence  timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    launched_at timestamptz,
    job_id      uuid,
    error       text CHECK (length(error) <= 1000),
    PRIMARY KEY (schedule_id, occurrence)
);
CREATE INDEX schedule_occurrences_pending_idx ON schedule_occurrences (created_at) WHERE launched_at IS NULL;

-- +goose Down
DROP TABLE schedule_occurrences;
DROP TABLE job_schedules;
