package templates

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// QuestionType is what a survey question asks for.
type QuestionType string

// The question types (AWX's survey is the model).
const (
	// Text is a string, of MinLength-MaxLength characters when given.
	Text QuestionType = "text"
	// Integer is a whole number, within Min-Max when given.
	Integer QuestionType = "integer"
	// Choice is one of Choices.
	Choice QuestionType = "choice"
	// MultiChoice is a list of distinct Choices.
	MultiChoice QuestionType = "multi_choice"
	// Secret is a text whose answer is written to Vault at launch and
	// reaches the play through the job's secret_vars (its environment),
	// never a row; it has no default.
	Secret QuestionType = "secret"
)

// Question is a survey's prompt: its answer becomes the extra variable
// Variable of the launched job.
type Question struct {
	Variable    string       `json:"variable"`
	Label       string       `json:"label,omitempty"`
	Description string       `json:"description,omitempty"`
	Type        QuestionType `json:"type"`
	Required    bool         `json:"required,omitempty"`
	// Default is the answer when a launch gives none.
	Default any `json:"default,omitempty"`
	// Choices are the answers of a choice or multi_choice question.
	Choices []string `json:"choices,omitempty"`
	// Min and Max bound an integer's value; MinLength and MaxLength a
	// text's length in characters.
	Min       *int64 `json:"min,omitempty"`
	Max       *int64 `json:"max,omitempty"`
	MinLength *int   `json:"min_length,omitempty"`
	MaxLength *int   `json:"max_length,omitempty"`
}

// variableRE is the shape of an extra variable's name, as the wire
// contract has it (no ansible_ prefix is checked apart).
var variableRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// checkSurvey validates a survey's questions (secret ones only when
// secrets can be written to Vault).
func checkSurvey(qs []Question, secrets bool) []deployments.FieldError {
	var out []deployments.FieldError
	bad := func(i int, f, msg string) {
		out = append(out, deployments.FieldError{Field: fmt.Sprintf("survey[%d]%s", i, f), Message: msg})
	}
	if len(qs) > 50 {
		return []deployments.FieldError{{Field: "survey", Message: "at most 50 questions"}}
	}
	seen := map[string]bool{}
	for i, q := range qs {
		switch {
		case !variableRE.MatchString(q.Variable) || strings.HasPrefix(q.Variable, "ansible_"):
			bad(i, ".variable", "must be a variable name (letters, digits, '_'; not starting with a digit or ansible_)")
		case seen[q.Variable]:
			bad(i, ".variable", "asked twice")
		}
		seen[q.Variable] = true
		if len(q.Label) > 200 || len(q.Description) > 1000 {
			bad(i, ".label", "label at most 200 characters, description at most 1000")
		}
		switch q.Type {
		case Secret:
			if q.Default != nil {
				bad(i, ".default", "a secret question has no default: it would be stored")
				q.Default = nil
			}
			if !secrets {
				bad(i, ".type", "secret questions need a Vault for the answers (CREDENTIALS_VAULT_ADDR)")
			}
			fallthrough
		case Text, Integer:
			if len(q.Choices) > 0 {
				bad(i, ".choices", "only choice and multi_choice questions have choices")
			}
		case Choice, MultiChoice:
			if len(q.Choices) == 0 || len(q.Choices) > 100 {
				bad(i, ".choices", "give 1-100 choices")
			}
			for j, c := range q.Choices {
				if c == "" || len(c) > 200 || slices.Index(q.Choices, c) != j {
					bad(i, ".choices", "choices are distinct, non-empty strings of at most 200 characters")
					break
				}
			}
		default:
			bad(i, ".type", "must be text, integer, choice, multi_choice or secret")
			continue
		}
		if (q.Min != nil || q.Max != nil) && q.Type != Integer {
			bad(i, ".min", "min and max bound integers only")
		}
		if (q.MinLength != nil || q.MaxLength != nil) && q.Type != Text && q.Type != Secret {
			bad(i, ".min_length", "min_length and max_length bound texts and secrets only")
		}
		if q.Min != nil && q.Max != nil && *q.Min > *q.Max {
			bad(i, ".min", "min is above max")
		}
		if q.MinLength != nil && q.MaxLength != nil && *q.MinLength > *q.MaxLength {
			bad(i, ".min_length", "min_length is above max_length")
		}
		if q.Default != nil {
			if _, msg := q.answer(q.Default); msg != "" {
				bad(i, ".default", "the default is not a valid answer: "+msg)
			}
		}
	}
	return out
}

// Answers applies a launch's survey answers (variable to value, as JSON
// decoded them) to qs: it returns the extra variables to set and the
// secret questions' answers, or the problems, by "survey.<variable>". A
// required question without answer or default, an answer to no question,
// and an invalid answer are refused.
func Answers(qs []Question, given map[string]any) (map[string]any, map[string]secrets.Value, []deployments.FieldError) {
	var fields []deployments.FieldError
	out := map[string]any{}
	hidden := map[string]secrets.Value{}
	asked := map[string]bool{}
	for _, q := range qs {
		asked[q.Variable] = true
		v, ok := given[q.Variable]
		if !ok || v == nil {
			v = q.Default
		}
		if v == nil {
			if q.Required {
				fields = append(fields, deployments.FieldError{Field: "survey." + q.Variable, Message: "required: this question has no default"})
			}
			continue
		}
		a, msg := q.answer(v)
		switch {
		case msg != "":
			fields = append(fields, deployments.FieldError{Field: "survey." + q.Variable, Message: msg})
		case q.Type == Secret:
			hidden[q.Variable] = secrets.NewValue([]byte(a.(string)))
		default:
			out[q.Variable] = a
		}
	}
	names := make([]string, 0, len(given))
	for name := range given {
		if !asked[name] {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		fields = append(fields, deployments.FieldError{Field: "survey." + truncate(name, 64), Message: "the survey has no such question"})
	}
	return out, hidden, fields
}

// answer checks v as an answer to q: the value to pass on, or why not.
// Messages never repeat the value.
func (q Question) answer(v any) (any, string) {
	switch q.Type {
	case Text, Secret:
		s, ok := v.(string)
		if !ok {
			return nil, "must be a string"
		}
		n := utf8.RuneCountInString(s)
		if q.MinLength != nil && n < *q.MinLength || q.MaxLength != nil && n > *q.MaxLength || n > 4096 {
			return nil, fmt.Sprintf("must be %d-%d characters", deref(q.MinLength, 0), min(deref(q.MaxLength, 4096), 4096))
		}
		if q.Required && s == "" {
			return nil, "required: must not be empty"
		}
		return s, ""
	case Integer:
		n, ok := integer(v)
		if !ok {
			return nil, "must be a whole number"
		}
		if q.Min != nil && n < *q.Min || q.Max != nil && n > *q.Max {
			return nil, fmt.Sprintf("must be within %s-%s", bound(q.Min, "any"), bound(q.Max, "any"))
		}
		return n, ""
	case Choice:
		s, ok := v.(string)
		if !ok || !slices.Contains(q.Choices, s) {
			return nil, "must be one of the choices: " + strings.Join(q.Choices, ", ")
		}
		return s, ""
	case MultiChoice:
		list, ok := v.([]any)
		if !ok {
			return nil, "must be a list of the choices"
		}
		out := make([]any, 0, len(list))
		for _, item := range list {
			s, ok := item.(string)
			if !ok || !slices.Contains(q.Choices, s) || slices.Contains(out, any(s)) {
				return nil, "must be a list of distinct choices: " + strings.Join(q.Choices, ", ")
			}
			out = append(out, s)
		}
		if q.Required && len(out) == 0 {
			return nil, "required: choose at least one"
		}
		return out, ""
	}
	return nil, "unknown question type"
}

// integer reads v (a JSON number, as float64 or json.Number, or an int)
// as a whole number.
func integer(v any) (int64, bool) {
	switch n := v.(type) {
	case float64:
		if n != math.Trunc(n) || math.Abs(n) > 1<<53 {
			return 0, false
		}
		return int64(n), true
	case json.Number:
		i, err := n.Int64()
		return i, err == nil
	case int64:
		return n, true
	case int:
		return int64(n), true
	}
	return 0, false
}

func deref(p *int, def int) int {
	if p == nil {
		return def
	}
	return *p
}

func bound(p *int64, none string) string {
	if p == nil {
		return none
	}
	return fmt.Sprint(*p)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
