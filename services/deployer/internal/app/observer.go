package app

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/clock"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// observer follows the request queue read-only (OBSERVE_QUEUE): it needs
// only read access to ansible:deploy:queue (XREAD, no consumer group), so
// the deployer can neither acknowledge nor hold back infra's requests, and
// a stopped deployer never keeps infra from trimming the queue.
type observer struct {
	rdb    stream.Client
	stream string
	svc    *deployments.Service
	log    zerolog.Logger
}

// observePause lets the observer read the queue in batches: under load it
// makes about ten reads a second instead of one per commit group, and
// another producer's request shows in the API at most this much later.
const observePause = 100 * time.Millisecond

// Run starts after the newest request the deployer knows and follows the
// queue until ctx is done.
func (o *observer) Run(ctx context.Context) error {
	from, err := o.svc.ObserveFrom(ctx)
	for err != nil {
		if ctx.Err() != nil {
			return nil
		}
		o.log.Warn().Err(err).Msg("observer: finding where to start failed; retrying")
		_ = clock.Sleep(ctx, nil, 2*time.Second)
		from, err = o.svc.ObserveFrom(ctx)
	}
	t, err := stream.NewTail(o.rdb, stream.TailConfig{Stream: o.stream, From: from, Pause: observePause, Logger: o.log}, o.svc.ObserveBatch)
	if err != nil {
		return err
	}
	o.log.Info().Str("stream", o.stream).Str("from", from).Msg("observer: following the request queue")
	return t.Run(ctx)
}
