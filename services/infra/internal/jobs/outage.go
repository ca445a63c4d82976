package jobs

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
)

// defaultOutageWait is how long a job waits out a Postgres outage when
// Config.OutageWait is 0.
const defaultOutageWait = 3 * time.Minute

// isOutage reports whether err says Postgres cannot be reached right now (a
// restart, a failover, a network cut), as opposed to an answer it gave: such
// a failure is waited out, never turned into the job's result.
func isOutage(err error) bool {
	return errors.Is(err, errLockLost) || store.Unreachable(err)
}

// durably runs f, each try with a context of its own bounded by perTry, and
// runs it again with backoff while it fails because Postgres cannot be
// reached, for up to the configured outage wait (DB_OUTAGE_WAIT) in all or
// until ctx is done. It returns f's last error.
func (j *job) durably(ctx context.Context, what string, perTry time.Duration, f func(ctx context.Context) error) error {
	wait := j.h.cfg.OutageWait
	if wait == 0 {
		wait = defaultOutageWait
	}
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval = 200*time.Millisecond, 5*time.Second
	start := time.Now()
	warned := false
	for {
		tctx, cancel := context.WithTimeout(ctx, perTry)
		err := f(tctx)
		cancel()
		if err == nil || !isOutage(err) || ctx.Err() != nil {
			if err == nil && warned {
				j.log.Info().Str("step", what).Dur("waited", time.Since(start)).Msg("Postgres is back")
			}
			return err
		}
		d := bo.NextBackOff()
		if time.Since(start)+d > wait {
			j.log.Error().Str("step", what).Dur("waited", time.Since(start)).Err(err).Msg("Postgres still unreachable: giving up waiting")
			return err
		}
		if !warned {
			warned = true
			j.log.Warn().Str("step", what).Err(err).Dur("outage_wait", wait).Msg("Postgres unreachable: waiting for it")
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}
