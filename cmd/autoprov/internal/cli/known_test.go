package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// TestDeadListUnknownStream: dead list of a stream that is not the
// system's and has neither entries nor dead letters says so, names the
// known streams, and exits non-zero; a known stream without dead letters
// is an empty list.
func TestDeadListUnknownStream(t *testing.T) {
	t.Parallel()
	url, rdb := redisDB(t)
	env := map[string]string{"REDIS_URL": url}
	ctx := context.Background()
	// Another service's stream with dead letters is known too.
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "webhooks:queue" + stream.DeadLetterSuffix, Values: map[string]any{"x": "1"}}).Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		wantErr  []string
	}{
		{"typo", []string{"dead", "list", "provisoner:queue"}, 1, []string{
			"no dead-letter stream provisoner:queue:dead", "known: ", messages.StreamProvisionerQueue,
			messages.StreamDeployResults, "webhooks:queue",
		}},
		{"typo, dead-letter name", []string{"--json", "dead", "list", "nope:dead"}, 1, []string{"no stream nope and no dead-letter stream nope:dead"}},
		{"system stream, nothing yet", []string{"dead", "list", messages.StreamAnsibleDeployQueue}, 0, nil},
		{"other stream with dead letters", []string{"dead", "list", "webhooks:queue"}, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := run(t, env, tc.args...)
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d\n%s%s", code, tc.wantCode, out, errOut)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(errOut, want) {
					t.Errorf("stderr lacks %q:\n%s", want, errOut)
				}
			}
		})
	}
}
