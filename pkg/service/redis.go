package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisConfig says how to reach Redis: one server (URL), a Sentinel-managed
// primary (SentinelMaster and SentinelAddrs) or a Cluster (ClusterAddrs).
// In every mode the URL gives the credentials, TLS (rediss://), the database
// number and go-redis's query options (dial_timeout, pool_size, ...); its
// host is the server only in single mode.
type RedisConfig struct {
	URL string `env:"URL" scrub:"true" envDefault:"redis://127.0.0.1:16379/0" desc:"Redis URL redis[s]://[user:password@]host:port/db[?options]; with Sentinel or Cluster only its credentials, TLS, db and options count"`
	// URLFile names a file holding the URL, read at start instead of URL
	// (keeps its password out of the process environment).
	URLFile string `env:"URL_FILE" desc:"file holding the Redis URL, read at start instead of REDIS_URL (keeps its password out of the process environment)"`

	SentinelMaster   string   `env:"SENTINEL_MASTER" desc:"Sentinel: name of the monitored primary (set with REDIS_SENTINEL_ADDRS)"`
	SentinelAddrs    []string `env:"SENTINEL_ADDRS" envSeparator:"," desc:"Sentinel: comma-separated host:port of the sentinels"`
	SentinelPassword string   `env:"SENTINEL_PASSWORD" secret:"true" desc:"Sentinel: password of the sentinels themselves, if they have one"`

	ClusterAddrs []string `env:"CLUSTER_ADDRS" envSeparator:"," desc:"Cluster: comma-separated host:port of seed nodes (the db must be 0)"`
}

// ReadURLFile reads REDIS_URL_FILE, when set, into URL (Common.Validate
// does; tools that load only a RedisConfig call it).
func (c *RedisConfig) ReadURLFile() error {
	return readSettingFile("REDIS_URL_FILE", c.URLFile, &c.URL)
}

// Validate checks the Redis settings; Load calls it through Common.
func (c RedisConfig) Validate() error {
	_, err := c.Options()
	return err
}

// Options returns the go-redis options for the configured mode;
// redis.NewUniversalClient turns them into a *redis.Client, a Sentinel
// failover client or a *redis.ClusterClient. Its errors are FieldErrors
// that never echo the URL (it may hold a password).
func (c RedisConfig) Options() (*redis.UniversalOptions, error) {
	var errs []error
	if _, err := url.Parse(c.URL); err != nil {
		return nil, Invalid("REDIS_URL", "not a valid URL")
	}
	o, err := redis.ParseURL(c.URL)
	if err != nil {
		return nil, &FieldError{Var: "REDIS_URL", Err: err}
	}
	sentinel := c.SentinelMaster != "" || len(c.SentinelAddrs) > 0
	cluster := len(c.ClusterAddrs) > 0
	switch {
	case sentinel && cluster:
		errs = append(errs, Invalid("REDIS_CLUSTER_ADDRS", "set either REDIS_SENTINEL_* or REDIS_CLUSTER_ADDRS, not both"))
	case sentinel && c.SentinelMaster == "":
		errs = append(errs, Invalid("REDIS_SENTINEL_MASTER", "required with REDIS_SENTINEL_ADDRS"))
	case sentinel && len(c.SentinelAddrs) == 0:
		errs = append(errs, Invalid("REDIS_SENTINEL_ADDRS", "required with REDIS_SENTINEL_MASTER"))
	case cluster && o.DB != 0:
		errs = append(errs, Invalid("REDIS_URL", "a Redis Cluster has only database 0, the URL selects %d", o.DB))
	case !sentinel && c.SentinelPassword != "":
		errs = append(errs, Invalid("REDIS_SENTINEL_PASSWORD", "set without REDIS_SENTINEL_MASTER"))
	}
	if (sentinel || cluster) && o.Network == "unix" {
		errs = append(errs, Invalid("REDIS_URL", "a unix socket URL works only with a single server"))
	}
	errs = append(errs, checkAddrs("REDIS_SENTINEL_ADDRS", c.SentinelAddrs), checkAddrs("REDIS_CLUSTER_ADDRS", c.ClusterAddrs))
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	u := &redis.UniversalOptions{
		Addrs:                 []string{o.Addr},
		ClientName:            o.ClientName,
		DB:                    o.DB,
		Protocol:              o.Protocol,
		Username:              o.Username,
		Password:              o.Password,
		MaxRetries:            o.MaxRetries,
		MinRetryBackoff:       o.MinRetryBackoff,
		MaxRetryBackoff:       o.MaxRetryBackoff,
		DialTimeout:           o.DialTimeout,
		ReadTimeout:           o.ReadTimeout,
		WriteTimeout:          o.WriteTimeout,
		ContextTimeoutEnabled: o.ContextTimeoutEnabled,
		PoolFIFO:              o.PoolFIFO,
		PoolSize:              o.PoolSize,
		PoolTimeout:           o.PoolTimeout,
		MinIdleConns:          o.MinIdleConns,
		MaxIdleConns:          o.MaxIdleConns,
		MaxActiveConns:        o.MaxActiveConns,
		ConnMaxIdleTime:       o.ConnMaxIdleTime,
		ConnMaxLifetime:       o.ConnMaxLifetime,
		TLSConfig:             o.TLSConfig,
	}
	switch {
	case sentinel:
		u.Addrs = c.SentinelAddrs
		u.MasterName = c.SentinelMaster
		u.SentinelPassword = c.SentinelPassword
	case cluster:
		u.Addrs = c.ClusterAddrs
		u.IsClusterMode = true // a Cluster even with a single seed address
	case o.Network == "unix":
		path := o.Addr
		u.Dialer = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
	}
	return u, nil
}

// checkAddrs checks a list of host:port addresses.
func checkAddrs(name string, addrs []string) error {
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return Invalid(name, "%q is not host:port", a)
		}
	}
	return nil
}

// RedisPingTimeout bounds the ping NewRedis sends.
const RedisPingTimeout = 5 * time.Second

// NewRedis builds the client cfg describes (single server, Sentinel or
// Cluster) and pings it, waiting at most RedisPingTimeout. The caller owns
// the client and closes it.
func NewRedis(ctx context.Context, cfg RedisConfig) (redis.UniversalClient, error) {
	opts, err := cfg.Options()
	if err != nil {
		return nil, err
	}
	c := redis.NewUniversalClient(opts)
	pingCtx, cancel := context.WithTimeout(ctx, RedisPingTimeout)
	defer cancel()
	if err := c.Ping(pingCtx).Err(); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("ping redis %v: %w", opts.Addrs, err)
	}
	return c, nil
}
