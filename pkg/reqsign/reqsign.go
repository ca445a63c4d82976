// Package reqsign gives a producer of requests (the scheduler, the deployer,
// the autoprov CLI) its signing key: the settings REQUEST_SIGNING_KEY_ID and
// REQUEST_SIGNING_KEY (or REQUEST_SIGNING_KEY_FILE), and the signing function
// stream.ProducerOptions.Sign takes. infra checks these signatures against
// its REQUEST_KEYS (services/infra/internal/signing); with
// REQUEST_SIGNATURES=require it refuses unsigned requests.
package reqsign

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
)

// Config is a producer's signing key (caarlos0/env tags; desc is the
// --help line). The zero value signs nothing.
type Config struct {
	KeyID   string        `env:"REQUEST_SIGNING_KEY_ID" desc:"id of this producer's request signing key, as infra's REQUEST_KEYS names it (empty: requests are not signed)"`
	Key     secrets.Value `env:"REQUEST_SIGNING_KEY,unset" secret:"true" desc:"this producer's request signing key, at least 32 bytes (removed from the environment once read)"`
	KeyFile string        `env:"REQUEST_SIGNING_KEY_FILE" desc:"file holding the request signing key, read at start instead of REQUEST_SIGNING_KEY"`
}

// Enabled reports whether a key id is set.
func (c *Config) Enabled() bool { return c.KeyID != "" }

// Validate checks the settings without reading the key file.
func (c *Config) Validate() error {
	var errs []error
	hasKey := !c.Key.IsZero() || c.KeyFile != ""
	switch {
	case c.KeyID == "" && hasKey:
		errs = append(errs, service.Invalid("REQUEST_SIGNING_KEY_ID", "must be set when a signing key is"))
	case c.KeyID != "" && !messages.ValidKeyID(c.KeyID):
		errs = append(errs, service.Invalid("REQUEST_SIGNING_KEY_ID", "want %s", messages.KeyIDPattern))
	case c.KeyID != "" && !hasKey:
		errs = append(errs, service.Invalid("REQUEST_SIGNING_KEY", "set it or REQUEST_SIGNING_KEY_FILE (REQUEST_SIGNING_KEY_ID is set)"))
	}
	if !c.Key.IsZero() && c.KeyFile != "" {
		errs = append(errs, service.Invalid("REQUEST_SIGNING_KEY", "set only one of REQUEST_SIGNING_KEY and REQUEST_SIGNING_KEY_FILE"))
	}
	if !c.Key.IsZero() && c.Key.Len() < messages.MinSigningKeyLen {
		errs = append(errs, service.Invalid("REQUEST_SIGNING_KEY", "must be at least %d bytes", messages.MinSigningKeyLen))
	}
	return errors.Join(errs...)
}

// Signer returns the function that signs an entry's data for its stream
// (stream.ProducerOptions.Sign), or nil when no key is configured. It reads
// REQUEST_SIGNING_KEY_FILE when that is set.
func (c *Config) Signer() (func(stream string, data []byte) (string, error), error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if !c.Enabled() {
		return nil, nil
	}
	key := c.Key.Bytes()
	if c.KeyFile != "" {
		b, err := os.ReadFile(c.KeyFile)
		if err != nil {
			return nil, service.Invalid("REQUEST_SIGNING_KEY_FILE", "%v", err)
		}
		key = []byte(strings.TrimSpace(string(b)))
		if len(key) < messages.MinSigningKeyLen {
			return nil, service.Invalid("REQUEST_SIGNING_KEY_FILE", "the key must be at least %d bytes", messages.MinSigningKeyLen)
		}
	}
	id := c.KeyID
	// A private copy: the caller may wipe its Value.
	key = append([]byte(nil), key...)
	return func(stream string, data []byte) (string, error) {
		sig, err := messages.Sign(id, key, stream, data)
		if err != nil {
			return "", fmt.Errorf("request signing key %s: %w", id, err)
		}
		return sig, nil
	}, nil
}
