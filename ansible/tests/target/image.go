// Package target builds and runs throw-away Debian test targets for the
// Ansible content: a debootstrap root file system cached on disk, started as a
// fresh copy-on-write copy (overlayfs) with its own network namespace, a veth
// pair with documentation addresses, an HTTP proxy for apt on the host end and
// sshd inside. Nothing outside the target's directory, its network namespace
// and its veth pair is changed; no init system runs inside, so packages are
// installed but their daemons are not started (policy-rc.d).
package target

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// imageRevision is part of the cache key: bump it when the post-processing of
// the root file system changes.
const imageRevision = "1"

// DefaultInclude is what a fresh Debian VPS image has besides the minimal base:
// Python for Ansible, sshd, and iproute2.
var DefaultInclude = []string{"python3", "openssh-server", "iproute2"}

// ImageConfig describes the cached root file system.
type ImageConfig struct {
	// CacheDir holds the images; DefaultCacheDir() when empty.
	CacheDir string
	// Suite is the Debian release (default "bookworm").
	Suite string
	// Mirror is the Debian mirror (default "http://deb.debian.org/debian").
	Mirror string
	// Include lists the packages added to the minbase variant (default DefaultInclude).
	Include []string
	// Progress receives debootstrap's progress lines (nil discards them).
	Progress io.Writer
}

// Image is a built root file system, used read-only as the lower layer of targets.
type Image struct {
	// Dir is the root file system.
	Dir string
	// Suite is the Debian release.
	Suite string
	// Key identifies the build inputs (suite, mirror, packages, revision).
	Key string
}

func (c *ImageConfig) setDefaults() error {
	if c.CacheDir == "" {
		dir, err := DefaultCacheDir()
		if err != nil {
			return err
		}
		c.CacheDir = dir
	}
	c.Suite = cmp.Or(c.Suite, "bookworm")
	c.Mirror = cmp.Or(c.Mirror, "http://deb.debian.org/debian")
	if len(c.Include) == 0 {
		c.Include = DefaultInclude
	}
	c.Progress = cmp.Or(c.Progress, io.Discard)
	return nil
}

// Key returns the cache key of the image the config describes.
func (c ImageConfig) Key() string {
	h := sha256.New()
	fmt.Fprintf(h, "rev=%s\nsuite=%s\nmirror=%s\nvariant=minbase\ninclude=%s\n",
		imageRevision, c.Suite, c.Mirror, strings.Join(c.Include, ","))
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// DefaultCacheDir returns <repository>/.cache/testtarget, the repository being
// the nearest parent of the working directory holding go.work.
func DefaultCacheDir() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, ".cache", "testtarget"), nil
}

// RepoRoot returns the nearest parent of the working directory that holds go.work.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find repository root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("find repository root: no go.work above the working directory")
		}
		dir = parent
	}
}

// EnsureImage returns the cached image for cfg, building it with debootstrap
// first when it is missing (about a minute from Debian's mirror). Concurrent
// callers, in this process or others, wait for one build.
func EnsureImage(ctx context.Context, cfg ImageConfig) (*Image, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("build test target image: debootstrap needs root")
	}
	key := cfg.Key()
	base := filepath.Join(cfg.CacheDir, "debian-"+cfg.Suite+"-"+key)
	img := &Image{Dir: filepath.Join(base, "rootfs"), Suite: cfg.Suite, Key: key}
	marker := filepath.Join(base, "complete")
	if _, err := os.Stat(marker); err == nil {
		return img, nil
	}
	if err := os.MkdirAll(cfg.CacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("create image cache %s: %w", cfg.CacheDir, err)
	}
	unlock, err := lockFile(ctx, base+".lock")
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, err := os.Stat(marker); err == nil {
		return img, nil // built by another process while we waited
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return nil, errors.New("build test target image: debootstrap is not installed (apt-get install debootstrap)")
	}

	tmp := base + ".building"
	// A crashed build may have left debootstrap's mounts behind.
	if err := unmountUnder(tmp); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(tmp); err != nil {
		return nil, fmt.Errorf("remove unfinished image %s: %w", tmp, err)
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", tmp, err)
	}
	fmt.Fprintf(cfg.Progress, "building test target image %s (debootstrap %s, about a minute)\n", base, cfg.Suite)
	start := time.Now()
	args := []string{
		"--variant=minbase",
		"--include=" + strings.Join(cfg.Include, ","),
		cfg.Suite, filepath.Join(tmp, "rootfs"), cfg.Mirror,
	}
	if err := runProgress(ctx, cfg.Progress, "debootstrap: ", "debootstrap", args...); err != nil {
		_ = unmountUnder(tmp)
		return nil, fmt.Errorf("debootstrap %s: %w", cfg.Suite, err)
	}
	if err := postProcess(filepath.Join(tmp, "rootfs")); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(base); err != nil {
		return nil, fmt.Errorf("remove old image %s: %w", base, err)
	}
	if err := os.Rename(tmp, base); err != nil {
		return nil, fmt.Errorf("install image %s: %w", base, err)
	}
	if err := os.WriteFile(marker, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("mark image %s complete: %w", base, err)
	}
	fmt.Fprintf(cfg.Progress, "test target image ready in %s\n", time.Since(start).Round(time.Second))
	return img, nil
}

// postProcess turns debootstrap's output into a pristine image: no package
// files, no host keys (each target generates its own) and a policy-rc.d that
// keeps package scripts from starting daemons, as no init system runs.
func postProcess(root string) error {
	debs, _ := filepath.Glob(filepath.Join(root, "var/cache/apt/archives/*.deb"))
	keys, _ := filepath.Glob(filepath.Join(root, "etc/ssh/ssh_host_*"))
	for _, f := range append(debs, keys...) {
		if err := os.Remove(f); err != nil {
			return fmt.Errorf("clean image: %w", err)
		}
	}
	policy := "#!/bin/sh\n# autoprovisioner test target: no init system runs here, so package\n" +
		"# scripts must not start daemons (they would run on the test machine's kernel).\nexit 101\n"
	if err := os.WriteFile(filepath.Join(root, "usr/sbin/policy-rc.d"), []byte(policy), 0o755); err != nil {
		return fmt.Errorf("write policy-rc.d: %w", err)
	}
	return nil
}

// runProgress runs a command, copying its output line by line to w with a prefix.
func runProgress(ctx context.Context, w io.Writer, prefix, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive"}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	done := make(chan struct{})
	var tail []string
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(w, prefix+line)
			tail = append(tail, line)
			if len(tail) > 20 {
				tail = tail[1:]
			}
		}
	}()
	err := cmd.Run()
	pw.Close()
	<-done
	if err != nil {
		return fmt.Errorf("%w: %s", err, strings.Join(tail, "\n"))
	}
	return nil
}

// lockFile takes an exclusive flock on path, waiting until ctx is done.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
