package tests

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
)

// startLatencyRelay forwards 127.0.0.1:<port> to addr, delaying every chunk
// by oneWay in each direction: a remote server's round trip on a local
// target. Stops when the benchmark ends.
func startLatencyRelay(b testing.TB, addr string, oneWay time.Duration) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	b.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			wg.Add(2)
			go func() { defer wg.Done(); delayCopy(up, c, oneWay) }()
			go func() { defer wg.Done(); delayCopy(c, up, oneWay) }()
		}
	}()
	return l.Addr().String()
}

func delayCopy(dst, src net.Conn, d time.Duration) {
	type chunk struct {
		data []byte
		at   time.Time
	}
	ch := make(chan chunk, 4096)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 64<<10)
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{buf[:n], time.Now().Add(d)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		time.Sleep(time.Until(c.at))
		if _, err := dst.Write(c.data); err != nil {
			break
		}
	}
	for range ch {
		// drain, so the reader can exit
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	_ = src.Close()
	_, _ = io.Copy(io.Discard, src)
}

var recapChanged = regexp.MustCompile(`(?m)^\S+\s+:\s+ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=0`)

type benchFigures struct {
	name              string
	fresh, noChange   time.Duration
	noChangeChangedOK bool
}

// BenchmarkSetupServer times setup_server.yml on a fresh target and again
// with nothing to change, with the project's ansible.cfg and with Ansible's
// defaults (an empty config plus the roles and modules paths), on the local
// veth (RTT about 0) and through a relay adding 50 ms of round trip (a remote
// VPS). Package downloads are cached and warmed first, so fresh runs compare
// Ansible, not the mirror.
func BenchmarkSetupServer(b *testing.B) {
	requireTools(b, targetTools...)
	warmPackageCache(b)
	var (
		mu      sync.Mutex
		figures []benchFigures
	)
	for _, rtt := range []time.Duration{0, 50 * time.Millisecond} {
		for _, cfg := range []string{"project", "defaults"} {
			name := fmt.Sprintf("rtt=%dms/config=%s", rtt.Milliseconds(), cfg)
			b.Run(name, func(b *testing.B) {
				var fresh, noChange time.Duration
				ok := true
				for i := 0; i < b.N; i++ {
					f, n, changed := benchSetupOnce(b, cfg, rtt)
					fresh += f
					noChange += n
					ok = ok && changed == 0
				}
				fresh /= time.Duration(b.N)
				noChange /= time.Duration(b.N)
				b.ReportMetric(fresh.Seconds(), "fresh-s")
				b.ReportMetric(noChange.Seconds(), "nochange-s")
				b.ReportMetric(0, "ns/op")
				mu.Lock()
				figures = append(figures, benchFigures{name, fresh, noChange, ok})
				mu.Unlock()
			})
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nsetup_server.yml wall time (fresh target / second run with nothing to change)\n")
	fmt.Fprintf(&sb, "%-28s %10s %12s %s\n", "", "fresh", "no-change", "")
	base := map[string]benchFigures{}
	for _, f := range figures {
		base[f.name] = f
	}
	for _, f := range figures {
		note := ""
		if !f.noChangeChangedOK {
			note = " (second run changed something!)"
		}
		if strings.HasSuffix(f.name, "config=project") {
			if d, ok := base[strings.TrimSuffix(f.name, "project")+"defaults"]; ok && f.noChange > 0 {
				note += fmt.Sprintf("  no-change %.1fx faster than defaults", d.noChange.Seconds()/f.noChange.Seconds())
			}
		}
		fmt.Fprintf(&sb, "%-28s %9.1fs %11.1fs%s\n", f.name, f.fresh.Seconds(), f.noChange.Seconds(), note)
	}
	fmt.Print(sb.String())
}

// benchSetupOnce provisions a fresh target twice and returns the wall times
// and the changed count of the second run.
func benchSetupOnce(b *testing.B, cfg string, rtt time.Duration) (time.Duration, time.Duration, int) {
	b.StopTimer()
	key := newKey(b)
	tgt := startTarget(b, key, targetOpts{})
	addr, port := tgt.Addr, tgt.Port
	if rtt > 0 {
		host, p, _ := net.SplitHostPort(startLatencyRelay(b, net.JoinHostPort(tgt.Addr, strconv.Itoa(tgt.Port)), rtt/2))
		addr = host
		port, _ = strconv.Atoi(p)
	}
	vars := setupVars()
	// Through the relay ansible_port is the relay's: keep the rules on sshd's port.
	vars["firewall_ssh_port"] = tgt.Port
	vars["fail2ban_sshd_port"] = tgt.Port
	dir := ansibleDir(b)
	if cfg == "defaults" {
		dir = defaultsAnsibleDir(b)
	}
	r := newRunner(b, dir)
	timed := func(user string) (time.Duration, int) {
		spec := ansible.Spec{
			Playbook: "setup_server.yml",
			Host:     ansible.Host{Alias: "srv-test", Address: addr, Port: port, User: user, KnownHostsKey: tgt.HostKey},
			Vars:     vars, SecretEnv: map[string]string{"AUTOPROV_DEPLOY_SSH_PUBKEY": key.PubLine}, SSHKeys: [][]byte{key.PEM},
		}
		b.StartTimer()
		res := runPlay(b, r, spec)
		b.StopTimer()
		m := recapChanged.FindStringSubmatch(res.Output)
		if res.ExitCode != 0 || m == nil {
			b.Fatalf("%s run as %s failed: %s", cfg, user, res.Summary())
		}
		changed, _ := strconv.Atoi(m[1])
		return res.Duration, changed
	}
	fresh, _ := timed("root")
	noChange, changed := timed("deploy")
	return fresh, noChange, changed
}

// defaultsAnsibleDir is an ansible directory with Ansible's defaults: an
// ansible.cfg naming only the project's roles and modules (no callback, so
// no events), and the project's playbooks.
func defaultsAnsibleDir(b *testing.B) string {
	dir := b.TempDir()
	real := ansibleDir(b)
	cfg := fmt.Sprintf("[defaults]\nroles_path = %s\nlibrary = %s\n",
		filepath.Join(real, "roles"), filepath.Join(real, "plugins", "modules"))
	if err := os.WriteFile(filepath.Join(dir, "ansible.cfg"), []byte(cfg), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(real, "playbooks"), filepath.Join(dir, "playbooks")); err != nil {
		b.Fatal(err)
	}
	return dir
}

// warmPackageCache provisions a throw-away target once when the shared
// package cache lacks Docker, so timed fresh runs do not download.
func warmPackageCache(b *testing.B) {
	debs, _ := filepath.Glob(filepath.Join(repoRoot(b), ".cache", "testtarget", "debs", "docker.io_*.deb"))
	if len(debs) > 0 {
		return
	}
	b.Log("warming the package cache with an untimed setup run")
	key := newKey(b)
	tgt := startTarget(b, key, targetOpts{})
	res := runPlay(b, newRunner(b, ansibleDir(b)), ansible.Spec{
		Playbook: "setup_server.yml", Host: hostFor(tgt, "root"), Vars: setupVars(), SSHKeys: [][]byte{key.PEM},
		SecretEnv: map[string]string{"AUTOPROV_DEPLOY_SSH_PUBKEY": key.PubLine},
	})
	if res.ExitCode != 0 {
		b.Fatalf("warm-up run failed: %s", res.Summary())
	}
	if err := tgt.Stop(); err != nil {
		b.Fatal(err)
	}
}
