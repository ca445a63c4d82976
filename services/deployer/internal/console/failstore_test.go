package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// A page whose read fails because Postgres cannot be reached (here: what
// pgx returns for a port nobody listens on) answers 503 with a
// Retry-After; any other failure is a 500, without one.
func TestFailStore(t *testing.T) {
	t.Parallel()
	c, err := New(Config{}, Deps{Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	_, down := pgx.Connect(context.Background(), fmt.Sprintf("postgres://nobody@127.0.0.1:%d/none?connect_timeout=5", testenv.FreePort(t)))
	if down == nil {
		t.Fatal("connected to a port nobody listens on")
	}
	tests := []struct {
		name  string
		err   error
		want  int
		retry bool
	}{
		{"Postgres refuses connections", down, http.StatusServiceUnavailable, true},
		{"wrapped", fmt.Errorf("list runs: %w", down), http.StatusServiceUnavailable, true},
		{"a bug", errors.New("unexpected row shape"), http.StatusInternalServerError, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			c.failStore(w, httptest.NewRequest(http.MethodGet, Prefix+"/runs", nil), tt.err, "list runs", "The runs cannot be listed right now.")
			if w.Code != tt.want {
				t.Errorf("status %d, want %d", w.Code, tt.want)
			}
			n, err := strconv.Atoi(w.Header().Get("Retry-After"))
			if got := err == nil && n > 0; got != tt.retry {
				t.Errorf("Retry-After %q, want one: %v", w.Header().Get("Retry-After"), tt.retry)
			}
		})
	}
}
