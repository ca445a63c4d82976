package service

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/caarlos0/env/v11"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
)

// Struct tags read by Load, Usage and LogConfig, next to caarlos0/env's own
// `env`, `envDefault`, `envPrefix` and `envSeparator`.
const (
	// DescTag holds the one-line description Usage prints for a variable.
	DescTag = "desc"
	// SecretTag set to "true" marks a value that LogConfig and Usage mask
	// and that errors never echo.
	SecretTag = "secret"
)

// maskedText replaces a secret that is set (the text pkg/secrets prints too).
const maskedText = "[REDACTED]"

// FieldError is a problem with one environment variable.
type FieldError struct {
	// Var is the environment variable, e.g. "LOG_LEVEL".
	Var string
	// Err says what is wrong; it never holds a secret value.
	Err error
}

// Invalid returns a FieldError for the variable name with a formatted message.
// Validate methods use it so that every problem names its variable.
func Invalid(name, format string, args ...any) *FieldError {
	return &FieldError{Var: name, Err: fmt.Errorf(format, args...)}
}

// Error implements error.
func (e *FieldError) Error() string { return e.Var + ": " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *FieldError) Unwrap() error { return e.Err }

// ConfigError lists every problem Load found in a configuration. ExitCode
// maps it to exit status 2.
type ConfigError struct {
	Problems []error
}

// Error implements error: one problem on one line, several on one line each.
func (e *ConfigError) Error() string {
	if len(e.Problems) == 1 {
		return "invalid configuration: " + e.Problems[0].Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "invalid configuration (%d problems):", len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n  ")
		b.WriteString(p.Error())
	}
	return b.String()
}

// Unwrap returns the problems, for errors.Is and errors.As.
func (e *ConfigError) Unwrap() []error { return e.Problems }

// Load fills cfg, a pointer to a config struct, from the environment that
// getenv reads (os.Getenv in main, a map lookup in tests) using
// caarlos0/env's tags, then calls the Validate() error method of cfg and of
// every struct nested in it that has one (a method promoted from an embedded
// struct counts once). Values already in cfg are kept for variables that are
// unset and have no envDefault, which is how a service gives a shared field
// its own default.
//
// All problems are reported at once in a *ConfigError, each naming its
// variable; a variable that failed to parse is not validated again.
// Slices of structs (caarlos0/env's indexed prefixes) are not supported.
func Load(getenv func(string) string, cfg any) error {
	fields, err := fieldsOf(cfg)
	if err != nil {
		return err
	}
	environ := make(map[string]string, len(fields)) // never nil: env would read os.Environ
	for _, f := range fields {
		if v := getenv(f.Key); v != "" {
			environ[f.Key] = v
		}
	}
	var problems []error
	failed := map[string]bool{}
	if err := env.ParseWithOptions(cfg, env.Options{Environment: environ}); err != nil {
		for _, p := range parseProblems(err, fields, environ) {
			var fe *FieldError
			if errors.As(p, &fe) {
				failed[fe.Var] = true
			}
			problems = append(problems, p)
		}
	}
	seen := map[string]bool{}
	for _, p := range validate(reflect.ValueOf(cfg).Elem()) {
		var fe *FieldError
		if errors.As(p, &fe) && failed[fe.Var] {
			continue
		}
		if seen[p.Error()] {
			continue
		}
		seen[p.Error()] = true
		problems = append(problems, p)
	}
	if len(problems) > 0 {
		return &ConfigError{Problems: problems}
	}
	return nil
}

// parseProblems turns caarlos0/env's aggregated error into one error per
// problem, naming the variable instead of the Go field and hiding secret values.
func parseProblems(err error, fields []field, environ map[string]string) []error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return []error{err}
	}
	var out []error
	for _, e := range agg.Errors {
		switch e := e.(type) {
		case env.ParseError:
			f, ok := fieldByGoName(fields, environ, e.Name, e.Type)
			switch {
			case !ok:
				out = append(out, e)
			case f.Secret:
				out = append(out, Invalid(f.Key, "invalid value (not shown: secret)"))
			default:
				out = append(out, &FieldError{Var: f.Key, Err: e.Err})
			}
		case env.VarIsNotSetError:
			out = append(out, Invalid(e.Key, "required but not set"))
		case env.EmptyVarError:
			out = append(out, Invalid(e.Key, "must not be empty"))
		case env.LoadFileContentError:
			out = append(out, Invalid(e.Key, "read file %s: %v", e.Filename, e.Err))
		default:
			out = append(out, e)
		}
	}
	return out
}

// fieldByGoName finds the field an env.ParseError names. Fields of nested
// structs may share a Go name and type; the one set in the environment wins.
func fieldByGoName(fields []field, environ map[string]string, name string, typ reflect.Type) (field, bool) {
	var found []field
	for _, f := range fields {
		if f.GoName == name && f.Value.Type() == typ {
			found = append(found, f)
		}
	}
	for _, f := range found {
		if _, set := environ[f.Key]; set {
			return f, true
		}
	}
	if len(found) > 0 {
		return found[0], true
	}
	return field{}, false
}

// validator is what Load calls on config structs that have it.
type validator interface{ Validate() error }

// validate calls Validate on v and every struct nested in it, inner first,
// and returns the problems one by one.
func validate(v reflect.Value) []error {
	var out []error
	t := v.Type()
	for i := range t.NumField() {
		sf, fv := t.Field(i), v.Field(i)
		if !sf.IsExported() {
			continue
		}
		if fv.Kind() == reflect.Pointer && !fv.IsNil() && fv.Elem().Kind() == reflect.Struct {
			fv = fv.Elem()
		}
		if fv.Kind() == reflect.Struct && !isLeafStruct(fv) {
			out = append(out, validate(fv)...)
		}
	}
	if v.CanAddr() {
		if val, ok := v.Addr().Interface().(validator); ok {
			out = append(out, flatten(val.Validate())...)
		}
	}
	return out
}

// isLeafStruct reports whether a struct value is a value of its own (a
// url.URL, a time.Time) rather than a group of settings.
func isLeafStruct(v reflect.Value) bool {
	if v.CanAddr() {
		if _, ok := v.Addr().Interface().(interface{ UnmarshalText([]byte) error }); ok {
			return true
		}
	}
	return v.Type() == reflect.TypeFor[url.URL]()
}

// flatten splits joined errors (errors.Join, ConfigError) into their leaves.
func flatten(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// field is one environment variable of a config struct.
type field struct {
	Key      string // full variable name, prefixes included
	GoName   string // Go field name, as caarlos0/env's errors give it
	Default  string // envDefault, else the value the struct held
	Desc     string
	Secret   bool
	Scrub    string // ScrubTag
	Required bool
	Value    reflect.Value
	Sep      string
}

// fieldsOf lists the environment variables of cfg (a pointer to a struct)
// in declaration order, walking nested and embedded structs with their
// envPrefix the way caarlos0/env does.
func fieldsOf(cfg any) ([]field, error) {
	v := reflect.ValueOf(cfg)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("config must be a non-nil pointer to a struct, got %T", cfg)
	}
	var out []field
	walk(v.Elem(), "", &out)
	return out, nil
}

func walk(v reflect.Value, prefix string, out *[]field) {
	t := v.Type()
	for i := range t.NumField() {
		sf, fv := t.Field(i), v.Field(i)
		if !sf.IsExported() {
			continue
		}
		key, opts, _ := strings.Cut(sf.Tag.Get("env"), ",")
		options := strings.Split(opts, ",")
		if key == "-" || slices.Contains(options, "-") {
			continue
		}
		inner := fv
		if inner.Kind() == reflect.Pointer && !inner.IsNil() && inner.Elem().Kind() == reflect.Struct {
			inner = inner.Elem()
		}
		if key == "" {
			if inner.Kind() == reflect.Struct {
				walk(inner, prefix+sf.Tag.Get("envPrefix"), out)
			}
			continue
		}
		f := field{
			Key:      prefix + key,
			GoName:   sf.Name,
			Desc:     sf.Tag.Get(DescTag),
			Secret:   sf.Tag.Get(SecretTag) == "true",
			Scrub:    sf.Tag.Get(ScrubTag),
			Required: slices.Contains(options, "required") || slices.Contains(options, "notEmpty"),
			Value:    fv,
			Sep:      ",",
		}
		if s, ok := sf.Tag.Lookup("envSeparator"); ok {
			f.Sep = s
		}
		if d, ok := sf.Tag.Lookup("envDefault"); ok {
			f.Default = d
		} else if !fv.IsZero() {
			f.Default = format(fv, f.Sep)
		}
		*out = append(*out, f)
	}
}

// format renders a config value the way it would be written in the environment.
func format(v reflect.Value, sep string) string {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return ""
		}
		if s, ok := v.Interface().(fmt.Stringer); ok {
			return s.String()
		}
		v = v.Elem()
	}
	if v.CanAddr() {
		if s, ok := v.Addr().Interface().(fmt.Stringer); ok {
			return s.String()
		}
	}
	if s, ok := v.Interface().(fmt.Stringer); ok {
		return s.String()
	}
	if v.Kind() == reflect.Slice {
		parts := make([]string, v.Len())
		for i := range v.Len() {
			parts[i] = format(v.Index(i), sep)
		}
		return strings.Join(parts, sep)
	}
	return fmt.Sprint(v.Interface())
}

// display renders a value for logs: secrets masked, passwords in URLs
// redacted, types with a Redacted() string method (url.URL, secret types)
// shown through it.
func display(f field) string {
	if f.Secret {
		if f.Value.IsZero() {
			return ""
		}
		return maskedText
	}
	return displayValue(f.Value, f.Sep)
}

type redacter interface{ Redacted() string }

func displayValue(v reflect.Value, sep string) string {
	if v.Kind() == reflect.Pointer && v.IsNil() {
		return ""
	}
	if r, ok := v.Interface().(redacter); ok {
		return RedactURL(r.Redacted())
	}
	if v.CanAddr() {
		if r, ok := v.Addr().Interface().(redacter); ok {
			return RedactURL(r.Redacted())
		}
	}
	if v.Kind() == reflect.Slice {
		parts := make([]string, v.Len())
		for i := range v.Len() {
			parts[i] = displayValue(v.Index(i), sep)
		}
		return strings.Join(parts, sep)
	}
	return RedactURL(format(v, sep))
}

// RedactURL returns s with every credential a URL or DSN can hold replaced
// by "xxxxx": the userinfo password, credential query parameters
// (password=, sslpassword=, token=, ...), keyword/value DSN passwords (see
// secrets.RedactCredentials). Anything else is returned unchanged.
func RedactURL(s string) string { return secrets.RedactCredentials(s) }

// Usage writes the --help text for a service: its name and summary, then a
// table of every environment variable of cfg (a pointer to a config struct,
// nested structs and prefixes included) with its default and description.
// Defaults are the envDefault tags, or the values cfg already holds.
func Usage(w io.Writer, name, summary string, cfg any) { usage(w, name, summary, cfg, nil) }

// usage is Usage listing the binary's subcommands cmds too.
func usage(w io.Writer, name, summary string, cfg any, cmds []Command) {
	fmt.Fprintf(w, "%s: %s\n\nUsage: %s [--help | --check-config | --check-secrets [--secret-refs FILE]]\n", name, summary, name)
	if len(cmds) > 0 {
		fmt.Fprintf(w, "       %s COMMAND [ARGS...]   (%s COMMAND --help for its own help)\n", name, name)
	}
	fmt.Fprintf(w, "\n  --check-config   load and validate the configuration, start nothing, exit\n")
	fmt.Fprintf(w, "  --check-secrets  also resolve every secret reference it names (one JSON line each, no values)\n\n")
	if len(cmds) > 0 {
		fmt.Fprintf(w, "Commands:\n\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, c := range cmds {
			fmt.Fprintf(tw, "  %s\t%s\n", c.Name, c.Summary)
		}
		_ = tw.Flush()
		fmt.Fprintln(w)
	}
	fields, err := fieldsOf(cfg)
	if err != nil {
		fmt.Fprintf(w, "(no configuration: %v)\n", err)
		return
	}
	fmt.Fprintf(w, "Configuration, from environment variables:\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  VARIABLE\tDEFAULT\tDESCRIPTION")
	for _, f := range fields {
		def := f.Default
		switch {
		case f.Secret && def != "":
			def = maskedText
		case def == "" && f.Required:
			def = "(required)"
		case def == "":
			def = "-"
		}
		desc := f.Desc
		if f.Secret {
			desc += " (secret)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", f.Key, def, desc)
	}
	_ = tw.Flush()
}

// LogConfig logs cfg (a pointer to a config struct) at info level as one
// "configuration" event with a field per environment variable: secrets are
// masked and URL passwords redacted.
func LogConfig(logger zerolog.Logger, cfg any) {
	fields, err := fieldsOf(cfg)
	if err != nil {
		logger.Error().Err(err).Msg("log configuration")
		return
	}
	d := zerolog.Dict()
	for _, f := range fields {
		d.Str(f.Key, display(f))
	}
	logger.Info().Dict("config", d).Msg("configuration")
}
