package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
)

// checkKnownStream returns an error naming the known streams when name is
// none of the system's streams and neither it nor its dead-letter stream
// exists (a typo would otherwise list no dead letters, as if all were
// well).
func checkKnownStream(ctx context.Context, rdb redis.UniversalClient, name string) error {
	if slices.Contains(defaultStreams, name) {
		return nil
	}
	for _, key := range []string{name, name + stream.DeadLetterSuffix} {
		n, err := rdb.Exists(ctx, key).Result()
		if err != nil {
			return fmt.Errorf("exists %s: %w", key, err)
		}
		if n > 0 {
			return nil
		}
	}
	known, err := deadLetterStreams(ctx, rdb)
	if err != nil {
		return err
	}
	return fmt.Errorf("no stream %s and no dead-letter stream %s%s; known: %s",
		name, name, stream.DeadLetterSuffix, strings.Join(known, ", "))
}

// deadLetterStreams returns the system's streams and every other stream
// that has a dead-letter stream, sorted.
func deadLetterStreams(ctx context.Context, rdb redis.UniversalClient) ([]string, error) {
	dead, err := stream.NewInspector(rdb).WithDeadLetters(ctx)
	if err != nil {
		return nil, err
	}
	known := append(slices.Clone(defaultStreams), dead...)
	slices.Sort(known)
	return slices.Compact(known), nil
}
