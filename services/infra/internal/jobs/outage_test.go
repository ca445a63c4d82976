package jobs

import (
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
)

func TestIsOutage(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"connection refused", fmt.Errorf("read run: %w", syscall.ECONNREFUSED), true},
		{"connection cut", fmt.Errorf("start run: %w", io.ErrUnexpectedEOF), true},
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"cannot connect now", &pgconn.PgError{Code: "57P03"}, true},
		{"connection exception", &pgconn.PgError{Code: "08006"}, true},
		{"lock session died", fmt.Errorf("run: %w", errLockLost), true},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"run not found", store.ErrRunNotFound, false},
		{"job running elsewhere", store.ErrJobRunningElsewhere, false},
		{"plain error", errors.New("boom"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := isOutage(tc.err); got != tc.want {
				t.Errorf("isOutage(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
