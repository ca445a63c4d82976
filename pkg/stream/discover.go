package stream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

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
