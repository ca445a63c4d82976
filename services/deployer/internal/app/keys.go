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
	err := Keys(ctx, args, os.Getenv, os.Stdout)
	stop()
	code := service.ExitCode(err)
	if code != 0 {
		fmt.Fprintf(os.Stderr, "%s keys: %v\n", Name, err)
	}
	os.Exit(code)
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
