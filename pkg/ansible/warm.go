package ansible

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// Warm connections (Config.WarmIdle; off by default).
//
// Without them every run of Run pays an SSH handshake of its own: the
// play's ssh ControlPersist master lives in the run's group and runguard
// kills it when the run ends. With them, back-to-back runs of one scope
// share one SSH connection:
//
//   - a scope is (host alias, address, port, login user, pinned host key,
//     the public keys of the run's SSH keys): a run never uses a master
//     another key, user or pinned host key opened;
//   - the master is started by this process, not by Ansible (runguard would
//     kill it): "ssh -M -N" with the same strict options as the takeover's
//     ssh (no ssh_config, the pinned host key only, keys from the run's
//     agent only, nothing forwarded), as the play user when Config.RunAs is
//     set (ssh's multiplexing accepts clients of its own user only), in its
//     own process group, with Pdeathsig=SIGKILL: it dies with this process,
//     even by SIGKILL. It authenticates once, through the agent of the run
//     that started it, and holds no key afterwards;
//   - its socket is in a directory of its own under RunRoot ("ar-w...",
//     this process's, with a flocked marker, so SweepLeftovers removes it
//     after a crash, and the pinned host key, which the play user cannot
//     change; the socket in its subdirectory "s", 0700, the play user's);
//     the run's ansible-playbook gets "s" as
//     ANSIBLE_SSH_CONTROL_PATH_DIR and ssh_args starting with
//     "-o ControlMaster=no": its ssh processes use the master when it is
//     there and connect directly when it is not, and never start a master
//     of their own there;
//   - the takeover (remote.go) starts the master when the scope has none
//     (before the gate opens: no task connects earlier), then goes through
//     it; a takeover that cannot get through an existing master drops it
//     and tries again with a fresh one, so a master the server dropped
//     never fails a run;
//   - a master is closed after WarmIdle without a run of its scope, when a
//     run of the same alias uses another scope (new key, user or pinned
//     host key), when CloseWarm is called for its alias (the SSH check
//     failed, the server was rebuilt), when a run of its scope finds the
//     target unreachable, and all of them at Close.
//
// RunJob never uses warm connections: every job runs as the same play
// user, so a job's code could reach a master's socket.

// warmReady is what the master's LocalCommand prints once its control
// socket listens (ssh runs LocalCommand after it set up the socket).
const warmReady = "autoprov-warm-ready"

// warmStartTimeout bounds a master's start (ConnectTimeout is 10 s).
const warmStartTimeout = 30 * time.Second

// warmDirPrefix names the masters' directories under RunRoot; it starts
// with runDirPrefix, so SweepLeftovers treats them as run directories.
const warmDirPrefix = runDirPrefix + "w"

// warmPool holds the warm masters of a Runner.
type warmPool struct {
	r    *Runner
	idle time.Duration

	mu     sync.Mutex
	closed bool
	conns  map[string]*warmConn // by scope

	live atomic.Int64 // masters started and not exited (WarmConnections)
}

// warmConn is the master of one scope and its directory.
type warmConn struct {
	pool       *warmPool
	scope      string // hex sha256 of the scope
	alias      string
	host       Host
	key        pinnedKey
	dir        string // the scope's directory under RunRoot
	sockDir    string // its control socket's directory (the play's ANSIBLE_SSH_CONTROL_PATH_DIR)
	knownHosts string
	marker     *os.File

	closed atomic.Bool // out of the pool: no new master

	// Guarded by pool.mu.
	refs    int
	timer   *time.Timer
	stopped bool      // closed and its master stopped: the dir goes once refs is 0
	rmOnce  sync.Once // removeDir

	mu     sync.Mutex // serialises start and stop of the master
	cmd    *exec.Cmd
	exited chan struct{} // closed when the master process exited
	stderr *cappedBuffer
}

// WarmConnections reports how many warm ssh masters are open now (always
// 0 without Config.WarmConnections). It never waits on a master's start.
func (r *Runner) WarmConnections() int {
	if r.warm == nil {
		return 0
	}
	return int(r.warm.live.Load())
}

// warmScope is the scope of a run: every field of the connection that
// decides who logs in where, and the public keys of the run's keys.
func warmScope(h Host, key pinnedKey, pubKeys [][]byte) string {
	blobs := slices.Clone(pubKeys)
	slices.SortFunc(blobs, bytes.Compare)
	s := sha256.New()
	for _, f := range []string{h.Alias, h.Address, strconv.Itoa(h.Port), h.User, key.line} {
		s.Write([]byte(f))
		s.Write([]byte{0})
	}
	for _, b := range blobs {
		s.Write([]byte(strconv.Itoa(len(b)) + ":"))
		s.Write(b)
	}
	return hex.EncodeToString(s.Sum(nil))
}

// acquire returns the scope's connection (created when missing) for a run;
// release it when the run ends. nil when the pool is closed or the
// directory cannot be made (the run then goes cold).
func (p *warmPool) acquire(h Host, key pinnedKey, pubKeys [][]byte, log zerolog.Logger) *warmConn {
	scope := warmScope(h, key, pubKeys)
	var stale []*warmConn
	defer func() { p.shut(stale, "another key, user or host key for the server") }()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	// Another key, user or pinned host key for this server: the old
	// scope's master has no business staying open.
	for s, c := range p.conns {
		if s != scope && c.alias == h.Alias && c.refs == 0 {
			stale = append(stale, p.forgetLocked(c))
		}
	}
	c := p.conns[scope]
	if c == nil {
		var err error
		if c, err = p.newConn(scope, h, key); err != nil {
			log.Warn().Err(err).Msg("warm connection directory: the run goes without a warm connection")
			return nil
		}
		p.conns[scope] = c
	}
	c.refs++
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	return c
}

// release ends a run's use of c; the master closes after the idle time.
func (p *warmPool) release(c *warmConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c.refs--
	if c.refs > 0 {
		return
	}
	if c.closed.Load() {
		if c.stopped {
			c.removeDir()
		}
		return
	}
	var t *time.Timer
	t = time.AfterFunc(p.idle, func() {
		var idle []*warmConn
		p.mu.Lock()
		if c.timer == t && c.refs == 0 && !c.closed.Load() {
			idle = append(idle, p.forgetLocked(c))
		}
		p.mu.Unlock()
		p.shut(idle, "idle")
	})
	c.timer = t
}

// forgetLocked marks c closed and takes it out of the pool (p.mu held);
// hand it to shut then.
func (p *warmPool) forgetLocked(c *warmConn) *warmConn {
	c.closed.Store(true)
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if p.conns[c.scope] == c {
		delete(p.conns, c.scope)
	}
	return c
}

// shut stops the masters of conns taken out of the pool (p.mu not held)
// and removes their directories, now or when their last run ends.
func (p *warmPool) shut(conns []*warmConn, reason string) {
	for _, c := range conns {
		if c.stop() {
			p.r.log.Debug().Str("host", c.alias).Str("warm_scope", c.scope[:16]).Str("reason", reason).Msg("warm SSH connection closed")
		}
		p.mu.Lock()
		c.stopped = true
		if c.refs == 0 {
			c.removeDir()
		}
		p.mu.Unlock()
	}
}

// closeAlias closes the masters of the inventory host alias.
func (p *warmPool) closeAlias(alias, reason string) {
	var conns []*warmConn
	p.mu.Lock()
	for _, c := range p.conns {
		if c.alias == alias {
			conns = append(conns, p.forgetLocked(c))
		}
	}
	p.mu.Unlock()
	p.shut(conns, reason)
}

// close closes every master and returns once they are gone; later runs
// go cold.
func (p *warmPool) close() {
	var conns []*warmConn
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		conns = append(conns, p.forgetLocked(c))
	}
	p.mu.Unlock()
	p.shut(conns, "shutdown")
}

// newConn creates the scope's directory: this process's own (0711 with
// Config.RunAs, else 0700), with a flocked marker (SweepLeftovers) and the
// pinned host key (0644 with RunAs: the master reads it, the play user
// cannot change it), and the socket directory "s" (0700, the play user's).
func (p *warmPool) newConn(scope string, h Host, key pinnedKey) (*warmConn, error) {
	dir, err := os.MkdirTemp(p.r.cfg.RunRoot, warmDirPrefix)
	if err != nil {
		return nil, err
	}
	c := &warmConn{pool: p, scope: scope, alias: h.Alias, host: h, key: key, dir: dir,
		sockDir: filepath.Join(dir, "s"), knownHosts: filepath.Join(dir, "known_hosts")}
	fail := func(err error) (*warmConn, error) {
		c.removeDir()
		return nil, err
	}
	mode := os.FileMode(0o700)
	if p.r.cfg.RunAs != nil {
		mode = 0o711
	}
	if err := os.Chmod(dir, mode); err != nil {
		return fail(err)
	}
	m, err := createMarker(dir, fmt.Sprintf("autoprovisioner warm ssh connection\npid %d\n", os.Getpid()))
	c.marker = m
	if err != nil {
		return fail(err)
	}
	if err := writeFile(c.knownHosts, []byte(knownHostsLine(h, key))); err != nil {
		return fail(err)
	}
	if err := os.Mkdir(c.sockDir, 0o700); err != nil {
		return fail(err)
	}
	if o := p.r.cfg.RunAs; o != nil {
		if err := os.Chmod(c.knownHosts, 0o644); err != nil {
			return fail(err)
		}
		if err := os.Lchown(c.sockDir, int(o.UID), int(o.GID)); err != nil {
			return fail(err)
		}
	}
	return c, nil
}

// removeDir removes c's directory (its master is gone) and unlocks it.
func (c *warmConn) removeDir() {
	c.rmOnce.Do(func() {
		if err := os.RemoveAll(c.dir); err != nil {
			c.pool.r.log.Warn().Err(err).Str("dir", c.dir).Msg("remove warm connection directory")
		}
		if c.marker != nil {
			_ = c.marker.Close()
		}
	})
}

// controlPath is the ControlPath of the scope's master (ansible-playbook's
// ssh computes the same %C: same address, port and user).
func (c *warmConn) controlPath() string { return filepath.Join(c.sockDir, "%C") }

// alive tells whether c's master process runs.
func (c *warmConn) alive() bool {
	if c.cmd == nil {
		return false
	}
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

// ensure starts the scope's master unless it runs, authenticating through
// the agent at agentSock, and returns once its control socket listens. It
// reports whether it started one.
func (c *warmConn) ensure(ctx context.Context, agentSock string) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.alive() {
		return false, nil
	}
	if c.closed.Load() {
		return false, errors.New("warm connection closed")
	}
	c.reapLocked()
	// Sockets of a master that died without cleaning up: ssh would refuse
	// to listen where one is.
	if ents, err := os.ReadDir(c.sockDir); err == nil {
		for _, e := range ents {
			_ = os.Remove(filepath.Join(c.sockDir, e.Name()))
		}
	}
	ctx, cancel := context.WithTimeout(ctx, warmStartTimeout)
	defer cancel()
	h := c.host
	args := sshOptions(c.knownHosts, h, c.key, "yes", c.controlPath())
	args = append(args,
		"-o", "ControlPersist=no",
		"-o", "ForwardAgent=no",
		"-o", "ForwardX11=no",
		"-o", "ClearAllForwardings=yes",
		"-o", "UpdateHostKeys=no",
		"-o", "PermitLocalCommand=yes",
		"-o", "LocalCommand=echo "+warmReady,
		"-N", "--", h.Address)
	cmd := exec.Command("ssh", args...)
	cmd.Env = []string{"PATH=" + safePath, "HOME=" + c.sockDir, "LANG=C.UTF-8", "LC_ALL=C.UTF-8", "SSH_AUTH_SOCK=" + agentSock}
	cmd.Dir = c.sockDir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if o := c.pool.r.cfg.RunAs; o != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: o.UID, Gid: o.GID, Groups: []uint32{}}
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return false, fmt.Errorf("warm connection: %w", err)
	}
	c.stderr = &cappedBuffer{max: 4096}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		return false, fmt.Errorf("warm connection: start ssh: %w", err)
	}
	exited := make(chan struct{})
	c.cmd, c.exited = cmd, exited
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		counted := false
		for sc.Scan() {
			if sc.Text() == warmReady {
				c.pool.live.Add(1)
				counted = true
				close(ready)
				break
			}
		}
		// Nothing else prints to stdout; drain until the master exits.
		for sc.Scan() {
		}
		_ = cmd.Wait()
		if counted {
			c.pool.live.Add(-1)
		}
		close(exited)
	}()
	select {
	case <-ready:
		return true, nil
	case <-exited:
		c.cmd = nil
		return false, fmt.Errorf("warm connection to %s: ssh exited: %s", h.Alias, lastLine(c.stderr.String()))
	case <-ctx.Done():
		c.stopLocked()
		return false, fmt.Errorf("warm connection to %s: %w", h.Alias, context.Cause(ctx))
	}
}

// reapLocked forgets a master that exited (c.mu held).
func (c *warmConn) reapLocked() {
	if c.cmd != nil && !c.alive() {
		c.cmd = nil
	}
}

// stop ends c's master; it reports whether one was running.
func (c *warmConn) stop() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopLocked()
}

// stopLocked sends the master SIGTERM (it removes its socket and ends its
// connection), SIGKILL if it is still there after a second, and waits for
// it (c.mu held).
func (c *warmConn) stopLocked() bool {
	if !c.alive() {
		c.cmd = nil
		return false
	}
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(time.Second):
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.exited
	}
	c.cmd = nil
	return true
}

// drop ends c's master (the takeover could not get through it); the next
// ensure starts a new one.
func (c *warmConn) drop() { c.stop() }

// pid is the master's pid (0: none); for tests.
func (c *warmConn) pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.alive() {
		return 0
	}
	return c.cmd.Process.Pid
}

// cappedBuffer keeps the first max bytes written to it.
type cappedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *cappedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// warmSSHArgs is ANSIBLE_SSH_ARGS of a run with a warm connection: the
// ssh_args of ansible.cfg behind "-o ControlMaster=no" (ssh takes the
// first value of an option), so that the play's ssh uses the master and
// never starts one; ControlPersist stays in, as Ansible adds the
// ControlPath only when it finds it.
func warmSSHArgs(ansibleCfg string) string {
	args := "-C -o ControlMaster=auto -o ControlPersist=60s" // Ansible's default
	if b, err := os.ReadFile(ansibleCfg); err == nil {
		if v, ok := iniValue(string(b), "ssh_connection", "ssh_args"); ok {
			args = v
		}
	}
	if !strings.Contains(strings.ToLower(args), "controlpersist") {
		args += " -o ControlPersist=60s"
	}
	return strings.TrimSpace("-o ControlMaster=no " + args)
}

// iniValue finds key in section of an ansible.cfg (one-line values).
func iniValue(cfg, section, key string) (string, bool) {
	in := false
	for line := range strings.Lines(cfg) {
		l := strings.TrimSpace(line)
		switch {
		case l == "" || l[0] == '#' || l[0] == ';':
		case l[0] == '[':
			in = strings.TrimSpace(strings.Trim(l, "[]")) == section
		case in:
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				k, v, ok = strings.Cut(l, ":")
			}
			if ok && strings.TrimSpace(k) == key {
				return strings.TrimSpace(v), true
			}
		}
	}
	return "", false
}
