// Package service holds the plumbing every service binary shares: typed
// configuration from environment variables (Load, Usage, LogConfig and the
// Common settings), the logger (NewLogger), the Redis client (NewRedis), the
// admin HTTP server (/healthz, /readyz, /metrics), shutdown on signals
// (WithShutdownSignals) and running long-lived components that fail and stop
// together (RunComponents).
//
// These are building blocks, not a framework: a service's main wires them in
// the order it needs, and every piece can be used and tested on its own.
package service
