package deployments

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	submitted *prometheus.CounterVec
	results   *prometheus.CounterVec
	cancelled *prometheus.CounterVec
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
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.submitted, m.results, m.cancelled} {
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
