package testenv

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// RepoRoot returns the repository's root: the nearest folder above the
// working directory that holds go.work.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("testenv: no go.work above the working directory")
		}
		dir = parent
	}
}

// ACLRedis starts a redis-server with the shipped ACL file
// (deploy/redis/users.acl) turned on by scripts/redis-acl.sh, and returns
// it with a client logged in as each role (admin, scheduler, deployer,
// infra). It is stopped when the test ends.
func ACLRedis(t testing.TB) (*RedisServer, map[string]*redis.Client) {
	t.Helper()
	root := RepoRoot(t)
	dir := t.TempDir()
	pass := filepath.Join(dir, "passwords")
	users := []string{"admin", "scheduler", "deployer", "infra"}
	script := filepath.Join(root, "scripts", "redis-acl.sh")
	if out, err := exec.Command("bash", append([]string{script, "passwords", pass}, users...)...).CombinedOutput(); err != nil {
		t.Fatalf("redis-acl.sh passwords: %v\n%s", err, out)
	}
	acl, err := exec.Command("bash", script, "render", filepath.Join(root, "deploy", "redis", "users.acl"), pass).Output()
	if err != nil {
		t.Fatalf("redis-acl.sh render: %v", err)
	}
	if bytes.Contains(acl, []byte(">")) {
		t.Fatal("the rendered ACL file holds a plain-text password")
	}
	aclFile := filepath.Join(dir, "users.acl")
	if err := os.WriteFile(aclFile, acl, 0o600); err != nil {
		t.Fatal(err)
	}
	srv := StartRedisServer(t, "--aclfile", aclFile)
	clients := map[string]*redis.Client{}
	for _, u := range users {
		pw, err := os.ReadFile(filepath.Join(pass, u+".pass"))
		if err != nil {
			t.Fatal(err)
		}
		clients[u] = srv.Client(func(o *redis.Options) {
			o.Username, o.Password = u, strings.TrimSpace(string(pw))
		})
		if err := clients[u].Ping(context.Background()).Err(); err != nil {
			t.Fatalf("%s cannot log in: %v", u, err)
		}
	}
	return srv, clients
}
