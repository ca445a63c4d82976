package time4vps

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestFlexInt(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]FlexInt{
		`12`: 12, `"12"`: 12, `" 7 "`: 7, `""`: 0, `null`: 0, `12.0`: 12, `"-3"`: -3,
	} {
		var got FlexInt
		if err := json.Unmarshal([]byte(in), &got); err != nil || got != want {
			t.Errorf("%s -> %d, %v; want %d", in, got, err, want)
		}
	}
	var n FlexInt
	if err := json.Unmarshal([]byte(`"abc"`), &n); err == nil {
		t.Error(`"abc" decoded`)
	}
}

func TestParseErrorField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body string
		want []string
		ok   bool
	}{
		{`{"error":["wronglogin"]}`, []string{"wronglogin"}, true},
		{`{"error":["a",{"k":1},2,null]}`, []string{"a", `{"k":1}`, "2"}, true},
		{`{"error":"one"}`, []string{"one"}, true},
		{`{"error":{"z":"last","a":"first"}}`, []string{"first", "last"}, true},
		{`{"error":[]}`, nil, false},
		{`{"error":""}`, nil, false},
		{`{"error":null}`, nil, false},
		{`{"error":false}`, nil, false},
		{`{"task_id":5}`, nil, false},
		{`[{"error":["x"]}]`, nil, false},
		{`<html>`, nil, false},
		{``, nil, false},
	} {
		got, ok := parseErrorField([]byte(tc.body))
		if ok != tc.ok || !cmp.Equal(got, tc.want) {
			t.Errorf("%s -> %q, %v; want %q, %v", tc.body, got, ok, tc.want, tc.ok)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Duration{
		"":   0,
		"0":  0,
		"-5": 0,
		"7":  7 * time.Second,
		now.Add(90 * time.Second).Format(http.TimeFormat): 90 * time.Second,
		now.Add(-time.Minute).Format(http.TimeFormat):     0,
		"soon": 0,
	} {
		if got := parseRetryAfter(in, now); got != want {
			t.Errorf("%q -> %s, want %s", in, got, want)
		}
	}
}

func TestLooksFailed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		task Task
		want bool
	}{
		{Task{Completed: "2026-01-01T00:00:00+00:00", Results: "VM rebooted successfully"}, false},
		{Task{Completed: "2026-01-01T00:00:00+00:00", Results: "Error: no space"}, true},
		{Task{Completed: "2026-01-01T00:00:00+00:00", Results: "  FAILED to fetch image"}, true},
		{Task{Completed: "", Results: "Error: not done yet"}, false},
	} {
		if got := LooksFailed(tc.task); got != tc.want {
			t.Errorf("LooksFailed(%+v) = %v", tc.task, got)
		}
	}
}

func TestRedactor(t *testing.T) {
	t.Parallel()
	const user, pw = "ops@example.com", "p@ss word/+="
	r := newRedactor(user, pw)
	token := base64.StdEncoding.EncodeToString([]byte(user + ":" + pw))
	in := strings.Join([]string{pw, token, "p%40ss+word%2F%2B%3D", "p@ss%20word%2F+="}, " | ")
	out := r(in)
	if strings.Contains(out, "ss word") || strings.Contains(out, token) || strings.Contains(out, "ss+word") || strings.Contains(out, "ss%20word") {
		t.Errorf("redacted %q -> %q", in, out)
	}
}

func TestAPIErrorIs(t *testing.T) {
	t.Parallel()
	post := &APIError{StatusCode: 502, Endpoint: "POST /server/1/reboot"}
	get := &APIError{StatusCode: 502, Endpoint: "GET /server/1"}
	if !post.Is(ErrOutcomeUnknown) || get.Is(ErrOutcomeUnknown) || !get.Is(ErrUnavailable) {
		t.Error("5xx mapping wrong")
	}
	te := &TransportError{Endpoint: "POST /server/1/reinstall"}
	if !te.Is(ErrOutcomeUnknown) || (&TransportError{Endpoint: "GET /server"}).Is(ErrOutcomeUnknown) {
		t.Error("transport mapping wrong")
	}
}
