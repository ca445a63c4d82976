package sshcheck

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics is told about every attempt a Checker makes: its result class
// and how long it took.
type Metrics interface {
	AttemptDone(result Class, took time.Duration)
}

// MetricsFunc adapts a function to Metrics.
type MetricsFunc func(result Class, took time.Duration)

// AttemptDone calls f.
func (f MetricsFunc) AttemptDone(result Class, took time.Duration) { f(result, took) }

// PrometheusMetrics counts attempts in autoprov_ssh_attempts_total{result}
// and times them in autoprov_ssh_attempt_duration_seconds.
type PrometheusMetrics struct {
	attempts *prometheus.CounterVec
	duration prometheus.Histogram
}

// NewPrometheusMetrics creates the metrics and registers them with reg.
func NewPrometheusMetrics(reg prometheus.Registerer) (*PrometheusMetrics, error) {
	m := &PrometheusMetrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "autoprov", Subsystem: "ssh",
			Name: "attempts_total", Help: "SSH reachability check attempts, by result class."}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "autoprov", Subsystem: "ssh",
			Name: "attempt_duration_seconds", Help: "Time of one SSH check attempt (connect, handshake, authentication).",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}),
	}
	for _, c := range []prometheus.Collector{m.attempts, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register ssh check metrics: %w", err)
		}
	}
	return m, nil
}

// AttemptDone records one attempt.
func (m *PrometheusMetrics) AttemptDone(result Class, took time.Duration) {
	m.attempts.WithLabelValues(string(result)).Inc()
	m.duration.Observe(took.Seconds())
}
