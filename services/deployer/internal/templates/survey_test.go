package templates

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

func ptr[T any](v T) *T { return &v }

// TestAnswers: each question type takes its valid answers (JSON-decoded
// values), applies defaults, refuses what is invalid by survey.<variable>
// without repeating the value, and sets secret answers apart.
func TestAnswers(t *testing.T) {
	qs := []Question{
		{Variable: "name", Type: Text, Required: true, MinLength: ptr(2), MaxLength: ptr(5)},
		{Variable: "n", Type: Integer, Min: ptr(int64(1)), Max: ptr(int64(3)), Default: float64(2)},
		{Variable: "env", Type: Choice, Choices: []string{"a", "b"}},
		{Variable: "feat", Type: MultiChoice, Choices: []string{"x", "y"}},
		{Variable: "pw", Type: Secret, MaxLength: ptr(30)},
	}
	for _, tc := range []struct {
		name    string
		given   map[string]any
		want    string // fmt of the extra variables
		secret  string
		invalid string // the first field refused
	}{
		{name: "defaults", given: map[string]any{"name": "ab"}, want: "map[n:2 name:ab]"},
		{name: "every type", given: map[string]any{"name": "abc", "n": float64(3), "env": "b", "feat": []any{"y", "x"}, "pw": "s3cr{{et}}"},
			want: "map[env:b feat:[y x] n:3 name:abc]", secret: "s3cr{{et}}"},
		{name: "required missing", given: map[string]any{}, invalid: "survey.name"},
		{name: "null is no answer", given: map[string]any{"name": nil}, invalid: "survey.name"},
		{name: "text too short", given: map[string]any{"name": "a"}, invalid: "survey.name"},
		{name: "text not a string", given: map[string]any{"name": float64(12)}, invalid: "survey.name"},
		{name: "integer above max", given: map[string]any{"name": "ab", "n": float64(4)}, invalid: "survey.n"},
		{name: "integer with a fraction", given: map[string]any{"name": "ab", "n": 2.5}, invalid: "survey.n"},
		{name: "integer as a string", given: map[string]any{"name": "ab", "n": "2"}, invalid: "survey.n"},
		{name: "choice unknown", given: map[string]any{"name": "ab", "env": "c"}, invalid: "survey.env"},
		{name: "multi choice not a list", given: map[string]any{"name": "ab", "feat": "x"}, invalid: "survey.feat"},
		{name: "multi choice twice", given: map[string]any{"name": "ab", "feat": []any{"x", "x"}}, invalid: "survey.feat"},
		{name: "secret too long", given: map[string]any{"name": "ab", "pw": "0123456789012345678901234567890123"}, invalid: "survey.pw"},
		{name: "no such question", given: map[string]any{"name": "ab", "zz": 1}, invalid: "survey.zz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vars, hidden, bad := Answers(qs, tc.given)
			if tc.invalid != "" {
				if len(bad) == 0 || bad[0].Field != tc.invalid {
					t.Fatalf("problems %+v, want %s first", bad, tc.invalid)
				}
				for _, f := range bad {
					for _, v := range tc.given {
						if s, ok := v.(string); ok && len(s) > 3 && strings.Contains(f.Message, s) {
							t.Errorf("%s repeats the answer: %s", f.Field, f.Message)
						}
					}
				}
				return
			}
			if len(bad) > 0 {
				t.Fatalf("problems %+v", bad)
			}
			if got := fmt.Sprint(vars); got != tc.want {
				t.Errorf("extra vars %s, want %s", got, tc.want)
			}
			if _, leaked := vars["pw"]; leaked {
				t.Error("the secret answer is an extra variable")
			}
			if got := hidden["pw"].Reveal(); got != tc.secret {
				t.Errorf("secret %q, want %q", got, tc.secret)
			}
		})
	}
}

// TestCheckSurvey: malformed questions are refused by their field, and a
// secret question needs a Vault and has no default.
func TestCheckSurvey(t *testing.T) {
	for _, tc := range []struct {
		name    string
		qs      []Question
		secrets bool
		want    string // the first field refused; "" for none
	}{
		{name: "valid", qs: []Question{{Variable: "a", Type: Text}, {Variable: "b", Type: Secret}}, secrets: true},
		{name: "secret without a Vault", qs: []Question{{Variable: "b", Type: Secret}}, want: "survey[0].type"},
		{name: "secret with a default", qs: []Question{{Variable: "b", Type: Secret, Default: "x"}}, secrets: true, want: "survey[0].default"},
		{name: "variable twice", qs: []Question{{Variable: "a", Type: Text}, {Variable: "a", Type: Text}}, want: "survey[1].variable"},
		{name: "ansible_ variable", qs: []Question{{Variable: "ansible_user", Type: Text}}, want: "survey[0].variable"},
		{name: "choices on a text", qs: []Question{{Variable: "a", Type: Text, Choices: []string{"x"}}}, want: "survey[0].choices"},
		{name: "choices twice", qs: []Question{{Variable: "a", Type: Choice, Choices: []string{"x", "x"}}}, want: "survey[0].choices"},
		{name: "min above max", qs: []Question{{Variable: "a", Type: Integer, Min: ptr(int64(3)), Max: ptr(int64(1))}}, want: "survey[0].min"},
		{name: "bounds on a choice", qs: []Question{{Variable: "a", Type: Choice, Choices: []string{"x"}, Min: ptr(int64(1))}}, want: "survey[0].min"},
		{name: "default outside choices", qs: []Question{{Variable: "a", Type: Choice, Choices: []string{"x"}, Default: "y"}}, want: "survey[0].default"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := checkSurvey(tc.qs, tc.secrets)
			switch {
			case tc.want == "" && len(bad) > 0:
				t.Errorf("refused %+v", bad)
			case tc.want != "" && (len(bad) == 0 || bad[0].Field != tc.want):
				t.Errorf("problems %+v, want %s first", bad, tc.want)
			}
		})
	}
}

// TestRequest: a launch overrides only what the template asks for; the
// survey's answers win over extra_vars (the launch's over the template's);
// the template's own job is not changed; the job names the version.
func TestRequest(t *testing.T) {
	tpl := &Template{ID: "01a20000-0000-7000-8000-000000000001", ProjectID: "p", Name: "site", Version: 3,
		Definition: Definition{
			Job: deployments.JobRequest{Source: deployments.JobSource{Type: "playbook", Ref: "main"},
				Options: deployments.JobOptions{ExtraVars: map[string]any{"a": 1, "b": 1}, Limit: "all"}},
			Ask:    Ask{ExtraVars: true, Ref: true},
			Survey: []Question{{Variable: "b", Type: Text, Default: "survey"}, {Variable: "pw", Type: Secret}},
		}}
	r, hidden, err := Request(tpl, Launch{Ref: "v2", ExtraVars: map[string]any{"a": 2, "b": 2, "c": 2}, Survey: map[string]any{"pw": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(r.Options.ExtraVars); got != "map[a:2 b:survey c:2]" || r.Source.Ref != "v2" || r.Options.Limit != "all" || r.ProjectID != "p" {
		t.Errorf("request %+v", r)
	}
	if r.Template == nil || *r.Template != (deployments.TemplateRef{ID: tpl.ID, Name: "site", Version: 3}) || hidden["pw"].Reveal() != "x" {
		t.Errorf("template %+v, secrets %d", r.Template, len(hidden))
	}
	if got := fmt.Sprint(tpl.Job.Options.ExtraVars); got != "map[a:1 b:1]" {
		t.Errorf("the template's job changed: %s", got)
	}
	for _, tc := range []struct {
		name  string
		l     Launch
		field string
	}{
		{"limit not asked", Launch{Limit: ptr("web")}, "limit"},
		{"inventory not asked", Launch{Inventory: &deployments.JobInventory{Type: "inline"}}, "inventory"},
		{"check not asked", Launch{Check: ptr(true)}, "check"},
		{"verbosity not asked", Launch{Verbosity: ptr(2)}, "verbosity"},
		{"extra var shadows a secret", Launch{ExtraVars: map[string]any{"pw": "y"}, Survey: map[string]any{"pw": "x"}}, "extra_vars[pw]"},
	} {
		_, _, err := Request(tpl, tc.l)
		var ie *deployments.InvalidError
		if !errors.As(err, &ie) || ie.Fields[0].Field != tc.field {
			t.Errorf("%s: %v, want a problem at %s", tc.name, err, tc.field)
		}
	}
}
