package service

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
)

// SecretRef is a secret reference to check with --check-secrets, and where
// it comes from.
type SecretRef struct {
	// Source names what holds the reference: a variable ("SSH_KEY_REF"),
	// or, for references handed in with --secret-refs, whatever the caller
	// wrote there (autoprov: the inventory file, line and hosts).
	Source string `json:"source"`
	// Ref is the reference; for --secret-refs "" means "none: the
	// service's default applies" (infra: a host without ssh_key_ref).
	Ref string `json:"ref"`
}

// SecretResult is the outcome of one reference: --check-secrets writes one
// JSON line of it per reference on stdout. It never holds a value.
type SecretResult struct {
	Source string `json:"source"`
	Ref    string `json:"ref"`
	OK     bool   `json:"ok"`
	// Kind is the kind of failure (see SecretKind); empty when OK.
	Kind string `json:"kind,omitempty"`
	// Error says what went wrong, in words that hold no value.
	Error string `json:"error,omitempty"`
}

// Kinds of a secret check's failure beyond pkg/secrets' own.
var (
	// ErrSecretRefused: the service refuses to use the reference there,
	// whatever the backend would answer (e.g. infra refuses a server key
	// naming its request signing key). Nothing was resolved.
	ErrSecretRefused = errors.New("secret reference refused")
	// ErrSecretUnusable: the secret resolved but the service could not use
	// it (not an SSH private key, a signing key too short).
	ErrSecretUnusable = errors.New("secret not usable")
)

// SecretKind names the kind of a secret check's failure: refused,
// unusable, bad_ref, not_found, permission, unavailable, disabled,
// too_large, or error for anything else.
func SecretKind(err error) string {
	for _, k := range []struct {
		err  error
		name string
	}{
		{ErrSecretRefused, "refused"}, {ErrSecretUnusable, "unusable"},
		{secrets.ErrBadRef, "bad_ref"}, {secrets.ErrNotFound, "not_found"},
		{secrets.ErrPermission, "permission"}, {secrets.ErrUnavailable, "unavailable"},
		{secrets.ErrDisabled, "disabled"}, {secrets.ErrTooLarge, "too_large"},
	} {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	return "error"
}

// SecretChecker is what a service gives --check-secrets (Program.Secrets):
// the references its configuration names and how it checks one, with the
// backends and the rules it uses at run time.
type SecretChecker struct {
	// Refs are the references the configuration names.
	Refs []SecretRef
	// Check resolves r as the service would at run time, checks that the
	// service could use the value, and wipes it. Its error is a
	// *secrets.Error or wraps ErrSecretRefused or ErrSecretUnusable, and
	// never holds the value.
	Check func(ctx context.Context, r SecretRef) error
	// Extra checks a reference handed in with --secret-refs; nil: the
	// service takes none (each fails).
	Extra func(ctx context.Context, r SecretRef) error
	// Err, when set, is why the backends could not be opened (Vault down,
	// its login refused): every reference fails with it, and without any
	// reference one result with the source "secret backends" does (the
	// service would not start).
	Err error
	// Close releases the backends; may be nil.
	Close func()
}

// SecretsError is Run's error when some references did not pass
// --check-secrets; ExitCode maps it to 1.
type SecretsError struct {
	Failed, Total int
}

func (e *SecretsError) Error() string {
	return fmt.Sprintf("%d of %d secret references did not resolve", e.Failed, e.Total)
}

// checkSecrets runs --check-secrets: it checks every reference the
// service's checker lists, then those of refsFile (JSON lines of
// SecretRef), and writes one SecretResult per reference on w.
func checkSecrets(ctx context.Context, name string, checker SecretChecker, refsFile string, w io.Writer) error {
	if checker.Close != nil {
		defer checker.Close()
	}
	extra, err := readSecretRefs(refsFile)
	if err != nil {
		return &UsageError{Err: err}
	}
	enc := json.NewEncoder(w)
	failed, total := 0, 0
	run := func(r SecretRef, check func(context.Context, SecretRef) error) error {
		total++
		var err error
		switch {
		case checker.Err != nil:
			err = checker.Err
		case check == nil:
			err = fmt.Errorf("%w: %s resolves no references of this kind", ErrSecretRefused, name)
		default:
			err = check(ctx, r)
		}
		res := SecretResult{Source: r.Source, Ref: r.Ref, OK: err == nil}
		if err != nil {
			failed++
			res.Kind, res.Error = SecretKind(err), err.Error()
		}
		return enc.Encode(res)
	}
	for _, r := range checker.Refs {
		if err := run(r, checker.Check); err != nil {
			return err
		}
	}
	for _, r := range extra {
		if err := run(r, checker.Extra); err != nil {
			return err
		}
	}
	if total == 0 && checker.Err != nil {
		// No reference to blame, but the service would not start.
		if err := run(SecretRef{Source: "secret backends"}, nil); err != nil {
			return err
		}
	}
	if failed > 0 {
		return &SecretsError{Failed: failed, Total: total}
	}
	return nil
}

// readSecretRefs reads the --secret-refs file ("" for none).
func readSecretRefs(path string) ([]SecretRef, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--secret-refs: %w", err)
	}
	defer f.Close()
	var out []SecretRef
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var r SecretRef
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, fmt.Errorf("--secret-refs %s:%d: not a JSON object with source and ref", path, n)
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--secret-refs %s: %w", path, err)
	}
	return out, nil
}
