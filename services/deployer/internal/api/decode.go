package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"regexp"
	"strconv"
	"strings"
)

// decodeJSON reads the request body into v: JSON only, one object, no
// unknown fields, at most maxBytes. On failure it writes a problem naming
// what is wrong (never the rejected value) and returns false.
func decodeJSON(w http.ResponseWriter, r *http.Request, maxBytes int64, v any) bool {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			writeProblem(w, r, http.StatusUnsupportedMediaType, ProbUnsupportedMedia,
				"send the body as application/json")
			return false
		}
	}
	// The body is read whole (at most maxBytes) so that an unknown field
	// can be found again with its path (see unknownFieldPath).
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBytes))
	if err == nil {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		err = dec.Decode(v)
		if err == nil {
			if _, terr := dec.Token(); !errors.Is(terr, io.EOF) {
				err = errTrailing
			}
		}
	}
	if err == nil {
		return true
	}
	status, detail, field := describeJSONError(err, maxBytes)
	if field != "" && status == http.StatusBadRequest && strings.HasPrefix(err.Error(), "json: unknown field ") {
		if path, ok := unknownFieldPath(data, reflect.TypeOf(v)); ok && strings.HasSuffix(path, field) {
			field = path
		}
	}
	typ := ProbInvalidJSON
	if status == http.StatusRequestEntityTooLarge {
		typ = ProbTooLarge
	}
	if field != "" {
		writeProblem(w, r, status, typ, detail, FieldProblem{Field: field, Message: detail})
	} else {
		writeProblem(w, r, status, typ, detail)
	}
	return false
}

var errTrailing = errors.New("trailing data")

// fieldNameRE is the shape of field names that may be repeated in an
// error: short snake_case names. Anything else (a pasted token used as a
// key) is not echoed.
var fieldNameRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,39}$`)

func describeJSONError(err error, maxBytes int64) (status int, detail, field string) {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is larger than %d bytes", maxBytes), ""
	case errors.Is(err, io.EOF):
		return http.StatusBadRequest, "the request body is empty: send a JSON object", ""
	case errors.Is(err, io.ErrUnexpectedEOF):
		return http.StatusBadRequest, "the request body ends in the middle of its JSON", ""
	case errors.Is(err, errTrailing):
		return http.StatusBadRequest, "the request body has data after its JSON object", ""
	case errors.As(err, &syntax):
		return http.StatusBadRequest, fmt.Sprintf("malformed JSON at byte %d", syntax.Offset), ""
	case errors.As(err, &typ):
		f := typ.Field
		if f == "" {
			return http.StatusBadRequest, "the request body must be a JSON object", ""
		}
		return http.StatusBadRequest, "must be " + jsonKind(typ.Type.Kind().String()), f
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		name = strings.Trim(name, `"`)
		if fieldNameRE.MatchString(name) {
			return http.StatusBadRequest, "unknown field (see the OpenAPI document for the fields)", name
		}
		return http.StatusBadRequest, "the body has an unknown field (its name is not repeated here)", ""
	}
	return http.StatusBadRequest, "the request body is not valid JSON", ""
}

func jsonKind(goKind string) string {
	switch goKind {
	case "int", "int64", "int32", "uint", "uint64":
		return "an integer"
	case "float64", "float32":
		return "a number"
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	case "slice", "array":
		return "an array"
	case "struct", "map":
		return "an object"
	}
	return "of another type"
}

// unknownFieldPath finds the first field of the JSON document data that t
// (the type decoded into) does not have, in document order as
// encoding/json meets it, and returns its path: "options.retries",
// "modules[1].name". Known parts of the path are spelled as t names them;
// only the last part is the client's.
func unknownFieldPath(data []byte, t reflect.Type) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	path, found, err := walkUnknown(dec, t, "")
	return path, found && err == nil
}

// walkUnknown reads one JSON value from dec, matching it against t (nil:
// anything, skipped), and returns the path of the first unknown field.
func walkUnknown(dec *json.Decoder, t reflect.Type, path string) (string, bool, error) {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := dec.Token()
	if err != nil {
		return "", false, err
	}
	delim, ok := tok.(json.Delim)
	if !ok {
		return "", false, nil // a scalar
	}
	switch delim {
	case '{':
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return "", false, err
			}
			key, _ := kt.(string)
			var elem reflect.Type
			name := key
			switch {
			case t == nil:
			case t.Kind() == reflect.Struct:
				f, ok := jsonField(t, key)
				if !ok {
					return joinPath(path, key), true, nil
				}
				elem, name = f.typ, f.name
			case t.Kind() == reflect.Map:
				elem, name = t.Elem(), "*" // map keys are the client's: not repeated
			}
			if p, found, err := walkUnknown(dec, elem, joinPath(path, name)); found || err != nil {
				return p, found, err
			}
		}
	case '[':
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if p, found, err := walkUnknown(dec, elem, path+"["+strconv.Itoa(i)+"]"); found || err != nil {
				return p, found, err
			}
		}
	}
	_, err = dec.Token() // the closing delimiter
	return "", false, err
}

func joinPath(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// jsonFieldInfo is a struct field as encoding/json sees it.
type jsonFieldInfo struct {
	name string
	typ  reflect.Type
}

// jsonField finds the field of struct type t that encoding/json decodes
// key into: an exact name first, else one equal under case folding;
// fields of embedded structs count as t's.
func jsonField(t reflect.Type, key string) (jsonFieldInfo, bool) {
	var folded *jsonFieldInfo
	for _, f := range jsonFields(t) {
		if f.name == key {
			return f, true
		}
		if folded == nil && strings.EqualFold(f.name, key) {
			folded = &f
		}
	}
	if folded != nil {
		return *folded, true
	}
	return jsonFieldInfo{}, false
}

func jsonFields(t reflect.Type) []jsonFieldInfo {
	var out []jsonFieldInfo
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		ft := f.Type
		if f.Anonymous && name == "" {
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				out = append(out, jsonFields(ft)...)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, jsonFieldInfo{name: name, typ: f.Type})
	}
	return out
}
