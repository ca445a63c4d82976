package jobs

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
)

// Metrics are the infra service's job metrics.
type Metrics struct {
	runs            *prometheus.CounterVec
	duration        *prometheus.HistogramVec
	unreachable     prometheus.Counter
	inFlight        prometheus.Gauge
	progressDropped prometheus.Counter
	overhead        *prometheus.HistogramVec
	sshChecksReused prometheus.Counter
	remoteStopped   *prometheus.CounterVec
	steps           *prometheus.HistogramVec
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns = "autoprov_infra"
	m := &Metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "jobs_total",
			Help: "Finished jobs by kind, playbook and status."}, []string{"kind", "playbook", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "job_duration_seconds",
			Help:    "Duration of finished jobs by kind and playbook.",
			Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 2400, 3600}}, []string{"kind", "playbook"}),
		unreachable: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "servers_marked_unreachable_total",
			Help: "Times a server was marked UNREACHABLE."}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "runs_in_flight",
			Help: "Runs holding their server's lock on this instance."}),
		progressDropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "progress_events_dropped_total",
			Help: "Routine progress events dropped under load."}),
		overhead: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "overhead_seconds",
			Help: "The service's own time around a play: start (request read to ansible-playbook started, SSH check " +
				"included) and finish (ansible-playbook's exit to result published, the runner's clean-up included).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}}, []string{"phase"}),
		sshChecksReused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "ssh_checks_reused_total",
			Help: "Runs that went without an SSH check because the same server passed one moments before."}),
		remoteStopped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "remote_processes_stopped_total",
			Help: "Processes stopped on servers: of earlier runs whose controller was gone, before a play (takeover), " +
				"and of a play that was stopped (cleanup)."}, []string{"step"}),
		steps: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "job_step_seconds",
			Help: "Time of each step of a job (decode, server_lookup, authorization, locks, run_record, secrets, " +
				"ssh_check, run_dir, agent, takeover, process_start, play, log_store, result); a job observes only the steps it took.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10, 60, 300, 1200}}, []string{"step"}),
	}
	reg.MustRegister(m.runs, m.duration, m.unreachable, m.inFlight, m.progressDropped, m.overhead, m.sshChecksReused, m.remoteStopped, m.steps)
	return m
}

func (m *Metrics) finished(kind, playbook string, status messages.Status, d time.Duration) {
	m.runs.WithLabelValues(kind, playbook, string(status)).Inc()
	if d > 0 {
		m.duration.WithLabelValues(kind, playbook).Observe(d.Seconds())
	}
}

// RegisterWarmConnections registers the gauge of open warm ssh masters
// (SSH_WARM_CONNECTIONS), read from open at each scrape.
func RegisterWarmConnections(reg prometheus.Registerer, open func() int) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "autoprov_infra", Name: "warm_connections",
		Help: "Warm ssh masters open now (SSH_WARM_CONNECTIONS; 0 when off)."}, func() float64 { return float64(open()) }))
}
