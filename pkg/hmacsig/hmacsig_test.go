package hmacsig_test

import (
	"errors"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/hmacsig"
)

// TestVerify: a signature verifies with its secret and body within the
// tolerance; a changed body, another secret, a late replay and a
// malformed header do not, each with its error.
func TestVerify(t *testing.T) {
	secret, body, at := "whsec_test", []byte(`{"event":"job.finished"}`), time.Unix(1_800_000_000, 0)
	h := hmacsig.Sign(secret, at, body)
	if err := hmacsig.Verify(secret, h, body, 5*time.Minute, at.Add(time.Minute)); err != nil {
		t.Fatalf("valid signature: %v", err)
	}
	for name, tc := range map[string]struct {
		err  error
		want error
	}{
		"tampered body": {hmacsig.Verify(secret, h, []byte(`{"event":"x"}`), 5*time.Minute, at), hmacsig.ErrSignatureMismatch},
		"other secret":  {hmacsig.Verify(secret+"x", h, body, 5*time.Minute, at), hmacsig.ErrSignatureMismatch},
		"replayed late": {hmacsig.Verify(secret, h, body, 5*time.Minute, at.Add(time.Hour)), hmacsig.ErrTimestampSkew},
		"garbage":       {hmacsig.Verify(secret, "v1=abc", body, 5*time.Minute, at), hmacsig.ErrBadSignatureHeader},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", name, tc.err, tc.want)
		}
	}
}
