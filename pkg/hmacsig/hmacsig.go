// Package hmacsig signs the bodies the system posts to receivers outside
// it (the deployer's webhooks, the scheduler's webhook notifications) and
// checks them as a receiver does. Each request carries
//
//	Autoprov-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>
//
// where the HMAC is computed with the receiver's secret over the bytes
// "<t>.<body>". Receivers recompute it, compare in constant time, and
// refuse timestamps too far from their clock (replays). docs/webhooks.md
// shows how, in Python and Go.
package hmacsig

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Headers of a signed request.
const (
	HeaderSignature = "Autoprov-Signature"
	HeaderID        = "Autoprov-Webhook-Id"
	HeaderAttempt   = "Autoprov-Webhook-Attempt"
	HeaderEvent     = "Autoprov-Event"
)

// Sign returns the Autoprov-Signature header value of body sent at t.
func Sign(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + mac(secret, ts, body)
}

func mac(secret, ts string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts))
	m.Write([]byte("."))
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// Errors of Verify.
var (
	ErrBadSignatureHeader = errors.New("malformed signature header")
	ErrSignatureMismatch  = errors.New("signature does not match")
	ErrTimestampSkew      = errors.New("signature timestamp outside the tolerance")
)

// Verify checks a signature header against body, as a receiver does: the
// timestamp must be within tolerance of now and one of the v1 signatures
// must match.
func Verify(secret, header string, body []byte, tolerance time.Duration, now time.Time) error {
	var ts string
	var sigs []string
	for part := range strings.SplitSeq(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return ErrBadSignatureHeader
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			sigs = append(sigs, v)
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return ErrBadSignatureHeader
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w (%s)", ErrTimestampSkew, d.Round(time.Second))
	}
	want := mac(secret, ts, body)
	for _, s := range sigs {
		if hmac.Equal([]byte(s), []byte(want)) {
			return nil
		}
	}
	return ErrSignatureMismatch
}
