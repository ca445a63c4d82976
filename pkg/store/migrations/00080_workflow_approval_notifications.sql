-- +goose Up

-- approval_needed (issue 36): when a workflow run's approval node starts
-- waiting, every rule of the run's project (the project's own rules, not a
-- template's: an approval belongs to no template) that names the event
-- queues one notification, in the transaction of the change, as a job's
-- events do (00076). Such a row names the run and node instead of a
-- deployment.
ALTER TABLE job_notifications
    ALTER COLUMN deployment_id DROP NOT NULL,
    ADD COLUMN workflow_run_id uuid REFERENCES workflow_runs (id) ON DELETE CASCADE,
    ADD COLUMN node text NOT NULL DEFAULT '' CHECK (length(node) <= 64),
    ADD CONSTRAINT job_notifications_subject CHECK ((deployment_id IS NULL) <> (workflow_run_id IS NULL));
CREATE UNIQUE INDEX job_notifications_approval_once ON job_notifications (rule_id, workflow_run_id, node, event)
    WHERE workflow_run_id IS NOT NULL;

-- +goose StatementBegin
CREATE FUNCTION autoprov_workflow_approval_needed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_notifications (rule_id, workflow_run_id, node, event, status)
    SELECT r.id, NEW.run_id, NEW.node, 'approval_needed', 'waiting'
      FROM workflow_runs w
      JOIN notification_rules r ON r.project_id = w.project_id
     WHERE w.id = NEW.run_id
       AND r.template_id IS NULL
       AND 'approval_needed' = ANY (r.events)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER workflow_nodes_approval_needed AFTER UPDATE OF status ON workflow_nodes
    FOR EACH ROW WHEN (NEW.status = 'waiting' AND OLD.status <> 'waiting')
    EXECUTE FUNCTION autoprov_workflow_approval_needed();

-- +goose Down
DROP TRIGGER workflow_nodes_approval_needed ON workflow_nodes;
DROP FUNCTION autoprov_workflow_approval_needed();
DELETE FROM job_notifications WHERE workflow_run_id IS NOT NULL;
DROP INDEX job_notifications_approval_once;
ALTER TABLE job_notifications
    DROP CONSTRAINT job_notifications_subject,
    DROP COLUMN node,
    DROP COLUMN workflow_run_id,
    ALTER COLUMN deployment_id SET NOT NULL;
