package sources

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// safePATH is the PATH of git and Ansible tools run here.
const safePATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// maxStderr bounds the git message kept for an error.
const maxStderr = 2048

// gitConfig is the configuration git runs with, from the environment
// (GIT_CONFIG_COUNT...), on top of no system or global file.
func (c *Cache) gitConfig(token string) [][2]string {
	cfg := [][2]string{
		{"protocol.allow", "never"},
		{"protocol.https.allow", "always"},
		{"core.hooksPath", "/dev/null"},
		{"core.fsmonitor", "false"},
		{"core.symlinks", "true"},
		{"credential.helper", ""},
		{"http.followRedirects", "false"},
		{"fetch.fsckObjects", "true"},
		{"gc.autoDetach", "false"},
		{"advice.detachedHead", "false"},
	}
	if c.cfg.AllowHTTP {
		cfg = append(cfg, [2]string{"protocol.http.allow", "always"})
	}
	if token != "" {
		cfg = append(cfg, [2]string{"http.extraHeader", "Authorization: Basic " + basicAuth(token)})
	}
	return cfg
}

// basicAuth is the basic authentication of a git token, as GitHub, GitLab
// and Gitea accept it.
func basicAuth(token string) string {
	return base64.StdEncoding.EncodeToString([]byte("x-access-token:" + token))
}

// gitEnv is git's whole environment: nothing of this process's.
func (c *Cache) gitEnv(token string, extra []string) []string {
	protocols := "https"
	if c.cfg.AllowHTTP {
		protocols = "https:http"
	}
	env := []string{
		"PATH=" + safePATH,
		"HOME=" + filepath.Join(c.cfg.CacheDir, "home"),
		"LANG=C", "LC_ALL=C",
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_ALLOW_PROTOCOL=" + protocols,
		"GIT_PROTOCOL_FROM_USER=0",
		"GIT_NO_REPLACE_OBJECTS=1",
		"GIT_NO_LAZY_FETCH=1",
	}
	cfg := c.gitConfig(token)
	env = append(env, "GIT_CONFIG_COUNT="+strconv.Itoa(len(cfg)))
	for i, kv := range cfg {
		n := strconv.Itoa(i)
		env = append(env, "GIT_CONFIG_KEY_"+n+"="+kv[0], "GIT_CONFIG_VALUE_"+n+"="+kv[1])
	}
	return append(env, extra...)
}

// run runs git on gitDir (none when empty) with token's credential.
func (c *Cache) run(ctx context.Context, token, gitDir string, args ...string) ([]byte, error) {
	return c.exec(ctx, token, nil, gitDir, args...)
}

// runEnv runs git on gitDir with extra environment variables.
func (c *Cache) runEnv(ctx context.Context, extra []string, gitDir string, args ...string) ([]byte, error) {
	return c.exec(ctx, "", extra, gitDir, args...)
}

func (c *Cache) exec(ctx context.Context, token string, extra []string, gitDir string, args ...string) ([]byte, error) {
	argv := []string{}
	if gitDir != "" {
		argv = append(argv, "--git-dir="+gitDir)
	}
	argv = append(argv, args...)
	if c.onExec != nil {
		c.onExec(argv)
	}
	cmd := exec.CommandContext(ctx, "git", argv...)
	cmd.Env = c.gitEnv(token, extra)
	cmd.Dir = filepath.Join(c.cfg.CacheDir, "home")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// git fetch runs git-remote-http and index-pack: stop them all.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &limitedBuffer{b: &stderr, n: maxStderr}
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if token != "" {
			msg = strings.ReplaceAll(msg, token, "***")
			msg = strings.ReplaceAll(msg, basicAuth(token), "***")
		}
		if msg == "" {
			msg = err.Error()
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("git %s: %w", args[0], context.Cause(ctx))
		}
		return nil, fmt.Errorf("git %s: %s", args[0], msg)
	}
	return stdout.Bytes(), nil
}

// limitedBuffer keeps the first n bytes written.
type limitedBuffer struct {
	b *bytes.Buffer
	n int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.n - l.b.Len(); room > 0 {
		l.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}
