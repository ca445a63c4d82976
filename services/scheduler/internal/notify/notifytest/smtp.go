package notifytest

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"fmt"
	"math/big"
	"net"
	"net/textproto"
	"strings"
	"sync"
	"time"
)

// Mail is a message the SMTP sink accepted.
type Mail struct {
	From string
	To   []string
	// Data is the message as sent (headers and body), dot-unstuffed,
	// with CRLF line ends.
	Data string
	// TLS: the message came after STARTTLS; User is who authenticated.
	TLS  bool
	User string
}

// SMTP is a small SMTP sink speaking the part of RFC 5321 a client that
// sends mail needs: the greeting, EHLO/HELO, MAIL FROM, RCPT TO (one or
// more), DATA ending in <CRLF>.<CRLF> with dot-stuffing, RSET, NOOP and
// QUIT, each answered with its reply code; commands out of order get 503,
// unknown ones 502. With TLS set it offers STARTTLS (RFC 3207); with
// Users set, AUTH PLAIN (RFC 4954), only after STARTTLS, and mail only
// from a client that authenticated. It keeps what it accepted.
type SMTP struct {
	ln   net.Listener
	mu   sync.Mutex
	mail []Mail
	// Refuse, when set, answers RCPT TO with 550 for these addresses.
	Refuse map[string]bool
	// TLS, when set, is offered with STARTTLS.
	TLS *tls.Config
	// Users, when set, are the user names and passwords AUTH PLAIN takes.
	Users map[string]string
}

// NewSMTP starts a sink listening on addr (e.g. 127.0.0.1:0); Close
// stops it.
func NewSMTP(addr string) (*SMTP, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &SMTP{ln: ln}
	go s.serve()
	return s, nil
}

// Close stops the sink.
func (s *SMTP) Close() error { return s.ln.Close() }

// Addr is the sink's host:port.
func (s *SMTP) Addr() string { return s.ln.Addr().String() }

// Mail returns the messages accepted.
func (s *SMTP) Mail() []Mail {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Mail(nil), s.mail...)
}

func (s *SMTP) serve() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		go s.session(c)
	}
}

// session runs one connection's dialogue.
func (s *SMTP) session(c net.Conn) {
	defer func() { c.Close() }()
	tp := textproto.NewConn(c)
	reply := func(code int, msg string) { _ = tp.PrintfLine("%d %s", code, msg) }
	reply(220, "sink.test ESMTP notifytest")
	var cur *Mail
	helo, secure, user := false, false, ""
	for {
		line, err := tp.ReadLine()
		if err != nil {
			return
		}
		verb, arg, _ := strings.Cut(line, " ")
		switch strings.ToUpper(verb) {
		case "EHLO":
			helo = true
			_ = tp.PrintfLine("250-sink.test greets %s", arg)
			if s.TLS != nil && !secure {
				_ = tp.PrintfLine("250-STARTTLS")
			}
			if s.Users != nil && secure {
				_ = tp.PrintfLine("250-AUTH PLAIN")
			}
			_ = tp.PrintfLine("250-8BITMIME")
			reply(250, "SMTPUTF8")
		case "STARTTLS":
			if s.TLS == nil || secure {
				reply(502, "5.5.1 no STARTTLS here")
				continue
			}
			reply(220, "2.0.0 ready to start TLS")
			tc := tls.Server(c, s.TLS)
			if err := tc.Handshake(); err != nil {
				return
			}
			// RFC 3207: the client starts again with EHLO.
			c, tp, secure, helo, cur = tc, textproto.NewConn(tc), true, false, nil
		case "AUTH":
			mech, resp, _ := strings.Cut(arg, " ")
			switch {
			case s.Users == nil || !secure:
				reply(503, "5.5.1 AUTH not offered")
			case !strings.EqualFold(mech, "PLAIN"):
				reply(504, "5.5.4 only PLAIN")
			default:
				name, ok := plain(resp, s.Users)
				if !ok {
					reply(535, "5.7.8 authentication credentials invalid")
					continue
				}
				user = name
				reply(235, "2.7.0 authentication succeeded")
			}
		case "HELO":
			helo = true
			reply(250, "sink.test")
		case "MAIL":
			addr, ok := path(arg, "FROM:")
			switch {
			case !helo:
				reply(503, "5.5.1 EHLO first")
			case s.Users != nil && user == "":
				reply(530, "5.7.0 authentication required")
			case !ok:
				reply(501, "5.5.4 syntax: MAIL FROM:<address>")
			default:
				cur = &Mail{From: addr, TLS: secure, User: user}
				reply(250, "2.1.0 ok")
			}
		case "RCPT":
			addr, ok := path(arg, "TO:")
			switch {
			case cur == nil:
				reply(503, "5.5.1 MAIL first")
			case !ok || addr == "":
				reply(501, "5.5.4 syntax: RCPT TO:<address>")
			case s.Refuse[addr]:
				reply(550, "5.1.1 no such user")
			default:
				cur.To = append(cur.To, addr)
				reply(250, "2.1.5 ok")
			}
		case "DATA":
			if cur == nil || len(cur.To) == 0 {
				reply(503, "5.5.1 RCPT first")
				continue
			}
			reply(354, "end data with <CR><LF>.<CR><LF>")
			data, err := readData(tp.Reader.R)
			if err != nil {
				return
			}
			cur.Data = data
			s.mu.Lock()
			s.mail = append(s.mail, *cur)
			s.mu.Unlock()
			cur = nil
			reply(250, "2.0.0 queued")
		case "RSET":
			cur = nil
			reply(250, "2.0.0 ok")
		case "NOOP":
			reply(250, "2.0.0 ok")
		case "QUIT":
			reply(221, "2.0.0 bye")
			return
		default:
			reply(502, "5.5.2 command not implemented")
		}
	}
}

// plain checks an AUTH PLAIN initial response (base64 of
// authzid NUL user NUL password) against users and returns the user.
func plain(resp string, users map[string]string) (string, bool) {
	b, err := base64.StdEncoding.DecodeString(resp)
	if err != nil {
		return "", false
	}
	parts := strings.Split(string(b), "\x00")
	if len(parts) != 3 {
		return "", false
	}
	want, ok := users[parts[1]]
	return parts[1], ok && subtle.ConstantTimeCompare([]byte(want), []byte(parts[2])) == 1
}

// path reads "FROM:<a>" (or "TO:<a>") and its parameters.
func path(arg, prefix string) (string, bool) {
	if len(arg) < len(prefix) || !strings.EqualFold(arg[:len(prefix)], prefix) {
		return "", false
	}
	rest := strings.TrimSpace(arg[len(prefix):])
	if !strings.HasPrefix(rest, "<") {
		return "", false
	}
	end := strings.Index(rest, ">")
	if end < 0 {
		return "", false
	}
	return rest[1:end], true
}

// readData reads the DATA lines up to the lone ".", undoing the
// dot-stuffing (RFC 5321 4.5.2).
func readData(r *bufio.Reader) (string, error) {
	var b strings.Builder
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return "", fmt.Errorf("data: %w", err)
		}
		if line == ".\r\n" {
			return b.String(), nil
		}
		b.WriteString(strings.TrimPrefix(line, "."))
	}
}

// SelfSigned returns a server TLS configuration with a self-signed
// certificate for the IP address ip, and the pool that trusts it.
func SelfSigned(ip string) (*tls.Config, *x509.CertPool, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "notifytest"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP(ip)}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12}, pool, nil
}
