package service

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestLoggerLevels(t *testing.T) {
	tests := []struct {
		level string
		want  []string
	}{
		{"debug", []string{"debug", "info", "warn", "error"}},
		{"info", []string{"info", "warn", "error"}},
		{"warn", []string{"warn", "error"}},
		{"error", []string{"error"}},
	}
	for _, tt := range tests {
		t.Run(tt.level, func(t *testing.T) {
			var buf bytes.Buffer
			logger, err := NewLogger(&buf, tt.level, FormatJSON)
			if err != nil {
				t.Fatal(err)
			}
			logger.Debug().Msg("d")
			logger.Info().Msg("i")
			logger.Warn().Msg("w")
			logger.Error().Msg("e")
			var got []string
			sc := bufio.NewScanner(&buf)
			for sc.Scan() {
				var line struct{ Level string }
				if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
					t.Fatalf("line %q: %v", sc.Text(), err)
				}
				got = append(got, line.Level)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("levels logged (-want, +got):\n%s", diff)
			}
		})
	}
}

func TestLoggerJSON(t *testing.T) {
	var buf bytes.Buffer
	logger, err := NewLogger(&buf, "info", FormatAuto) // a buffer is no terminal: JSON
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now().UTC().Truncate(time.Millisecond)
	logger = logger.With().Str("service", "svc").Logger()
	logger.Info().Str("run_id", "r1").Msg("hello")
	after := time.Now().UTC()

	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("not JSON: %q: %v", buf.String(), err)
	}
	for k, want := range map[string]string{"level": "info", "service": "svc", "run_id": "r1", "message": "hello"} {
		if line[k] != want {
			t.Errorf("%s = %v, want %q", k, line[k], want)
		}
	}
	if _, ok := line["caller"]; ok {
		t.Error("caller is on")
	}
	ts, _ := line["time"].(string)
	if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`).MatchString(ts) {
		t.Fatalf("time %q is not UTC RFC 3339 with milliseconds", ts)
	}
	parsed, err := time.Parse(TimeFormat, ts)
	if err != nil || parsed.Before(before) || parsed.After(after) {
		t.Errorf("time %q (%v) not between %v and %v", ts, err, before, after)
	}
}

func TestLoggerConsole(t *testing.T) {
	var buf bytes.Buffer
	logger, err := NewLogger(&buf, "info", FormatConsole)
	if err != nil {
		t.Fatal(err)
	}
	logger.Info().Str("run_id", "r1").Msg("hello")
	out := buf.String()
	if json.Valid(buf.Bytes()) || !strings.Contains(out, "hello") || !strings.Contains(out, "run_id=") {
		t.Errorf("not console output: %q", out)
	}
}

func TestLoggerAutoOnFile(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	logger, err := NewLogger(f, "info", FormatAuto) // a regular file is no terminal either
	if err != nil {
		t.Fatal(err)
	}
	logger.Info().Msg("x")
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(bytes.TrimSpace(b)) {
		t.Errorf("auto on a file did not write JSON: %q", b)
	}
}

func TestLoggerInvalid(t *testing.T) {
	for _, tt := range []struct{ level, format string }{
		{"verbose", FormatJSON},
		{"trace", FormatJSON},
		{"", FormatJSON},
		{"info", "xml"},
	} {
		if _, err := NewLogger(&bytes.Buffer{}, tt.level, tt.format); err == nil {
			t.Errorf("NewLogger(%q, %q) succeeded", tt.level, tt.format)
		}
	}
}
