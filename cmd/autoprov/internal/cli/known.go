package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

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
	known := slices.Clone(defaultStreams)
	var mu sync.Mutex // ForEachMaster scans the masters at once
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.ScanType(ctx, 0, "*"+stream.DeadLetterSuffix, 1000, "stream").Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			known = append(known, strings.TrimSuffix(iter.Val(), stream.DeadLetterSuffix))
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, c)
	default:
		err = errors.New("cannot list the keys of this Redis client")
	}
	if err != nil {
		return nil, fmt.Errorf("scan dead-letter streams: %w", err)
	}
	slices.Sort(known)
	return slices.Compact(known), nil
}
