package app

import (
	"context"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/webhooks"
)

// KeysCLI runs `deployer keys ...` against the configured database
// (migrating it first, so that it works before the service ever ran).
func KeysCLI(ctx context.Context, cfg *Config, args []string, stdout interface{ Write([]byte) (int, error) }) error {
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
	return auth.CLI(ctx, args, auth.NewStore(db), secret, stdout)
}
