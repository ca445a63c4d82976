// Package harden protects a service process that holds secrets from the
// processes it starts and from anyone sharing its user:
//
//   - NoDumps makes the process non-dumpable (prctl PR_SET_DUMPABLE 0):
//     its /proc/<pid>/environ, /proc/<pid>/mem and friends become owned by
//     root, so processes of the same user (plays, their modules) cannot
//     read them, and ptrace is refused; and it sets the core limit to 0, so
//     a crash leaves no core file holding secrets.
//   - ScrubEnv removes secrets from the environment block the kernel shows
//     in /proc/<pid>/environ, which os.Unsetenv cannot change: it
//     re-executes the program without them and hands their values to the
//     new image through an inherited memory file, which is read and closed
//     at once.
package harden

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// NoDumps makes the calling process non-dumpable and sets its core file
// size limit to 0 (inherited by its children).
func NoDumps() error {
	var errs []error
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		errs = append(errs, fmt.Errorf("prctl PR_SET_DUMPABLE: %w", err))
	}
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		errs = append(errs, fmt.Errorf("setrlimit RLIMIT_CORE: %w", err))
	}
	return errors.Join(errs...)
}

// Dumpable reports whether the calling process is dumpable.
func Dumpable() (bool, error) {
	v, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	return v != 0, err
}

// envFDVar names the descriptor of the memory file holding the scrubbed
// variables in the re-executed image.
const envFDVar = "AUTOPROV_SCRUBBED_ENV_FD"

// ScrubEnv makes sure no variable whose name secret reports true for is in
// the process's initial environment block (the one the kernel shows in
// /proc/<pid>/environ), while the program still sees them with os.Getenv:
//
//   - in an image ScrubEnv re-executed, it first reads the variables back
//     (see Restore);
//   - when the kernel's block holds none of them, it does nothing more;
//   - else it writes them to a memory file (memfd, never on disk) and
//     replaces the process with the same program, arguments and
//     environment (the program's, os.Environ) without them, telling the
//     new image the file's descriptor; it does not return then (unless
//     exec fails). A variable the program already removed with
//     os.Unsetenv (the env "unset" option of a configuration loaded
//     before) is carried over from the kernel's block, so the new image
//     loads the same configuration.
//
// So it may be called after the configuration is parsed (the names may
// depend on it: a secret prefix), provided Restore ran first thing in
// main; or first thing in main on its own. Children started with an
// explicit environment (never os.Environ()) do not inherit the variables
// either way.
func ScrubEnv(secret func(name string) bool) error {
	if err := Restore(); err != nil {
		return err
	}
	block, err := os.ReadFile("/proc/self/environ")
	if err != nil {
		return fmt.Errorf("scrub environment: %w", err)
	}
	var payload strings.Builder
	moved := map[string]bool{}
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); secret(name) {
			payload.WriteString(kv)
			payload.WriteByte(0)
			moved[name] = true
		}
	}
	inBlock := false
	for kv := range strings.SplitSeq(string(block), "\x00") {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || !secret(name) {
			continue
		}
		inBlock = true
		if !moved[name] {
			payload.WriteString(kv)
			payload.WriteByte(0)
			moved[name] = true
		}
	}
	clear(block)
	if !inBlock {
		return nil
	}
	var keep []string
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); !moved[name] {
			keep = append(keep, kv)
		}
	}
	fd, err := unix.MemfdCreate("autoprov-env", 0) // no CLOEXEC: the new image inherits it
	if err != nil {
		return fmt.Errorf("scrub environment: memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), "autoprov-env")
	if _, err := f.WriteString(payload.String()); err != nil {
		f.Close()
		return fmt.Errorf("scrub environment: %w", err)
	}
	exe, err := os.Executable()
	if err != nil {
		f.Close()
		return fmt.Errorf("scrub environment: %w", err)
	}
	keep = append(keep, envFDVar+"="+strconv.Itoa(fd))
	err = syscall.Exec(exe, os.Args, keep)
	f.Close()
	return fmt.Errorf("scrub environment: exec %s: %w", exe, err)
}

// Restore, in an image ScrubEnv re-executed, reads the variables it
// removed back into the program's environment (os.Setenv: Go's copy, not
// the kernel's block) and closes their memory file; elsewhere it does
// nothing. Call it first thing in main when ScrubEnv runs later (after the
// configuration, which needs the variables, is parsed).
func Restore() error {
	if fd := os.Getenv(envFDVar); fd != "" {
		return restore(fd)
	}
	return nil
}

// restore reads the scrubbed variables back from the memory file fd.
func restore(fdText string) error {
	_ = os.Unsetenv(envFDVar)
	fd, err := strconv.Atoi(fdText)
	if err != nil || fd < 3 {
		return fmt.Errorf("scrub environment: bad %s %q", envFDVar, fdText)
	}
	f := os.NewFile(uintptr(fd), "autoprov-env")
	defer f.Close()
	buf := make([]byte, 0, 4096)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err == nil && st.Size > 0 {
		buf = make([]byte, 0, st.Size)
	}
	var chunk [4096]byte
	for off := int64(0); ; {
		n, err := f.ReadAt(chunk[:], off)
		buf = append(buf, chunk[:n]...)
		off += int64(n)
		if err != nil {
			break
		}
	}
	defer clear(buf)
	for kv := range strings.SplitSeq(string(buf), "\x00") {
		if name, value, ok := strings.Cut(kv, "="); ok && name != "" {
			if err := os.Setenv(name, value); err != nil {
				return fmt.Errorf("scrub environment: %w", err)
			}
		}
	}
	return nil
}

// Names returns a matcher for ScrubEnv: the variables named, and those
// starting with one of prefixes.
func Names(names []string, prefixes ...string) func(string) bool {
	return func(name string) bool {
		if slices.Contains(names, name) {
			return true
		}
		for _, p := range prefixes {
			if p != "" && strings.HasPrefix(name, p) {
				return true
			}
		}
		return false
	}
}
