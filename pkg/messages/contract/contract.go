// Package contract checks the wire contract of package messages with tools
// the contract's own module must not depend on, so that a producer
// importing package messages pulls msgpack and nothing else.
//
// It generates the JSON Schemas (draft 2020-12) of the messages from their
// Go types into pkg/messages/schema (`make generate`): key names, types and
// required keys come from the `msgpack` struct tags, descriptions from the
// doc comments, and the rules of the types' Validate methods are added here
// as patterns, formats, bounds, enums and conditions. Its tests check that
// the checked-in schemas are up to date, that they accept and refuse
// exactly what Validate does and the vectors the decoder does, and run the
// Python producer of the documentation against real Redis.
package contract

//go:generate go run ./schemagen -src .. -out ../schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/invopop/jsonschema"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// ImportPath is the import path of package messages, for the comments.
const ImportPath = "github.com/autoprovisioner/autoprovisioner/pkg/messages"

// BaseID prefixes the $id of every schema.
const BaseID = "https://github.com/autoprovisioner/autoprovisioner/pkg/messages/schema/"

// The patterns of the rules (ECMA-262 and RE2 compatible). Each mirrors a
// check of package messages.
const (
	idPattern        = `^[!-~]{1,255}$`
	timePattern      = `^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|\+00:00)$`
	uuidPattern      = `^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`
	repoPattern      = `^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$`
	repoDotsPattern  = `/\.\.?$`
	branchPattern    = `^[A-Za-z0-9._/-]+$`
	branchBadPattern = `^[-/]|[/.]$|\.\.|//|(^|/)\.|\.lock(/|$)`
	ipPattern        = `^[0-9A-Fa-f:.]+$`
	modulePattern    = `^[a-z0-9][a-z0-9_-]{0,62}$`
	secretRefPattern = `^(vault|env|file):[!-~]+$`
	entryIDPattern   = `^[0-9]{1,20}-[0-9]{1,20}$`
	errorKindPattern = `^[a-z][a-z0-9_]{0,63}$`
	// An http(s) URL without user, query or fragment (the Go check also
	// parses it).
	urlPattern = `^https?://[^/@?#\s]+(/[^?#\s]*)?$`
	// A relative path inside a repository: not absolute, no ".." part, no
	// backslash or control character.
	repoPathPattern    = `^[^/\\\x00-\x1f\x7f][^\\\x00-\x1f\x7f]*$`
	repoPathBadPattern = `(^|/)\.\.(/|$)|^\.?/*$`
)

// File is one generated schema.
type File struct {
	// Name is the file name under pkg/messages/schema.
	Name string
	// Data is the schema as indented JSON with a final newline.
	Data []byte
}

// Generate returns the schema of every message type. srcDir is the
// directory of package messages, whose doc comments become descriptions.
func Generate(srcDir string) ([]File, error) {
	base, err := commentBase(srcDir)
	if err != nil {
		return nil, err
	}
	roots := []struct {
		name string
		v    any
		fix  func(*jsonschema.Schema)
	}{
		{"provisioner_message", &messages.ProvisionerMessage{}, provisionerMessage},
		{"ansible_deploy_message", &messages.AnsibleDeployMessage{}, nil},
		{"provisioner_result", &messages.ProvisionerResult{}, result},
		{"ansible_deploy_result", &messages.AnsibleDeployResult{}, result},
		{"progress_event", &messages.ProgressEvent{}, progressEvent},
		{"ansible_job_message", &messages.AnsibleJobMessage{}, jobMessage},
		{"ansible_job_result", &messages.AnsibleJobResult{}, result},
		{"stream_entry", &messages.StreamEntry{}, streamEntry},
	}
	var files []File
	for _, root := range roots {
		r := &jsonschema.Reflector{
			FieldNameTag:              "msgpack",
			AllowAdditionalProperties: true, // unknown keys are ignored
			ExpandedStruct:            true,
			Mapper:                    mapType,
		}
		if err := r.AddGoComments(base, srcDir); err != nil {
			return nil, fmt.Errorf("read doc comments in %s: %w", srcDir, err)
		}
		for k, v := range r.CommentMap { // one line per description
			r.CommentMap[k] = strings.Join(strings.Fields(v), " ")
		}
		s := r.Reflect(root.v)
		s.ID = jsonschema.ID(BaseID + root.name + ".schema.json")
		s.Title = reflect.TypeOf(root.v).Elem().Name()
		s.Comments = "Generated from the Go types of " + ImportPath + " by `go generate`; do not edit."
		if root.name == "stream_entry" {
			s.Description += " The fields of a stream entry (XADD), not a msgpack map; see docs/wire-contract.md."
		} else {
			s.Description += " Each stream entry's \"data\" field holds it as a msgpack map; see docs/wire-contract.md."
		}
		applyRules(s, s.Title)
		for name, def := range s.Definitions {
			applyRules(def, name)
		}
		if root.fix != nil {
			root.fix(s)
		}
		data, err := marshal(s)
		if err != nil {
			return nil, fmt.Errorf("marshal schema %s: %w", root.name, err)
		}
		files = append(files, File{Name: root.name + ".schema.json", Data: data})
	}
	return files, nil
}

func marshal(s *jsonschema.Schema) ([]byte, error) {
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return nil, err
	}
	buf.WriteByte('\n')
	return buf.Bytes(), nil
}

// mapType gives the schemas of the enumerated string types.
func mapType(t reflect.Type) *jsonschema.Schema {
	switch t {
	case reflect.TypeFor[messages.Status]():
		return &jsonschema.Schema{Type: "string", Enum: anys(messages.Statuses())}
	case reflect.TypeFor[messages.PlaybookStatus]():
		return &jsonschema.Schema{Type: "string", Enum: anys(messages.PlaybookStatuses())}
	case reflect.TypeFor[messages.SourceType]():
		return &jsonschema.Schema{Type: "string", Enum: anys(messages.SourceTypes())}
	case reflect.TypeFor[messages.InventoryType]():
		return &jsonschema.Schema{Type: "string", Enum: anys(messages.InventoryTypes())}
	case reflect.TypeFor[messages.EventType]():
		return &jsonschema.Schema{Type: "string", Enum: anys(messages.EventTypes())}
	case reflect.TypeFor[messages.ErrorKind]():
		// Open set: kinds may be added; consumers treat unknown ones as internal.
		return &jsonschema.Schema{Type: "string", Pattern: errorKindPattern, Examples: anys(messages.ErrorKinds())}
	}
	return nil
}

func anys[T any](xs []T) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// propertyRules adds the rules of Validate to the properties, by key. Keys
// mean the same in every message type, which keeps this one table.
func propertyRules(owner, key string, p *jsonschema.Schema) {
	switch key {
	case "schema_version":
		p.Minimum = "0"
		p.Maximum = json.Number(strconv.Itoa(messages.SchemaVersion))
	case "job_id", "correlation_id":
		p.Pattern = idPattern
	case "created_at", "started_at", "finished_at", "time":
		p.Pattern = timePattern
		p.Format = "date-time"
	case "server_handle":
		if owner == "ProvisionerMessage" {
			p.Pattern = messages.ServerHandlePattern
		}
	case "project_id":
		if owner == "AnsibleDeployMessage" || owner == "AnsibleJobMessage" {
			p.Pattern = uuidPattern
		}
	case "repo_full_name":
		p.Pattern = repoPattern
		p.Not = &jsonschema.Schema{Pattern: repoDotsPattern}
	case "branch":
		p.Pattern = branchPattern
		p.Not = &jsonschema.Schema{Pattern: branchBadPattern}
		p.MaxLength = ptr(uint64(messages.MaxBranchLen))
		p.Default = messages.DefaultBranch
	case "server_ip":
		if owner == "AnsibleDeployMessage" {
			p.Pattern = ipPattern
			p.AnyOf = []*jsonschema.Schema{{Format: "ipv4"}, {Format: "ipv6"}}
		}
	case "port":
		p.Minimum = "1"
		if owner != "AnsibleDeployMessage" {
			p.Minimum = "0" // echoed; 0 when the request had none
		}
		p.Maximum = "65535"
	case "ssh_port":
		p.Minimum = "0" // 0 is the same as absent: 22, or the registered server's
		p.Maximum = "65535"
	case "modules":
		p.MaxItems = ptr(uint64(messages.MaxModules))
		p.UniqueItems = true
		p.Items.Pattern = modulePattern
	case "playbooks":
		if owner == "ProvisionerMessage" {
			p.MaxItems = ptr(uint64(messages.MaxPlaybooks))
			p.UniqueItems = true
			p.Items.Pattern = messages.PlaybookNamePattern
		}
	case "playbook":
		if owner == "PlaybookOutcome" {
			p.MinLength = ptr(uint64(1))
		}
	case "github_token_ref", "secrets_ref", "git_credential", "credential", "ssh", "become_password",
		"vault_password", "cloud", "galaxy":
		p.Pattern = secretRefPattern
		p.MaxLength = ptr(uint64(messages.MaxSecretRefLen))
	case "timeout_seconds":
		p.Minimum = "0" // 0 is the same as absent
		p.Maximum = json.Number(strconv.Itoa(messages.MaxTimeoutSeconds))
	case "request_id":
		p.Pattern = entryIDPattern
	case "traceparent":
		p.Pattern = messages.TraceparentPattern
	case "tracestate":
		p.Pattern = messages.TracestatePattern
		p.MaxLength = ptr(uint64(messages.MaxTracestateLen))
	case "hosts":
		switch owner {
		case "JobInventory":
			p.PropertyNames = &jsonschema.Schema{Pattern: messages.HostNamePattern}
			p.MaxProperties = ptr(uint64(messages.MaxJobHosts))
			p.AdditionalProperties = inventoryVarsSchema()
		case "InventoryGroup":
		default:
			p.PropertyNames = &jsonschema.Schema{MinLength: ptr(uint64(1))}
		}
	case "groups":
		p.PropertyNames = &jsonschema.Schema{Pattern: messages.GroupNamePattern}
		p.MaxProperties = ptr(uint64(messages.MaxJobGroups))
	case "vars":
		if owner == "InventoryGroup" {
			*p = *inventoryVarsSchema()
		}
	case "extra_vars", "role_vars":
		p.PropertyNames = &jsonschema.Schema{Pattern: messages.VarNamePattern,
			Not: &jsonschema.Schema{Pattern: "^[Aa][Nn][Ss][Ii][Bb][Ll][Ee]_"}}
	case "secret_vars":
		p.PropertyNames = &jsonschema.Schema{Pattern: messages.VarNamePattern,
			Not: &jsonschema.Schema{Pattern: "^[Aa][Nn][Ss][Ii][Bb][Ll][Ee]_"}}
		p.MaxProperties = ptr(uint64(messages.MaxJobSecretVars))
		if p.AdditionalProperties != nil {
			p.AdditionalProperties.Pattern = secretRefPattern
			p.AdditionalProperties.MaxLength = ptr(uint64(messages.MaxSecretRefLen))
		}
	case "repository", "url", "galaxy_server", "callback_url":
		p.Pattern = urlPattern
		p.MaxLength = ptr(uint64(messages.MaxURLLen))
	case "ref":
		p.Pattern = messages.RefPattern
		p.Not = &jsonschema.Schema{Pattern: branchBadPattern}
		p.MaxLength = ptr(uint64(messages.MaxRefLen))
	case "paths":
		p.MaxItems = ptr(uint64(messages.MaxJobPlaybooks))
		p.UniqueItems = true
		p.Items.Pattern = repoPathPattern
		p.Items.Not = &jsonschema.Schema{Pattern: repoPathBadPattern}
		p.Items.MaxLength = ptr(uint64(messages.MaxJobPathLen))
	case "role_path", "path":
		p.Pattern = repoPathPattern
		p.Not = &jsonschema.Schema{Pattern: repoPathBadPattern}
		p.MaxLength = ptr(uint64(messages.MaxJobPathLen))
	case "collection":
		p.Pattern = messages.CollectionPattern
	case "role":
		p.Pattern = messages.RoleNamePattern
	case "version":
		p.Pattern = messages.VersionPattern
	case "plugin":
		p.Pattern = messages.PluginPattern
	case "config":
		p.Not = &jsonschema.Schema{Required: []string{"plugin"}}
	case "tags", "skip_tags":
		p.MaxItems = ptr(uint64(messages.MaxJobTags))
		p.UniqueItems = true
		p.Items.Pattern = messages.TagPattern
	case "limit":
		p.Pattern = messages.LimitPattern
		p.Not = &jsonschema.Schema{Pattern: "^@"}
		p.MaxLength = ptr(uint64(messages.MaxJobLimitLen))
	case "verbosity":
		p.Minimum = "0"
		p.Maximum = json.Number(strconv.Itoa(messages.MaxJobVerbosity))
	case "forks":
		p.Minimum = "0" // 0 is the same as absent
		p.Maximum = json.Number(strconv.Itoa(messages.MaxJobForks))
	case "pool":
		p.Pattern = messages.PoolPattern
	case "commit", "inventory_commit":
		p.Pattern = messages.CommitPattern
	case "duration_ms", "attempt", "ok", "changed", "failed", "unreachable", "skipped", "rescued", "ignored":
		p.Minimum = "0"
	case "seq":
		p.Minimum = "1"
	case "field":
		if owner == "FieldError" {
			p.MinLength = ptr(uint64(1))
		}
	}
}

// applyRules adds the property rules to the object schema of Go type owner,
// then lets every optional property be null (a nil value is an absent key)
// and, when the property is a constrained string, empty (an empty string is
// an absent key).
func applyRules(s *jsonschema.Schema, owner string) {
	if s.Properties == nil {
		return
	}
	required := map[string]bool{}
	for _, k := range s.Required {
		required[k] = true
	}
	for key, p := range s.Properties.FromOldest() {
		propertyRules(owner, key, p)
		if required[key] {
			continue
		}
		alternatives := []*jsonschema.Schema{p}
		if p.Type == "string" && (p.Pattern != "" || p.Format != "" || len(p.Enum) > 0 || p.AnyOf != nil) {
			alternatives = append(alternatives, &jsonschema.Schema{Const: ""})
		}
		alternatives = append(alternatives, &jsonschema.Schema{Type: "null"})
		wrapper := &jsonschema.Schema{Description: p.Description, Default: p.Default, AnyOf: alternatives}
		p.Description, p.Default = "", nil
		s.Properties.Set(key, wrapper)
	}
}

func provisionerMessage(s *jsonschema.Schema) {
	// force_reinstall and is_recovery are exclusive.
	s.Not = withProps(&jsonschema.Schema{Required: []string{"force_reinstall", "is_recovery"}},
		map[string]*jsonschema.Schema{"force_reinstall": {Const: true}, "is_recovery": {Const: true}})
}

func result(s *jsonschema.Schema) {
	// error is absent (or null) on success and present otherwise.
	s.If = withProps(&jsonschema.Schema{Required: []string{"status"}},
		map[string]*jsonschema.Schema{"status": {Const: string(messages.StatusSucceeded)}})
	s.Then = withProps(&jsonschema.Schema{}, map[string]*jsonschema.Schema{"error": {Type: "null"}})
	s.Else = withProps(&jsonschema.Schema{Required: []string{"error"}},
		map[string]*jsonschema.Schema{"error": {Type: "object"}})
}

func progressEvent(s *jsonschema.Schema) {
	var hostTypes []any
	for _, t := range messages.EventTypes() {
		if t.HostEvent() {
			hostTypes = append(hostTypes, t)
		}
	}
	s.AllOf = []*jsonschema.Schema{
		{ // host_* events name their host
			If: withProps(&jsonschema.Schema{Required: []string{"type"}},
				map[string]*jsonschema.Schema{"type": {Enum: hostTypes}}),
			Then: withProps(&jsonschema.Schema{Required: []string{"host"}},
				map[string]*jsonschema.Schema{"host": {Type: "string", MinLength: ptr(uint64(1))}}),
		},
		{ // status is on run_finished and only there
			If: withProps(&jsonschema.Schema{Required: []string{"type"}},
				map[string]*jsonschema.Schema{"type": {Const: string(messages.EventRunFinished)}}),
			Then: withProps(&jsonschema.Schema{Required: []string{"status"}},
				map[string]*jsonschema.Schema{"status": {Type: "string", MinLength: ptr(uint64(1))}}),
			Else: withProps(&jsonschema.Schema{},
				map[string]*jsonschema.Schema{"status": {AnyOf: []*jsonschema.Schema{{Type: "null"}, {Const: ""}}}}),
		},
	}
}

// inventoryVarsSchema is the schema of an inventory's host or group
// variables: variable names, no connection variables but the allowed ones.
func inventoryVarsSchema() *jsonschema.Schema {
	allowed := messages.InventoryConnectionVars()
	return &jsonschema.Schema{
		Type: "object",
		PropertyNames: &jsonschema.Schema{Pattern: messages.VarNamePattern, AnyOf: []*jsonschema.Schema{
			{Not: &jsonschema.Schema{Pattern: "^[Aa][Nn][Ss][Ii][Bb][Ll][Ee]_"}},
			{Enum: anys(allowed)},
		}},
	}
}

// jobMessage adds the keys each source and inventory type requires, and
// refuses (non-empty) the keys that belong to other types.
func jobMessage(s *jsonschema.Schema) {
	nonEmpty := &jsonschema.Schema{AnyOf: []*jsonschema.Schema{
		{Type: "string", MinLength: ptr(uint64(1))}, {Type: "array", MinItems: ptr(uint64(1))},
		{Type: "object", MinProperties: ptr(uint64(1))}, {Type: "boolean"}, {Type: "number"},
	}}
	rules := func(keys map[string][]string, required map[string][]string) []*jsonschema.Schema {
		all := map[string]bool{}
		for _, ks := range keys {
			for _, k := range ks {
				all[k] = true
			}
		}
		var out []*jsonschema.Schema
		for _, typ := range slices.Sorted(maps.Keys(keys)) {
			then := &jsonschema.Schema{Required: required[typ]}
			for _, k := range slices.Sorted(maps.Keys(all)) {
				if slices.Contains(keys[typ], k) {
					continue
				}
				then.AllOf = append(then.AllOf, &jsonschema.Schema{Not: withProps(
					&jsonschema.Schema{Required: []string{k}}, map[string]*jsonschema.Schema{k: nonEmpty})})
			}
			out = append(out, &jsonschema.Schema{
				If: withProps(&jsonschema.Schema{Required: []string{"type"}},
					map[string]*jsonschema.Schema{"type": {Const: typ}}),
				Then: then,
			})
		}
		return out
	}
	if src, ok := s.Definitions["JobSource"]; ok {
		src.AllOf = rules(map[string][]string{
			string(messages.SourcePlaybook):       {"repository", "ref", "paths", "git_credential"},
			string(messages.SourceRole):           {"repository", "ref", "git_credential", "role_path", "role_vars"},
			string(messages.SourceCollectionRole): {"role_vars", "collection", "role", "version", "galaxy_server"},
		}, map[string][]string{
			string(messages.SourcePlaybook):       {"repository", "paths"},
			string(messages.SourceRole):           {"repository", "role_path"},
			string(messages.SourceCollectionRole): {"collection", "role"},
		})
	}
	if inv, ok := s.Definitions["JobInventory"]; ok {
		inv.AllOf = rules(map[string][]string{
			string(messages.InventoryInline):  {"hosts", "groups"},
			string(messages.InventoryGit):     {"repository", "ref", "path", "credential"},
			string(messages.InventoryURL):     {"url", "credential"},
			string(messages.InventoryDynamic): {"plugin", "config"},
		}, map[string][]string{
			string(messages.InventoryInline):  {"hosts"},
			string(messages.InventoryGit):     {"repository", "path"},
			string(messages.InventoryURL):     {"url"},
			string(messages.InventoryDynamic): {"plugin"},
		})
	}
}

// withProps sets the properties of s from m, in key order, and returns s.
// streamEntry describes the signature's form.
func streamEntry(s *jsonschema.Schema) {
	if p, ok := s.Properties.Get("sig"); ok {
		p.Pattern = messages.SignaturePattern
	}
}

func withProps(s *jsonschema.Schema, m map[string]*jsonschema.Schema) *jsonschema.Schema {
	s.Properties = jsonschema.NewProperties()
	for _, k := range slices.Sorted(maps.Keys(m)) {
		s.Properties.Set(k, m[k])
	}
	return s
}

// commentBase returns the base import path for jsonschema's AddGoComments,
// which keys the comments of the files in directory d under
// path.Join(base, d): for srcDir "." it is ImportPath, for ".." (from this
// package's directory) ImportPath with one more element, and so on.
func commentBase(srcDir string) (string, error) {
	rel := filepath.ToSlash(filepath.Clean(srcDir))
	up := 0
	for _, seg := range strings.Split(rel, "/") {
		switch seg {
		case ".":
		case "..":
			up++
		default:
			return "", fmt.Errorf("source directory %q: want . or a parent (..) of the working directory", srcDir)
		}
	}
	return ImportPath + strings.Repeat("/_", up), nil
}
