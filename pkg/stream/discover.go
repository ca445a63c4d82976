package stream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Discover returns the streams whose names match pattern (a Redis glob,
// like "ansible:job:queue:*"), sorted, scanning every primary of a
// Cluster: what an operator's view lists beside the streams it knows, so
// that a new pool's queue shows without anyone naming it. Dead-letter
// streams are left out unless pattern asks for them (ends in
// DeadLetterSuffix).
func (i *Inspector) Discover(ctx context.Context, pattern string) ([]string, error) {
	var mu sync.Mutex // ForEachMaster scans the primaries at once
	var out []string
	wantDead := strings.HasSuffix(pattern, DeadLetterSuffix)
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.ScanType(ctx, 0, pattern, 1000, "stream").Iterator()
		for iter.Next(ctx) {
			if name := iter.Val(); wantDead || !strings.HasSuffix(name, DeadLetterSuffix) {
				mu.Lock()
				out = append(out, name)
				mu.Unlock()
			}
		}
		return iter.Err()
	}
	var err error
	switch c := i.rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, c)
	default:
		err = errors.New("cannot list the keys of this Redis client")
	}
	if err != nil {
		return nil, fmt.Errorf("scan streams %s: %w", pattern, err)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// WithDeadLetters returns the streams that have a dead-letter stream,
// sorted (Discover of "*" + DeadLetterSuffix, the suffix cut).
func (i *Inspector) WithDeadLetters(ctx context.Context) ([]string, error) {
	dead, err := i.Discover(ctx, "*"+DeadLetterSuffix)
	if err != nil {
		return nil, err
	}
	for k, d := range dead {
		dead[k] = strings.TrimSuffix(d, DeadLetterSuffix)
	}
	return dead, nil
}

// LiveConsumers counts the consumers of stream, in any group, that read it
// (or claimed from it) within the last within: on a queue, the replicas
// serving it. It needs only XINFO GROUPS and XINFO CONSUMERS. A stream
// that does not exist is ErrNotFound.
func (i *Inspector) LiveConsumers(ctx context.Context, stream string, within time.Duration) (int, error) {
	groups, err := i.rdb.XInfoGroups(ctx, stream).Result()
	if err != nil {
		if isNoSuchKey(err) {
			return 0, fmt.Errorf("stream %s: %w", stream, ErrNotFound)
		}
		return 0, fmt.Errorf("xinfo groups %s: %w", stream, err)
	}
	pipe := i.rdb.Pipeline()
	cmds := make([]*redis.XInfoConsumersCmd, len(groups))
	for k, g := range groups {
		cmds[k] = pipe.XInfoConsumers(ctx, stream, g.Name)
	}
	if len(groups) > 0 {
		_, _ = pipe.Exec(ctx)
	}
	n := 0
	for _, cmd := range cmds {
		cs, err := cmd.Result()
		if err != nil {
			return 0, fmt.Errorf("xinfo consumers %s: %w", stream, err)
		}
		for _, c := range cs {
			if c.Idle < within {
				n++
			}
		}
	}
	return n, nil
}
