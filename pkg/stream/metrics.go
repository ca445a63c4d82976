package stream

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Prometheus metrics of producers and consumers. One Metrics
// is shared by all of a process's producers and consumers; a nil *Metrics
// records nothing.
type Metrics struct {
	published       *prometheus.CounterVec
	consumed        *prometheus.CounterVec
	acked           *prometheus.CounterVec
	failed          *prometheus.CounterVec
	deadLettered    *prometheus.CounterVec
	reclaimed       *prometheus.CounterVec
	deleted         *prometheus.CounterVec
	leaseLost       *prometheus.CounterVec
	released        *prometheus.CounterVec
	inFlight        *prometheus.GaugeVec
	handlerDuration *prometheus.HistogramVec
	lag             *prometheus.GaugeVec
	pending         *prometheus.GaugeVec
	trimmed         *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns, sub = "autoprov", "stream"
	sg := []string{"stream", "group"}
	m := &Metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "published_total", Help: "Entries appended to a stream."}, []string{"stream"}),
		consumed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "consumed_total", Help: "Entries delivered to a handler (first deliveries and reclaimed ones)."}, sg),
		acked: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "acked_total", Help: "Entries acknowledged after their handler succeeded or they were dead-lettered."}, sg),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "failed_total", Help: "Handler runs that returned an error or panicked."}, sg),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "dead_lettered_total", Help: "Entries moved to the dead-letter stream, by reason."}, []string{"stream", "group", "reason"}),
		reclaimed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "reclaimed_total", Help: "Entries claimed from other (dead or failed) deliveries."}, sg),
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "deleted_pending_total", Help: "Pending entries found deleted from the stream (trimmed) and dropped."}, sg),
		leaseLost: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "lease_lost_total", Help: "Handlers cancelled because another consumer took their entry."}, sg),
		released: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "released_total", Help: "Entries released to other consumers at shutdown."}, sg),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "in_flight", Help: "Entries held by this process: prefetched and waiting for a handler, handler running, or acknowledgement pending."}, sg),
		handlerDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "handler_duration_seconds", Help: "Handler run time.",
			Buckets: []float64{.0001, .001, .01, .1, .5, 1, 5, 15, 60, 300, 900, 3600}}, sg),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "group_lag", Help: "Entries not yet delivered to the group (XINFO GROUPS lag)."}, sg),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "group_pending", Help: "Entries delivered to the group and not yet acknowledged."}, sg),
		trimmed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "trimmed_total", Help: "Entries trimmed from a stream after every group read them."}, []string{"stream"}),
	}
	reg.MustRegister(m.published, m.consumed, m.acked, m.failed, m.deadLettered, m.reclaimed,
		m.deleted, m.leaseLost, m.released, m.inFlight, m.handlerDuration, m.lag, m.pending, m.trimmed)
	return m
}

// groupMetrics are the per-(stream, group) children, resolved once so the hot
// path does no label lookups.
type groupMetrics struct {
	consumed, acked, failed, reclaimed, deleted, leaseLost, released prometheus.Counter
	inFlight                                                         prometheus.Gauge
	duration                                                         prometheus.Observer
	lag, pending                                                     prometheus.Gauge
	m                                                                *Metrics
	stream, group                                                    string
}

func (m *Metrics) forGroup(stream, group string) *groupMetrics {
	if m == nil {
		return nil
	}
	return &groupMetrics{
		consumed:  m.consumed.WithLabelValues(stream, group),
		acked:     m.acked.WithLabelValues(stream, group),
		failed:    m.failed.WithLabelValues(stream, group),
		reclaimed: m.reclaimed.WithLabelValues(stream, group),
		deleted:   m.deleted.WithLabelValues(stream, group),
		leaseLost: m.leaseLost.WithLabelValues(stream, group),
		released:  m.released.WithLabelValues(stream, group),
		inFlight:  m.inFlight.WithLabelValues(stream, group),
		duration:  m.handlerDuration.WithLabelValues(stream, group),
		lag:       m.lag.WithLabelValues(stream, group),
		pending:   m.pending.WithLabelValues(stream, group),
		m:         m,
		stream:    stream,
		group:     group,
	}
}

// The helpers below accept a nil receiver so callers need no checks.

func (g *groupMetrics) add(c func(*groupMetrics) prometheus.Counter, n int) {
	if g != nil && n > 0 {
		c(g).Add(float64(n))
	}
}

func (g *groupMetrics) deadLetter(reason string) {
	if g != nil {
		g.m.deadLettered.WithLabelValues(g.stream, g.group, reason).Inc()
	}
}

func (g *groupMetrics) inFlightAdd(n int) {
	if g != nil {
		g.inFlight.Add(float64(n))
	}
}

func (g *groupMetrics) observe(seconds float64) {
	if g != nil {
		g.duration.Observe(seconds)
	}
}

func (g *groupMetrics) setGroupInfo(lag, pending int64) {
	if g == nil {
		return
	}
	if lag >= 0 {
		g.lag.Set(float64(lag))
	}
	g.pending.Set(float64(pending))
}

func (m *Metrics) incPublished(stream string, n int) {
	if m != nil {
		m.published.WithLabelValues(stream).Add(float64(n))
	}
}

func (m *Metrics) addTrimmed(stream string, n int64) {
	if m != nil && n > 0 {
		m.trimmed.WithLabelValues(stream).Add(float64(n))
	}
}

// Counter selectors for groupMetrics.add.
func cConsumed(g *groupMetrics) prometheus.Counter  { return g.consumed }
func cAcked(g *groupMetrics) prometheus.Counter     { return g.acked }
func cFailed(g *groupMetrics) prometheus.Counter    { return g.failed }
func cReclaimed(g *groupMetrics) prometheus.Counter { return g.reclaimed }
func cDeleted(g *groupMetrics) prometheus.Counter   { return g.deleted }
func cLeaseLost(g *groupMetrics) prometheus.Counter { return g.leaseLost }
func cReleased(g *groupMetrics) prometheus.Counter  { return g.released }
