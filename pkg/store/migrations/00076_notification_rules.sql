-- +goose Up

-- notification_rules tell people about a project's template-launched jobs
-- (issue 36): on start, success, failure or (once workflows exist) an
-- approval needed, through Slack, Telegram, email (SMTP) or a signed
-- webhook. A rule belongs to a project, and to one of its templates or
-- (template_id NULL) to every template of the project. Its secret part
-- (the Slack webhook URL, the Telegram bot token, the SMTP password, the
-- webhook signing secret) is a credential of the project, named here:
-- no row holds a secret. target is the channel's address: a Telegram
-- chat, email recipients, a webhook URL ('' for Slack, whose URL is the
-- secret). email holds the SMTP server, sender and user name of an email
-- rule ('{}' for the others).
CREATE TABLE notification_rules (
    id          uuid PRIMARY KEY,
    project_id  text NOT NULL
                CHECK (project_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'),
    template_id uuid REFERENCES job_templates (id) ON DELETE CASCADE,
    name        text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    channel     text NOT NULL CHECK (channel IN ('slack', 'telegram', 'email', 'webhook')),
    target      text NOT NULL DEFAULT '' CHECK (length(target) <= 2048),
    credential  text NOT NULL DEFAULT '' CHECK (credential = '' OR credential ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    email       jsonb NOT NULL DEFAULT '{}',
    events      text[] NOT NULL
                CHECK (cardinality(events) BETWEEN 1 AND 4
                       AND events <@ ARRAY['started', 'succeeded', 'failed', 'approval_needed']),
    api_key_id  uuid REFERENCES api_keys (id) ON DELETE SET NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (project_id, name)
);
CREATE INDEX notification_rules_project_idx ON notification_rules (project_id);

-- job_notifications is the outbox of the rules: one row per rule and
-- event of a job, written in the transaction of the change (the triggers
-- below), so an event is notified exactly once; the scheduler's notifier
-- delivers them and marks each in the transaction that read it. status
-- and error_kind are the job's at the event.
CREATE TABLE job_notifications (
    id              bigserial PRIMARY KEY,
    rule_id         uuid NOT NULL REFERENCES notification_rules (id) ON DELETE CASCADE,
    deployment_id   uuid NOT NULL REFERENCES deployments (id) ON DELETE CASCADE,
    event           text NOT NULL CHECK (event IN ('started', 'succeeded', 'failed', 'approval_needed')),
    status          text NOT NULL,
    error_kind      text NOT NULL DEFAULT '',
    state           text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text NOT NULL DEFAULT '' CHECK (length(last_error) <= 1000),
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    UNIQUE (rule_id, deployment_id, event)
);
CREATE INDEX job_notifications_pending_idx ON job_notifications (next_attempt_at, id) WHERE state = 'pending';
CREATE INDEX job_notifications_deployment_idx ON job_notifications (deployment_id);

-- +goose StatementBegin
-- autoprov_job_notify queues event ev of the job of deployment d for every
-- rule of its project that names the event and its template (or none).
-- A job not launched from a template queues nothing.
CREATE FUNCTION autoprov_job_notify(d deployments, ev text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    tpl uuid;
BEGIN
    IF d.kind <> 'job' OR d.project_id IS NULL OR d.job_request IS NULL
       OR COALESCE(jsonb_typeof(d.job_request -> 'template'), '') <> 'object' THEN
        RETURN;
    END IF;
    -- A malformed id (no template of the deployer writes one) matches only
    -- the project's rules: a notification never fails the change.
    IF d.job_request -> 'template' ->> 'id' ~ '^[0-9a-fA-F-]{36}$' THEN
        tpl := (d.job_request -> 'template' ->> 'id')::uuid;
    END IF;
    INSERT INTO job_notifications (rule_id, deployment_id, event, status, error_kind)
    SELECT r.id, d.id, ev, d.status, COALESCE(d.error_kind, '')
      FROM notification_rules r
     WHERE r.project_id = d.project_id
       AND (r.template_id IS NULL OR r.template_id = tpl)
       AND ev = ANY (r.events)
    ON CONFLICT (rule_id, deployment_id, event) DO NOTHING;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- A job starts when infra inserts its run (store.StartRun): started.
CREATE FUNCTION autoprov_job_run_started() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    d deployments;
BEGIN
    SELECT * INTO d FROM deployments WHERE job_id = NEW.job_id;
    IF FOUND THEN
        PERFORM autoprov_job_notify(d, 'started');
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- A job's first final status: succeeded, else failed (failed,
-- unreachable, rejected, cancelled).
CREATE FUNCTION autoprov_job_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM autoprov_job_notify(NEW, CASE WHEN NEW.status = 'succeeded' THEN 'succeeded' ELSE 'failed' END);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER runs_job_started AFTER INSERT ON runs
    FOR EACH ROW WHEN (NEW.kind = 'job' AND NEW.state = 'running')
    EXECUTE FUNCTION autoprov_job_run_started();
CREATE TRIGGER deployments_job_finished AFTER UPDATE OF status ON deployments
    FOR EACH ROW WHEN (NEW.kind = 'job' AND OLD.status = 'queued' AND NEW.status <> 'queued')
    EXECUTE FUNCTION autoprov_job_finished();

-- +goose Down
DROP TRIGGER deployments_job_finished ON deployments;
DROP TRIGGER runs_job_started ON runs;
DROP FUNCTION autoprov_job_finished();
DROP FUNCTION autoprov_job_run_started();
DROP FUNCTION autoprov_job_notify(deployments, text);
DROP TABLE job_notifications;
DROP TABLE notification_rules;
