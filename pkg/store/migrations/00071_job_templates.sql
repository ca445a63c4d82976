-- +goose Up

-- job_templates are a project's stored Ansible jobs (issue 36): a name, and
-- its current version. Every change adds a row to job_template_versions and
-- never rewrites one, so a job launched from a template names the version
-- it ran (in its job_request's "template") and that version stays readable.
CREATE TABLE job_templates (
    id         uuid PRIMARY KEY,
    project_id text NOT NULL
               CHECK (project_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'),
    name       text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    version    integer NOT NULL CHECK (version >= 1),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (project_id, name)
);

-- A version's definition is the template as it was saved: the job (its
-- credentials as names or references, never values), what a launch may
-- override, and the survey (defaults of secret questions are refused).
CREATE TABLE job_template_versions (
    template_id uuid NOT NULL REFERENCES job_templates (id) ON DELETE CASCADE,
    version     integer NOT NULL CHECK (version >= 1),
    definition  jsonb NOT NULL,
    api_key_id  uuid REFERENCES api_keys (id) ON DELETE SET NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (template_id, version)
);

-- +goose Down
DROP TABLE job_template_versions;
DROP TABLE job_templates;
