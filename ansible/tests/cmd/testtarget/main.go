// Command testtarget starts and stops a local Debian test target (see package
// target) for trying the playbooks by hand or from `make run`.
//
//	testtarget up --dir DIR [--authorized-key KEY]... [--root-size-mb N] [--cache-dir DIR]
//	    builds or reuses the cached image, starts a target, prints its
//	    connection details as JSON and runs until SIGINT/SIGTERM.
//	testtarget up --detach --dir DIR ...
//	    the same in the background; prints the JSON once the target is up.
//	testtarget down --dir DIR
//	    stops the target started with --dir DIR.
//	testtarget cleanup
//	    removes what crashed runs left behind.
//	testtarget image [--cache-dir DIR] [--suite SUITE]
//	    builds or reuses the cached image and prints its root file system's
//	    directory (scripts/containers.sh imports it as the containers' base).
//
// Without --authorized-key an ed25519 key pair is generated in DIR
// (id_ed25519, id_ed25519.pub) and named in the JSON.
package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/crypto/ssh"

	"github.com/autoprovisioner/autoprovisioner/ansible/tests/target"
)

type keyList []string

func (k *keyList) String() string     { return strings.Join(*k, ",") }
func (k *keyList) Set(v string) error { *k = append(*k, v); return nil }

// upInfo is what `up` prints.
type upInfo struct {
	target.Info
	PrivateKeyFile string `json:"private_key_file,omitempty"`
}

func main() {
	log := zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.TimeOnly}).With().Timestamp().Logger()
	if len(os.Args) < 2 {
		usage()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "up":
		err = up(ctx, log, os.Args[2:])
	case "down":
		err = down(ctx, os.Args[2:])
	case "cleanup":
		err = target.CleanupStale(ctx, log)
	case "image":
		err = image(ctx, os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testtarget:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: testtarget up --dir DIR [--detach] [--authorized-key KEY]... [--root-size-mb N]\n"+
		"       testtarget down --dir DIR\n       testtarget cleanup\n       testtarget image [--cache-dir DIR] [--suite SUITE]")
	os.Exit(2)
}

// image builds or reuses the cached image and prints its root file system.
func image(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("image", flag.ExitOnError)
	suite := fs.String("suite", "bookworm", "Debian release")
	cacheDir := fs.String("cache-dir", "", "image and package cache (default <repository>/.cache/testtarget)")
	_ = fs.Parse(args)
	img, err := target.EnsureImage(ctx, target.ImageConfig{CacheDir: *cacheDir, Suite: *suite, Progress: os.Stderr})
	if err != nil {
		return err
	}
	fmt.Println(img.Dir)
	return nil
}

func up(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	dir := fs.String("dir", "", "target directory (required)")
	detach := fs.Bool("detach", false, "run in the background")
	rootMB := fs.Int("root-size-mb", 0, "size of the target's writable layer (tmpfs), 0 for unlimited")
	suite := fs.String("suite", "bookworm", "Debian release")
	cacheDir := fs.String("cache-dir", "", "image and package cache (default <repository>/.cache/testtarget)")
	var keys keyList
	fs.Var(&keys, "authorized-key", "authorized_keys line for root (repeatable)")
	_ = fs.Parse(args)
	if *dir == "" {
		return errors.New("up: --dir is required")
	}
	abs, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	if *detach {
		return upDetached(ctx, abs, args)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return err
	}
	var privFile string
	if len(keys) == 0 {
		pub, priv, err := generateKey(abs)
		if err != nil {
			return err
		}
		keys, privFile = keyList{pub}, priv
	}
	if *cacheDir == "" {
		if *cacheDir, err = target.DefaultCacheDir(); err != nil {
			return fmt.Errorf("%w (run from the repository or pass --cache-dir)", err)
		}
	}
	img, err := target.EnsureImage(ctx, target.ImageConfig{CacheDir: *cacheDir, Suite: *suite, Progress: os.Stderr})
	if err != nil {
		return err
	}
	t, err := target.Start(ctx, img, target.Options{
		Dir: abs, AuthorizedKeys: keys, RootSizeMB: *rootMB,
		PackageCache: filepath.Join(*cacheDir, "debs"), Logger: log,
	})
	if err != nil {
		return err
	}
	defer func() {
		if err := t.Stop(); err != nil {
			log.Error().Err(err).Msg("stopping the target")
		}
	}()
	info := upInfo{Info: t.Info(), PrivateKeyFile: privFile}
	data, _ := json.MarshalIndent(info, "", "  ")
	if err := os.WriteFile(filepath.Join(abs, "up.json"), append(data, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Println(string(data))
	<-ctx.Done()
	_ = os.Remove(filepath.Join(abs, "up.json"))
	return nil
}

// upDetached re-runs `up` without --detach in a new session, waits for its
// up.json and prints it.
func upDetached(ctx context.Context, dir string, args []string) error {
	var rest []string
	for _, a := range args {
		if a != "--detach" && a != "-detach" {
			rest = append(rest, a)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(dir, "up.json"))
	logf, err := os.OpenFile(filepath.Join(dir, "testtarget.log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, append([]string{"up"}, rest...)...)
	cmd.Stdout, cmd.Stderr = io.Discard, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start background target: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "testtarget.pid"), fmt.Appendf(nil, "%d\n", cmd.Process.Pid), 0o644); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "up.json")); err == nil {
			fmt.Print(string(data))
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("background target exited (%v); see %s", err, logf.Name())
		case <-ctx.Done():
			_ = cmd.Process.Signal(syscall.SIGTERM)
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func down(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("down", flag.ExitOnError)
	dir := fs.String("dir", "", "target directory (required)")
	_ = fs.Parse(args)
	if *dir == "" {
		return errors.New("down: --dir is required")
	}
	data, err := os.ReadFile(filepath.Join(*dir, "testtarget.pid"))
	if err != nil {
		return fmt.Errorf("down: no background target in %s: %w", *dir, err)
	}
	var pid int
	if _, err := fmt.Sscan(string(data), &pid); err != nil || pid <= 0 {
		return fmt.Errorf("down: bad pid file in %s", *dir)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			_ = os.Remove(filepath.Join(*dir, "testtarget.pid"))
			return nil
		}
		return fmt.Errorf("down: signal %d: %w", pid, err)
	}
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.Remove(filepath.Join(*dir, "testtarget.pid"))
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("down: target process %d still running after 60s", pid)
}

// generateKey writes an ed25519 key pair to dir and returns the public key
// line and the private key file.
func generateKey(dir string) (string, string, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", "", err
	}
	block, err := ssh.MarshalPrivateKey(priv, "testtarget")
	if err != nil {
		return "", "", err
	}
	privFile := filepath.Join(dir, "id_ed25519")
	if err := os.WriteFile(privFile, pem.EncodeToMemory(block), 0o600); err != nil {
		return "", "", err
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		return "", "", err
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub))) + " testtarget"
	if err := os.WriteFile(privFile+".pub", []byte(line+"\n"), 0o644); err != nil {
		return "", "", err
	}
	return line, privFile, nil
}
