package time4vps_test

import (
	"encoding/base64"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps"
	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps/time4vpstest"
)

type harness struct {
	api    *time4vpstest.Server
	client *time4vps.Client
	cfg    time4vps.Config
	logs   *testenv.SafeBuffer
	// secrets must never appear in logs or errors: the password(s) in use,
	// their basic auth tokens, and every root password a task reported.
	secrets []string
}

const testServerID = 101

// setup starts a stand-in with one server (testServerID) and a client with
// short waits, and checks at the end of the test that no secret reached the
// logs.
func setup(t *testing.T, scfg time4vpstest.Config, mutate func(*time4vps.Config), opts ...time4vps.Option) *harness {
	t.Helper()
	api := time4vpstest.Start(t, scfg)
	api.AddServer(time4vpstest.VPS{
		ID: testServerID, Domain: "web1.example.net", IP: "203.0.113.10",
		AdditionalIPs: []string{"203.0.113.11"}, Label: "web", OS: "kvm-debian-12-x86_64", PackageID: 11,
	})
	h := &harness{api: api, logs: &testenv.SafeBuffer{}}
	h.cfg = time4vps.Config{
		URL:              api.URL(),
		Username:         api.Username(),
		Password:         time4vps.Secret(api.Password()),
		Timeout:          5 * time.Second,
		ConnectTimeout:   2 * time.Second,
		TaskPollInterval: 5 * time.Millisecond,
		RetryMax:         3,
		RetryWaitMin:     2 * time.Millisecond,
		RetryWaitMax:     50 * time.Millisecond,
	}
	if mutate != nil {
		mutate(&h.cfg)
	}
	h.addSecret(string(h.cfg.Password))
	h.addSecret(api.Password())
	logger := zerolog.New(h.logs).Level(zerolog.DebugLevel).With().Timestamp().Logger()
	c, err := time4vps.New(h.cfg, logger, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.client = c
	t.Cleanup(func() {
		for _, ti := range api.Tasks() {
			if m := rootPassword.FindStringSubmatch(ti.Results); m != nil {
				h.addSecret(m[1])
			}
		}
		h.assertNoSecret(t, "logs", h.logs.String())
	})
	return h
}

var rootPassword = regexp.MustCompile(`Password: (\S+)`)

func (h *harness) addSecret(s string) {
	if s == "" {
		return
	}
	h.secrets = append(h.secrets, s,
		base64.StdEncoding.EncodeToString([]byte(h.api.Username()+":"+s)))
}

// assertNoSecret fails the test if text holds any secret.
func (h *harness) assertNoSecret(t *testing.T, where, text string) {
	t.Helper()
	for _, s := range h.secrets {
		if strings.Contains(text, s) {
			// Print the text with the secret masked: test output is a log too.
			t.Errorf("%s hold a secret (%d chars) at [SECRET]: %q", where, len(s), strings.ReplaceAll(text, s, "[SECRET]"))
		}
	}
}

// errNoSecret checks an error's text and returns it.
func (h *harness) errNoSecret(t *testing.T, err error) error {
	t.Helper()
	if err != nil {
		h.assertNoSecret(t, "error", err.Error())
	}
	return err
}
