package reqsign_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/reqsign"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
)

const key = "scheduler-key-0123456789abcdef0123456789abcdef"

func load(t *testing.T, env map[string]string) (reqsign.Config, error) {
	t.Helper()
	var c struct{ Signing reqsign.Config }
	err := service.Load(func(k string) string { return env[k] }, &c)
	return c.Signing, err
}

func TestValidate(t *testing.T) {
	file := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(file, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		wantVar string // "" means valid
		enabled bool
	}{
		{name: "nothing set signs nothing", env: nil},
		{name: "id and key", env: map[string]string{"REQUEST_SIGNING_KEY_ID": "scheduler-1", "REQUEST_SIGNING_KEY": key}, enabled: true},
		{name: "id and key file", env: map[string]string{"REQUEST_SIGNING_KEY_ID": "scheduler-1", "REQUEST_SIGNING_KEY_FILE": file}, enabled: true},
		{name: "key without id", env: map[string]string{"REQUEST_SIGNING_KEY": key}, wantVar: "REQUEST_SIGNING_KEY_ID"},
		{name: "id without key", env: map[string]string{"REQUEST_SIGNING_KEY_ID": "scheduler-1"}, wantVar: "REQUEST_SIGNING_KEY"},
		{name: "bad id", env: map[string]string{"REQUEST_SIGNING_KEY_ID": "Scheduler 1", "REQUEST_SIGNING_KEY": key}, wantVar: "REQUEST_SIGNING_KEY_ID"},
		{name: "short key", env: map[string]string{"REQUEST_SIGNING_KEY_ID": "scheduler-1", "REQUEST_SIGNING_KEY": "short"}, wantVar: "REQUEST_SIGNING_KEY"},
		{name: "key and file", env: map[string]string{"REQUEST_SIGNING_KEY_ID": "scheduler-1", "REQUEST_SIGNING_KEY": key, "REQUEST_SIGNING_KEY_FILE": file}, wantVar: "REQUEST_SIGNING_KEY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, tc.env)
			if err == nil {
				err = c.Validate()
			}
			if tc.wantVar == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				if c.Enabled() != tc.enabled {
					t.Fatalf("Enabled() = %v, want %v", c.Enabled(), tc.enabled)
				}
				return
			}
			var fe *service.FieldError
			if !errors.As(err, &fe) || fe.Var != tc.wantVar {
				t.Fatalf("want an error naming %s, got %v", tc.wantVar, err)
			}
			if strings.Contains(err.Error(), key) {
				t.Fatalf("the error shows the key: %v", err)
			}
		})
	}
}

// TestSignerVerifies: what the signer produces is what infra's verifier
// accepts for the stream it was made for, and only for it.
func TestSignerVerifies(t *testing.T) {
	file := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(file, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := messages.NewVerifier(messages.VerifierKey{ID: "scheduler-1", Key: []byte(key), Streams: []string{messages.StreamProvisionerQueue}})
	if err != nil {
		t.Fatal(err)
	}
	for _, env := range []map[string]string{
		{"REQUEST_SIGNING_KEY_ID": "scheduler-1", "REQUEST_SIGNING_KEY": key},
		{"REQUEST_SIGNING_KEY_ID": "scheduler-1", "REQUEST_SIGNING_KEY_FILE": file},
	} {
		c, err := load(t, env)
		if err != nil {
			t.Fatal(err)
		}
		sign, err := c.Signer()
		if err != nil || sign == nil {
			t.Fatalf("Signer() = nil? %v, %v", sign == nil, err)
		}
		data := []byte("a request")
		sig, err := sign(messages.StreamProvisionerQueue, data)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(sig, key) {
			t.Fatal("the signature holds the key")
		}
		if id, err := v.Verify(messages.StreamProvisionerQueue, data, sig); err != nil || id != "scheduler-1" {
			t.Fatalf("Verify = %q, %v", id, err)
		}
		if _, err := v.Verify(messages.StreamAnsibleDeployQueue, data, sig); err == nil {
			t.Fatal("a signature for one queue verified on another")
		}
		if _, err := v.Verify(messages.StreamProvisionerQueue, []byte("another request"), sig); err == nil {
			t.Fatal("the signature verified other data")
		}
	}
}

func TestSignerOff(t *testing.T) {
	c, err := load(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	sign, err := c.Signer()
	if err != nil || sign != nil {
		t.Fatalf("Signer() with no key = nil? %v, %v; want nil, nil", sign == nil, err)
	}
}

func TestSignerShortKeyFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(file, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := load(t, map[string]string{"REQUEST_SIGNING_KEY_ID": "scheduler-1", "REQUEST_SIGNING_KEY_FILE": file})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Signer(); err == nil {
		t.Fatal("a key file holding a short key was accepted")
	}
}
