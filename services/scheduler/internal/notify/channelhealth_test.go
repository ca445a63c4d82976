package notify_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/notify"
)

// TestSlackURLFromFileWithNewline: a webhook URL written with
// `echo URL > file` (a trailing newline) and read through a file:
// reference passes the check and delivers a real notification.
func TestSlackURLFromFileWithNewline(t *testing.T) {
	t.Parallel()
	e := setup(t)
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "slack.url"), []byte(e.sURL+slackPath+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	red := secrets.NewRedactor()
	res, err := secrets.Open(context.Background(), secrets.Config{FileRoot: root, EnvPrefix: "AUTOPROV_SECRET_"}, secrets.Deps{Redactor: red})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = res.Close() })
	v, err := res.Resolve(context.Background(), "file:slack.url")
	if err != nil {
		t.Fatal(err)
	}
	if err := notify.CheckSlackURL(v); err != nil {
		t.Fatalf("check: %v", err)
	}
	d := notify.NewDispatcher(e.fleet, notify.NewSlack(v, red, 5*time.Second), notify.Config{Logger: e.logger()})
	if err := e.fleet.EnsureChannel(context.Background(), "slack"); err != nil {
		t.Fatal(err)
	}
	e.change(t, "ok", fleet.StatusReady, 1)
	if n, err := d.Once(context.Background()); err != nil || n != 1 {
		t.Fatalf("Once = %d, %v", n, err)
	}
	if msgs := e.slack.Messages(); len(msgs) != 1 || !strings.Contains(msgs[0].Text, "ok-000 is READY") {
		t.Errorf("messages %+v", msgs)
	}
}

// TestChannelFailingHealthAndMetrics: against a receiver answering 500,
// the channel is reported failing after FailingAfter sends in a row (by
// Health, for /readyz, and by the gauges the alert reads), and healthy
// again after one success.
func TestChannelFailingHealthAndMetrics(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := prometheus.NewRegistry()
	m := notify.NewMetrics(reg)
	d := notify.NewDispatcher(e.fleet, e.slackCh(), notify.Config{Logger: e.logger(), Metrics: m, FailingAfter: 3})
	if err := e.fleet.EnsureChannel(context.Background(), "slack"); err != nil {
		t.Fatal(err)
	}
	gauge := func(name string) float64 {
		t.Helper()
		n, err := testutil.GatherAndCount(reg, name)
		if err != nil || n != 1 {
			t.Fatalf("%s: %d series, %v", name, n, err)
		}
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	if gauge("autoprov_scheduler_notify_consecutive_failures") != 0 || gauge("autoprov_scheduler_notify_failing_since_timestamp_seconds") != 0 {
		t.Error("a new channel is not reported healthy")
	}
	e.slack.FailNext(100, 500)
	e.change(t, "down", fleet.StatusUnreachable, 1)
	start := time.Now()
	for i := 1; i <= 3; i++ {
		if _, err := d.Once(context.Background()); err == nil {
			t.Fatalf("send %d succeeded against a receiver answering 500", i)
		}
		if err := d.Health(context.Background()); (err != nil) != (i == 3) {
			t.Errorf("after %d failures: health %v", i, err)
		}
		if got := gauge("autoprov_scheduler_notify_consecutive_failures"); got != float64(i) {
			t.Errorf("after %d failures: consecutive failures %g", i, got)
		}
	}
	err := d.Health(context.Background())
	if err == nil || !strings.Contains(err.Error(), "3 sends failed in a row") || !strings.Contains(err.Error(), "status 500") {
		t.Errorf("health: %v", err)
	}
	if strings.Contains(err.Error(), "s3cretWebhookPart") {
		t.Errorf("health names the secret URL: %v", err)
	}
	if since := gauge("autoprov_scheduler_notify_failing_since_timestamp_seconds"); since < float64(start.Unix()-1) || since > float64(time.Now().Unix()+1) {
		t.Errorf("failing since %g, want about %d", since, start.Unix())
	}
	e.slack.FailNext(0, 0)
	if n, err := d.Once(context.Background()); err != nil || n != 1 {
		t.Fatalf("Once after the receiver recovered = %d, %v", n, err)
	}
	if err := d.Health(context.Background()); err != nil {
		t.Errorf("health after a success: %v", err)
	}
	if gauge("autoprov_scheduler_notify_consecutive_failures") != 0 || gauge("autoprov_scheduler_notify_failing_since_timestamp_seconds") != 0 {
		t.Error("gauges not reset by a success")
	}
}

// TestSecretShapeChecks: the checks --check-secrets and the start-up run on
// the notification secrets; their errors never quote the value.
func TestSecretShapeChecks(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		check func(secrets.Value) error
		value string
		ok    bool
	}{
		{notify.CheckSlackURL, "https://hooks.slack.com/services/T0/B0/canaryXYZ", true},
		{notify.CheckSlackURL, "http://127.0.0.1:8080/services/T0/B0/canaryXYZ", true},
		{notify.CheckSlackURL, "https://hooks.slack.com/services/T0/B0/canaryXYZ\n", false},
		{notify.CheckSlackURL, " https://hooks.slack.com/canaryXYZ", false},
		{notify.CheckSlackURL, "hooks.slack.com/services/canaryXYZ", false},
		{notify.CheckSlackURL, "ftp://hooks.slack.com/canaryXYZ", false},
		{notify.CheckSlackURL, "https:///canaryXYZ", false},
		{notify.CheckSlackURL, "https://[canaryXYZ", false},
		{notify.CheckSlackURL, "", false},
		{notify.CheckTelegramToken, "123456:AAF-canaryXYZ_0", true},
		{notify.CheckTelegramToken, "123456:AAF-canaryXYZ\r\n", false},
		{notify.CheckTelegramToken, "canaryXYZ", false},
		{notify.CheckTelegramToken, "123456:canary XYZ", false},
		{notify.CheckTelegramToken, "", false},
	} {
		err := c.check(secrets.ValueFromString(c.value))
		if (err == nil) != c.ok {
			t.Errorf("%q: %v, want ok=%v", c.value, err, c.ok)
		}
		if err != nil && strings.Contains(err.Error(), "canary") {
			t.Errorf("%q: the error quotes the value: %v", c.value, err)
		}
	}
}
