package target

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// Names and addresses. Everything this package creates outside the target's
// directory carries the prefix, so a crashed run's leftovers are recognisable.
const (
	// RegistryDir records the live targets of every process on this machine
	// (a tmpfs, emptied at boot).
	RegistryDir = "/run/autoprov-testtarget"
	// NetnsPrefix starts the name of every network namespace of a target.
	NetnsPrefix = "aptgt-"
	// VethPrefix starts the name of the host end of every target's veth pair.
	VethPrefix = "aptg"
	// MaxSlots is the number of targets that can run at once: the /30
	// networks of 198.51.100.0/24 (TEST-NET-2, RFC 5737).
	MaxSlots = 64
)

// slotNames returns the names and addresses of slot n.
func slotNames(n int) (netns, hostVeth, peerVeth, hostAddr, addr string) {
	base := 4 * n
	return fmt.Sprintf("%s%02d", NetnsPrefix, n),
		fmt.Sprintf("%s%02d-h", VethPrefix, n),
		fmt.Sprintf("%s%02d-t", VethPrefix, n),
		fmt.Sprintf("198.51.100.%d", base+1),
		fmt.Sprintf("198.51.100.%d", base+2)
}

// entry is what the registry holds about one slot.
type entry struct {
	Slot       int    `json:"slot"`
	OwnerPid   int    `json:"owner_pid"`
	OwnerStart string `json:"owner_start"`
	Dir        string `json:"dir"`
	Root       string `json:"root"`
	ProxyPid   int    `json:"proxy_pid,omitempty"`
	ProxyConf  string `json:"proxy_conf,omitempty"`
}

func entryPath(slot int) string {
	return filepath.Join(RegistryDir, fmt.Sprintf("slot-%02d.json", slot))
}

// acquireSlot reserves the first free slot for this process.
func acquireSlot(dir, root string) (*entry, error) {
	if err := os.MkdirAll(RegistryDir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", RegistryDir, err)
	}
	for n := 0; n < MaxSlots; n++ {
		f, err := os.OpenFile(entryPath(n), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reserve slot %d: %w", n, err)
		}
		e := &entry{Slot: n, OwnerPid: os.Getpid(), OwnerStart: processStart(os.Getpid()), Dir: dir, Root: root}
		err = json.NewEncoder(f).Encode(e)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(entryPath(n))
			return nil, fmt.Errorf("write slot %d: %w", n, err)
		}
		return e, nil
	}
	return nil, fmt.Errorf("all %d test target slots are in use", MaxSlots)
}

func (e *entry) save() error {
	data, err := json.Marshal(e)
	if err != nil {
		return err
	}
	tmp := entryPath(e.Slot) + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("update slot %d: %w", e.Slot, err)
	}
	return os.Rename(tmp, entryPath(e.Slot))
}

// alive reports whether the process that owns the entry still runs.
func (e *entry) alive() bool {
	return e.OwnerPid > 0 && processStart(e.OwnerPid) == e.OwnerStart && e.OwnerStart != ""
}

// release removes everything of the slot: processes, mounts, veth, netns and
// the registry entry.
func (e *entry) release(ctx context.Context) error {
	netns, hostVeth, _, _, _ := slotNames(e.Slot)
	var errs []error
	if e.ProxyPid > 0 && e.ProxyConf != "" {
		if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", e.ProxyPid)); err == nil &&
			strings.Contains(string(cmdline), e.ProxyConf) {
			_ = syscall.Kill(e.ProxyPid, syscall.SIGKILL)
		}
	}
	if err := killAll(func() []int {
		pids := netnsPids(ctx, netns)
		if e.Root != "" {
			pids = append(pids, processesRootedAt(e.Root)...)
		}
		return pids
	}); err != nil {
		errs = append(errs, fmt.Errorf("stop processes of %s: %w", netns, err))
	}
	if e.Dir != "" {
		if err := unmountUnder(e.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	if linkExists(hostVeth) {
		if err := run(ctx, "ip", "link", "del", hostVeth); err != nil {
			errs = append(errs, err)
		}
	}
	if netnsExists(netns) {
		if err := run(ctx, "ip", "netns", "del", netns); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		if err := os.Remove(entryPath(e.Slot)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

func netnsExists(name string) bool {
	_, err := os.Stat(filepath.Join("/run/netns", name))
	return err == nil
}

// CleanupStale removes what crashed runs left behind: registry entries whose
// owner process is gone (with their processes, mounts, veth and netns), and
// network namespaces and veths with this package's prefixes that no entry
// owns. Targets of live processes are left alone.
func CleanupStale(ctx context.Context, log zerolog.Logger) error {
	var errs []error
	owned := map[int]bool{}
	for n := 0; n < MaxSlots; n++ {
		data, err := os.ReadFile(entryPath(n))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var e entry
		if err := json.Unmarshal(data, &e); err != nil {
			// Being written right now, or torn by a crash long ago.
			if st, serr := os.Stat(entryPath(n)); serr == nil && time.Since(st.ModTime()) > time.Minute {
				e = entry{Slot: n}
			} else {
				owned[n] = true
				continue
			}
		}
		e.Slot = n
		if e.alive() {
			owned[n] = true
			continue
		}
		log.Info().Int("slot", n).Str("dir", e.Dir).Int("owner_pid", e.OwnerPid).Msg("removing stale test target")
		if err := e.release(ctx); err != nil {
			errs = append(errs, fmt.Errorf("release stale slot %d: %w", n, err))
		}
	}
	// Namespaces and veths without an entry (the registry was lost).
	nsEntries, _ := os.ReadDir("/run/netns")
	for _, ns := range nsEntries {
		name := ns.Name()
		if !strings.HasPrefix(name, NetnsPrefix) {
			continue
		}
		n, err := strconv.Atoi(strings.TrimPrefix(name, NetnsPrefix))
		if err != nil || n < 0 || n >= MaxSlots || owned[n] {
			continue
		}
		if _, err := os.Stat(entryPath(n)); err == nil {
			continue
		}
		log.Info().Str("netns", name).Msg("removing orphaned test target namespace")
		e := entry{Slot: n}
		if err := e.release(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	ifaces, _ := net.Interfaces()
	for _, iface := range ifaces {
		if !strings.HasPrefix(iface.Name, VethPrefix) || !strings.HasSuffix(iface.Name, "-h") {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(iface.Name, VethPrefix), "-h"))
		if err != nil || owned[n] {
			continue
		}
		if _, err := os.Stat(entryPath(n)); err == nil {
			continue
		}
		log.Info().Str("veth", iface.Name).Msg("removing orphaned test target veth")
		if err := run(ctx, "ip", "link", "del", iface.Name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// requireTools fails with a clear message when a command is missing.
func requireTools(names ...string) error {
	var missing []string
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing tools for test targets: %s (scripts/services.sh deps installs them)", strings.Join(missing, ", "))
	}
	return nil
}
