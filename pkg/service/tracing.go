package service

import (
	"errors"
	"net/url"

	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"
)

// TracingConfig holds the OpenTelemetry settings every service reads, by
// their standard names. No endpoint: tracing is off (a no-op tracer).
// The OTLP exporter reads the further standard variables itself
// (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE,
// OTEL_TRACES_SAMPLER, OTEL_BSP_*, OTEL_RESOURCE_ATTRIBUTES).
type TracingConfig struct {
	Endpoint       string `env:"OTEL_EXPORTER_OTLP_ENDPOINT" desc:"OTLP/HTTP base URL of a trace collector, like http://otel-collector:4318 (spans go to /v1/traces); unset with OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: tracing off"`
	TracesEndpoint string `env:"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" desc:"full OTLP/HTTP URL for traces, like http://otel-collector:4318/v1/traces; wins over OTEL_EXPORTER_OTLP_ENDPOINT"`
	ServiceName    string `env:"OTEL_SERVICE_NAME" desc:"service.name of the spans; default: the service's name"`
	Disabled       bool   `env:"OTEL_SDK_DISABLED" desc:"true turns tracing off whatever the endpoints"`
}

// Validate checks the endpoints: http or https URLs with a host.
func (c TracingConfig) Validate() error {
	var errs []error
	for name, v := range map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": c.Endpoint, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": c.TracesEndpoint} {
		if v == "" {
			continue
		}
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			// The URL may hold credentials: it is not echoed.
			errs = append(errs, Invalid(name, "must be an http:// or https:// URL with a host"))
		}
	}
	return errors.Join(errs...)
}

// Settings returns the settings of package tracing.
func (c TracingConfig) Settings() tracing.Settings {
	return tracing.Settings{Endpoint: c.Endpoint, TracesEndpoint: c.TracesEndpoint, ServiceName: c.ServiceName, Disabled: c.Disabled}
}
