package sshcheck

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/rs/zerolog"
	"golang.org/x/crypto/ssh"
)

// preferredHostKeyAlgos is the order host key algorithms are offered in
// when no key is pinned, so that first use pins the strongest common key
// (ed25519 where the server has one) whatever the library's default order.
var preferredHostKeyAlgos = []string{
	ssh.KeyAlgoED25519,
	ssh.KeyAlgoECDSA256, ssh.KeyAlgoECDSA384, ssh.KeyAlgoECDSA521,
	ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256,
}

// hostKeyAlgosFor returns the algorithms to offer for a pinned key: only
// its own, so that a server with several host keys presents the pinned one.
func hostKeyAlgosFor(pinned ssh.PublicKey) []string {
	if pinned.Type() == ssh.KeyAlgoRSA {
		return []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256}
	}
	return []string{pinned.Type()}
}

// handshakeState is what the callbacks of one handshake saw; they run on
// the library's goroutines.
type handshakeState struct {
	mu         sync.Mutex
	presented  string // authorized_keys line of the key the server presented
	mismatch   bool
	authTrying bool
}

// attempt makes one connection: TCP, handshake, authentication. It
// returns the class of the outcome, the host key presented (if the
// handshake got that far) and the error.
func (c *Checker) attempt(ctx context.Context, addr string, t Target, pinned ssh.PublicKey, signers []ssh.Signer, log zerolog.Logger) (Class, string, error) {
	actx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
	defer cancel()

	raw, err := c.dialer.DialContext(actx, "tcp", addr)
	if err != nil {
		return classifyDial(ctx, actx, err), "", err
	}
	conn := &countingConn{Conn: raw}
	defer conn.Close()
	// The SSH library takes no context: a deadline bounds the handshake and
	// closing the connection interrupts it when ctx ends.
	if dl, ok := actx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(actx, func() { _ = conn.Close() })
	defer stop()

	st := &handshakeState{}
	cfg := &ssh.ClientConfig{
		User: t.User,
		Auth: []ssh.AuthMethod{ssh.PublicKeysCallback(func() ([]ssh.Signer, error) {
			st.mu.Lock()
			st.authTrying = true
			st.mu.Unlock()
			return signers, nil
		})},
		HostKeyCallback: func(_ string, _ net.Addr, key ssh.PublicKey) error {
			st.mu.Lock()
			defer st.mu.Unlock()
			st.presented = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key)))
			if pinned == nil || bytes.Equal(key.Marshal(), pinned.Marshal()) {
				return nil
			}
			if c.cfg.Policy == PolicyOff {
				log.Warn().Str("pinned_fingerprint", ssh.FingerprintSHA256(pinned)).
					Str("presented_fingerprint", ssh.FingerprintSHA256(key)).
					Msg("ssh host key differs from the pinned one; accepted because the policy is off (insecure)")
				return nil
			}
			st.mismatch = true
			return errHostKeyMismatch
		},
		HostKeyAlgorithms: preferredHostKeyAlgos,
	}
	if pinned != nil && c.cfg.Policy != PolicyOff {
		cfg.HostKeyAlgorithms = hostKeyAlgosFor(pinned)
	}

	sc, chans, reqs, err := ssh.NewClientConn(conn, addr, cfg)
	st.mu.Lock()
	presented, mismatch, authTrying := st.presented, st.mismatch, st.authTrying
	st.mu.Unlock()
	if err == nil {
		_ = ssh.NewClient(sc, chans, reqs).Close()
		return ClassOK, presented, nil
	}

	var negotiation *ssh.AlgorithmNegotiationError
	switch {
	case mismatch, pinned != nil && c.cfg.Policy != PolicyOff &&
		errors.As(err, &negotiation) && negotiation.What == "host key":
		// A server without a key of the pinned type changed its keys too.
		return ClassHostKeyMismatch, presented, &HostKeyMismatchError{
			Address: t.Address, Port: t.Port,
			Expected: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pinned))), Got: presented,
		}
	case ctx.Err() != nil:
		return ClassCanceled, presented, err
	case isAuthFailure(err, authTrying):
		return ClassAuth, presented, &AuthError{Address: t.Address, Port: t.Port, User: t.User, Err: err}
	case actx.Err() != nil || isTimeout(err):
		if conn.read.Load() == 0 {
			return ClassBannerTimeout, presented, err
		}
		return ClassHandshakeTimeout, presented, err
	case conn.read.Load() == 0 && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)):
		return ClassNoBanner, presented, err
	}
	return ClassHandshake, presented, err
}

// errHostKeyMismatch fails the handshake from the host key callback; the
// attempt turns it into a *HostKeyMismatchError.
var errHostKeyMismatch = errors.New("host key mismatch")

// isAuthFailure reports whether err is the server rejecting our keys. The
// SSH library has no typed error for it: it reports "unable to
// authenticate" once every key was refused, and the server may also
// disconnect with "too many authentication failures".
func isAuthFailure(err error, authTrying bool) bool {
	msg := err.Error()
	if strings.Contains(msg, "ssh: unable to authenticate") {
		return true
	}
	return authTrying && strings.Contains(strings.ToLower(msg), "authentication failures")
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// classifyDial classifies a failed TCP connect.
func classifyDial(ctx, actx context.Context, err error) Class {
	var dnsErr *net.DNSError
	switch {
	case ctx.Err() != nil:
		return ClassCanceled
	case errors.Is(err, syscall.ECONNREFUSED):
		return ClassRefused
	case errors.As(err, &dnsErr) && !dnsErr.IsTimeout:
		return ClassDNS
	case actx.Err() != nil || isTimeout(err):
		return ClassConnectTimeout
	}
	return ClassNetwork
}

// countingConn counts the bytes read, to tell "no banner at all" from a
// handshake that stalled later.
type countingConn struct {
	net.Conn
	read atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}
