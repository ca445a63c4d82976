-- +goose Up

-- clean_scopes marks the targets whose last playbook run ended clean: its
-- play succeeded, so nothing of it runs on the target any more. The next
-- run of the scope deletes the mark as it reads it and, when it was there,
-- skips the takeover of earlier runs' work (pkg/ansible, remote.go). A
-- scope is a hash of the target (alias, address, port, pinned host key).
CREATE TABLE clean_scopes (
    scope     text PRIMARY KEY,
    marked_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE clean_scopes;
