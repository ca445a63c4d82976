package console

import (
	"slices"
	"testing"
	"time"
)

// TestNeedsAttention: what the overview lists first, each with its link.
func TestNeedsAttention(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 10, 30, 0, 0, time.UTC)
	hour := now.Truncate(time.Hour)
	for _, tt := range []struct {
		name   string
		counts []statusCount
		ready  []readiness
		queues []queueRow
		hours  map[time.Time]map[string]int
		want   []attention
	}{
		{"all well", []statusCount{{"READY", 40}, {"FAILED", 0}}, []readiness{{Name: "infra", Ready: true}},
			[]queueRow{{Stream: "provisioner:queue", Lag: 3}}, map[time.Time]map[string]int{hour: {"succeeded": 9}}, nil},
		{"servers in trouble", []statusCount{{"READY", 40}, {"FAILED", 2}, {"UNREACHABLE", 1}, {"ORPHANED", 3}}, nil, nil, nil,
			[]attention{{"2 servers FAILED", "/ui/fleet?status=FAILED"}, {"1 server UNREACHABLE", "/ui/fleet?status=UNREACHABLE"},
				{"3 servers ORPHANED", "/ui/fleet?status=ORPHANED"}}},
		{"a service down", nil, []readiness{{Name: "scheduler", Ready: false, Detail: "connection refused"}}, nil, nil,
			[]attention{{"scheduler is not ready: connection refused", "/ui/#readiness"}}},
		{"queues", nil, nil, []queueRow{
			{Stream: "ansible:job:queue", DeadLetters: 1},
			{Stream: "provisioner:queue", HasOldest: true, OldestPending: 7 * time.Minute, Lag: 250},
			{Stream: "ansible:deploy:queue", HasOldest: true, OldestPending: time.Minute, Lag: 99}}, nil,
			[]attention{{"1 dead letter in ansible:job:queue", "/ui/queues"},
				{"provisioner:queue: an entry held for 7m0s", "/ui/queues"},
				{"provisioner:queue: 250 entries waiting to be read", "/ui/queues"}}},
		{"failed runs this hour, not before", nil, nil, nil,
			map[time.Time]map[string]int{hour: {"failed": 3, "succeeded": 1}, hour.Add(-time.Hour): {"failed": 5}},
			[]attention{{"3 runs failed this hour", "/ui/runs?status=failed"}}},
	} {
		if got := needsAttention(tt.counts, tt.ready, tt.queues, tt.hours, now); !slices.Equal(got, tt.want) {
			t.Errorf("%s:\n got %v\nwant %v", tt.name, got, tt.want)
		}
	}
}
