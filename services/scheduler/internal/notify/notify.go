// Package notify tells people about servers' terminal state changes (seed
// 000's "voice"): Slack incoming webhooks and the Telegram Bot API's
// sendMessage, through resty, behind the small Channel interface so more
// can be added.
//
// Exactly one notification per state change: the change and its
// notification row are written in one transaction (pkg/fleet); a
// Dispatcher per channel sends pending rows and records their delivery in
// the transaction that read them, so a restart neither repeats a delivered
// notification nor drops a pending one. The one window for a repeat is a
// crash during the HTTP request itself (the channel may have posted it
// before the answer came back); the notification is then sent again rather
// than lost.
//
// Sending respects the channels' documented limits (Slack: about one
// message per second per webhook; Telegram: one message per second per
// chat), honours 429 answers (Retry-After, retry_after), retries failures
// with exponential backoff, and sends one digest instead of many messages
// when several servers changed at once (500 servers failing make one
// message).
package notify

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
)

// Channel sends one message to people.
type Channel interface {
	// Name identifies the channel in the delivery records ("slack",
	// "telegram:<chat>"); it must stay the same across restarts.
	Name() string
	// Send posts text. A *RetryAfterError says when to try again.
	Send(ctx context.Context, text string) error
	// Limit is the channel's documented rate: one message per interval,
	// with a burst.
	Limit() (every time.Duration, burst int)
	// MaxLen is the longest text the channel takes, in characters.
	MaxLen() int
	// Markup is the formatting language the channel reads its text in.
	Markup() Markup
}

// RetryAfterError: the channel asked us to wait (HTTP 429).
type RetryAfterError struct {
	After time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("rate limited, retry after %s: %v", e.After, e.Err)
}

func (e *RetryAfterError) Unwrap() error { return e.Err }

// Config configures a Dispatcher. Zero values take the defaults.
type Config struct {
	// DigestThreshold: this many pending notifications or more go out as
	// one digest (default 5).
	DigestThreshold int
	// DigestMax is the most notifications one digest covers (default 500).
	DigestMax int
	// Poll is how often pending notifications are looked for when nothing
	// wakes the dispatcher (default 2s).
	Poll time.Duration
	// MaxBackoff bounds the wait between failed sends (default 5m).
	MaxBackoff time.Duration
	// FailingAfter is how many sends in a row must fail before Health
	// reports the channel failing (default 3; a 429 counts neither way).
	FailingAfter int
	// Hints tunes the "what to do next" lines.
	Hints  Hints
	Logger zerolog.Logger
	// Metrics are shared by the dispatchers (NewMetrics); nil records none.
	Metrics *Metrics
}

// Hints are facts the texts mention.
type Hints struct {
	// CLI is how operators run the scheduler's commands (default
	// "scheduler").
	CLI string
	// UnreachableCooldown is when UNREACHABLE servers are checked again.
	UnreachableCooldown time.Duration
}

// Dispatcher delivers one channel's notifications.
type Dispatcher struct {
	fleet *fleet.Store
	ch    Channel
	cfg   Config
	log   zerolog.Logger
	lim   *rate.Limiter
	wake  chan struct{}

	mu       sync.Mutex
	failures int       // sends failed in a row
	since    time.Time // first failure of the streak
	lastErr  string    // the last failure, as the channel redacted it
}

// NewDispatcher returns a Dispatcher for ch.
func NewDispatcher(f *fleet.Store, ch Channel, cfg Config) *Dispatcher {
	if cfg.DigestThreshold <= 0 {
		cfg.DigestThreshold = 5
	}
	if cfg.DigestMax <= 0 {
		cfg.DigestMax = 500
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 2 * time.Second
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Minute
	}
	if cfg.FailingAfter <= 0 {
		cfg.FailingAfter = 3
	}
	if cfg.Hints.CLI == "" {
		cfg.Hints.CLI = "scheduler"
	}
	every, burst := ch.Limit()
	cfg.Metrics.streak(ch.Name(), 0, time.Time{}) // the series exist from the start
	return &Dispatcher{fleet: f, ch: ch, cfg: cfg, lim: rate.NewLimiter(rate.Every(every), max(burst, 1)),
		log: cfg.Logger.With().Str("component", "notify").Str("channel", ch.Name()).Logger(), wake: make(chan struct{}, 1)}
}

// Wake makes the dispatcher look for pending notifications at once.
func (d *Dispatcher) Wake() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Run delivers until ctx is done.
func (d *Dispatcher) Run(ctx context.Context) error {
	if err := d.ensure(ctx); err != nil {
		return err
	}
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval = time.Second, d.cfg.MaxBackoff
	for ctx.Err() == nil {
		n, err := d.Once(ctx)
		var wait time.Duration
		var ra *RetryAfterError
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &ra):
			wait = ra.After
			d.log.Warn().Err(err).Msg("channel rate limit: waiting")
		case err != nil:
			wait = bo.NextBackOff()
			d.log.Error().Err(err).Dur("retry_in", wait).Msg("notification not delivered: retrying")
		case n > 0:
			bo.Reset()
			continue // more may be pending
		default:
			bo.Reset()
			wait = d.cfg.Poll
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-t.C:
		case <-d.wake:
			if err != nil { // a failing channel keeps its backoff
				<-t.C
			}
		}
		t.Stop()
	}
	return nil
}

// ensure registers the channel, retrying while Postgres is unavailable.
func (d *Dispatcher) ensure(ctx context.Context) error {
	for {
		err := d.fleet.EnsureChannel(ctx, d.ch.Name())
		if err == nil || ctx.Err() != nil {
			return nil
		}
		d.log.Error().Err(err).Msg("register channel failed: retrying")
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(5 * time.Second):
		}
	}
}

// Once sends one message: a digest when DigestThreshold or more
// notifications are pending, else the oldest one. It returns how many
// notifications it delivered.
func (d *Dispatcher) Once(ctx context.Context) (int, error) {
	pending, err := d.fleet.PendingNotifications(ctx, d.ch.Name())
	if err != nil || pending == 0 {
		return 0, err
	}
	d.cfg.Metrics.pending(d.ch.Name(), pending)
	limit := 1
	if pending >= d.cfg.DigestThreshold {
		limit = d.cfg.DigestMax
	}
	n, err := d.fleet.Deliver(ctx, d.ch.Name(), limit, func(ctx context.Context, batch []fleet.Notification) error {
		mk := d.ch.Markup()
		text := Text(batch, d.cfg.Hints, mk)
		if len(batch) > 1 {
			text = Digest(batch, d.cfg.Hints, mk)
		}
		text = mk.Truncate(text, d.ch.MaxLen())
		if err := d.lim.Wait(ctx); err != nil {
			return err
		}
		start := time.Now()
		// A send that started is not cut short by shutdown: the receiver
		// may have the message already, and only a send that returns can
		// be recorded as delivered (else the next run repeats it). The
		// channel's own timeout bounds it.
		err := d.ch.Send(context.WithoutCancel(ctx), text)
		d.cfg.Metrics.sent(d.ch.Name(), len(batch), err, time.Since(start))
		d.record(err, start)
		return err
	})
	if err == nil && n > 0 {
		d.log.Info().Int("notifications", n).Msg("delivered")
	}
	return n, err
}

// record keeps the streak of failed sends Health reports. A 429 is the
// channel working as documented: it changes nothing.
func (d *Dispatcher) record(err error, at time.Time) {
	var ra *RetryAfterError
	if errors.As(err, &ra) {
		return
	}
	d.mu.Lock()
	if err == nil {
		d.failures, d.since, d.lastErr = 0, time.Time{}, ""
	} else {
		if d.failures == 0 {
			d.since = at
		}
		d.failures++
		d.lastErr = err.Error()
	}
	failures, since := d.failures, d.since
	d.mu.Unlock()
	d.cfg.Metrics.streak(d.ch.Name(), failures, since)
}

// Health reports the channel failing, for /readyz (an advisory check:
// a channel that is down does not make the scheduler unready, its
// notifications wait) once FailingAfter sends or more in a row failed:
// how many, since when, and the last error. A channel nothing was sent to
// yet is healthy.
func (d *Dispatcher) Health(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.failures < d.cfg.FailingAfter {
		return nil
	}
	return fmt.Errorf("%s: %d sends failed in a row since %s; last: %s", d.ch.Name(), d.failures,
		d.since.UTC().Format(time.RFC3339), d.lastErr)
}

func truncate(s string, n int) string {
	r := []rune(s)
	if n <= 0 || len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

var icons = map[string]string{fleet.StatusReady: "✅", fleet.StatusFailed: "❌", fleet.StatusUnreachable: "⚠️"}

// Text is the message of one notification, in markup m: server, status,
// error, and what to do next. The server's handle, the job id and the
// error come from outside and are escaped.
func Text(batch []fleet.Notification, h Hints, m Markup) string {
	if len(batch) == 0 {
		return ""
	}
	n := batch[0]
	handle := m.Escape(n.Handle)
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s is %s", icons[n.Status], handle, n.Status)
	if n.JobID != "" {
		fmt.Fprintf(&b, " (job %s)", m.Escape(n.JobID))
	}
	b.WriteString("\n")
	if n.Error != "" {
		fmt.Fprintf(&b, "Error: %s\n", m.Escape(n.Error))
	}
	b.WriteString("Next: " + nextStep(n.Status, handle, n.Attempts, h, m))
	return b.String()
}

// nextStep says what to do next; handle is escaped already.
func nextStep(status, handle string, attempts int, h Hints, m Markup) string {
	cli := m.Escape(h.CLI)
	show := m.Code(cli + " servers show " + handle)
	switch status {
	case fleet.StatusReady:
		return "nothing to do: the server is provisioned."
	case fleet.StatusFailed:
		return fmt.Sprintf("no automatic retry is left (%d failed attempts). Read the error and the server's history "+
			"(%s), fix the cause, then %s (or %s).",
			attempts, show, m.Code(cli+" servers provision "+handle), m.Code("rebuild"))
	case fleet.StatusUnreachable:
		again := "after the cool-down"
		if h.UnreachableCooldown > 0 {
			again = "every " + h.UnreachableCooldown.String()
		}
		return fmt.Sprintf("check that the machine runs and its SSH port answers; it is checked again %s "+
			"(%s).", again, show)
	}
	return fmt.Sprintf("see %s.", show)
}

// Digest is one message for many notifications, in markup m: counts by
// status, the servers of each (the first few, handles and errors escaped),
// and what to do next.
func Digest(batch []fleet.Notification, h Hints, m Markup) string {
	by := map[string][]fleet.Notification{}
	for _, n := range batch {
		by[n.Status] = append(by[n.Status], n)
	}
	statuses := make([]string, 0, len(by))
	for s := range by {
		statuses = append(statuses, s)
	}
	order := map[string]int{fleet.StatusFailed: 0, fleet.StatusUnreachable: 1, fleet.StatusReady: 2}
	sort.Slice(statuses, func(i, j int) bool { return order[statuses[i]] < order[statuses[j]] })
	var b strings.Builder
	var counts []string
	for _, s := range statuses {
		counts = append(counts, fmt.Sprintf("%d %s", len(by[s]), s))
	}
	fmt.Fprintf(&b, "%d servers changed state: %s\n", len(batch), strings.Join(counts, ", "))
	const show = 10
	for _, s := range statuses {
		list := by[s]
		var names []string
		for i, n := range list {
			if i == show {
				names = append(names, fmt.Sprintf("and %d more", len(list)-show))
				break
			}
			item := m.Escape(n.Handle)
			if n.Error != "" && s != fleet.StatusReady {
				// Cut before escaping: a cut never splits an entity.
				item += " (" + m.Escape(truncate(n.Error, 80)) + ")"
			}
			names = append(names, item)
		}
		fmt.Fprintf(&b, "%s %s: %s\n", icons[s], s, strings.Join(names, "; "))
	}
	if len(by[fleet.StatusFailed])+len(by[fleet.StatusUnreachable]) > 0 {
		fmt.Fprintf(&b, "Next: list them with %s; many failing at once "+
			"usually share one cause (network, credentials, a playbook change).",
			m.Code(m.Escape(h.CLI)+" servers list --status FAILED,UNREACHABLE"))
	} else {
		b.WriteString("Next: nothing to do.")
	}
	return b.String()
}

// Metrics of the dispatchers.
type Metrics struct {
	messages      *prometheus.CounterVec
	notifications *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	pendingG      *prometheus.GaugeVec
	failures      *prometheus.GaugeVec
	failingSince  *prometheus.GaugeVec
}

// NewMetrics registers the dispatchers' metrics with reg (nil: none).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "autoprov_scheduler_notify_messages_total", Help: "Messages sent to a channel, by result (ok, error).",
		}, []string{"channel", "result"}),
		notifications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "autoprov_scheduler_notify_delivered_total", Help: "Notifications delivered (a digest delivers many).",
		}, []string{"channel"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "autoprov_scheduler_notify_send_seconds", Help: "Duration of a channel's send.",
		}, []string{"channel"}),
		pendingG: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "autoprov_scheduler_notify_pending", Help: "Notifications a channel has not delivered yet.",
		}, []string{"channel"}),
		failures: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "autoprov_scheduler_notify_consecutive_failures", Help: "Sends to a channel that failed in a row (0 after a success).",
		}, []string{"channel"}),
		failingSince: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "autoprov_scheduler_notify_failing_since_timestamp_seconds",
			Help: "When a channel's current streak of failed sends began (0 while its last send succeeded).",
		}, []string{"channel"}),
	}
	if reg != nil {
		reg.MustRegister(m.messages, m.notifications, m.duration, m.pendingG, m.failures, m.failingSince)
	}
	return m
}

func (m *Metrics) sent(ch string, n int, err error, took time.Duration) {
	if m == nil {
		return
	}
	m.duration.WithLabelValues(ch).Observe(took.Seconds())
	if err != nil {
		m.messages.WithLabelValues(ch, "error").Inc()
		return
	}
	m.messages.WithLabelValues(ch, "ok").Inc()
	m.notifications.WithLabelValues(ch).Add(float64(n))
}

func (m *Metrics) streak(ch string, failures int, since time.Time) {
	if m == nil {
		return
	}
	m.failures.WithLabelValues(ch).Set(float64(failures))
	ts := 0.0
	if failures > 0 {
		ts = float64(since.UnixNano()) / 1e9
	}
	m.failingSince.WithLabelValues(ch).Set(ts)
}

func (m *Metrics) pending(ch string, n int) {
	if m != nil {
		m.pendingG.WithLabelValues(ch).Set(float64(n))
	}
}
