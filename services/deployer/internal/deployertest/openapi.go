package deployertest

import (
	"bytes"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/api"
)

var (
	compileOnce sync.Once
	compiler    *jsonschema.Compiler
	compileErr  error
	schemas     sync.Map
)

const docURL = "https://autoprovisioner.dev/openapi.json"

// CheckSchema validates a JSON body against a schema of the checked-in
// OpenAPI document (components/schemas/<name>), so that tests prove the
// document describes what the API really answers.
func CheckSchema(t testing.TB, name string, body []byte) {
	t.Helper()
	compileOnce.Do(func() {
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(api.OpenAPIDocument()))
		if err != nil {
			compileErr = err
			return
		}
		compiler = jsonschema.NewCompiler()
		compiler.DefaultDraft(jsonschema.Draft2020)
		compileErr = compiler.AddResource(docURL, doc)
	})
	if compileErr != nil {
		t.Fatalf("OpenAPI document: %v", compileErr)
	}
	s, ok := schemas.Load(name)
	if !ok {
		sch, err := compiler.Compile(docURL + "#/components/schemas/" + name)
		if err != nil {
			t.Fatalf("schema %s: %v", name, err)
		}
		s, _ = schemas.LoadOrStore(name, sch)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("body is not JSON: %v", err)
	}
	if err := s.(*jsonschema.Schema).Validate(v); err != nil {
		t.Errorf("the answer does not match the OpenAPI schema %s: %v\nbody: %s", name, err, truncate(body))
	}
}
