package testenv

import (
	"context"
	"fmt"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
)

// Images used when a Docker engine is available and no URL is given. The
// containers live as long as the test process (testcontainers' reaper removes
// them afterwards).
const (
	redisImage    = "redis:7.0-alpine"
	postgresImage = "postgres:15-alpine"
)

// DockerAvailable reports whether a Docker engine answers; tests that can
// only run in a container (the Vault module) use it with the docker build tag.
func DockerAvailable() bool { return dockerAvailable() }

func dockerAvailable() bool {
	ok := false
	func() {
		defer func() { _ = recover() }() // the provider panics when no engine is configured
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		p, err := testcontainers.ProviderDocker.GetProvider()
		if err != nil {
			return
		}
		defer p.Close()
		ok = p.Health(ctx) == nil
	}()
	return ok
}

func startRedisContainer(ctx context.Context) (string, error) {
	c, err := tcredis.Run(ctx, redisImage, testcontainers.WithCmdArgs("--appendonly", "yes"))
	if err != nil {
		return "", fmt.Errorf("start redis container: %w", err)
	}
	return c.ConnectionString(ctx)
}

func startPostgresContainer(ctx context.Context) (string, error) {
	c, err := tcpostgres.Run(ctx, postgresImage,
		tcpostgres.WithDatabase("autoprov"),
		tcpostgres.WithUsername("autoprov"),
		tcpostgres.WithPassword("autoprov"),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		return "", fmt.Errorf("start postgres container: %w", err)
	}
	return c.ConnectionString(ctx, "sslmode=disable")
}
