package stream_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestRedactHookMasksLoggedAndDeadLetteredErrors: a handler whose errors
// and panics quote a secret has them masked by Config.Redact in every log
// line of the consumer and in the dead-letter entries.
func TestRedactHookMasksLoggedAndDeadLetteredErrors(t *testing.T) {
	const secret = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"
	rdb := testenv.Redis(t)
	s, g := names()
	log := &lockedLog{}
	h := stream.HandlerFunc(func(_ context.Context, msg *stream.Message) error {
		switch string(msg.Data()) {
		case "0":
			return stream.Permanent("invalid", errors.New("git said: bad credentials for "+secret))
		case "1":
			return errors.New("vault: token " + secret + " refused") // retried, then dead-lettered
		default:
			panic("cannot parse key " + secret)
		}
	})
	c, err := stream.NewConsumer(rdb, stream.Config{
		Group: g, Streams: []string{s}, Lease: 200 * time.Millisecond, ClaimInterval: 20 * time.Millisecond,
		MaxDeliveries: 2, RetryBackoff: 10 * time.Millisecond, Logger: zerolog.New(log),
		Redact: func(text string) string { return strings.ReplaceAll(text, secret, "[REDACTED]") },
	}, h)
	if err != nil {
		t.Fatal(err)
	}
	running(t, c)
	publish(t, rdb, s, 3)
	testenv.WaitFor(t, 20*time.Second, "three dead-letter entries", func() bool { return len(deadEntries(t, rdb, s)) == 3 })
	for _, d := range deadEntries(t, rdb, s) {
		e, _ := d.Values[stream.DeadFieldError].(string)
		if strings.Contains(e, secret) || !strings.Contains(e, "[REDACTED]") {
			t.Errorf("dead-letter error %q", e)
		}
	}
	out := log.String()
	if strings.Contains(out, secret) {
		t.Fatalf("the log holds the secret:\n%s", out)
	}
	for _, want := range []string{"permanent failure", "will be redelivered", "handler panicked"} {
		if !strings.Contains(out, want) {
			t.Errorf("log has no %q line:\n%s", want, out)
		}
	}
}
