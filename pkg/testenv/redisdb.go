package testenv

import (
	"context"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisDB claims a Redis logical database of the test's own, empties it,
// and returns the URL that selects it; the database is emptied and released
// when the test ends. It lets tests run programs that use the system's fixed
// stream names (provisioner:queue, ...) side by side, also across test
// packages running in parallel: claims are keys in database 0, taken with
// SET NX, so two processes never get the same database.
func RedisDB(t testing.TB) string {
	t.Helper()
	base := RedisURL(t)
	opt, err := redis.ParseURL(base)
	if err != nil {
		t.Fatalf("parse REDIS_URL: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opt.DB = 0
	admin := redis.NewClient(opt)
	defer admin.Close()
	n := 16
	if v, err := admin.ConfigGet(ctx, "databases").Result(); err == nil {
		if got, err := strconv.Atoi(v["databases"]); err == nil {
			n = got
		}
	}
	token := Unique("claim-")
	for db := 1; db < n; db++ {
		key := "testenv:db:" + strconv.Itoa(db)
		ok, err := admin.SetNX(ctx, key, token, time.Hour).Result()
		if err != nil {
			t.Fatalf("claim a redis database: %v", err)
		}
		if !ok {
			continue
		}
		c := redis.NewClient(&redis.Options{Addr: opt.Addr, Username: opt.Username, Password: opt.Password, DB: db, TLSConfig: opt.TLSConfig})
		if err := c.FlushDB(ctx).Err(); err != nil {
			c.Close()
			t.Fatalf("empty redis database %d: %v", db, err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = c.FlushDB(ctx).Err()
			c.Close()
			a := redis.NewClient(opt)
			defer a.Close()
			if v, _ := a.Get(ctx, key).Result(); v == token {
				a.Del(ctx, key)
			}
		})
		u, err := url.Parse(base)
		if err != nil {
			t.Fatal(err)
		}
		u.Path = "/" + strconv.Itoa(db)
		return u.String()
	}
	t.Fatalf("all %d redis databases are claimed by other tests (raise `databases` in the Redis config)", n-1)
	return ""
}
