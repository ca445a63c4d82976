package console

import (
	"fmt"
	"net/url"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/fleet"
)

// attention is one thing on the overview that an operator should look at
// first, with where to look.
type attention struct {
	What, Link string
}

// Thresholds past which a queue needs attention.
const (
	stuckPending = 5 * time.Minute // an entry held this long
	laggingAt    = 100             // entries not yet read by the group
)

// needsAttention lists, worst first, what the overview's data shows in
// trouble: servers FAILED, UNREACHABLE or ORPHANED, services not ready,
// dead letters, entries held too long, queues lagging and runs that
// failed in the last hour.
func needsAttention(counts []statusCount, ready []readiness, queues []queueRow, hours map[time.Time]map[string]int, now time.Time) []attention {
	var out []attention
	for _, c := range counts {
		switch c.Status {
		case fleet.StatusFailed, fleet.StatusUnreachable, fleet.StatusOrphaned:
			if c.N > 0 {
				out = append(out, attention{fmt.Sprintf("%d %s %s", c.N, servers(c.N), c.Status), Prefix + "/fleet?status=" + url.QueryEscape(c.Status)})
			}
		}
	}
	for _, r := range ready {
		if !r.Ready {
			out = append(out, attention{r.Name + " is not ready: " + r.Detail, Prefix + "/#readiness"})
		}
	}
	for _, q := range queues {
		if q.DeadLetters > 0 {
			out = append(out, attention{fmt.Sprintf("%d dead %s in %s", q.DeadLetters, plural(q.DeadLetters, "letter", "letters"), q.Stream), Prefix + "/queues"})
		}
		if q.HasOldest && q.OldestPending >= stuckPending {
			out = append(out, attention{fmt.Sprintf("%s: an entry held for %s", q.Stream, humanMS(q.OldestPending.Milliseconds())), Prefix + "/queues"})
		}
		if q.Lag >= laggingAt {
			out = append(out, attention{fmt.Sprintf("%s: %d entries waiting to be read", q.Stream, q.Lag), Prefix + "/queues"})
		}
	}
	if n := hours[now.UTC().Truncate(time.Hour)]["failed"]; n > 0 {
		out = append(out, attention{fmt.Sprintf("%d %s failed this hour", n, plural(int64(n), "run", "runs")), Prefix + "/runs?status=failed"})
	}
	return out
}

func servers(n int) string { return plural(int64(n), "server", "servers") }

func plural(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
