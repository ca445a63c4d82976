package deployments

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	submitted       *prometheus.CounterVec
	results         *prometheus.CounterVec
	cancelled       *prometheus.CounterVec
	publishFailures prometheus.Counter
	commitGroup     prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		submitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "autoprov_deployer_deployments_submitted_total",
			Help: "Deployments submitted through the API (new, or replayed by an Idempotency-Key).",
		}, []string{"kind"}),
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "autoprov_deployer_results_total",
			Help: "Results read from deploy:results, by status (duplicate: already recorded; foreign: from another producer).",
		}, []string{"status"}),
		cancelled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "autoprov_deployer_cancellations_total",
			Help: "Cancellations, before the job started or requested from a running one.",
		}, []string{"kind"}),
		publishFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "autoprov_deployer_publish_failures_total",
			Help: "Requests whose publication failed at submit (the republisher publishes them later).",
		}),
		commitGroup: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "autoprov_deployer_submit_group_size",
			Help:    "Submits stored with one commit and published with one round trip (group commit under load).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128},
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.submitted, m.results, m.cancelled, m.publishFailures, m.commitGroup} {
			if err := reg.Register(c); err != nil {
				var are prometheus.AlreadyRegisteredError
				if !errors.As(err, &are) {
					return nil, err
				}
			}
		}
	}
	return m, nil
}
