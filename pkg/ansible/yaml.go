package ansible

import (
	"fmt"
	"math"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// varNameRe is what Ansible accepts as a variable name.
var varNameRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// maxVarDepth bounds nesting in Spec.Vars (and so the recursion below).
const maxVarDepth = 32

// unsafeYAML renders vars as a YAML flow mapping in which every string (map
// keys included) is a double-quoted scalar tagged !unsafe, so that Ansible
// never templates message data. The output is pure ASCII: everything outside
// printable ASCII is written as a \u or \U escape, which also keeps PyYAML's
// "non-printable character" check away from raw control characters.
//
// Supported values: nil, bool, signed and unsigned integers, finite floats,
// strings, and slices, arrays and string-keyed maps of these (nested). Top
// level keys must be valid Ansible variable names.
func unsafeYAML(vars map[string]any) (string, error) {
	var b strings.Builder
	keys := make([]string, 0, len(vars))
	for k := range vars {
		if !varNameRe.MatchString(k) {
			return "", fmt.Errorf("extra var name %q: want [A-Za-z_][A-Za-z0-9_]*", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b.WriteString("{")
	for i, k := range keys {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString("\n  ")
		writeKey(&b, k)
		if err := writeYAMLValue(&b, reflect.ValueOf(vars[k]), 1); err != nil {
			return "", fmt.Errorf("extra var %s: %w", k, err)
		}
	}
	b.WriteString("\n}\n")
	return b.String(), nil
}

// UnsafeYAML renders v as one YAML flow value in which every string (map
// keys included) is a double-quoted scalar tagged !unsafe, with the value
// kinds and limits of Spec.Vars: for the role variables of generated plays
// and the host variables of generated inventories.
func UnsafeYAML(v any) (string, error) {
	var b strings.Builder
	if err := writeYAMLValue(&b, reflect.ValueOf(v), 1); err != nil {
		return "", err
	}
	return b.String(), nil
}

func writeYAMLValue(b *strings.Builder, v reflect.Value, depth int) error {
	if depth > maxVarDepth {
		return fmt.Errorf("nested deeper than %d levels", maxVarDepth)
	}
	for v.IsValid() && (v.Kind() == reflect.Interface || v.Kind() == reflect.Pointer) {
		if v.IsNil() {
			b.WriteString("null")
			return nil
		}
		v = v.Elem()
	}
	if !v.IsValid() {
		b.WriteString("null")
		return nil
	}
	switch v.Kind() {
	case reflect.String:
		writeUnsafeString(b, v.String())
	case reflect.Bool:
		b.WriteString(strconv.FormatBool(v.Bool()))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		b.WriteString(strconv.FormatInt(v.Int(), 10))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		b.WriteString(strconv.FormatUint(v.Uint(), 10))
	case reflect.Float32, reflect.Float64:
		f := v.Float()
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Errorf("float %v is not representable", f)
		}
		// YAML 1.1 (PyYAML) reads a float only with a dot and no bare exponent.
		s := strconv.FormatFloat(f, 'f', -1, 64)
		if !strings.ContainsRune(s, '.') {
			s += ".0"
		}
		b.WriteString(s)
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Uint8 {
			return fmt.Errorf("[]byte is not supported; pass a string")
		}
		b.WriteString("[")
		for i := 0; i < v.Len(); i++ {
			if i > 0 {
				b.WriteString(", ")
			}
			if err := writeYAMLValue(b, v.Index(i), depth+1); err != nil {
				return fmt.Errorf("[%d]: %w", i, err)
			}
		}
		b.WriteString("]")
	case reflect.Map:
		if v.Type().Key().Kind() != reflect.String {
			return fmt.Errorf("map keys must be strings, not %s", v.Type().Key())
		}
		keys := make([]string, 0, v.Len())
		for _, k := range v.MapKeys() {
			keys = append(keys, k.String())
		}
		sort.Strings(keys)
		b.WriteString("{")
		for i, k := range keys {
			if i > 0 {
				b.WriteString(", ")
			}
			writeKey(b, k)
			if err := writeYAMLValue(b, v.MapIndex(reflect.ValueOf(k).Convert(v.Type().Key())), depth+1); err != nil {
				return fmt.Errorf("[%q]: %w", k, err)
			}
		}
		b.WriteString("}")
	default:
		return fmt.Errorf("unsupported type %s", v.Type())
	}
	return nil
}

// maxImplicitKey is below YAML's 1024-character limit on implicit keys.
const maxImplicitKey = 512

// writeKey writes a mapping key and its ": " separator; long keys use the
// explicit "? key" form, since YAML limits implicit keys to 1024 characters.
func writeKey(b *strings.Builder, k string) {
	var kb strings.Builder
	writeUnsafeString(&kb, k)
	if kb.Len() > maxImplicitKey {
		b.WriteString("? ")
		b.WriteString(kb.String())
		b.WriteString(" : ")
		return
	}
	b.WriteString(kb.String())
	b.WriteString(": ")
}

// writeUnsafeString writes s as `!unsafe "..."`.
func writeUnsafeString(b *strings.Builder, s string) {
	b.WriteString(`!unsafe `)
	writeQuoted(b, s)
}

// writeQuoted writes s as an ASCII-only YAML double-quoted scalar. Invalid
// UTF-8 becomes U+FFFD.
func writeQuoted(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r >= 0x20 && r < 0x7f:
			b.WriteRune(r)
		case r == utf8.RuneError:
			b.WriteString(`\uFFFD`)
		case r <= 0xffff:
			fmt.Fprintf(b, `\u%04X`, r)
		default:
			fmt.Fprintf(b, `\U%08X`, r)
		}
	}
	b.WriteByte('"')
}

// quoted returns s as an ASCII-only YAML double-quoted scalar.
func quoted(s string) string {
	var b strings.Builder
	writeQuoted(&b, s)
	return b.String()
}
