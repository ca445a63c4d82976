package messages

import (
	"fmt"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern"
)

// Validation messages shared by several keys.
const (
	msgRequired = "required"
	msgID       = "must be 1 to 255 printable ASCII characters without spaces"
	msgTime     = "must be an RFC 3339 time in UTC, like 2024-05-01T12:00:00Z"
)

// idRE is the shape of job_id and correlation_id: printable ASCII without
// spaces, 1 to 255 bytes, so that an id is safe in logs, keys and stream
// names.
var idRE = pattern.MustCompile(`^[!-~]+$`, 255)

// checker collects the field errors of one message, in the order found:
// the first MaxFieldErrors, and a count of the others.
type checker struct {
	fields  []FieldError
	omitted int
}

func (c *checker) add(field, message string) {
	if len(c.fields) >= MaxFieldErrors {
		c.omitted++
		return
	}
	c.fields = append(c.fields, FieldError{Field: field, Message: message})
}

// err returns a *ValidationError holding the collected errors, or nil.
func (c *checker) err() error {
	if len(c.fields) == 0 {
		return nil
	}
	return &ValidationError{Fields: c.fields, Omitted: c.omitted}
}

// version checks schema_version: 0 (absent) or 1..SchemaVersion.
func (c *checker) version(v int) {
	switch {
	case v < 0:
		c.add("schema_version", "must be a positive integer")
	case v > SchemaVersion:
		c.add("schema_version", fmt.Sprintf("unsupported version %d; the newest supported is %d", v, SchemaVersion))
	}
}

// id checks an identifier key; an empty value is absent.
func (c *checker) id(field, v string, required bool) {
	switch {
	case v == "":
		if required {
			c.add(field, msgRequired)
		}
	case !idRE.MatchString(v):
		c.add(field, msgID)
	}
}

// time checks a time key; an empty value is absent.
func (c *checker) time(field, v string, required bool) {
	if v == "" {
		if required {
			c.add(field, msgRequired)
		}
		return
	}
	if _, err := ParseTime(v); err != nil {
		c.add(field, msgTime)
	}
}

// nonNegative checks an integer that may not be negative.
func (c *checker) nonNegative(field string, v int64) {
	if v < 0 {
		c.add(field, "must not be negative")
	}
}

// names checks a list of names: at most max entries, each valid (else
// message), none repeated. Errors name the entry: field[i].
func (c *checker) names(field string, names []string, max int, valid func(string) bool, message string) {
	if len(names) > max {
		c.add(field, fmt.Sprintf("must have at most %d entries", max))
		return
	}
	first := make(map[string]int, len(names))
	for i, name := range names {
		entry := fmt.Sprintf("%s[%d]", field, i)
		if !valid(name) {
			c.add(entry, message)
			continue
		}
		if j, dup := first[name]; dup {
			c.add(entry, fmt.Sprintf("duplicate of %s[%d]", field, j))
			continue
		}
		first[name] = i
	}
}
