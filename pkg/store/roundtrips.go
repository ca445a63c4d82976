package store

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// roundTripsKey is the context key of a round trip counter.
type roundTripsKey struct{}

// CountRoundTrips returns a context whose Postgres round trips through a
// pool of Open are counted (a query, an Exec, a batch: one each; the
// pool's own pings and resets are not), and the function that reads the
// count. Contexts derived from it count into the same counter, so a job
// that passes its context down learns what its path cost.
func CountRoundTrips(ctx context.Context) (context.Context, func() int64) {
	n := new(atomic.Int64)
	return context.WithValue(ctx, roundTripsKey{}, n), n.Load
}

// countTrip adds one to ctx's counter, if it has one.
func countTrip(ctx context.Context) {
	if n, ok := ctx.Value(roundTripsKey{}).(*atomic.Int64); ok {
		n.Add(1)
	}
}

// roundTripTracer counts queries and batches (CountRoundTrips).
type roundTripTracer struct{}

var (
	_ pgx.QueryTracer = roundTripTracer{}
	_ pgx.BatchTracer = roundTripTracer{}
)

func (roundTripTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	countTrip(ctx)
	return ctx
}

func (roundTripTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (roundTripTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	countTrip(ctx)
	return ctx
}

func (roundTripTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (roundTripTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
