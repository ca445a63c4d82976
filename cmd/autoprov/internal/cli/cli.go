// Package cli holds the commands of autoprov, the operators' command line:
// the command tree (kong), the settings it shares with the services, and
// the output (human tables, or JSON with --json).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/reqsign"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/tracing"
)

// Env is what a run of the command line reads and writes.
type Env struct {
	Stdout, Stderr io.Writer
	// Stdin is where a confirmation is read (dead replay --resign); nil,
	// or a file that is not a terminal: nothing is asked, the step is
	// refused unless confirmed by a flag (--yes).
	Stdin io.Reader
	// Getenv reads the process environment.
	Getenv func(string) string
	// Environ lists the process environment (os.Environ); nil: empty.
	// validate passes the secret backends' credentials on from it.
	Environ func() []string
}

// Exit statuses.
const (
	ExitOK      = 0
	ExitFailed  = 1 // a command failed or found problems
	ExitUsage   = 2 // a mistake on the command line or in the settings
	exitUnknown = ExitFailed
)

// command line: the global flags and the commands.
type commandLine struct {
	EnvFile string `name:"env-file" type:"existingfile" help:"read settings (REDIS_URL, ...) from this dotenv file; variables set in the environment win (validate checks this file alone). Default: $AUTOPROV_ENV_FILE, else run/dev/autoprov.env (what make run writes) when it exists in the working directory"`
	JSON    bool   `name:"json" help:"print JSON instead of tables (for scripts)"`

	Status    statusCmd    `cmd:"" aliases:"queues" help:"per stream and consumer group: length, lag, pending, consumers with idle times (stale ones marked), oldest pending age, dead letters; with DATABASE_URL also servers by status and runs in flight"`
	Dead      deadCmd      `cmd:"" aliases:"dlq" help:"list, show, replay and drop the dead letters of a stream"`
	Consumers consumersCmd `cmd:"" help:"the consumers of the groups: prune the stale ones (replicas that are gone) once they hold no pending entries"`
	Provision provisionCmd `cmd:"" help:"queue a provisioning job for a registered server (--follow: print its progress, exit with its status)"`
	Deploy    deployCmd    `cmd:"" help:"queue a deploy of a project to a server (--follow: print its progress, exit with its status)"`
	Follow    followCmd    `cmd:"" help:"print a job's progress events (live, or all at once for a job that is over) and its result, and exit with its status (0 succeeded, 1 otherwise)"`
	Cancel    cancelCmd    `cmd:"" help:"ask a running job to stop (it ends as cancelled)"`
	Job       jobCmd       `cmd:"" help:"Ansible jobs through the deployer's HTTP API (AUTOPROV_API_URL, AUTOPROV_API_KEY): run, status, follow, cancel"`
	Template  templateCmd  `cmd:"" aliases:"templates" help:"job templates through the deployer's HTTP API (AUTOPROV_API_URL, AUTOPROV_API_KEY): list, show, create, update, delete, versions; job launch runs one"`
	Schedule  scheduleCmd  `cmd:"" aliases:"schedules" help:"a template launched on a cron expression or an RRULE, through the deployer's HTTP API: list, show (the next occurrences), create, pause, resume, delete"`
	Trigger   triggerCmd   `cmd:"" aliases:"triggers" help:"a template's webhook URL for git hosting to launch it on a push, through the deployer's HTTP API: list, show, create, rotate (the secret, shown only then), delete"`
	Workflow  workflowCmd  `cmd:"" aliases:"workflows" help:"workflows (templates in a graph, with approvals) and their runs, through the deployer's HTTP API: list, show, create, update, delete, launch (--follow), runs, run show, approve, deny, cancel"`
	Validate  validateCmd  `cmd:"" help:"check the services' configuration (every variable, by each service's own validation), that every secret reference resolves (values never printed; --no-secrets skips), inventories and playbooks; every problem is printed"`
	Config    configCmd    `cmd:"" help:"environment configuration packages (config/<env>/): seal a version"`
	Probe     probeCmd     `cmd:"" help:"GET an admin URL (/readyz, /healthz) and exit 0 on a 2xx answer (container health checks)"`
}

// globals is what every command's Run receives.
type globals struct {
	ctx     context.Context
	env     Env
	envFile string
	json    bool
	file    map[string]string // the --env-file's variables
	// progressAfter is how long a step runs before its progress shows;
	// 0: progressAfter.
	progressAfter time.Duration
}

// getenv reads a setting: the environment first, then the env file.
func (g *globals) getenv(name string) string {
	return service.WithEnvFile(g.env.Getenv, g.file)(name)
}

// redisSettings is the part of the services' configuration autoprov uses to
// reach Redis (service.RedisConfig: single server, Sentinel or Cluster).
type redisSettings struct {
	Redis service.RedisConfig `envPrefix:"REDIS_"`
}

// signer returns the function signing the requests autoprov publishes
// (REQUEST_SIGNING_KEY_ID and REQUEST_SIGNING_KEY or _FILE, as the
// scheduler's and the deployer's), or nil when no key is set.
func (g *globals) signer() (func(stream string, data []byte) (string, error), error) {
	_, sign, err := g.signingKey()
	return sign, err
}

// signingKey is signer with the id of the key ("" and nil when none is
// set).
func (g *globals) signingKey() (keyID string, sign func(stream string, data []byte) (string, error), err error) {
	var s struct{ Signing reqsign.Config }
	if err := service.Load(g.getenv, &s); err != nil {
		return "", nil, err
	}
	if sign, err = s.Signing.Signer(); err != nil || sign == nil {
		return "", nil, err
	}
	return s.Signing.KeyID, sign, nil
}

// producer returns a producer through rdb that signs what it publishes
// when a signing key is set.
func (g *globals) producer(rdb redis.UniversalClient) (*stream.Producer, error) {
	sign, err := g.signer()
	if err != nil {
		return nil, err
	}
	return stream.NewProducer(rdb, stream.ProducerOptions{Sign: sign}), nil
}

// tracing returns the tracer provider the OTEL_* settings ask for: OTLP
// export with an endpoint, a no-op without (package tracing).
func (g *globals) tracing() (*tracing.Provider, error) {
	var s struct{ Tracing service.TracingConfig }
	if err := service.Load(g.getenv, &s); err != nil {
		return nil, err
	}
	settings := s.Tracing.Settings()
	if settings.ServiceName == "" {
		settings.ServiceName = "autoprov"
	}
	return tracing.New(g.ctx, settings, "autoprov")
}

// redis connects to the Redis the settings name and checks it answers.
func (g *globals) redis() (redis.UniversalClient, error) {
	var s redisSettings
	if err := service.Load(g.getenv, &s); err != nil {
		return nil, err
	}
	if err := s.Redis.ReadURLFile(); err != nil {
		return nil, err
	}
	opts, err := s.Redis.Options()
	if err != nil {
		return nil, err
	}
	rdb := redis.NewUniversalClient(opts)
	if err := rdb.Ping(g.ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("connect to Redis: %w", err)
	}
	return rdb, nil
}

// usageError is a mistake the user made in arguments kong could not catch.
type usageError struct{ error }

// Run runs the command line args and returns the exit status.
func Run(ctx context.Context, args []string, env Env) (code int) {
	var cl commandLine
	exited := false
	envFile, findErr := service.FindEnvFile("", env.Getenv)
	desc := "The operators' command line of autoprovisioner: queues, dead letters, jobs, configuration checks."
	if envFile != "" {
		desc += " Settings from the environment, then " + envFile + " (--env-file or " + service.EnvFileVar + " names another)."
	}
	parser, err := kong.New(&cl,
		kong.Name("autoprov"),
		kong.Description(desc),
		kong.Writers(env.Stdout, env.Stderr),
		kong.Exit(func(c int) { exited = true; code = c }),
		kong.UsageOnError(),
	)
	if err != nil {
		fmt.Fprintf(env.Stderr, "autoprov: %v\n", err)
		return ExitFailed
	}
	kctx, err := parser.Parse(args)
	if exited { // --help
		return code
	}
	if err != nil {
		fmt.Fprintf(env.Stderr, "autoprov: %v (see --help)\n", err)
		return ExitUsage
	}
	if cl.EnvFile != "" {
		envFile, findErr = cl.EnvFile, nil
	}
	if findErr != nil {
		fmt.Fprintf(env.Stderr, "autoprov: %v\n", findErr)
		return ExitUsage
	}
	g := &globals{ctx: ctx, env: env, envFile: envFile, json: cl.JSON}
	if envFile != "" {
		if g.file, err = service.ReadEnvFile(envFile); err != nil {
			fmt.Fprintf(env.Stderr, "autoprov: %v\n", err)
			return ExitUsage
		}
	}
	err = kctx.Run(g)
	var ue usageError
	var cfgErr *service.ConfigError
	var failed *problemsFound
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &failed):
		return ExitFailed // the command printed them
	case errors.As(err, &ue), errors.As(err, &cfgErr):
		fmt.Fprintf(env.Stderr, "autoprov: %v\n", err)
		return ExitUsage
	}
	fmt.Fprintf(env.Stderr, "autoprov: %v%s\n", err, redisAuthHint(err, envFile))
	return exitUnknown
}

// redisAuthHint says which setting to fix when Redis refused the
// credentials (NOAUTH, WRONGPASS) or a command (NOPERM): "" otherwise.
func redisAuthHint(err error, envFile string) string {
	msg := err.Error()
	from := "REDIS_URL or REDIS_URL_FILE in the environment"
	if envFile != "" {
		from += " or in " + envFile
	}
	switch {
	case strings.Contains(msg, "NOAUTH"), strings.Contains(msg, "WRONGPASS"):
		return "\n  Redis wants a user and password: fix " + from + " (redis://USER:PASSWORD@HOST:PORT/DB); " +
			"against make run's stack, run from the repository (it reads " + service.DefaultEnvFile + ") or pass --env-file"
	case strings.Contains(msg, "NOPERM"):
		return "\n  the Redis user of " + from + " may not run this command: use a user whose ACL allows it (make run's admin user, in " +
			service.DefaultEnvFile + ")"
	}
	return ""
}

// problemsFound is returned by a command that printed the problems it
// found (validate): the exit status is 1 and nothing more is printed.
type problemsFound struct{ n int }

func (p *problemsFound) Error() string { return fmt.Sprintf("%d problems found", p.n) }
