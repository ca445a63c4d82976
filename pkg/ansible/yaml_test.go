package ansible

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// ansibleLoad parses a YAML file with Ansible's own loader (Debian's
// python) and returns it in a typed JSON form: {"str": s, "unsafe": bool},
// {"int": n}, {"float": f}, {"bool": b}, {"null": true}, {"list": [...]},
// {"map": [[key, value], ...]}.
const ansibleLoad = `
import json, sys
from ansible.parsing.yaml.loader import AnsibleLoader
from ansible.utils.unsafe_proxy import AnsibleUnsafe
def conv(v):
    if v is None: return {"null": True}
    if isinstance(v, bool): return {"bool": v}
    if isinstance(v, int): return {"int": v}
    if isinstance(v, float): return {"float": v}
    if isinstance(v, str): return {"str": str(v), "unsafe": isinstance(v, AnsibleUnsafe)}
    if isinstance(v, list): return {"list": [conv(x) for x in v]}
    if isinstance(v, dict): return {"map": sorted([[conv(k), conv(x)] for k, x in v.items()], key=lambda kv: kv[0]["str"])}
    raise TypeError(type(v))
with open(sys.argv[1], encoding="utf-8") as f:
    print(json.dumps(conv(AnsibleLoader(f.read()).get_single_data())))
`

// typed is the Go side of ansibleLoad's form for a value given to
// unsafeYAML.
func typed(v any) any {
	rv := reflect.ValueOf(v)
	for rv.IsValid() && (rv.Kind() == reflect.Interface || rv.Kind() == reflect.Pointer) {
		if rv.IsNil() {
			return map[string]any{"null": true}
		}
		rv = rv.Elem()
	}
	if !rv.IsValid() {
		return map[string]any{"null": true}
	}
	switch rv.Kind() {
	case reflect.String:
		return map[string]any{"str": runeWise(rv.String()), "unsafe": true}
	case reflect.Bool:
		return map[string]any{"bool": rv.Bool()}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return map[string]any{"int": json.Number(formatInt(rv.Int()))}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"int": json.Number(formatUint(rv.Uint()))}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"float": rv.Float()}
	case reflect.Slice, reflect.Array:
		list := []any{}
		for i := 0; i < rv.Len(); i++ {
			list = append(list, typed(rv.Index(i).Interface()))
		}
		return map[string]any{"list": list}
	case reflect.Map:
		type pair struct {
			key string
			val any
		}
		var pairs0 []pair
		for _, k := range rv.MapKeys() {
			pairs0 = append(pairs0, pair{runeWise(k.String()), rv.MapIndex(k).Interface()})
		}
		sort.Slice(pairs0, func(i, j int) bool { return pairs0[i].key < pairs0[j].key })
		pairs := []any{}
		for _, p := range pairs0 {
			pairs = append(pairs, []any{typed(p.key), typed(p.val)})
		}
		return map[string]any{"map": pairs}
	}
	panic("unexpected kind " + rv.Kind().String())
}

func normalize(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var out any
	if err := dec.Decode(&out); err != nil {
		t.Fatal(err)
	}
	b, _ = json.Marshal(floatsAsFloats(out))
	return string(b)
}

// floatsAsFloats turns {"float": json.Number} into float64 (one spelling
// per value), leaving integers as exact json.Numbers.
func floatsAsFloats(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if n, ok := x.(json.Number); ok && k == "float" {
				f, _ := n.Float64()
				v[k] = f
			} else {
				v[k] = floatsAsFloats(x)
			}
		}
	case []any:
		for i, x := range v {
			v[i] = floatsAsFloats(x)
		}
	}
	return v
}

// TestUnsafeYAMLWithAnsibleLoader renders awkward values and checks that
// Ansible's loader reads them back exactly, every string (keys included)
// tagged unsafe.
func TestUnsafeYAMLWithAnsibleLoader(t *testing.T) {
	t.Parallel()
	awkward := []string{
		"", " lead", "trail ", "{{ lookup('env','HOME') }}", "{% raw %}", "{# c #}", "!unsafe x",
		"*alias", "&anchor", "%TAG", "- item", "? key", ": v", "# comment", "'", `"`, `\`, `\n`,
		"null", "~", "yes", "no", "on", "0x1F", "1e3", "0o17", ".inf", "2001-01-01",
		"line\nbreak", "tab\there", "nul\x00byte", "del\x7f", "c1\u0085\u0080", "ls\u2028ps\u2029",
		"bom\ufeff", "nonchar\uffff\ufffe", "é ü 日本", "emoji 😀", "bad utf8 \xff\xfe", "\r\n",
		strings.Repeat("long ", 2000),
	}
	nestedMap := map[string]any{}
	for i, s := range awkward {
		nestedMap[s] = i
	}
	vars := map[string]any{
		"strings":   awkward,
		"keys":      nestedMap,
		"numbers":   []any{0, -1, math.MaxInt64, math.MinInt64, uint64(math.MaxUint64), int8(-8), uint16(16)},
		"floats":    []any{0.0, -0.5, 0.1, 3.0, 1e-7, 1e300, float32(2.5)},
		"bools":     []bool{true, false},
		"nothing":   nil,
		"nil_slice": []string{},
		"deep":      map[string]any{"a": map[string]any{"b": []any{map[string]string{"c": "{{ d }}"}}}},
		"_under":    "x",
	}
	text, err := unsafeYAML(vars)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(text); i++ {
		if text[i] >= 0x7f || (text[i] < 0x20 && text[i] != '\n') {
			t.Fatalf("non-printable-ASCII byte %#x at %d", text[i], i)
		}
	}
	path := filepath.Join(t.TempDir(), "vars.yml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("/usr/bin/python3", "-c", ansibleLoad, path).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("Ansible's loader rejects the file: %v\n%s", err, stderr)
	}
	var got any
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.UseNumber()
	if err := dec.Decode(&got); err != nil {
		t.Fatal(err)
	}
	if a, b := normalize(t, got), normalize(t, typed(vars)); a != b {
		i := 0
		for i < len(a) && i < len(b) && a[i] == b[i] {
			i++
		}
		lo := max(0, i-200)
		t.Errorf("Ansible read back something else; from byte %d:\ngot  %.400q\nwant %.400q", lo, a[lo:], b[lo:])
	}
}

func TestUnsafeYAMLRejects(t *testing.T) {
	t.Parallel()
	deep := map[string]any{}
	cur := deep
	for i := 0; i < maxVarDepth+2; i++ {
		next := map[string]any{}
		cur["x"] = next
		cur = next
	}
	tests := map[string]map[string]any{
		"bad name":      {"bad-name": 1},
		"jinja name":    {"{{x}}": 1},
		"empty name":    {"": 1},
		"NaN":           {"f": math.NaN()},
		"Inf":           {"f": math.Inf(1)},
		"bytes":         {"b": []byte("x")},
		"struct":        {"s": struct{}{}},
		"int map keys":  {"m": map[int]string{1: "x"}},
		"channel":       {"c": make(chan int)},
		"too deep":      {"d": deep},
		"nested struct": {"l": []any{struct{}{}}},
	}
	for name, vars := range tests {
		if _, err := unsafeYAML(vars); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func formatInt(n int64) string   { return strconv.FormatInt(n, 10) }
func formatUint(n uint64) string { return strconv.FormatUint(n, 10) }

// runeWise replaces every invalid UTF-8 byte with U+FFFD, as ranging over
// a string does.
func runeWise(s string) string {
	var b strings.Builder
	for _, r := range s {
		b.WriteRune(r)
	}
	return b.String()
}
