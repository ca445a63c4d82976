package service

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
)

// TimeFormat is the layout of log timestamps: RFC 3339 in UTC with milliseconds.
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"

// Log formats accepted by NewLogger and LOG_FORMAT.
const (
	FormatAuto    = "auto"    // console when the writer is a terminal, else json
	FormatJSON    = "json"    // one JSON object per line
	FormatConsole = "console" // zerolog's human-readable console writer
)

// ParseLevel parses one of the log levels a service accepts: debug, info,
// warn or error.
func ParseLevel(s string) (zerolog.Level, error) {
	switch s {
	case "debug":
		return zerolog.DebugLevel, nil
	case "info":
		return zerolog.InfoLevel, nil
	case "warn":
		return zerolog.WarnLevel, nil
	case "error":
		return zerolog.ErrorLevel, nil
	}
	return zerolog.NoLevel, fmt.Errorf("%q is not one of debug, info, warn, error", s)
}

func checkFormat(s string) error {
	switch s {
	case FormatAuto, FormatJSON, FormatConsole:
		return nil
	}
	return fmt.Errorf("%q is not one of auto, json, console", s)
}

// NewLogger returns a logger writing to w at level (debug, info, warn,
// error) in format (auto, json, console). Each event has a "time" field in
// UTC (TimeFormat); callers add the "service" field and ids with With():
//
//	logger = logger.With().Str("service", "infra").Logger()
//
// Caller information is off. NewLogger changes no zerolog globals.
func NewLogger(w io.Writer, level, format string) (zerolog.Logger, error) {
	lvl, err := ParseLevel(level)
	if err != nil {
		return zerolog.Nop(), fmt.Errorf("log level: %w", err)
	}
	if err := checkFormat(format); err != nil {
		return zerolog.Nop(), fmt.Errorf("log format: %w", err)
	}
	if format == FormatAuto {
		format = FormatJSON
		if isTerminal(w) {
			format = FormatConsole
		}
	}
	if format == FormatConsole {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: TimeFormat, TimeLocation: time.UTC}
	}
	return zerolog.New(w).Level(lvl).Hook(timestampHook{now: time.Now}), nil
}

// timestampHook adds the time to each event without touching zerolog's
// global TimestampFunc and TimeFieldFormat.
type timestampHook struct{ now func() time.Time }

// Run implements zerolog.Hook.
func (h timestampHook) Run(e *zerolog.Event, _ zerolog.Level, _ string) {
	e.Str(zerolog.TimestampFieldName, h.now().UTC().Format(TimeFormat))
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}
