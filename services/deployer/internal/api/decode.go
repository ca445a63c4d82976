package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
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
	body := http.MaxBytesReader(w, r.Body, maxBytes)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); !errors.Is(terr, io.EOF) {
			err = errTrailing
		}
	}
	if err == nil {
		return true
	}
	status, detail, field := describeJSONError(err, maxBytes)
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
