package service_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/service"
)

// TestAdminAdvisoryCheck: a failing advisory check is shown and named in
// "degraded" while the service stays ready; an ordinary check of the same
// name decides readiness again.
func TestAdminAdvisoryCheck(t *testing.T) {
	a, base := startAdmin(t, service.AdminConfig{})
	a.AddCheck("ok", func(context.Context) error { return nil })
	a.AddAdvisoryCheck("notify:slack", func(context.Context) error { return errors.New("slack: status 500") })
	a.MarkReady()
	code, r := getReady(t, base)
	if code != http.StatusOK || r.Status != "ready" || !slices.Equal(r.Degraded, []string{"notify:slack"}) {
		t.Errorf("readyz with a failing advisory check: %d %+v", code, r)
	}
	if c := r.Checks["notify:slack"]; c.OK || !c.Advisory || c.Error != "slack: status 500" {
		t.Errorf("advisory check: %+v", c)
	}
	if c := r.Checks["ok"]; !c.OK || c.Advisory {
		t.Errorf("ordinary check: %+v", c)
	}
	a.AddCheck("notify:slack", func(context.Context) error { return errors.New("down") })
	if code, r := getReady(t, base); code != http.StatusServiceUnavailable || r.Degraded != nil {
		t.Errorf("readyz once the check decides readiness: %d %+v", code, r)
	}
}
