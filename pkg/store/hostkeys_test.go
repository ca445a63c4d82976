package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

func TestPinHostKeyFirstUseRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)

	if key, err := store.GetHostKey(ctx, pool, "203.0.113.5", 22); err != nil || key != "" {
		t.Fatalf("unpinned target: key=%q err=%v", key, err)
	}
	const rounds = 20
	for i := range rounds {
		port := 2000 + i
		keys := []string{fmt.Sprintf("ssh-ed25519 AAAA%da", i), fmt.Sprintf("ssh-ed25519 AAAA%db", i)}
		var got [2]string
		var wg sync.WaitGroup
		start := make(chan struct{})
		for j, key := range keys {
			wg.Go(func() {
				<-start
				pinned, err := store.PinHostKey(ctx, pool, "203.0.113.5", port, key)
				if err != nil {
					t.Error(err)
				}
				got[j] = pinned
			})
		}
		close(start)
		wg.Wait()
		if got[0] != got[1] || (got[0] != keys[0] && got[0] != keys[1]) {
			t.Fatalf("round %d: pinners saw %q and %q, want the same winning key", i, got[0], got[1])
		}
		stored, err := store.GetHostKey(ctx, pool, "203.0.113.5", port)
		if err != nil || stored != got[0] {
			t.Fatalf("round %d: stored %q (err %v), pinners saw %q", i, stored, err, got[0])
		}
	}

	// Another port of the same address is another target.
	if pinned, err := store.PinHostKey(ctx, pool, "203.0.113.5", 22, "ssh-ed25519 AAAAport22"); err != nil || pinned != "ssh-ed25519 AAAAport22" {
		t.Fatalf("port 22: pinned=%q err=%v", pinned, err)
	}
	removed, err := store.ClearHostKey(ctx, pool, "203.0.113.5", 22)
	if err != nil || !removed {
		t.Fatalf("clear: removed=%v err=%v", removed, err)
	}
	if key, err := store.GetHostKey(ctx, pool, "203.0.113.5", 22); err != nil || key != "" {
		t.Fatalf("after clear: key=%q err=%v", key, err)
	}
	if removed, err := store.ClearHostKey(ctx, pool, "203.0.113.5", 22); err != nil || removed {
		t.Fatalf("clear again: removed=%v err=%v", removed, err)
	}
	if _, err := store.PinHostKey(ctx, pool, "203.0.113.5", 22, ""); err == nil {
		t.Fatal("pinned an empty key")
	}
}
