package time4vps

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"
)

// Sentinels for errors.Is. An *APIError or *TransportError matches the ones
// that apply to it.
var (
	// ErrUnauthorized: the API refused the credentials (HTTP 401 or 403, or
	// the "wronglogin" error the official PHP library checks for).
	ErrUnauthorized = errors.New("time4vps: unauthorized")
	// ErrNotFound: no such server or task (HTTP 404, or the "Invalid task ID"
	// error the official PHP library checks for).
	ErrNotFound = errors.New("time4vps: not found")
	// ErrRateLimited: HTTP 429.
	ErrRateLimited = errors.New("time4vps: rate limited")
	// ErrUnavailable: HTTP 5xx.
	ErrUnavailable = errors.New("time4vps: service unavailable")
	// ErrOutcomeUnknown: a non-idempotent call (reinstall, reboot) failed in a
	// way that leaves unknown whether the API acted on it (no response, or a
	// 5xx). Do not resend it blindly: read the server's ActiveTask/LastTasks.
	ErrOutcomeUnknown = errors.New("time4vps: outcome of the request is unknown")
	// ErrTaskFailed: a task completed but reported failure (*TaskFailedError).
	ErrTaskFailed = errors.New("time4vps: task failed")
	// ErrUnknownOS: the OS template is not offered for the server.
	ErrUnknownOS = errors.New("time4vps: OS template not available")
)

// APIError is an error the API returned: an HTTP error status, or an
// {"error": [...]} body (with any status, 200 included).
type APIError struct {
	// StatusCode is the HTTP status (200 when the error came in a 200 body).
	StatusCode int
	// Messages are the entries of the body's "error" field; non-string
	// entries are kept as their JSON text. Empty when the body had none.
	Messages []string
	// Endpoint is the method and path, such as "POST /server/42/reinstall".
	Endpoint string
	// RetryAfter is the parsed Retry-After header, 0 when absent.
	RetryAfter time.Duration
}

// Error implements error.
func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "time4vps: %s: HTTP %d", e.Endpoint, e.StatusCode)
	if t := http.StatusText(e.StatusCode); t != "" && e.StatusCode != http.StatusOK {
		b.WriteString(" " + t)
	}
	if len(e.Messages) > 0 {
		b.WriteString(": " + strings.Join(e.Messages, "; "))
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, " (retry after %s)", e.RetryAfter)
	}
	return b.String()
}

// Is maps the error to the package sentinels.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrUnauthorized:
		return e.StatusCode == http.StatusUnauthorized || e.StatusCode == http.StatusForbidden ||
			e.hasMessage("wronglogin")
	case ErrNotFound:
		return e.StatusCode == http.StatusNotFound || e.hasMessage("invalid task id")
	case ErrRateLimited:
		return e.StatusCode == http.StatusTooManyRequests
	case ErrUnavailable:
		return e.StatusCode >= 500
	case ErrOutcomeUnknown:
		return e.StatusCode >= 500 && strings.HasPrefix(e.Endpoint, http.MethodPost+" ")
	}
	return false
}

// Temporary reports whether repeating the same idempotent request later may
// succeed (429 or 5xx).
func (e *APIError) Temporary() bool {
	return e.StatusCode == http.StatusTooManyRequests || e.StatusCode >= 500
}

func (e *APIError) hasMessage(m string) bool {
	for _, s := range e.Messages {
		if strings.EqualFold(strings.TrimSpace(s), m) {
			return true
		}
	}
	return false
}

// TransportError is a request that got no HTTP response (connection refused or
// dropped, timeout). For POST it matches ErrOutcomeUnknown.
type TransportError struct {
	// Endpoint is the method and path.
	Endpoint string
	// Err is the underlying error (for errors.Is/As, such as
	// context.DeadlineExceeded). Error() prints its text with the password
	// removed.
	Err error
	msg string
}

// Error implements error.
func (e *TransportError) Error() string {
	m := e.msg
	if m == "" && e.Err != nil {
		m = e.Err.Error()
	}
	return fmt.Sprintf("time4vps: %s: %s", e.Endpoint, m)
}

// Unwrap returns the underlying error.
func (e *TransportError) Unwrap() error { return e.Err }

// Is matches ErrOutcomeUnknown for POST requests.
func (e *TransportError) Is(target error) bool {
	return target == ErrOutcomeUnknown && strings.HasPrefix(e.Endpoint, http.MethodPost+" ")
}

// TaskFailedError is returned by WaitTask when a task completed with a failure.
type TaskFailedError struct {
	ServerID int64
	TaskID   int64
	// Task is the final state. Its Results may hold secrets: the error text
	// leaves them out; show them only where secrets may go.
	Task Task
}

// Error implements error.
func (e *TaskFailedError) Error() string {
	return fmt.Sprintf("time4vps: task %d (%s) on server %d failed at %s",
		e.TaskID, e.Task.Name, e.ServerID, e.Task.Completed)
}

// Is matches ErrTaskFailed.
func (e *TaskFailedError) Is(target error) bool { return target == ErrTaskFailed }

// parseErrorField returns the messages of a body's "error" field, and whether
// the body had a non-empty one. The field may be an array (documented shape),
// a string or an object (HostBill's admin API documents "error hash/array").
func parseErrorField(body []byte) ([]string, bool) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return nil, false
	}
	var env struct {
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return nil, false
	}
	raw := bytes.TrimSpace(env.Error)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) || bytes.Equal(raw, []byte("false")) {
		return nil, false
	}
	var msgs []string
	switch raw[0] {
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return []string{string(raw)}, true
		}
		for _, it := range items {
			if m := rawText(it); m != "" {
				msgs = append(msgs, m)
			}
		}
	case '{':
		var items map[string]json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return []string{string(raw)}, true
		}
		keys := make([]string, 0, len(items))
		for k := range items {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if m := rawText(items[k]); m != "" {
				msgs = append(msgs, m)
			}
		}
	default:
		if s := rawText(raw); s != "" {
			msgs = []string{s}
		}
	}
	return msgs, len(msgs) > 0
}

// rawText is a JSON string's value, "" for null, or the JSON text of
// anything else.
func rawText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if bytes.Equal(raw, []byte("null")) {
		return ""
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s
	}
	return string(raw)
}
