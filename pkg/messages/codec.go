package messages

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// The codec maps the message structs to msgpack maps by their `msgpack`
// struct tags (the same tags the JSON Schemas are generated from), so the
// tags are the one source of the key names:
//
//   - Encode writes a map whose keys are sorted by their bytes, integers in
//     their most compact form, and leaves out the `omitempty` fields that hold
//     their zero value. Equal values always give equal bytes.
//   - decode reads a map in any key order, with integers of any width,
//     ignores unknown keys (whatever their value), treats a nil value as an
//     absent key, and reports every value of the wrong type by its wire path
//     instead of stopping at the first one.

// maxDepth bounds the nesting of maps and arrays, known or not, so that a
// hostile input cannot exhaust the stack.
const maxDepth = 32

// Encode returns the canonical msgpack encoding of a message:
// ProvisionerMessage, AnsibleDeployMessage, ProvisionerResult,
// AnsibleDeployResult or ProgressEvent, or a pointer to one. Map keys are
// sorted, integers are compact, empty optional keys are left out, so equal
// values give equal bytes. Encode does not validate (call Validate first);
// it fails for other types, for strings that are not valid UTF-8 and for
// encodings over MaxMessageSize, all of which every consumer would refuse.
func Encode(v any) ([]byte, error) {
	rv := reflect.ValueOf(v)
	if !rv.IsValid() {
		return nil, fmt.Errorf("encode: nil value")
	}
	if rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return nil, fmt.Errorf("encode %T: nil pointer", v)
		}
		rv = rv.Elem()
	}
	switch rv.Type() {
	case reflect.TypeFor[ProvisionerMessage](), reflect.TypeFor[AnsibleDeployMessage](),
		reflect.TypeFor[ProvisionerResult](), reflect.TypeFor[AnsibleDeployResult](),
		reflect.TypeFor[ProgressEvent](), reflect.TypeFor[AnsibleJobMessage](), reflect.TypeFor[AnsibleJobResult]():
	default:
		return nil, fmt.Errorf("encode %T: not a message type of this package", v)
	}
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	if err := encodeValue(enc, rv); err != nil {
		return nil, fmt.Errorf("encode %s: %w", rv.Type().Name(), err)
	}
	if buf.Len() > MaxMessageSize {
		return nil, fmt.Errorf("encode %s: %d bytes is over the %d byte limit", rv.Type().Name(), buf.Len(), MaxMessageSize)
	}
	return buf.Bytes(), nil
}

// wireField is one key of a struct's map.
type wireField struct {
	name      string
	index     []int // reflect field index path (through embedded structs)
	omitEmpty bool
}

// fieldCache memoizes wireFields by type: a type's fields never change,
// and walking them by reflection on every Encode and decode was the largest
// cost of both. Like encoding/json's field cache it is the one
// package-level variable here; it holds nothing but what the types say.
var fieldCache sync.Map // reflect.Type -> []wireField

// wireFields lists the keys of struct type t sorted by name, flattening
// embedded structs that have no key of their own. The slice is shared:
// callers must not change it.
func wireFields(t reflect.Type) []wireField {
	if f, ok := fieldCache.Load(t); ok {
		return f.([]wireField)
	}
	f, _ := fieldCache.LoadOrStore(t, walkWireFields(t))
	return f.([]wireField)
}

// walkWireFields computes wireFields(t).
func walkWireFields(t reflect.Type) []wireField {
	var fields []wireField
	var walk func(t reflect.Type, index []int)
	walk = func(t reflect.Type, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("msgpack")
			name, opts, _ := strings.Cut(tag, ",")
			idx := append(slices.Clone(index), i)
			if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
				walk(f.Type, idx)
				continue
			}
			if !f.IsExported() || name == "-" || name == "" {
				continue
			}
			fields = append(fields, wireField{
				name:      name,
				index:     idx,
				omitEmpty: slices.Contains(strings.Split(opts, ","), "omitempty"),
			})
		}
	}
	walk(t, nil)
	slices.SortFunc(fields, func(a, b wireField) int { return strings.Compare(a.name, b.name) })
	return fields
}

func isEmptyValue(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.String, reflect.Slice, reflect.Map:
		return v.Len() == 0
	case reflect.Pointer:
		return v.IsNil()
	default:
		return v.IsZero()
	}
}

func encodeValue(enc *msgpack.Encoder, v reflect.Value) error {
	switch v.Kind() {
	case reflect.String:
		if !utf8.ValidString(v.String()) {
			return errors.New("not valid UTF-8")
		}
		return enc.EncodeString(v.String())
	case reflect.Bool:
		return enc.EncodeBool(v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return enc.EncodeInt(v.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return enc.EncodeUint(v.Uint())
	case reflect.Float32, reflect.Float64:
		return enc.EncodeFloat64(v.Float())
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return enc.EncodeNil()
		}
		return encodeValue(enc, v.Elem())
	case reflect.Slice:
		if err := enc.EncodeArrayLen(v.Len()); err != nil {
			return err
		}
		for i := range v.Len() {
			if err := encodeValue(enc, v.Index(i)); err != nil {
				return fmt.Errorf("[%d]: %w", i, err)
			}
		}
		return nil
	case reflect.Map:
		keys := v.MapKeys()
		slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(a.String(), b.String()) })
		if err := enc.EncodeMapLen(len(keys)); err != nil {
			return err
		}
		for _, k := range keys {
			if !utf8.ValidString(k.String()) {
				return errors.New("map key not valid UTF-8")
			}
			if err := enc.EncodeString(k.String()); err != nil {
				return err
			}
			if err := encodeValue(enc, v.MapIndex(k)); err != nil {
				return fmt.Errorf("[%s]: %w", k.String(), err)
			}
		}
		return nil
	case reflect.Struct:
		fields := wireFields(v.Type())
		present := fields[:0:0]
		for _, f := range fields {
			if !f.omitEmpty || !isEmptyValue(v.FieldByIndex(f.index)) {
				present = append(present, f)
			}
		}
		if err := enc.EncodeMapLen(len(present)); err != nil {
			return err
		}
		for _, f := range present {
			if err := enc.EncodeString(f.name); err != nil {
				return err
			}
			if err := encodeValue(enc, v.FieldByIndex(f.index)); err != nil {
				return fmt.Errorf("%s: %w", f.name, err)
			}
		}
		return nil
	default:
		return fmt.Errorf("unsupported kind %s", v.Kind())
	}
}

// decode reads one msgpack map from data into the struct pointed to by out.
// It returns a *DecodeError with an empty Fields list when the input as a
// whole is unusable (out is then in an unspecified state), and a
// *DecodeError listing the fields when only some values have the wrong type
// (out then holds every other value).
func decode(data []byte, out any) error {
	if len(data) == 0 {
		return &DecodeError{Reason: "empty input"}
	}
	if len(data) > MaxMessageSize {
		return &DecodeError{Reason: fmt.Sprintf("%d bytes is over the %d byte limit", len(data), MaxMessageSize)}
	}
	r := bytes.NewReader(data)
	d := &decoder{dec: msgpack.NewDecoder(r)}
	c, err := d.dec.PeekCode()
	if err != nil {
		return d.malformed(err)
	}
	if !isMap(c) {
		return &DecodeError{Reason: "not a msgpack map (got " + codeType(c) + ")"}
	}
	if err := d.structValue(reflect.ValueOf(out).Elem(), "", 1); err != nil {
		return err
	}
	if r.Len() != 0 {
		return &DecodeError{Reason: fmt.Sprintf("%d trailing bytes after the map", r.Len())}
	}
	if len(d.errs) > 0 {
		return &DecodeError{Fields: d.errs, Omitted: d.omitted}
	}
	return nil
}

type decoder struct {
	dec     *msgpack.Decoder
	errs    []FieldError
	omitted int // field errors beyond MaxFieldErrors
}

// fieldError records a problem with one value: the first MaxFieldErrors
// are kept, the others counted.
func (d *decoder) fieldError(path, message string) {
	if len(d.errs) >= MaxFieldErrors {
		d.omitted++
		return
	}
	d.errs = append(d.errs, FieldError{Field: path, Message: message})
}

// malformed turns an error of the msgpack reader into the *DecodeError that
// ends decoding.
func (d *decoder) malformed(err error) error {
	var de *DecodeError
	if errors.As(err, &de) {
		return err
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return &DecodeError{Reason: "truncated msgpack"}
	}
	return &DecodeError{Reason: "malformed msgpack", Err: err}
}

func (d *decoder) typeError(path, want string, c byte) {
	d.fieldError(path, "must be "+want+" (got "+codeType(c)+")")
}

func joinPath(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}

// structValue reads a map into the struct v. The next value must be a map.
func (d *decoder) structValue(v reflect.Value, path string, depth int) error {
	if depth > maxDepth {
		return &DecodeError{Reason: fmt.Sprintf("nested deeper than %d levels", maxDepth)}
	}
	n, err := d.dec.DecodeMapLen()
	if err != nil {
		return d.malformed(err)
	}
	fields := wireFields(v.Type())
	seen := make([]bool, len(fields))
	for range n {
		c, err := d.dec.PeekCode()
		if err != nil {
			return d.malformed(err)
		}
		if !msgpcode.IsString(c) {
			where := "map"
			if path != "" {
				where = path
			}
			return &DecodeError{Reason: where + " has a key that is not a string (" + codeType(c) + ")"}
		}
		key, err := d.dec.DecodeString()
		if err != nil {
			return d.malformed(err)
		}
		i, ok := slices.BinarySearchFunc(fields, key, func(f wireField, k string) int { return strings.Compare(f.name, k) })
		if !ok {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
			continue
		}
		fieldPath := joinPath(path, key)
		if seen[i] {
			d.fieldError(fieldPath, "duplicate key")
			if err := d.skip(depth + 1); err != nil {
				return err
			}
			continue
		}
		seen[i] = true
		c, err = d.dec.PeekCode()
		if err != nil {
			return d.malformed(err)
		}
		if c == msgpcode.Nil { // nil is the same as an absent key
			if err := d.dec.DecodeNil(); err != nil {
				return d.malformed(err)
			}
			continue
		}
		if err := d.value(v.FieldByIndex(fields[i].index), fieldPath, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// value reads the next msgpack value into v, recording a field error (and
// skipping the value) when its type does not fit.
func (d *decoder) value(v reflect.Value, path string, depth int) error {
	if depth > maxDepth {
		return &DecodeError{Reason: fmt.Sprintf("nested deeper than %d levels", maxDepth)}
	}
	c, err := d.dec.PeekCode()
	if err != nil {
		return d.malformed(err)
	}
	switch v.Kind() {
	case reflect.String:
		if !msgpcode.IsString(c) {
			d.typeError(path, "a string", c)
			return d.skip(depth)
		}
		s, err := d.dec.DecodeString()
		if err != nil {
			return d.malformed(err)
		}
		if !utf8.ValidString(s) {
			d.fieldError(path, "must be valid UTF-8")
			return nil
		}
		v.SetString(s)
	case reflect.Bool:
		if c != msgpcode.True && c != msgpcode.False {
			d.typeError(path, "a boolean", c)
			return d.skip(depth)
		}
		b, err := d.dec.DecodeBool()
		if err != nil {
			return d.malformed(err)
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if !isInt(c) {
			d.typeError(path, "an integer", c)
			return d.skip(depth)
		}
		var n int64
		if c == msgpcode.Uint64 {
			u, err := d.dec.DecodeUint64()
			if err != nil {
				return d.malformed(err)
			}
			if u > math.MaxInt64 {
				d.fieldError(path, "integer out of range")
				return nil
			}
			n = int64(u)
		} else if n, err = d.dec.DecodeInt64(); err != nil {
			return d.malformed(err)
		}
		if v.OverflowInt(n) {
			d.fieldError(path, "integer out of range")
			return nil
		}
		v.SetInt(n)
	case reflect.Pointer:
		if !isMap(c) {
			d.typeError(path, "a map", c)
			return d.skip(depth)
		}
		p := reflect.New(v.Type().Elem())
		if err := d.structValue(p.Elem(), path, depth); err != nil {
			return err
		}
		v.Set(p)
	case reflect.Struct:
		if !isMap(c) {
			d.typeError(path, "a map", c)
			return d.skip(depth)
		}
		return d.structValue(v, path, depth)
	case reflect.Slice:
		if !isArray(c) {
			d.typeError(path, "an array", c)
			return d.skip(depth)
		}
		n, err := d.dec.DecodeArrayLen()
		if err != nil {
			return d.malformed(err)
		}
		s := reflect.MakeSlice(v.Type(), 0, min(n, 16))
		for i := range n {
			elem := reflect.New(v.Type().Elem()).Elem()
			if err := d.element(elem, path+"["+strconv.Itoa(i)+"]", depth+1); err != nil {
				return err
			}
			s = reflect.Append(s, elem)
		}
		if s.Len() > 0 {
			v.Set(s)
		}
	case reflect.Map:
		if !isMap(c) {
			d.typeError(path, "a map", c)
			return d.skip(depth)
		}
		n, err := d.dec.DecodeMapLen()
		if err != nil {
			return d.malformed(err)
		}
		m := reflect.MakeMap(v.Type())
		for range n {
			c, err := d.dec.PeekCode()
			if err != nil {
				return d.malformed(err)
			}
			if !msgpcode.IsString(c) {
				return &DecodeError{Reason: path + " has a key that is not a string (" + codeType(c) + ")"}
			}
			key, err := d.dec.DecodeString()
			if err != nil {
				return d.malformed(err)
			}
			elemPath := path + "[" + key + "]"
			if !utf8.ValidString(key) {
				d.fieldError(path, "keys must be valid UTF-8")
				if err := d.skip(depth + 1); err != nil {
					return err
				}
				continue
			}
			k := reflect.ValueOf(key).Convert(v.Type().Key())
			if m.MapIndex(k).IsValid() {
				d.fieldError(elemPath, "duplicate key")
				if err := d.skip(depth + 1); err != nil {
					return err
				}
				continue
			}
			elem := reflect.New(v.Type().Elem()).Elem()
			if err := d.element(elem, elemPath, depth+1); err != nil {
				return err
			}
			m.SetMapIndex(k, elem)
		}
		if m.Len() > 0 {
			v.Set(m)
		}
	case reflect.Interface:
		x, ok, err := d.freeValue(path, depth)
		if err != nil || !ok {
			return err
		}
		if x != nil {
			v.Set(reflect.ValueOf(x))
		}
	default:
		return fmt.Errorf("messages: unsupported field kind %s at %s", v.Kind(), path)
	}
	return nil
}

// freeValue reads a free-form value (the values of Vars): nil, a boolean,
// an integer, a float, a string, or an array or map (string keys) of them.
// Integers come back as int64, floats as float64, arrays as []any, maps as
// map[string]any. A binary, an extension or an integer beyond int64 is a
// field error (ok false, the value skipped).
func (d *decoder) freeValue(path string, depth int) (x any, ok bool, err error) {
	if depth > maxDepth {
		return nil, false, &DecodeError{Reason: fmt.Sprintf("nested deeper than %d levels", maxDepth)}
	}
	c, err := d.dec.PeekCode()
	if err != nil {
		return nil, false, d.malformed(err)
	}
	switch {
	case c == msgpcode.Nil:
		return nil, true, d.wrap(d.dec.DecodeNil())
	case c == msgpcode.True || c == msgpcode.False:
		b, err := d.dec.DecodeBool()
		return b, err == nil, d.wrap(err)
	case c == msgpcode.Uint64:
		u, err := d.dec.DecodeUint64()
		if err != nil {
			return nil, false, d.malformed(err)
		}
		if u > math.MaxInt64 {
			d.fieldError(path, "integer out of range")
			return nil, false, nil
		}
		return int64(u), true, nil
	case isInt(c):
		n, err := d.dec.DecodeInt64()
		return n, err == nil, d.wrap(err)
	case c == msgpcode.Float || c == msgpcode.Double:
		f, err := d.dec.DecodeFloat64()
		return f, err == nil, d.wrap(err)
	case msgpcode.IsString(c):
		s, err := d.dec.DecodeString()
		if err != nil {
			return nil, false, d.malformed(err)
		}
		if !utf8.ValidString(s) {
			d.fieldError(path, "must be valid UTF-8")
			return nil, false, nil
		}
		return s, true, nil
	case isArray(c):
		n, err := d.dec.DecodeArrayLen()
		if err != nil {
			return nil, false, d.malformed(err)
		}
		l := make([]any, 0, min(n, 16))
		for i := range n {
			x, _, err := d.freeValue(path+"["+strconv.Itoa(i)+"]", depth+1)
			if err != nil {
				return nil, false, err
			}
			l = append(l, x)
		}
		return l, true, nil
	case isMap(c):
		n, err := d.dec.DecodeMapLen()
		if err != nil {
			return nil, false, d.malformed(err)
		}
		m := make(map[string]any, min(n, 16))
		for range n {
			c, err := d.dec.PeekCode()
			if err != nil {
				return nil, false, d.malformed(err)
			}
			if !msgpcode.IsString(c) {
				return nil, false, &DecodeError{Reason: path + " has a key that is not a string (" + codeType(c) + ")"}
			}
			key, err := d.dec.DecodeString()
			if err != nil {
				return nil, false, d.malformed(err)
			}
			elemPath := path + "[" + key + "]"
			if _, dup := m[key]; dup || !utf8.ValidString(key) {
				d.fieldError(elemPath, "duplicate or invalid key")
				if err := d.skip(depth + 1); err != nil {
					return nil, false, err
				}
				continue
			}
			x, _, err := d.freeValue(elemPath, depth+1)
			if err != nil {
				return nil, false, err
			}
			m[key] = x
		}
		return m, true, nil
	}
	d.fieldError(path, "must be nil, a boolean, a number, a string, an array or a map (got "+codeType(c)+")")
	return nil, false, d.skip(depth)
}

// wrap turns a reader error into the *DecodeError that ends decoding; nil
// stays nil.
func (d *decoder) wrap(err error) error {
	if err == nil {
		return nil
	}
	return d.malformed(err)
}

// element reads an array element or a map value, where nil is not allowed.
func (d *decoder) element(v reflect.Value, path string, depth int) error {
	c, err := d.dec.PeekCode()
	if err != nil {
		return d.malformed(err)
	}
	if c == msgpcode.Nil && v.Kind() != reflect.Interface {
		if err := d.dec.DecodeNil(); err != nil {
			return d.malformed(err)
		}
		d.fieldError(path, "must be "+wantName(v.Kind())+" (got nil)")
		return nil
	}
	return d.value(v, path, depth)
}

// skip passes over the next value, which may be of any type, bounding the
// nesting of maps and arrays.
func (d *decoder) skip(depth int) error {
	if depth > maxDepth {
		return &DecodeError{Reason: fmt.Sprintf("nested deeper than %d levels", maxDepth)}
	}
	c, err := d.dec.PeekCode()
	if err != nil {
		return d.malformed(err)
	}
	var n int
	switch {
	case isArray(c):
		if n, err = d.dec.DecodeArrayLen(); err != nil {
			return d.malformed(err)
		}
	case isMap(c):
		if n, err = d.dec.DecodeMapLen(); err != nil {
			return d.malformed(err)
		}
		n *= 2
	default: // a scalar: Skip does not recurse
		if err := d.dec.Skip(); err != nil {
			return d.malformed(err)
		}
		return nil
	}
	for range n {
		if err := d.skip(depth + 1); err != nil {
			return err
		}
	}
	return nil
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isInt(c byte) bool {
	if msgpcode.IsFixedNum(c) {
		return true
	}
	switch c {
	case msgpcode.Uint8, msgpcode.Uint16, msgpcode.Uint32, msgpcode.Uint64,
		msgpcode.Int8, msgpcode.Int16, msgpcode.Int32, msgpcode.Int64:
		return true
	}
	return false
}

// wantName names the msgpack type that a Go kind is read from.
func wantName(k reflect.Kind) string {
	switch k {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Slice:
		return "an array"
	default:
		return "a map"
	}
}

// codeType names the msgpack type that starts with code c.
func codeType(c byte) string {
	switch {
	case c == msgpcode.Nil:
		return "nil"
	case c == msgpcode.True || c == msgpcode.False:
		return "boolean"
	case isInt(c):
		return "integer"
	case c == msgpcode.Float || c == msgpcode.Double:
		return "float"
	case msgpcode.IsString(c):
		return "string"
	case msgpcode.IsBin(c):
		return "binary"
	case isArray(c):
		return "array"
	case isMap(c):
		return "map"
	case msgpcode.IsExt(c):
		return "extension"
	default:
		return fmt.Sprintf("invalid code 0x%02x", c)
	}
}
