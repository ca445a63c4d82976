package app

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/autoprovisioner/autoprovisioner/pkg/service"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/webhooks"
)

// KeysMain runs `deployer keys <args>` with the process's environment and
// output, and exits: 0 on success, 2 for configuration and usage errors, 1
// otherwise (see service.ExitCode).
func KeysMain(args []string) {
	ctx, stop := service.WithShutdownSignals(context.Background(), nil)
	getenv, envFile, err := keysEnv(os.Getenv)
	if err == nil {
		err = Keys(ctx, args, getenv, os.Stdout)
	}
	stop()
	code := service.ExitCode(err)
	if code != 0 {
		fmt.Fprintf(os.Stderr, "%s keys: %v\n", Name, err)
		if envFile != "" {
			fmt.Fprintf(os.Stderr, "%s keys: settings from the environment, then %s (%s names another)\n", Name, envFile, service.EnvFileVar)
		}
	}
	os.Exit(code)
}

// keysEnv is the settings `deployer keys` reads: the environment, then the
// operators' env file when there is one (service.FindEnvFile: make run's
// run/dev/autoprov.env, or AUTOPROV_ENV_FILE), whose path it returns.
func keysEnv(getenv func(string) string) (func(string) string, string, error) {
	path, err := service.FindEnvFile("", getenv)
	if err != nil || path == "" {
		return getenv, "", err
	}
	file, err := service.ReadEnvFile(path)
	if err != nil {
		return getenv, path, err
	}
	return service.WithEnvFile(getenv, file), path, nil
}

// Keys loads the configuration from getenv and runs the keys command
// against the configured database (migrating it first, so that it works
// before the service ever ran).
func Keys(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	cfg := NewConfig()
	if err := service.Load(getenv, cfg); err != nil {
		return err
	}
	db, err := store.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := store.Migrate(ctx, db); err != nil {
		return err
	}
	signingKey, err := cfg.Webhooks.SigningKeyBytes()
	if err != nil {
		return err
	}
	var secret func(string) string
	if signingKey != nil {
		secret = func(id string) string { return webhooks.DeriveSecret(signingKey, id) }
	}
	return auth.CLI(ctx, args, auth.NewStore(db), secret, auth.RateDefaults{Rate: cfg.API.RateLimit, Burst: cfg.API.RateBurst}, stdout)
}
