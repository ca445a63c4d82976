package notify

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"mime"
	"mime/quotedprintable"
	"net"
	"net/smtp"
	"strings"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
)

// Email sends a job notification by SMTP (RFC 5321) through a rule's
// server: STARTTLS when the server offers it (verified against the
// server's name), PLAIN authentication with the rule's user name and
// password when it has one (net/smtp refuses it without TLS, except to
// localhost), one text/plain message (quoted-printable UTF-8) to every
// recipient.
type Email struct {
	Settings EmailSettings
	To       []string
	Password secrets.Value
	Net      *Net
}

// Send sends subject and body; id makes the message's Message-ID.
func (e *Email) Send(ctx context.Context, subject, body, id string) error {
	host, _, err := net.SplitHostPort(e.Settings.Server)
	if err != nil {
		return fmt.Errorf("email: server %q is not host:port", e.Settings.Server)
	}
	conn, err := e.Net.Dial(ctx, e.Settings.Server)
	if err != nil {
		return fmt.Errorf("email: %w", err)
	}
	_ = conn.SetDeadline(time.Now().Add(e.Net.timeout))
	c, err := smtp.NewClient(conn, host)
	if err != nil {
		conn.Close()
		return fmt.Errorf("email: %w", err)
	}
	defer c.Close()
	if err := c.Hello("autoprov"); err != nil {
		return fmt.Errorf("email: EHLO: %w", err)
	}
	if ok, _ := c.Extension("STARTTLS"); ok {
		if err := c.StartTLS(&tls.Config{ServerName: host, RootCAs: e.Net.roots, MinVersion: tls.VersionTLS12}); err != nil {
			return fmt.Errorf("email: STARTTLS: %w", err)
		}
	}
	if e.Settings.Username != "" {
		if err := c.Auth(smtp.PlainAuth("", e.Settings.Username, e.Password.Reveal(), host)); err != nil {
			return fmt.Errorf("email: AUTH: %w", err)
		}
	}
	if err := c.Mail(e.Settings.From); err != nil {
		return fmt.Errorf("email: MAIL FROM: %w", err)
	}
	var to []string
	for _, r := range e.To {
		if r = strings.TrimSpace(r); r != "" {
			to = append(to, r)
			if err := c.Rcpt(r); err != nil {
				return fmt.Errorf("email: RCPT TO: %w", err)
			}
		}
	}
	if len(to) == 0 {
		return errors.New("email: no recipient")
	}
	w, err := c.Data()
	if err != nil {
		return fmt.Errorf("email: DATA: %w", err)
	}
	if _, err := w.Write(message(e.Settings.From, to, subject, body, id)); err != nil {
		return fmt.Errorf("email: DATA: %w", err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("email: the server refused the message: %w", err)
	}
	return c.Quit()
}

// message is the RFC 5322 message: headers (no value holds a line end:
// the addresses were checked when the rule was made, the subject is one
// line), then the body, quoted-printable.
func message(from string, to []string, subject, body, id string) []byte {
	var b bytes.Buffer
	oneLine := strings.NewReplacer("\r", " ", "\n", " ")
	fmt.Fprintf(&b, "From: %s\r\nTo: %s\r\nSubject: %s\r\nDate: %s\r\nMessage-ID: <%s@autoprov>\r\n",
		oneLine.Replace(from), oneLine.Replace(strings.Join(to, ", ")), mime.QEncoding.Encode("utf-8", oneLine.Replace(subject)),
		time.Now().UTC().Format(time.RFC1123Z), oneLine.Replace(id))
	b.WriteString("MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n")
	qp := quotedprintable.NewWriter(&b)
	_, _ = qp.Write([]byte(strings.ReplaceAll(body, "\n", "\r\n")))
	_ = qp.Close()
	b.WriteString("\r\n")
	return b.Bytes()
}
