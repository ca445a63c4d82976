package messages_test

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages/internal/cases"
)

// raw is an already encoded msgpack value, written into a map as is.
type raw []byte

// mp encodes key/value pairs as a msgpack map in the given order; a raw
// value is written as is, other values with msgpack's default encoding.
func mp(t testing.TB, kv ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	if err := enc.EncodeMapLen(len(kv) / 2); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(kv); i += 2 {
		if err := enc.Encode(kv[i]); err != nil {
			t.Fatal(err)
		}
		if r, ok := kv[i+1].(raw); ok {
			buf.Write(r)
			continue
		}
		if err := enc.Encode(kv[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

// nested returns n arrays nested in each other around an integer.
func nested(n int) raw {
	return raw(append(bytes.Repeat([]byte{0x91}, n), 0x01))
}

func TestDecodeErrors(t *testing.T) {
	valid := func(extra ...any) []byte {
		return mp(t, append([]any{"server_handle", "web-1"}, extra...)...)
	}
	tooLarge := valid("padding", strings.Repeat("x", messages.MaxMessageSize))
	tests := []struct {
		name       string
		data       []byte
		wantReason string                // a *DecodeError about the input as a whole
		wantFields []messages.FieldError // a *DecodeError about wrong-typed values
		wantMsg    *messages.ProvisionerMessage
	}{
		{name: "empty", data: nil, wantReason: "empty input"},
		{name: "over 1 MiB", data: tooLarge,
			wantReason: strings.Replace("N bytes is over the 1048576 byte limit", "N", strconv.Itoa(len(tooLarge)), 1)},
		{name: "unused msgpack code", data: []byte{0xc1}, wantReason: "not a msgpack map (got invalid code 0xc1)"},
		{name: "JSON text", data: []byte(`{"server_handle":"web-1"}`), wantReason: "not a msgpack map (got integer)"},
		{name: "an array", data: []byte{0x91, 0x01}, wantReason: "not a msgpack map (got array)"},
		{name: "a string", data: []byte{0xa1, 'x'}, wantReason: "not a msgpack map (got string)"},
		{name: "nil", data: []byte{0xc0}, wantReason: "not a msgpack map (got nil)"},
		{name: "truncated", data: valid()[:8], wantReason: "truncated msgpack"},
		{name: "truncated map header", data: []byte{0xde, 0x00}, wantReason: "truncated msgpack"},
		{name: "map claiming 2^32-1 entries", data: []byte{0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 'x', 0x01}, wantReason: "truncated msgpack"},
		{name: "string claiming 4 GiB", data: append(mp(t)[:0], 0x81, 0xdb, 0xff, 0xff, 0xff, 0xff, 'x'), wantReason: "truncated msgpack"},
		{name: "trailing bytes", data: append(valid(), 0x00, 0x01), wantReason: "2 trailing bytes after the map"},
		{name: "two maps", data: append(valid(), valid()...), wantReason: strconv.Itoa(len(valid())) + " trailing bytes after the map"},
		{name: "integer key", data: mp(t, 1, "x"), wantReason: "map has a key that is not a string (integer)"},
		{name: "binary key", data: mp(t, []byte("server_handle"), "x"), wantReason: "map has a key that is not a string (binary)"},
		{name: "unknown key nested too deep", data: valid("x", nested(40)), wantReason: "nested deeper than 32 levels"},
		{name: "invalid code inside an unknown key", data: valid("x", raw{0x92, 0x01, 0xc1}), wantReason: "malformed msgpack"},

		{name: "string for a boolean", data: valid("force_reinstall", "yes"),
			wantFields: []messages.FieldError{{Field: "force_reinstall", Message: "must be a boolean (got string)"}},
			wantMsg:    &messages.ProvisionerMessage{RequestMeta: messages.RequestMeta{SchemaVersion: 1}, ServerHandle: "web-1"}},
		{name: "every wrong type, in wire order", data: mp(t, "job_id", 7, "server_handle", []byte("web-1"),
			"is_recovery", 1, "schema_version", "1", "created_at", 1.5, "correlation_id", "c-1"),
			wantFields: []messages.FieldError{
				{Field: "job_id", Message: "must be a string (got integer)"},
				{Field: "server_handle", Message: "must be a string (got binary)"},
				{Field: "is_recovery", Message: "must be a boolean (got integer)"},
				{Field: "schema_version", Message: "must be an integer (got string)"},
				{Field: "created_at", Message: "must be a string (got float)"},
			},
			wantMsg: &messages.ProvisionerMessage{RequestMeta: messages.RequestMeta{SchemaVersion: 1, CorrelationID: "c-1"}}},
		{name: "duplicate key", data: mp(t, "server_handle", "a", "server_handle", "b"),
			wantFields: []messages.FieldError{{Field: "server_handle", Message: "duplicate key"}},
			wantMsg:    &messages.ProvisionerMessage{RequestMeta: messages.RequestMeta{SchemaVersion: 1}, ServerHandle: "a"}},
		{name: "invalid UTF-8", data: mp(t, "server_handle", "web\xff"),
			wantFields: []messages.FieldError{{Field: "server_handle", Message: "must be valid UTF-8"}},
			wantMsg:    &messages.ProvisionerMessage{RequestMeta: messages.RequestMeta{SchemaVersion: 1}}},
		{name: "integer beyond int64", data: valid("schema_version", uint64(math.MaxUint64)),
			wantFields: []messages.FieldError{{Field: "schema_version", Message: "integer out of range"}},
			wantMsg:    &messages.ProvisionerMessage{RequestMeta: messages.RequestMeta{SchemaVersion: 1}, ServerHandle: "web-1"}},
		{name: "map for a string", data: valid("job_id", map[string]any{"a": []any{1, 2}}),
			wantFields: []messages.FieldError{{Field: "job_id", Message: "must be a string (got map)"}},
			wantMsg:    &messages.ProvisionerMessage{RequestMeta: messages.RequestMeta{SchemaVersion: 1}, ServerHandle: "web-1"}},
		{name: "extension for a string", data: valid("job_id", raw{0xd4, 0x05, 0x00}),
			wantFields: []messages.FieldError{{Field: "job_id", Message: "must be a string (got extension)"}},
			wantMsg:    &messages.ProvisionerMessage{RequestMeta: messages.RequestMeta{SchemaVersion: 1}, ServerHandle: "web-1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			msg, err := messages.DecodeProvisionerMessage(tc.data)
			var de *messages.DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %T %v, want *DecodeError", err, err)
			}
			if !messages.IsInvalid(err) {
				t.Errorf("IsInvalid(%v) = false", err)
			}
			if de.Reason != tc.wantReason {
				t.Errorf("Reason = %q, want %q", de.Reason, tc.wantReason)
			}
			if diff := diff(tc.wantFields, de.Fields); diff != "" {
				t.Errorf("Fields (-want +got):\n%s", diff)
			}
			if diff := diff(tc.wantMsg, msg); diff != "" {
				t.Errorf("message (-want +got):\n%s", diff)
			}
			if len(tc.wantFields) > 0 {
				for _, f := range tc.wantFields {
					if !strings.Contains(err.Error(), f.Field+": "+f.Message) {
						t.Errorf("error %q does not name %s", err, f.Field)
					}
				}
			}
		})
	}
}

func TestDecodeNestedErrors(t *testing.T) {
	base := []any{"job_id", "j", "request_id", "1-0", "status", "failed"}
	tests := []struct {
		name       string
		extra      []any
		wantReason string
		wantFields []messages.FieldError
	}{
		{name: "error not a map", extra: []any{"error", "boom"},
			wantFields: []messages.FieldError{{Field: "error", Message: "must be a map (got string)"}}},
		{name: "field error of the wrong type", extra: []any{"error", map[string]any{
			"kind": "invalid_message", "fields": []any{map[string]any{"field": 3}},
		}}, wantFields: []messages.FieldError{{Field: "error.fields[0].field", Message: "must be a string (got integer)"}}},
		{name: "nil in a list", extra: []any{"error", map[string]any{
			"kind": "invalid_message", "fields": []any{map[string]any{"field": "a"}, nil},
		}}, wantFields: []messages.FieldError{{Field: "error.fields[1]", Message: "must be a map (got nil)"}}},
		{name: "recap count of the wrong type", extra: []any{"hosts", map[string]any{"web-1": map[string]any{"ok": "3"}}},
			wantFields: []messages.FieldError{{Field: "hosts[web-1].ok", Message: "must be an integer (got string)"}}},
		{name: "recap not a map", extra: []any{"hosts", map[string]any{"web-1": 3}},
			wantFields: []messages.FieldError{{Field: "hosts[web-1]", Message: "must be a map (got integer)"}}},
		{name: "recap nil", extra: []any{"hosts", map[string]any{"web-1": nil}},
			wantFields: []messages.FieldError{{Field: "hosts[web-1]", Message: "must be a map (got nil)"}}},
		{name: "duplicate host", extra: []any{"hosts", raw{0x82, 0xa1, 'h', 0x80, 0xa1, 'h', 0x80}},
			wantFields: []messages.FieldError{{Field: "hosts[h]", Message: "duplicate key"}}},
		{name: "host key not a string", extra: []any{"hosts", raw{0x81, 0x01, 0x80}},
			wantReason: "hosts has a key that is not a string (integer)"},
		{name: "key of a nested map not a string", extra: []any{"failed_task", raw{0x81, 0x01, 0x80}},
			wantReason: "failed_task has a key that is not a string (integer)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := messages.DecodeAnsibleDeployResult(mp(t, append(slices.Clone(base), tc.extra...)...))
			var de *messages.DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %T %v, want *DecodeError", err, err)
			}
			if de.Reason != tc.wantReason {
				t.Errorf("Reason = %q, want %q", de.Reason, tc.wantReason)
			}
			if diff := diff(tc.wantFields, de.Fields); diff != "" {
				t.Errorf("Fields (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeModulesErrors(t *testing.T) {
	base := []any{"project_id", "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", "repo_full_name", "a/b", "server_ip", "192.0.2.1", "port", 22}
	for _, tc := range []struct {
		modules any
		want    []messages.FieldError
	}{
		{"nginx", []messages.FieldError{{Field: "modules", Message: "must be an array (got string)"}}},
		{[]any{"nginx", nil, 3}, []messages.FieldError{
			{Field: "modules[1]", Message: "must be a string (got nil)"},
			{Field: "modules[2]", Message: "must be a string (got integer)"},
		}},
	} {
		msg, err := messages.DecodeAnsibleDeployMessage(mp(t, append(slices.Clone(base), "modules", tc.modules)...))
		var de *messages.DecodeError
		if !errors.As(err, &de) {
			t.Fatalf("modules %v: error %T %v, want *DecodeError", tc.modules, err, err)
		}
		if diff := diff(tc.want, de.Fields); diff != "" {
			t.Errorf("modules %v: Fields (-want +got):\n%s", tc.modules, diff)
		}
		if msg == nil || msg.Port != 22 {
			t.Errorf("modules %v: message %+v, want the other keys read", tc.modules, msg)
		}
	}
}

// TestDecodeLenient checks what readers accept: nil as an absent key,
// integers of every width, unknown keys of every type, nesting up to the
// limit.
func TestDecodeLenient(t *testing.T) {
	want := &messages.AnsibleDeployMessage{
		RequestMeta:  messages.RequestMeta{SchemaVersion: 1},
		ProjectID:    "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f",
		RepoFullName: "a/b",
		Branch:       "main",
		ServerIP:     "192.0.2.1",
		Port:         22,
	}
	ints := map[string]raw{
		"positive fixint": {0x16},
		"uint8":           {0xcc, 0x16},
		"uint16":          {0xcd, 0x00, 0x16},
		"uint32":          {0xce, 0x00, 0x00, 0x00, 0x16},
		"uint64":          {0xcf, 0, 0, 0, 0, 0, 0, 0, 0x16},
		"int8":            {0xd0, 0x16},
		"int16":           {0xd1, 0x00, 0x16},
		"int32":           {0xd2, 0x00, 0x00, 0x00, 0x16},
		"int64":           {0xd3, 0, 0, 0, 0, 0, 0, 0, 0x16},
	}
	for name, port := range ints {
		t.Run("port as "+name, func(t *testing.T) {
			got, err := messages.DecodeAnsibleDeployMessage(mp(t,
				"port", port, "server_ip", "192.0.2.1", "repo_full_name", "a/b",
				"project_id", "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f"))
			if err != nil {
				t.Fatal(err)
			}
			if diff := diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	t.Run("nil values, unknown keys of every type, deep unknown nesting", func(t *testing.T) {
		got, err := messages.DecodeAnsibleDeployMessage(mp(t,
			"job_id", nil, "branch", nil, "modules", nil, "schema_version", nil, "secrets_ref", nil,
			"project_id", "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f", "repo_full_name", "a/b",
			"server_ip", "192.0.2.1", "port", 22,
			"u_nil", nil, "u_bool", true, "u_neg", -5, "u_float32", float32(1.5), "u_float64", 2.5,
			"u_bin", []byte{0, 1}, "u_str", "s", "u_array", []any{1, "a", nil}, "u_map", map[string]any{"k": []any{}},
			"u_int_keys", raw{0x81, 0x01, 0x02}, "u_ext", raw{0xc7, 0x03, 0x2a, 'x', 'y', 'z'},
			"u_fixext", raw{0xd6, 0xff, 0, 0, 0, 1}, "u_deep", nested(30),
		))
		if err != nil {
			t.Fatal(err)
		}
		if diff := diff(want, got); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	})
	t.Run("empty list and map are absent", func(t *testing.T) {
		got, err := messages.DecodeProvisionerResult(mp(t, "job_id", "j", "request_id", "1-0", "status", "succeeded",
			"hosts", map[string]any{}))
		if err != nil {
			t.Fatal(err)
		}
		if got.Hosts != nil {
			t.Errorf("Hosts = %#v, want nil", got.Hosts)
		}
	})
}

// TestEncodeCanonical checks the canonical form: keys sorted by bytes at
// every level, integers compact, empty optional keys left out, required
// keys always written.
func TestEncodeCanonical(t *testing.T) {
	for _, g := range cases.Goldens() {
		data, err := messages.Encode(g.Value)
		if err != nil {
			t.Fatal(err)
		}
		checkSortedKeys(t, g.File, msgpack.NewDecoder(bytes.NewReader(data)))
	}
	tests := []struct {
		name string
		v    any
		want []byte
	}{
		{"required keys written even when empty, false booleans left out",
			messages.ProvisionerMessage{ForceReinstall: false}, []byte("\x81\xadserver_handle\xa0")},
		{"small integers in one byte", &messages.AnsibleDeployMessage{Port: 22},
			[]byte("\x84\xa4port\x16\xaaproject_id\xa0\xaerepo_full_name\xa0\xa9server_ip\xa0")},
		{"uint16", &messages.AnsibleDeployMessage{Port: 65535},
			[]byte("\x84\xa4port\xcd\xff\xff\xaaproject_id\xa0\xaerepo_full_name\xa0\xa9server_ip\xa0")},
		{"negative integers compact", &messages.ProgressEvent{Seq: -1},
			[]byte("\x84\xa6job_id\xa0\xa3seq\xff\xa4time\xa0\xa4type\xa0")},
		{"empty list left out", &messages.AnsibleDeployMessage{Port: 1, Modules: []string{}},
			[]byte("\x84\xa4port\x01\xaaproject_id\xa0\xaerepo_full_name\xa0\xa9server_ip\xa0")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := messages.Encode(tc.v)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tc.want) {
				t.Errorf("Encode = %q, want %q", got, tc.want)
			}
		})
	}
}

// checkSortedKeys walks one msgpack value and fails when a map's keys are
// not in byte order.
func checkSortedKeys(t *testing.T, where string, dec *msgpack.Decoder) {
	t.Helper()
	c, err := dec.PeekCode()
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case c >= 0x80 && c <= 0x8f || c == 0xde || c == 0xdf:
		n, _ := dec.DecodeMapLen()
		prev := ""
		for i := range n {
			k, err := dec.DecodeString()
			if err != nil {
				t.Fatal(err)
			}
			if i > 0 && k <= prev {
				t.Errorf("%s: key %q after %q", where, k, prev)
			}
			prev = k
			checkSortedKeys(t, where, dec)
		}
	case c >= 0x90 && c <= 0x9f || c == 0xdc || c == 0xdd:
		n, _ := dec.DecodeArrayLen()
		for range n {
			checkSortedKeys(t, where, dec)
		}
	default:
		if err := dec.Skip(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestEncodeErrors(t *testing.T) {
	big := messages.NewProvisionerResult(&messages.ProvisionerMessage{ServerHandle: "web-1"}, "1-0")
	big.OutputTail = strings.Repeat("x", messages.MaxMessageSize)
	badUTF8 := messages.NewAnsibleDeployResult(nil, "1-0")
	badUTF8.Hosts = map[string]messages.HostRecap{"h\xff": {}}
	for name, v := range map[string]any{
		"other type":            map[string]any{"server_handle": "x"},
		"nil pointer":           (*messages.ProvisionerMessage)(nil),
		"nil":                   nil,
		"over 1 MiB":            big,
		"invalid UTF-8":         &messages.ProvisionerMessage{ServerHandle: "web\xff"},
		"invalid UTF-8 key":     badUTF8,
		"invalid UTF-8 in list": &messages.AnsibleDeployMessage{Modules: []string{"a", "\xff"}},
	} {
		if _, err := messages.Encode(v); err == nil {
			t.Errorf("Encode(%s) succeeded", name)
		}
	}
}

// TestTagsAreTheKeys checks that Encode writes exactly the keys of the
// `msgpack` struct tags (the JSON Schemas are generated from those tags):
// a value with every key set encodes to a map holding every tagged key.
func TestTagsAreTheKeys(t *testing.T) {
	full := []any{
		&messages.ProvisionerMessage{
			RequestMeta: messages.RequestMeta{SchemaVersion: 1, JobID: "j", CorrelationID: "c", CreatedAt: "t",
				TraceContext: messages.TraceContext{Traceparent: "tp", Tracestate: "ts"}},
			ServerHandle: "h", ForceReinstall: true, IsRecovery: true, Playbooks: []string{"p.yml"},
		},
		&messages.AnsibleDeployMessage{
			RequestMeta: messages.RequestMeta{SchemaVersion: 1, JobID: "j", CorrelationID: "c", CreatedAt: "t",
				TraceContext: messages.TraceContext{Traceparent: "tp", Tracestate: "ts"}},
			ProjectID: "p", RepoFullName: "r", Branch: "b", ServerIP: "i", Port: 1, SSHPort: 2, Modules: []string{"m"},
			GitHubTokenRef: "g", SecretsRef: "s", TimeoutSeconds: 60,
		},
		&messages.ProvisionerResult{Outcome: fullOutcome(), ServerHandle: "h", Playbooks: []messages.PlaybookOutcome{
			{Playbook: "p.yml", Status: messages.PlaybookFailed, ErrorKind: messages.KindPlaybookFailed, DurationMS: 1}}},
		&messages.AnsibleDeployResult{Outcome: fullOutcome(), ProjectID: "p", ServerIP: "i", Port: 1},
		&messages.ProgressEvent{SchemaVersion: 1, JobID: "j", Seq: 1, Time: "t", Type: "x", Play: "p", Task: "t",
			Host: "h", Message: "m", Status: "s"},
	}
	for _, v := range full {
		data, err := messages.Encode(v)
		if err != nil {
			t.Fatal(err)
		}
		var generic map[string]any
		if err := msgpack.Unmarshal(data, &generic); err != nil {
			t.Fatal(err)
		}
		got := keyPaths("", generic)
		want := tagPaths("", reflect.TypeOf(v).Elem())
		if diff := diff(want, got); diff != "" {
			t.Errorf("%T: keys (-tags +encoded):\n%s", v, diff)
		}
	}
}

func fullOutcome() messages.Outcome {
	return messages.Outcome{
		SchemaVersion: 1, JobID: "j", RequestID: "1-0", CorrelationID: "c", Status: messages.StatusFailed,
		Error:      &messages.ErrorInfo{Kind: "k", Message: "m", Fields: []messages.FieldError{{Field: "f", Message: "m"}}},
		Hosts:      map[string]messages.HostRecap{"h": {Ok: 1, Changed: 1, Failed: 1, Unreachable: 1, Skipped: 1, Rescued: 1, Ignored: 1}},
		FailedTask: &messages.FailedTask{Name: "n", Host: "h", Play: "p", Message: "m"},
		Playbook:   "p", StartedAt: "s", FinishedAt: "f", DurationMS: 1, OutputTail: "o", Attempt: 1,
		TraceContext: messages.TraceContext{Traceparent: "tp", Tracestate: "ts"},
	}
}

// keyPaths lists the key paths of a decoded map ("hosts.h.ok" for the
// entry h of a map, "error.fields[].field" for list elements).
func keyPaths(prefix string, v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, val := range v {
			p := prefix + k
			out = append(out, p)
			out = append(out, keyPaths(p+".", val)...)
		}
	case []any:
		for _, e := range v {
			out = append(out, keyPaths(strings.TrimSuffix(prefix, ".")+"[].", e)...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// tagPaths lists the key paths the msgpack tags of type t declare.
func tagPaths(prefix string, t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("msgpack"), ",")
		if f.Anonymous && name == "" {
			out = append(out, tagPaths(prefix, f.Type)...)
			continue
		}
		p := prefix + name
		out = append(out, p)
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch ft.Kind() {
		case reflect.Struct:
			out = append(out, tagPaths(p+".", ft)...)
		case reflect.Slice:
			if ft.Elem().Kind() == reflect.Struct {
				out = append(out, tagPaths(p+"[].", ft.Elem())...)
			}
		case reflect.Map:
			out = append(out, p+".h")
			out = append(out, tagPaths(p+".h.", ft.Elem())...)
		}
	}
	slices.Sort(out)
	return out
}
