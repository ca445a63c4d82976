package reconcile

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Leader elects one scheduler replica through a Postgres session advisory
// lock held on a connection of its own: the replica holding it runs the
// ticks; the others stand by and take over within one tick after the
// leader's session ends (a crash, kill -9 or network loss ends the session
// and with it the lock).
//
// Leadership is an optimisation (one replica polls the sources); safety
// does not depend on it: every queueing is a compare-and-set and the relay
// claims outbox rows with SKIP LOCKED, so even two leaders at once never
// publish two messages for one server.
type Leader struct {
	cfg *pgx.ConnConfig
	key int64

	mu   sync.Mutex
	conn *pgx.Conn
}

// NewLeader returns a Leader for the lock name on pool's database.
func NewLeader(pool *pgxpool.Pool, name string) *Leader {
	sum := sha256.Sum256([]byte("leader:" + name))
	return &Leader{cfg: pool.Config().ConnConfig.Copy(), key: int64(binary.BigEndian.Uint64(sum[:8]))}
}

// Check returns whether this replica leads now: it keeps a lock it holds
// (checking its connection is alive) or tries to take it.
func (l *Leader) Check(ctx context.Context) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if l.conn != nil {
		if err := l.conn.Ping(ctx); err == nil {
			return true, nil
		}
		_ = l.conn.Close(context.Background())
		l.conn = nil
	}
	conn, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		return false, fmt.Errorf("leader election: connect: %w", err)
	}
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, l.key).Scan(&got); err != nil {
		_ = conn.Close(context.Background())
		return false, fmt.Errorf("leader election: %w", err)
	}
	if !got {
		_ = conn.Close(context.Background())
		return false, nil
	}
	l.conn = conn
	return true, nil
}

// Release gives leadership up (closing the session releases the lock).
func (l *Leader) Release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = l.conn.Close(ctx)
		l.conn = nil
	}
}

// Leading reports whether this replica held the lock at its last Check.
func (l *Leader) Leading() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conn != nil
}
