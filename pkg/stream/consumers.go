package stream

import (
	"context"
	"fmt"
)

// DeleteConsumer deletes consumer from group of stream when it holds no
// pending entries, in one step (a script): deleting a consumer that holds
// some would drop them from the group for good (redis/redis#9745). It
// reports whether the consumer was deleted; false when it holds pending
// entries (they are claimed by a live consumer once idle beyond its lease,
// see Config.Lease) or does not exist.
func (i *Inspector) DeleteConsumer(ctx context.Context, stream, group, consumer string) (bool, error) {
	n, err := deleteConsumerScript.Run(ctx, i.rdb, []string{stream}, group, consumer).Int()
	if err != nil {
		return false, fmt.Errorf("delete consumer %s of %s/%s: %w", consumer, stream, group, err)
	}
	return n == 1, nil
}
