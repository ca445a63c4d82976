package app

import (
	"context"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/notify"
)

// openSecrets opens the scheduler's resolver (VAULT_*, SECRETS_*; env:
// references read getenv). Components and the secret check open it alike.
func openSecrets(ctx context.Context, cfg *Config, getenv func(string) string, log zerolog.Logger, red *secrets.Redactor) (*secrets.Resolver, error) {
	return secrets.Open(ctx, cfg.Secrets, secrets.Deps{Logger: log, Redactor: red, LookupEnv: secrets.LookupIn(getenv)})
}

// secretRefs are the references the configuration names, by variable.
func (c *Config) secretRefs() []service.SecretRef {
	var out []service.SecretRef
	for _, r := range []service.SecretRef{
		{Source: "SLACK_WEBHOOK_URL_REF", Ref: c.Notify.SlackWebhookRef},
		{Source: "TELEGRAM_BOT_TOKEN_REF", Ref: c.Notify.TelegramTokenRef},
		{Source: "EC2_SECRET_ACCESS_KEY_REF", Ref: c.EC2.SecretKeyRef},
	} {
		if r.Ref != "" {
			out = append(out, r)
		}
	}
	return out
}

// SecretChecks is the scheduler's --check-secrets: every *_REF variable
// resolved with the resolver Components opens (the value is wiped at
// once). The SSH key references of its inventories are infra's to resolve:
// autoprov validate hands them to infra's check.
func SecretChecks(ctx context.Context, cfg *Config, getenv func(string) string) service.SecretChecker {
	c := service.SecretChecker{Refs: cfg.secretRefs()}
	res, err := openSecrets(ctx, cfg, getenv, zerolog.Nop(), secrets.NewRedactor())
	if err != nil {
		c.Err = err
		return c
	}
	c.Close = func() { _ = res.Close() }
	c.Check = func(ctx context.Context, r service.SecretRef) error {
		v, err := res.Resolve(ctx, r.Ref)
		defer v.Wipe()
		if err != nil {
			return err
		}
		return usable(r.Source, r.Ref, v)
	}
	return c
}

// usable checks a secret the variable source resolved to in the form the
// scheduler uses it: the Slack webhook an absolute http(s) URL, the
// Telegram token a bot token. The error wraps service.ErrSecretUnusable
// and names the reference, never the value.
func usable(source, ref string, v secrets.Value) error {
	var err error
	switch source {
	case "SLACK_WEBHOOK_URL_REF":
		err = notify.CheckSlackURL(v)
	case "TELEGRAM_BOT_TOKEN_REF":
		err = notify.CheckTelegramToken(v)
	}
	if err != nil {
		return fmt.Errorf("secret %s %v: %w", ref, err, service.ErrSecretUnusable)
	}
	return nil
}
