package webhooks_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/webhooks"
)

// TestLateAttemptDoesNotUndoDelivery: an attempt that outlives its lease
// (a receiver that hangs, a stalled database) finds the delivery claimed
// by another replica, which delivers it; the late attempt's failure is
// recorded in the history but leaves the delivered state alone, so the
// webhook is not sent again.
func TestLateAttemptDoesNotUndoDelivery(t *testing.T) {
	t.Parallel()
	db := testenv.Pool(t)
	ctx := context.Background()
	deployment := uuid.NewString()
	if _, err := db.Exec(ctx, `INSERT INTO deployments (id, job_id, source, status) VALUES ($1, $2, 'api', 'succeeded')`, deployment, deployment); err != nil {
		t.Fatal(err)
	}

	var calls atomic.Int32
	release := make(chan struct{})
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			<-release // the first attempt hangs past its lease, then fails
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer receiver.Close()
	defer close(release)

	if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		return webhooks.Enqueue(ctx, tx, webhooks.NewDelivery{
			DeploymentID: deployment, Event: webhooks.EventDeploymentFinished, URL: receiver.URL + "/hook", Body: []byte(`{}`),
		}, time.Hour)
	}); err != nil {
		t.Fatal(err)
	}
	allow, err := webhooks.ParseCIDRs([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	client := webhooks.NewGuard(allow).NewClient(webhooks.ClientOptions{Timeout: time.Minute})
	deliverer := func() *webhooks.Deliverer {
		d, err := webhooks.NewDeliverer(db, webhooks.Config{SigningKey: []byte("0123456789abcdef0123456789abcdef"), Client: client,
			Workers: 1, Poll: 50 * time.Millisecond, Lease: 300 * time.Millisecond, BackoffMin: time.Millisecond,
			BackoffMax: time.Millisecond, Logger: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	runCtx, stop := context.WithCancel(ctx)
	first := make(chan error, 1)
	go func() { first <- deliverer().Run(runCtx) }()
	testenv.WaitFor(t, 10*time.Second, "the first attempt to reach the receiver", func() bool { return calls.Load() == 1 })
	second := make(chan error, 1)
	secondCtx, stopSecond := context.WithCancel(ctx)
	go func() { second <- deliverer().Run(secondCtx) }()

	list := func() webhooks.Delivery {
		t.Helper()
		ds, err := webhooks.ListForDeployment(ctx, db, deployment)
		if err != nil || len(ds) != 1 {
			t.Fatalf("deliveries %+v, %v", ds, err)
		}
		return ds[0]
	}
	testenv.WaitFor(t, 10*time.Second, "another replica to deliver after the lease", func() bool { return list().State == webhooks.StateDelivered })
	stopSecond()
	<-second
	// The hung attempt ends now, with a failure, long after its lease.
	release <- struct{}{}
	testenv.WaitFor(t, 10*time.Second, "the late attempt to be recorded", func() bool { return len(list().History) >= 2 })
	stop()
	<-first
	d := list()
	if d.State != webhooks.StateDelivered || d.Attempts != 2 || d.FinishedAt == nil {
		t.Errorf("delivery after the late failure: %+v; want delivered after 2 attempts", d)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("the receiver got %d requests, want 2 (no resend after the late failure)", n)
	}
}
