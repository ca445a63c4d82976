package cases

import (
	"fmt"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// The job id, project and commit of the job vectors.
const (
	jobProject = "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f"
	jobCommit  = "3f9a1c0d2e4b6a8c0e1f2a3b4c5d6e7f8a9b0c1d"
)

// jobGoldens returns the golden vectors of Ansible jobs.
func jobGoldens() []Golden {
	return []Golden{
		{"ansible_job_message_playbook.msgpack", "AnsibleJobMessage", &messages.AnsibleJobMessage{
			RequestMeta: messages.RequestMeta{SchemaVersion: 1, JobID: "job-2024-05-01-0001",
				CorrelationID: "ci/pipeline-981", CreatedAt: "2024-05-01T12:00:00.000Z"},
			ProjectID: jobProject,
			Source: messages.JobSource{Type: messages.SourcePlaybook, Repository: "https://git.example.com/acme/ops.git",
				Ref: "v1.4.0", Paths: []string{"site.yml", "playbooks/check.yml"},
				GitCredential: "vault:secret/data/acme/ci#git_token"},
			Inventory: messages.JobInventory{Type: messages.InventoryInline,
				Hosts: map[string]messages.Vars{
					"web-1": {"ansible_host": "198.51.100.7", "ansible_port": int64(2222), "role": "frontend"},
					"web-2": {"ansible_host": "198.51.100.8"},
				},
				Groups: map[string]messages.InventoryGroup{"web": {Hosts: []string{"web-1", "web-2"},
					Vars: messages.Vars{"http_port": int64(8080), "ratio": 0.5, "features": []any{"gzip", true, nil}}}},
			},
			Credentials: messages.JobCredentials{SSH: "vault:secret/data/acme/ssh#key",
				VaultPassword: "vault:secret/data/acme/ci#vault_password"},
			Options: messages.JobOptions{ExtraVars: messages.Vars{"release": "2024.05", "opts": map[string]any{"dry": false}},
				Tags: []string{"deploy"}, Limit: "web", Diff: true, Verbosity: 1, Forks: 10, TimeoutSeconds: 600,
				Pool: "linux", CallbackURL: "https://ci.example.com/hooks/ansible"},
		}},
		{"ansible_job_message_collection_role.msgpack", "AnsibleJobMessage", &messages.AnsibleJobMessage{
			RequestMeta: messages.RequestMeta{SchemaVersion: 1, JobID: "job-2024-05-01-0002"},
			ProjectID:   jobProject,
			Source: messages.JobSource{Type: messages.SourceCollectionRole, Collection: "acme.web", Role: "nginx",
				Version: ">=1.0.0,<2.0.0", GalaxyServer: "https://galaxy.example.com/api/",
				RoleVars: messages.Vars{"nginx_workers": int64(4)}},
			Inventory: messages.JobInventory{Type: messages.InventoryDynamic, Plugin: "acme.cloud.hosts",
				Config: messages.Vars{"regions": []any{"eu-1"}, "keyed_groups": []any{map[string]any{"key": "tags"}}}},
			Credentials: messages.JobCredentials{Cloud: "vault:secret/data/acme/cloud#token",
				Galaxy: "env:GALAXY_TOKEN"},
		}},
		{"ansible_job_result_partial.msgpack", "AnsibleJobResult", &messages.AnsibleJobResult{
			Outcome: messages.Outcome{SchemaVersion: 1, JobID: "job-2024-05-01-0001", RequestID: "1714564800000-0",
				CorrelationID: "ci/pipeline-981", Status: messages.StatusFailed,
				Error: &messages.ErrorInfo{Kind: messages.KindHostsUnreachable, Message: "1 of 3 hosts unreachable"},
				Hosts: map[string]messages.HostRecap{"web-1": {Ok: 3, Changed: 1}, "web-2": {Ok: 4},
					"web-3": {Unreachable: 1}},
				Playbook: "site.yml", StartedAt: "2024-05-01T12:00:01.000Z", FinishedAt: "2024-05-01T12:00:09.500Z",
				DurationMS: 8500, Attempt: 1},
			ProjectID: jobProject, Pool: "linux", Commit: jobCommit,
			Playbooks: []messages.PlaybookOutcome{
				{Playbook: "site.yml", Status: messages.PlaybookUnreachable, ErrorKind: messages.KindHostsUnreachable, DurationMS: 8400},
				{Playbook: "playbooks/check.yml", Status: messages.PlaybookSkipped},
			},
		}},
	}
}

// validJob returns a valid playbook job on an inline inventory.
func validJob() *messages.AnsibleJobMessage {
	return &messages.AnsibleJobMessage{
		ProjectID: jobProject,
		Source: messages.JobSource{Type: messages.SourcePlaybook, Repository: "http://127.0.0.1:9418/ops.git",
			Paths: []string{"site.yml"}},
		Inventory: messages.JobInventory{Type: messages.InventoryInline,
			Hosts: map[string]messages.Vars{"t1": {"ansible_host": "198.51.100.2"}}},
	}
}

func jobCases() []Validation {
	j := func(edit func(m *messages.AnsibleJobMessage)) *messages.AnsibleJobMessage {
		m := validJob()
		edit(m)
		return m
	}
	valid := func(name string, edit func(m *messages.AnsibleJobMessage)) Validation {
		return Validation{Name: name, Msg: j(edit)}
	}
	invalid := func(name string, edit func(m *messages.AnsibleJobMessage), want ...messages.FieldError) Validation {
		return Validation{Name: name, Msg: j(edit), Want: want}
	}
	only := func(field, key, types string) messages.FieldError {
		return fe(field, fmt.Sprintf("only allowed when %s is %s", key, types))
	}
	return []Validation{
		valid("playbook on inline hosts", func(*messages.AnsibleJobMessage) {}),
		valid("role with vars on a git inventory", func(m *messages.AnsibleJobMessage) {
			m.Source = messages.JobSource{Type: messages.SourceRole, Repository: "https://git.example.com/r.git",
				Ref: "main", RolePath: "roles/web", RoleVars: messages.Vars{"x": int64(1)}}
			m.Inventory = messages.JobInventory{Type: messages.InventoryGit, Repository: "https://git.example.com/inv.git",
				Path: "hosts.ini", Credential: "env:GIT_TOKEN"}
		}),
		valid("collection role on a url inventory", func(m *messages.AnsibleJobMessage) {
			m.Source = messages.JobSource{Type: messages.SourceCollectionRole, Collection: "acme.web", Role: "nginx"}
			m.Inventory = messages.JobInventory{Type: messages.InventoryURL, URL: "https://inv.example.com/hosts.yml"}
		}),
		valid("every option", func(m *messages.AnsibleJobMessage) {
			m.Options = messages.JobOptions{ExtraVars: messages.Vars{"a": "{{ lookup('pipe','id') }}"},
				Tags: []string{"a", "b"}, SkipTags: []string{"c"}, Limit: "web:&prod:!web-3", Check: true, Diff: true,
				Verbosity: 4, Forks: 200, TimeoutSeconds: 86400, Pool: "gpu-1"}
			m.Credentials = messages.JobCredentials{SSH: "env:K", BecomePassword: "env:B", VaultPassword: "file:/run/v"}
		}),
		invalid("empty", func(m *messages.AnsibleJobMessage) { *m = messages.AnsibleJobMessage{} },
			fe("project_id", msgRequired), fe("source.type", msgRequired), fe("inventory.type", msgRequired)),
		invalid("unknown types", func(m *messages.AnsibleJobMessage) {
			m.Source.Type, m.Inventory.Type = "script", "file"
		}, fe("source.type", "must be one of playbook, role, collection_role"),
			only("source.repository", "source.type", "playbook or role"),
			only("source.paths", "source.type", "playbook"),
			fe("inventory.type", "must be one of inline, git, url, dynamic"),
			only("inventory.hosts", "inventory.type", "inline")),
		invalid("playbook without repository and paths", func(m *messages.AnsibleJobMessage) {
			m.Source.Repository, m.Source.Paths = "", nil
		}, fe("source.repository", "required when source.type is playbook"),
			fe("source.paths", "required when source.type is playbook")),
		invalid("credentials in the URL", func(m *messages.AnsibleJobMessage) {
			m.Source.Repository = "https://user:tok@git.example.com/r.git"
		}, fe("source.repository", "must be an http or https URL without user, password, query or fragment")),
		invalid("ssh URL", func(m *messages.AnsibleJobMessage) {
			m.Source.Repository = "ssh://git.example.com/r.git"
		}, fe("source.repository", "must be an http or https URL without user, password, query or fragment")),
		invalid("path traversal", func(m *messages.AnsibleJobMessage) {
			m.Source.Paths = []string{"../etc/x.yml", "/abs.yml", "a/../../b.yml", "ok.yml"}
		}, fe("source.paths[0]", "must be a relative path inside the repository (no '..', not absolute)"),
			fe("source.paths[1]", "must be a relative path inside the repository (no '..', not absolute)"),
			fe("source.paths[2]", "must be a relative path inside the repository (no '..', not absolute)")),
		invalid("bad ref", func(m *messages.AnsibleJobMessage) { m.Source.Ref = "-x" },
			fe("source.ref", "must use only ASCII letters, digits and . _ / - and be a valid git ref")),
		invalid("secret value instead of a reference", func(m *messages.AnsibleJobMessage) {
			m.Credentials.VaultPassword = "hunter2"
		}, fe("credentials.vault_password", msgSecretRef)),
		invalid("connection variable in an inline host", func(m *messages.AnsibleJobMessage) {
			m.Inventory.Hosts["t1"]["ansible_connection"] = "local"
		}, fe("inventory.hosts[t1][ansible_connection]", "is a connection variable an inventory may not set")),
		invalid("connection variable in a group", func(m *messages.AnsibleJobMessage) {
			m.Inventory.Groups = map[string]messages.InventoryGroup{"g": {Hosts: []string{"t1"},
				Vars: messages.Vars{"ansible_ssh_common_args": "-o ProxyCommand=x"}}}
		}, fe("inventory.groups[g].vars[ansible_ssh_common_args]", "is a connection variable an inventory may not set")),
		{Name: "group naming an unknown host", Msg: j(func(m *messages.AnsibleJobMessage) {
			m.Inventory.Groups = map[string]messages.InventoryGroup{"g": {Hosts: []string{"nope"}}}
		}), Want: []messages.FieldError{fe("inventory.groups[g].hosts[0]", "must be a host of inventory.hosts")},
			SchemaDiffers: "a schema cannot check that a group's hosts are keys of inventory.hosts"},
		invalid("ansible_ variable in extra_vars", func(m *messages.AnsibleJobMessage) {
			m.Options.ExtraVars = messages.Vars{"ansible_connection": "local", "ok": 1}
		}, fe("options.extra_vars[ansible_connection]", "must not start with ansible_ (connection variables cannot be set here)")),
		invalid("bad variable name", func(m *messages.AnsibleJobMessage) {
			m.Options.ExtraVars = messages.Vars{"a-b": 1}
		}, fe("options.extra_vars[a-b]", "must be a variable name matching ^[A-Za-z_][A-Za-z0-9_]{0,127}$")),
		valid("secret variables", func(m *messages.AnsibleJobMessage) {
			m.Options.ExtraVars = messages.Vars{"release": "1"}
			m.Options.SecretVars = map[string]string{"db_password": "vault:secret/p/db#password", "token": "env:T"}
		}),
		invalid("secret variables that are no references or bad names", func(m *messages.AnsibleJobMessage) {
			m.Options.SecretVars = map[string]string{"a-b": "env:T", "ansible_become_pass": "env:T", "p": "hunter2"}
		}, fe("options.secret_vars[a-b]", "must be a variable name matching ^[A-Za-z_][A-Za-z0-9_]{0,127}$"),
			fe("options.secret_vars[ansible_become_pass]", "must not start with ansible_ (connection variables cannot be set here)"),
			fe("options.secret_vars[p]", msgSecretRef)),
		{Name: "secret variable that is an extra variable too", Msg: j(func(m *messages.AnsibleJobMessage) {
			m.Options.ExtraVars = messages.Vars{"p": "x"}
			m.Options.SecretVars = map[string]string{"p": "env:T"}
		}), Want: []messages.FieldError{fe("options.secret_vars[p]", "is an extra variable too")},
			SchemaDiffers: "a schema cannot check that two maps have no key in common"},
		invalid("options out of range", func(m *messages.AnsibleJobMessage) {
			m.Options = messages.JobOptions{Verbosity: 5, Forks: 201, TimeoutSeconds: -1, Pool: "GPU", Limit: "@file"}
		}, fe("options.limit", "must be a host pattern matching ^[A-Za-z0-9_.:,!&*\\[\\]~-]+$"),
			fe("options.verbosity", "must be between 0 and 4"),
			fe("options.forks", "must be between 1 and 200"),
			fe("options.timeout_seconds", "must be between 1 and 86400 (seconds)"),
			fe("options.pool", "must match ^[a-z0-9][a-z0-9-]{0,31}$")),
		invalid("role keys on a playbook", func(m *messages.AnsibleJobMessage) {
			m.Source.RolePath, m.Source.Collection = "roles/x", "a.b"
		}, only("source.role_path", "source.type", "role"), only("source.collection", "source.type", "collection_role")),
		invalid("collection role without collection and role", func(m *messages.AnsibleJobMessage) {
			m.Source = messages.JobSource{Type: messages.SourceCollectionRole, Version: "1.0.0"}
		}, fe("source.collection", "required when source.type is collection_role"),
			fe("source.role", "required when source.type is collection_role")),
		invalid("dynamic plugin in its config", func(m *messages.AnsibleJobMessage) {
			m.Inventory = messages.JobInventory{Type: messages.InventoryDynamic, Plugin: "a.b.c",
				Config: messages.Vars{"plugin": "x.y.z"}}
		}, fe("inventory.config[plugin]", "must not be set: the plugin is inventory.plugin")),
		invalid("git inventory without path", func(m *messages.AnsibleJobMessage) {
			m.Inventory = messages.JobInventory{Type: messages.InventoryGit, Repository: "https://g.example/i.git"}
		}, fe("inventory.path", "required when inventory.type is git")),
	}
}

func jobResultCases() []Validation {
	r := func(edit func(r *messages.AnsibleJobResult)) *messages.AnsibleJobResult {
		res := &messages.AnsibleJobResult{Outcome: messages.Outcome{JobID: "job-1", RequestID: "1-0",
			Status: messages.StatusSucceeded}, Commit: jobCommit}
		edit(res)
		return res
	}
	return []Validation{
		{Name: "succeeded", Msg: r(func(*messages.AnsibleJobResult) {})},
		{Name: "bad commit", Msg: r(func(r *messages.AnsibleJobResult) { r.Commit = "main" }),
			Want: []messages.FieldError{fe("commit", "must be a full commit id in lower-case hex")}},
		{Name: "playbook without status", Msg: r(func(r *messages.AnsibleJobResult) {
			r.Playbooks = []messages.PlaybookOutcome{{Playbook: "site.yml"}}
		}), Want: []messages.FieldError{fe("playbooks[0].status", msgRequired)}},
	}
}
