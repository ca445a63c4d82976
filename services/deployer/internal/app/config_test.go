package app

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
)

// TestSettings: the defaults keep finished deployments 90 days and
// Idempotency-Keys a day; 0 is allowed (keep), negative durations are
// refused with the variable named; a webhook lease shorter than twice the
// webhook timeout is refused.
func TestSettings(t *testing.T) {
	defaults := RetentionConfig{Deployments: 90 * 24 * time.Hour, IdempotencyKeys: 24 * time.Hour}
	const signingKey = "0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		env       map[string]string
		want      RetentionConfig
		wantError string
	}{
		{env: map[string]string{}, want: defaults},
		{env: map[string]string{"DEPLOYMENT_RETENTION": "0", "IDEMPOTENCY_KEY_TTL": "0"}, want: RetentionConfig{}},
		{env: map[string]string{"DEPLOYMENT_RETENTION": "-1h"}, wantError: "DEPLOYMENT_RETENTION"},
		{env: map[string]string{"IDEMPOTENCY_KEY_TTL": "-5m"}, wantError: "IDEMPOTENCY_KEY_TTL"},
		{env: map[string]string{"DEPLOYMENT_RETENTION": "soon"}, wantError: "DEPLOYMENT_RETENTION"},
		{env: map[string]string{"WEBHOOK_TIMEOUT": "40s", "WEBHOOK_SIGNING_KEY": signingKey}, wantError: "WEBHOOK_LEASE"},
		{env: map[string]string{"WEBHOOK_TIMEOUT": "30s", "WEBHOOK_SIGNING_KEY": signingKey}, want: defaults},
		// Without webhooks their lease does not matter.
		{env: map[string]string{"WEBHOOK_TIMEOUT": "40s"}, want: defaults},
	} {
		cfg := NewConfig()
		err := service.Load(func(k string) string { return tc.env[k] }, cfg)
		switch {
		case tc.wantError != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantError) {
				t.Errorf("%v: error %v, want one naming %s", tc.env, err, tc.wantError)
			}
		case err != nil:
			t.Errorf("%v: %v", tc.env, err)
		case cfg.Keep != tc.want:
			t.Errorf("%v: %+v, want %+v", tc.env, cfg.Keep, tc.want)
		}
	}
}

// TestSecretRefsAsInfra: DEPLOY_SECRET_REFS has infra's default (the
// deployer checks what infra checks), and a bad template is refused with
// the variable named.
func TestSecretRefsAsInfra(t *testing.T) {
	var infra authz.Config
	if err := service.Load(func(string) string { return "" }, &infra); err != nil {
		t.Fatal(err)
	}
	cfg := NewConfig()
	if err := service.Load(func(string) string { return "" }, cfg); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.SecretRefs.Templates, infra.SecretRefs) || len(infra.SecretRefs) == 0 {
		t.Errorf("DEPLOY_SECRET_REFS default %q, infra's %q", cfg.SecretRefs.Templates, infra.SecretRefs)
	}
	cfg = NewConfig()
	err := service.Load(func(k string) string {
		if k == "DEPLOY_SECRET_REFS" {
			return "vault:secret/a/**/b"
		}
		return ""
	}, cfg)
	if err == nil || !strings.Contains(err.Error(), "DEPLOY_SECRET_REFS") {
		t.Errorf("a bad template: %v", err)
	}
}
