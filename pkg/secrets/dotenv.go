package secrets

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/joho/godotenv"
)

// RenderDotenv renders fields as dotenv text: one KEY=value line per field,
// sorted by key, each value written so that docker compose (compose-go's
// dotenv parser) and joho/godotenv read back exactly the value written:
//
//   - in single quotes when the value has no single quote, no carriage
//     return and does not end in a backslash: nothing inside is interpreted
//     (no $ interpolation, no escapes), and newlines are kept as they are;
//   - else unquoted when nothing in it means anything unquoted (no $ # or
//     line break, no leading or trailing space, no leading quote);
//   - else in double quotes, with \ " $ newline and carriage return
//     escaped as \\ \" \$ \n \r.
//
// compose reads every form back exactly. joho/godotenv misreads the last
// form when the value ends in a backslash or a double quote (and then the
// lines after it too). Keys must match
// [A-Za-z_][A-Za-z0-9_]*; values must not contain NUL bytes (no environment
// variable can).
func RenderDotenv(fields map[string]string) ([]byte, error) {
	keys := make([]string, 0, len(fields))
	for k := range fields {
		if !validEnvName(k) {
			return nil, fmt.Errorf("dotenv: key %q is not a valid variable name", k)
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b bytes.Buffer
	for _, k := range keys {
		v := fields[k]
		if strings.IndexByte(v, 0) >= 0 {
			return nil, fmt.Errorf("dotenv: value of %s contains a NUL byte", k)
		}
		b.WriteString(k)
		b.WriteByte('=')
		switch dotenvStyleOf(v) {
		case dotenvSingle:
			b.WriteByte('\'')
			b.WriteString(v)
			b.WriteByte('\'')
		case dotenvBare:
			b.WriteString(v)
		default:
			b.WriteByte('"')
			for i := 0; i < len(v); i++ {
				switch c := v[i]; c {
				case '\\', '"', '$':
					b.WriteByte('\\')
					b.WriteByte(c)
				case '\n':
					b.WriteString(`\n`)
				case '\r':
					b.WriteString(`\r`)
				default:
					b.WriteByte(c)
				}
			}
			b.WriteByte('"')
		}
		b.WriteByte('\n')
	}
	return b.Bytes(), nil
}

type dotenvStyle int

const (
	dotenvSingle dotenvStyle = iota
	dotenvBare
	dotenvDouble
)

func dotenvStyleOf(v string) dotenvStyle {
	if !strings.ContainsAny(v, "'\r") && !strings.HasSuffix(v, `\`) {
		return dotenvSingle
	}
	if v != "" && !strings.ContainsAny(v, "$#\n\r") && v[0] != '\'' && v[0] != '"' {
		first, _ := utf8.DecodeRuneInString(v)
		last, _ := utf8.DecodeLastRuneInString(v)
		if !unicode.IsSpace(first) && !unicode.IsSpace(last) {
			return dotenvBare
		}
	}
	return dotenvDouble
}

// ParseDotenv parses dotenv text with joho/godotenv. Variable references
// ($NAME) are expanded only from earlier lines of the same text, never from
// the process environment.
func ParseDotenv(text []byte) (map[string]string, error) {
	m, err := godotenv.UnmarshalBytes(text)
	if err != nil {
		// godotenv's errors quote the offending input, which may be a
		// secret: keep our own words.
		return nil, fmt.Errorf("dotenv: not valid dotenv text")
	}
	return m, nil
}

// kvString turns a KV or JSON field value into the string a secret holds:
// strings as they are, numbers as written, booleans as true/false, null as
// the empty string, objects and arrays as compact JSON.
func kvString(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case json.Number:
		return x.String(), nil
	case bool:
		return strconv.FormatBool(x), nil
	case nil:
		return "", nil
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), nil
	default:
		b, err := json.Marshal(x)
		if err != nil {
			return "", fmt.Errorf("field of type %T cannot be rendered", v)
		}
		return string(b), nil
	}
}
