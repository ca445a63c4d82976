package sshcheck

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	"golang.org/x/crypto/ssh"
)

// Class is the outcome of one attempt, as logged, recorded in Attempt and
// counted by Metrics (the result label).
type Class string

// The classes of attempt outcomes. The unreachable ones are retried; auth,
// host_key_mismatch and canceled end the check at once.
const (
	ClassOK Class = "ok"
	// ClassRefused: the TCP connection was refused (nothing listens).
	ClassRefused Class = "refused"
	// ClassConnectTimeout: the TCP connection was not established in time.
	ClassConnectTimeout Class = "connect_timeout"
	// ClassDNS: the address did not resolve.
	ClassDNS Class = "dns"
	// ClassNetwork: another connect error (no route, network unreachable).
	ClassNetwork Class = "network"
	// ClassNoBanner: TCP was accepted, then closed before any SSH banner.
	ClassNoBanner Class = "no_banner"
	// ClassBannerTimeout: TCP was accepted but nothing came back in time (a
	// hung host or sshd).
	ClassBannerTimeout Class = "banner_timeout"
	// ClassHandshakeTimeout: the SSH handshake started but did not finish in time.
	ClassHandshakeTimeout Class = "handshake_timeout"
	// ClassHandshake: the SSH handshake failed otherwise (connection reset,
	// protocol error, not an SSH server).
	ClassHandshake Class = "handshake"
	// ClassAuth: the handshake worked but the server rejected the keys.
	ClassAuth Class = "auth"
	// ClassHostKeyMismatch: the server presented another host key than the
	// pinned one.
	ClassHostKeyMismatch Class = "host_key_mismatch"
	// ClassCanceled: the caller's context ended.
	ClassCanceled Class = "canceled"
)

// ErrNotPinned: the strict policy requires a pinned host key and the target
// has none. Nothing was dialed.
var ErrNotPinned = errors.New("strict host key policy: no host key pinned for the target")

// UnreachableError: no SSH session could be opened in any attempt (TCP
// refused or timed out, no banner, handshake failed or timed out).
type UnreachableError struct {
	Address  string
	Port     int
	Attempts int   // attempts made
	Class    Class // class of the last attempt
	Err      error // error of the last attempt
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("ssh %s unreachable after %d attempts (%s): %v", hostPort(e.Address, e.Port), e.Attempts, e.Class, e.Err)
}

// Unwrap returns the last attempt's error.
func (e *UnreachableError) Unwrap() error { return e.Err }

// HostKeyMismatchError: the server presented another host key than the
// pinned one (or none of the pinned key's type). It is not retried: a
// changed key means a reinstalled server or someone in the middle, and an
// operator must decide (clear the pin after a reinstall).
type HostKeyMismatchError struct {
	Address string
	Port    int
	// Expected is the pinned key, authorized_keys format.
	Expected string
	// Got is the presented key, authorized_keys format; "" when the server
	// offered no key of the pinned key's type.
	Got string
}

func (e *HostKeyMismatchError) Error() string {
	got := "no key of that type"
	if e.Got != "" {
		got = fingerprintOf(e.Got)
	}
	return fmt.Sprintf("ssh %s: host key mismatch: pinned %s, server presents %s",
		hostPort(e.Address, e.Port), fingerprintOf(e.Expected), got)
}

// AuthError: the server answered and its host key was accepted, but it
// rejected authentication with the given keys. It is not retried: the same
// keys would be rejected again.
type AuthError struct {
	Address string
	Port    int
	User    string
	Err     error
}

func (e *AuthError) Error() string {
	return fmt.Sprintf("ssh %s: authentication as %q rejected: %v", hostPort(e.Address, e.Port), e.User, e.Err)
}

// Unwrap returns the SSH library's error.
func (e *AuthError) Unwrap() error { return e.Err }

func hostPort(address string, port int) string {
	return net.JoinHostPort(address, strconv.Itoa(port))
}

// fingerprintOf returns "<type> SHA256:<fingerprint>" of an authorized_keys
// line, or "(unparsable key)".
func fingerprintOf(line string) string {
	key, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		return "(unparsable key)"
	}
	return key.Type() + " " + ssh.FingerprintSHA256(key)
}
