package templates

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/schedule"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
)

// Keys reads API keys (auth.Store).
type Keys interface {
	Get(ctx context.Context, id string) (*auth.Key, error)
}

// LauncherConfig configures a Launcher.
type LauncherConfig struct {
	// Workers launch at once. Default 8.
	Workers int
	// Batch is how many occurrences a worker claims at once (those of one
	// template, launched alike, are launched together). Default 100.
	Batch int
	// Poll is how often pending occurrences are looked for without a
	// notification. Default 1s.
	Poll time.Duration
	// Lease is how long a claim keeps an occurrence from the other
	// launchers: one not recorded by then (its launcher died) is claimed
	// again. Default 1m.
	Lease  time.Duration
	Logger zerolog.Logger
	// Registerer takes the launcher's metrics; nil: none.
	Registerer prometheus.Registerer
}

// Launcher launches the occurrences the scheduler writes, each once: it
// claims occurrences for a lease (SKIP LOCKED, so replicas share them),
// launches each one's schedule's template as the schedule's key with an
// Idempotency-Key naming the occurrence, and records the jobs. It holds
// no connection while it launches: a launch takes its own from the pool,
// and claims held open in transactions could take them all. A launch cut
// short (kill -9 after the job was stored) is claimed again once its
// lease lapses, and its Idempotency-Key replays the job instead of making
// a second.
type Launcher struct {
	db       *pgxpool.Pool
	svc      *Service
	sub      BatchSubmitter
	keys     Keys
	cfg      LauncherConfig
	log      zerolog.Logger
	launched *prometheus.CounterVec
	wake     chan struct{}
}

// NewLauncher returns a Launcher of svc's schedules submitting with sub.
func NewLauncher(db *pgxpool.Pool, svc *Service, sub BatchSubmitter, keys Keys, cfg LauncherConfig) (*Launcher, error) {
	if cfg.Workers <= 0 {
		cfg.Workers = 8
	}
	if cfg.Poll <= 0 {
		cfg.Poll = time.Second
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 100
	}
	if cfg.Lease <= 0 {
		cfg.Lease = time.Minute
	}
	l := &Launcher{db: db, svc: svc, sub: sub, keys: keys, cfg: cfg, log: cfg.Logger.With().Str("component", "schedule-launcher").Logger(),
		launched: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "autoprov_deployer_schedule_launches_total",
			Help: "Occurrences of job template schedules by outcome: launched, or refused (recorded with its error)."}, []string{"outcome"}),
		wake: make(chan struct{}, cfg.Workers)}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(l.launched); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Run launches occurrences until ctx is done: at once when the scheduler
// notifies schedule.Channel, else every Poll.
func (l *Launcher) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { l.listen(ctx) })
	for range l.cfg.Workers {
		wg.Go(func() { l.work(ctx) })
	}
	wg.Wait()
	return nil
}

// listen wakes the workers on each notification; it reconnects after a
// lost connection (the workers poll meanwhile).
func (l *Launcher) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := func() error {
			conn, err := l.db.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			if _, err := conn.Exec(ctx, "LISTEN "+schedule.Channel); err != nil {
				return err
			}
			for {
				if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
					conn.Conn().Close(context.WithoutCancel(ctx)) //nolint:errcheck // the pool drops it
					return err
				}
				for range l.cfg.Workers {
					select {
					case l.wake <- struct{}{}:
					default:
					}
				}
			}
		}()
		if ctx.Err() == nil {
			l.log.Debug().Err(err).Msg("listen for schedule occurrences; retrying")
			select {
			case <-ctx.Done():
			case <-time.After(l.cfg.Poll):
			}
		}
	}
}

func (l *Launcher) work(ctx context.Context) {
	t := time.NewTicker(l.cfg.Poll)
	defer t.Stop()
	for {
		for ctx.Err() == nil {
			n, err := l.LaunchDue(ctx, l.cfg.Batch)
			if err != nil && ctx.Err() == nil {
				l.log.Warn().Err(err).Msg("launch schedule occurrences; retried")
			}
			if n == 0 || err != nil {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-l.wake:
		}
	}
}

type pending struct {
	schedule, project, template, keyID string
	at                                 time.Time
	launch                             Launch
	raw                                string // launch as stored
}

// launched is what came of launching a pending occurrence: its job, or
// why it is refused for good, or an error that passes.
type launched struct {
	jobID, refusal string
	err            error
}

// LaunchDue claims at most batch pending occurrences for the lease,
// launches them and records the outcomes; it returns how many it
// claimed. An occurrence whose launch failed for a reason that passes
// (the database, Redis) is released for the next claim, and LaunchDue
// returns an error.
func (l *Launcher) LaunchDue(ctx context.Context, batch int) (int, error) {
	rows, err := l.db.Query(ctx, `WITH c AS (
			SELECT schedule_id, occurrence FROM schedule_occurrences
			WHERE launched_at IS NULL AND (claimed_until IS NULL OR claimed_until < now())
			ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED)
		UPDATE schedule_occurrences o SET claimed_until = now() + $2 * interval '1 millisecond'
		FROM c JOIN job_schedules s ON s.id = c.schedule_id
		WHERE o.schedule_id = c.schedule_id AND o.occurrence = c.occurrence
		RETURNING o.schedule_id::text, o.occurrence, s.project_id, s.template_id::text,
			COALESCE(s.api_key_id::text, ''), s.launch`, batch, l.cfg.Lease.Milliseconds())
	if err != nil {
		return 0, err
	}
	claimed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pending, error) {
		var p pending
		var launch []byte
		if err := r.Scan(&p.schedule, &p.at, &p.project, &p.template, &p.keyID, &launch); err != nil {
			return p, err
		}
		p.raw = string(launch)
		return p, json.Unmarshal(launch, &p.launch)
	})
	if err != nil {
		return 0, err
	}
	// Occurrences that launch one template the same way as one key (the
	// same schedule's, or schedules made alike) are launched together:
	// the template read and the job checked once, the jobs stored in one
	// transaction and published in one round trip.
	type same struct{ keyID, project, template, launch string }
	groups := map[same][]pending{}
	var order []same
	for _, p := range claimed {
		g := same{p.keyID, p.project, p.template, p.raw}
		if groups[g] == nil {
			order = append(order, g)
		}
		groups[g] = append(groups[g], p)
	}
	var done, retry outcomes
	keys := map[string]*auth.Key{} // the batch's schedules mostly share keys: each read once
	for _, g := range order {
		for i, res := range l.launch(ctx, keys, groups[g]) {
			p := groups[g][i]
			if res.err != nil {
				l.log.Warn().Err(res.err).Str("schedule_id", p.schedule).Time("occurrence", p.at).Msg("launch an occurrence; retried")
				retry.add(p, "", "")
				continue
			}
			outcome := "launched"
			if res.refusal != "" {
				outcome = "refused"
				l.log.Warn().Str("schedule_id", p.schedule).Time("occurrence", p.at).Str("error", res.refusal).Msg("schedule occurrence not launched")
			}
			l.launched.WithLabelValues(outcome).Inc()
			done.add(p, res.jobID, truncate(res.refusal, 1000))
		}
	}
	// What was launched is recorded even when ctx ends now (a shutdown):
	// else it would be launched again (into the same job) after the lease.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if len(done.ids) > 0 {
		if _, err := l.db.Exec(rctx, `UPDATE schedule_occurrences o
			SET launched_at = now(), job_id = NULLIF(u.job, '')::uuid, error = NULLIF(u.error, ''), claimed_until = NULL
			FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::text[]) AS u(id, at, job, error)
			WHERE o.schedule_id = u.id AND o.occurrence = u.at AND o.launched_at IS NULL`,
			done.ids, done.ats, done.jobs, done.errors); err != nil {
			return len(claimed), fmt.Errorf("record launches: %w", err)
		}
	}
	if len(retry.ids) > 0 {
		if _, err := l.db.Exec(rctx, `UPDATE schedule_occurrences o SET claimed_until = NULL
			FROM unnest($1::uuid[], $2::timestamptz[]) AS u(id, at)
			WHERE o.schedule_id = u.id AND o.occurrence = u.at AND o.launched_at IS NULL`, retry.ids, retry.ats); err != nil {
			return len(claimed), fmt.Errorf("release failed launches: %w", err)
		}
		// The worker waits for its next round before it claims again.
		return len(claimed), fmt.Errorf("%d of %d launches failed; retried", len(retry.ids), len(claimed))
	}
	return len(claimed), nil
}

// outcomes are launches to record, as columns.
type outcomes struct {
	ids, jobs, errors []string
	ats               []time.Time
}

func (o *outcomes) add(p pending, jobID, refusal string) {
	o.ids, o.ats, o.jobs, o.errors = append(o.ids, p.schedule), append(o.ats, p.at), append(o.jobs, jobID), append(o.errors, refusal)
}

// launch launches ps, occurrences of one template launched alike as one
// key (read once per batch, in keys), each with an Idempotency-Key naming
// its occurrence: what came of each, in order.
func (l *Launcher) launch(ctx context.Context, keys map[string]*auth.Key, ps []pending) []launched {
	out := make([]launched, len(ps))
	all := func(r launched) []launched {
		for i := range out {
			out[i] = r
		}
		return out
	}
	p := ps[0]
	key, refusal, err := launchKey(ctx, l.keys, keys, p.keyID, p.project, "schedule")
	if refusal != "" || err != nil {
		return all(launched{refusal: refusal, err: err})
	}
	idems := make([]string, len(ps))
	for i, p := range ps {
		idems[i] = "schedule:" + p.schedule + ":" + p.at.UTC().Format(time.RFC3339Nano)
	}
	subs, err := l.svc.LaunchMany(ctx, l.sub, key.ID, deployments.Visibility{Projects: []string{p.project}}, p.template, p.launch, idems)
	if refusal, err := launchRefusal(err); refusal != "" || err != nil {
		return all(launched{refusal: refusal, err: err})
	}
	for i, s := range subs {
		if out[i].refusal, out[i].err = launchRefusal(s.Err); out[i].refusal == "" && out[i].err == nil {
			out[i].jobID = s.Submission.Deployment.ID
		}
	}
	return out
}

// launchKey returns the API key keyID that a schedule or a trigger (its
// owner) launches project's templates as, reading it once into cache; or
// why it may not launch, for good (deleted, revoked, its scopes or
// projects changed); or an error that passes.
func launchKey(ctx context.Context, keys Keys, cache map[string]*auth.Key, keyID, project, owner string) (*auth.Key, string, error) {
	if keyID == "" {
		return nil, "the " + owner + "'s API key was deleted", nil
	}
	key, err := cache[keyID], error(nil)
	if key == nil {
		key, err = keys.Get(ctx, keyID)
		if err == nil && cache != nil {
			cache[keyID] = key
		}
	}
	switch {
	case errors.Is(err, auth.ErrNotFound):
		return nil, "the " + owner + "'s API key was deleted", nil
	case err != nil:
		return nil, "", err
	case !key.RevokedAt.IsZero():
		return nil, "the " + owner + "'s API key was revoked", nil
	case !key.Has(auth.ScopeTemplatesLaunch) || !key.HoldsProject(project):
		return nil, "the " + owner + "'s API key may no longer launch the project's templates", nil
	}
	return key, "", nil
}

// launchRefusal sorts the error of a launch made for no one waiting (a
// schedule's, a trigger's): why it is refused for good (invalid, the
// template gone), or an error that passes.
func launchRefusal(err error) (string, error) {
	var ie *deployments.InvalidError
	switch {
	case errors.As(err, &ie):
		msg := "the launch is invalid:"
		for _, f := range ie.Fields {
			msg += fmt.Sprintf(" %s: %s;", f.Field, f.Message)
		}
		return msg, nil
	case errors.Is(err, ErrNotFound), errors.Is(err, deployments.ErrForbiddenProject), errors.Is(err, deployments.ErrIdempotencyMismatch):
		return err.Error(), nil
	}
	return "", err
}
