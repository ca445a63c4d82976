// Package service holds the plumbing every service binary shares: typed
// configuration from environment variables (Load, Usage, LogConfig and the
// Common settings), the logger (NewLogger), the Redis client (NewRedis), the
// admin HTTP server (/healthz, /readyz, /metrics), shutdown on signals
// (WithShutdownSignals) and running long-lived components that fail and stop
// together (RunComponents).
//
// Serve wires these building blocks once, in the order every service uses:
// admin server, Postgres and its migrations, Redis, the service's
// components, and the ordered shutdown. Main (and Run, its testable core)
// adds the command line, the configuration and the logger, so that a
// service's main.go only names its Program: its configuration and its
// components, which live in the service's internal/app package.
package service
