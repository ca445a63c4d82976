package deployments

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"
)

// The refusals of Relaunch.
var (
	// ErrNotFinished: the run has not ended yet.
	ErrNotFinished = errors.New("the run has not finished")
	// ErrNoFailedHosts: a relaunch on the failed hosts of a run where no
	// host failed or was unreachable.
	ErrNoFailedHosts = errors.New("no host of the run failed or was unreachable")
	// ErrNotRelaunchable: a job another producer published, whose request
	// the deployer does not hold.
	ErrNotRelaunchable = errors.New("the deployer does not hold this run's request")
)

// CheckJob validates r as SubmitJob would (its project within v, its
// credential names and references, its wire shape, its hosts), without
// storing or publishing anything: a template's job is checked when saved.
func (s *Service) CheckJob(ctx context.Context, v Visibility, r JobRequest) error {
	id, err := uuid.NewV7FromReader(rand.Reader)
	if err != nil {
		return fmt.Errorf("new job id: %w", err)
	}
	_, err = s.jobMessage(ctx, &r, v, id.String(), s.now())
	return err
}

// Relaunch submits finished run d (a job or a deployment, as the key keyID
// that sees v found it) again with the same request, as a new run of the
// key: its webhook too. With failedOnly, a job runs only on the hosts that
// failed or were unreachable in d's recap (as its limit); a deployment,
// which has one server, only when that failed. idempotencyKey replays the
// first relaunch as a submit's does.
func (s *Service) Relaunch(ctx context.Context, keyID string, v Visibility, d *Deployment, failedOnly bool, idempotencyKey string) (*Submission, error) {
	if !d.Status.Terminal() {
		return nil, ErrNotFinished
	}
	if failedOnly && d.Status == StatusSucceeded {
		return nil, ErrNoFailedHosts
	}
	if d.Kind != KindJob {
		r := d.Request
		r.Options.CallbackURL = d.callbackURL
		return s.Submit(ctx, keyID, v, r, idempotencyKey)
	}
	if d.Job == nil {
		return nil, ErrNotRelaunchable
	}
	r := *d.Job
	r.Options.CallbackURL = d.callbackURL
	r.RelaunchOf = d.ID
	if failedOnly {
		var hosts []string
		if d.Result != nil {
			for h, rc := range d.Result.Hosts {
				if rc.Failed > 0 || rc.Unreachable > 0 {
					hosts = append(hosts, h)
				}
			}
		}
		if len(hosts) == 0 {
			return nil, ErrNoFailedHosts
		}
		slices.Sort(hosts)
		r.Options.Limit = strings.Join(hosts, ",")
	}
	return s.SubmitJob(ctx, keyID, v, r, idempotencyKey)
}
