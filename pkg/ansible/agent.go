package ansible

import (
	"crypto/ed25519"
	"crypto/rsa"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"sync"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

// sshAgent serves private keys from memory to the run's ssh processes over
// a unix socket in the run directory (SSH_AUTH_SOCK).
type sshAgent struct {
	listener net.Listener
	keyring  agent.Agent
	keys     []any // parsed private keys, wiped on close

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// startAgent parses keys and serves them on a new unix socket at path.
// Errors never quote key material.
func startAgent(path string, keys [][]byte) (*sshAgent, error) {
	a := &sshAgent{keyring: agent.NewKeyring(), conns: map[net.Conn]struct{}{}}
	for i, pem := range keys {
		key, err := ssh.ParseRawPrivateKey(pem)
		if err != nil {
			a.wipe()
			var missing *ssh.PassphraseMissingError
			if errors.As(err, &missing) {
				return nil, fmt.Errorf("ssh key %d: encrypted keys are not supported", i)
			}
			return nil, fmt.Errorf("ssh key %d: not a private key in PEM or OpenSSH format", i)
		}
		if k, ok := key.(*ed25519.PrivateKey); ok {
			key = *k
		}
		a.keys = append(a.keys, key)
		if err := a.keyring.Add(agent.AddedKey{PrivateKey: key, Comment: "autoprovisioner"}); err != nil {
			a.wipe()
			return nil, fmt.Errorf("ssh key %d: %w", i, err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		a.wipe()
		return nil, fmt.Errorf("ssh agent socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		a.wipe()
		return nil, fmt.Errorf("ssh agent socket: %w", err)
	}
	a.listener = l
	a.wg.Add(1)
	go a.serve()
	return a, nil
}

func (a *sshAgent) serve() {
	defer a.wg.Done()
	for {
		c, err := a.listener.Accept()
		if err != nil {
			return
		}
		a.mu.Lock()
		if a.closed {
			a.mu.Unlock()
			c.Close()
			return
		}
		a.conns[c] = struct{}{}
		a.wg.Add(1)
		a.mu.Unlock()
		go func() {
			defer a.wg.Done()
			_ = agent.ServeAgent(a.keyring, c)
			c.Close()
			a.mu.Lock()
			delete(a.conns, c)
			a.mu.Unlock()
		}()
	}
}

// publicKeys are the wire forms of the agent's public keys.
func (a *sshAgent) publicKeys() [][]byte {
	keys, _ := a.keyring.List()
	out := make([][]byte, 0, len(keys))
	for _, k := range keys {
		out = append(out, k.Blob)
	}
	return out
}

// close stops serving (the socket file is unlinked), closes the open
// connections, removes the keys from the keyring and overwrites their
// private parts in memory.
func (a *sshAgent) close() {
	a.mu.Lock()
	a.closed = true
	for c := range a.conns {
		c.Close()
	}
	a.mu.Unlock()
	a.listener.Close()
	a.wg.Wait()
	_ = a.keyring.RemoveAll()
	a.wipe()
}

// wipe overwrites the private key material this agent parsed (best effort:
// Go may have copied it while computing signatures).
func (a *sshAgent) wipe() {
	for _, k := range a.keys {
		switch k := k.(type) {
		case ed25519.PrivateKey:
			clear(k)
		case *rsa.PrivateKey:
			wipeInt(k.D)
			for _, p := range k.Primes {
				wipeInt(p)
			}
			wipeInt(k.Precomputed.Dp)
			wipeInt(k.Precomputed.Dq)
			wipeInt(k.Precomputed.Qinv)
		}
		// ecdsa keys keep their scalar in an internal form (Go 1.25 on)
		// that cannot be zeroed from outside; they are only dropped.
	}
	a.keys = nil
}

func wipeInt(x *big.Int) {
	if x != nil {
		clear(x.Bits())
	}
}
