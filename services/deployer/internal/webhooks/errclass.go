package webhooks

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
)

// Error classes: what a failed attempt's error and a delivery's last error
// show to API readers. The detailed error (with the address a name
// resolved to, the receiver's TLS names, ...) goes to the logs only.
const (
	// ClassRefused: the address is not allowed (private, loopback,
	// link-local, ...; see WEBHOOK_ALLOW_CIDRS); nothing was sent.
	ClassRefused = "refused"
	// ClassDNS: the host name did not resolve.
	ClassDNS = "dns"
	// ClassConnect: the connection failed (refused, reset, unreachable).
	ClassConnect = "connect"
	// ClassTimeout: the attempt ran out of time (WEBHOOK_TIMEOUT).
	ClassTimeout = "timeout"
	// ClassTLS: the TLS handshake or the receiver's certificate failed.
	ClassTLS = "tls"
	// ClassProtocol: the receiver's answer was not HTTP that could be read.
	ClassProtocol = "protocol"
	// ClassHTTP3xx, ClassHTTP4xx, ClassHTTP5xx: the receiver answered a
	// status outside 2xx (redirects are not followed); ClassGone: it
	// answered 410 Gone, which is not retried.
	ClassHTTP3xx = "http_3xx"
	ClassHTTP4xx = "http_4xx"
	ClassHTTP5xx = "http_5xx"
	ClassGone    = "gone"
	// ClassOther: any other failure.
	ClassOther = "error"
)

// Classes lists every error class, as the OpenAPI document's enum does.
var Classes = []string{ClassRefused, ClassDNS, ClassConnect, ClassTimeout, ClassTLS, ClassProtocol,
	ClassHTTP3xx, ClassHTTP4xx, ClassHTTP5xx, ClassGone, ClassOther}

// ErrorClass returns the class of a failed attempt: of err when it is set
// (the request got no answer), else of the status code the receiver
// answered.
func ErrorClass(err error, code int) string {
	if err == nil {
		switch {
		case code == 410:
			return ClassGone
		case code >= 300 && code < 400:
			return ClassHTTP3xx
		case code >= 400 && code < 500:
			return ClassHTTP4xx
		case code >= 500 && code < 600:
			return ClassHTTP5xx
		}
		return ClassOther
	}
	var refused *RefusedError
	var dnsErr *net.DNSError
	var netErr net.Error
	var opErr *net.OpError
	switch {
	case errors.As(err, &refused):
		return ClassRefused
	case errors.As(err, &dnsErr):
		return ClassDNS
	case isTLS(err):
		return ClassTLS
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return ClassTimeout
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH), errors.As(err, &opErr) && opErr.Op == "dial":
		return ClassConnect
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), strings.Contains(err.Error(), "malformed HTTP"):
		return ClassProtocol
	}
	return ClassOther
}

// isTLS reports whether err comes from the TLS handshake or the
// verification of the receiver's certificate.
func isTLS(err error) bool {
	var verify *tls.CertificateVerificationError
	var alert tls.AlertError
	var record tls.RecordHeaderError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	return errors.As(err, &verify) || errors.As(err, &alert) || errors.As(err, &record) ||
		errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid) ||
		strings.HasPrefix(err.Error(), "tls: ")
}

// PublicError returns what API readers see of a stored error: the error
// itself when it is a class, else ClassOther (a detailed error stored
// before errors were recorded as classes).
func PublicError(stored string) string {
	if stored == "" || slices.Contains(Classes, stored) {
		return stored
	}
	return ClassOther
}
