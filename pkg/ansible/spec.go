package ansible

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern"
)

// Host is the one server a run targets.
type Host struct {
	// Alias is the inventory name (the server handle, also the fact cache
	// file name): [A-Za-z0-9][A-Za-z0-9._-]{0,62}.
	Alias string
	// Address is the IP address or DNS name ssh connects to.
	Address string
	// Port is the SSH port; 0 means 22.
	Port int
	// User is the login user (ansible_user).
	User string
	// KnownHostsKey is the pinned host key in authorized_keys format
	// ("ssh-ed25519 AAAA..."); ssh accepts no other key and only the
	// signature algorithms of its type.
	KnownHostsKey string
}

// Spec describes one ansible-playbook run.
type Spec struct {
	// JobID names the job in logs and in the run directory's marker file.
	JobID string
	// Playbook is a file name under <AnsibleDir>/playbooks (no path
	// separators), e.g. "setup_server.yml".
	Playbook string
	// Host is the target.
	Host Host
	// Vars are NON-secret extra vars (strings, numbers, bools, slices and
	// string-keyed maps of these). They are written to vars.yml with every
	// string tagged !unsafe, so message data is never templated.
	Vars map[string]any
	// SecretEnv holds secrets, passed only as environment variables of the
	// child (playbooks read them with lookup('env', NAME)). Names match
	// [A-Z_][A-Z0-9_]* and may not be one of the variables the runner sets,
	// start with ANSIBLE_, LD_, PYTHON, SSH_, LC_ or MALLOC_, nor be one
	// that changes the shell or the C library (BASH_ENV, IFS, ...).
	// AUTOPROV_ names are allowed, except the ones the runner sets itself.
	SecretEnv map[string]string
	// SSHKeys are private keys (PEM or OpenSSH format) served to ssh by an
	// in-process agent; they are never written to disk.
	SSHKeys [][]byte
	// Redact masks secrets in text (e.g. secrets.Redactor.RedactString). It
	// is applied to everything that leaves the package: events, the output
	// tail, errors and logs. Nil means no masking.
	Redact func(string) string
	// Timeout is the wall-clock limit of this run; 0 means Config.Timeout.
	Timeout time.Duration
	// TimeoutCap, when positive, lowers the wall-clock limit to it (a
	// request's own timeout_seconds); it never raises the limit.
	TimeoutCap time.Duration
	// IdleTimeout is the longest time without output (stdout, stderr or
	// events); 0 means Config.IdleTimeout.
	IdleTimeout time.Duration
	// OnEvent, when set, gets every callback event (already redacted), in
	// order, from one goroutine. Run returns only after the last call; a
	// slow OnEvent delays nothing but its own deliveries (events are queued).
	OnEvent func(Event)
	// OnStart, when set, is called once with the pid of ansible-playbook
	// right after it was started.
	OnStart func(pid int)
	// OnOutput, when set, gets every line of ansible-playbook's stdout and
	// stderr (redacted, without the newline, cut at 64 KiB), in order, from
	// the goroutine that drains the pipe: it must return quickly and not
	// panic. The Result's OutputTail keeps only the end.
	OnOutput func(line string)

	// argv and env are set by RunJob only: the command line in place of
	// the playbook run's, and variables added to the child's environment.
	argv []string
	env  []string
}

var (
	aliasRe    = pattern.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`, 63)
	hostnameRe = pattern.MustCompileParts(`^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*\.?$`, ".", 63)
	userRe     = pattern.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*$`, 32)
	playbookRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\.ya?ml$`)
	envNameRe  = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)
)

// reservedEnvPrefixes may not start a SecretEnv name, and reservedEnvNames
// may not be one: they would change how Ansible, Python, ssh, the shell,
// the C library or the dynamic linker behave.
var (
	reservedEnvPrefixes = []string{"ANSIBLE_", "LD_", "PYTHON", "SSH_", "LC_", "MALLOC_"}
	reservedEnvNames    = map[string]struct{}{
		"BASH_ENV": {}, "ENV": {}, "IFS": {}, "CDPATH": {}, "SHELLOPTS": {}, "GCONV_PATH": {},
		"GLIBC_TUNABLES": {}, "HOSTALIASES": {}, "LOCALDOMAIN": {}, "LOCPATH": {}, "NLSPATH": {},
		"RES_OPTIONS": {}, "TZDIR": {}, "LANGUAGE": {},
	}
)

// hostKeyAlgorithms maps a host key type to the signature algorithms ssh may
// accept for it (HostKeyAlgorithms). SHA-1 "ssh-rsa" signatures stay off.
var hostKeyAlgorithms = map[string]string{
	ssh.KeyAlgoED25519:  ssh.KeyAlgoED25519,
	ssh.KeyAlgoECDSA256: ssh.KeyAlgoECDSA256,
	ssh.KeyAlgoECDSA384: ssh.KeyAlgoECDSA384,
	ssh.KeyAlgoECDSA521: ssh.KeyAlgoECDSA521,
	ssh.KeyAlgoRSA:      ssh.KeyAlgoRSASHA512 + "," + ssh.KeyAlgoRSASHA256,
}

// pinnedKey is a validated Host.KnownHostsKey.
type pinnedKey struct {
	line       string // "type base64", normalised (no options, no comment)
	algorithms string // for HostKeyAlgorithms
}

// validateHost checks h and returns its pinned key.
func validateHost(h *Host) (pinnedKey, error) {
	if !aliasRe.MatchString(h.Alias) {
		return pinnedKey{}, fmt.Errorf("host alias %q: want [A-Za-z0-9][A-Za-z0-9._-]{0,62}", h.Alias)
	}
	if net.ParseIP(h.Address) == nil && (len(h.Address) > 253 || !hostnameRe.MatchString(h.Address)) {
		return pinnedKey{}, fmt.Errorf("host %s: address %q is neither an IP address nor a host name", h.Alias, h.Address)
	}
	if h.Port == 0 {
		h.Port = 22
	}
	if h.Port < 1 || h.Port > 65535 {
		return pinnedKey{}, fmt.Errorf("host %s: port %d out of range", h.Alias, h.Port)
	}
	if !userRe.MatchString(h.User) {
		return pinnedKey{}, fmt.Errorf("host %s: user %q: want [A-Za-z_][A-Za-z0-9_.-]{0,31}", h.Alias, h.User)
	}
	if strings.ContainsAny(h.KnownHostsKey, "\r\n") {
		return pinnedKey{}, fmt.Errorf("host %s: pinned host key holds a line break", h.Alias)
	}
	key, _, options, rest, err := ssh.ParseAuthorizedKey([]byte(h.KnownHostsKey))
	if err != nil {
		return pinnedKey{}, fmt.Errorf("host %s: pinned host key: %w", h.Alias, err)
	}
	if len(options) > 0 || len(strings.TrimSpace(string(rest))) > 0 {
		return pinnedKey{}, fmt.Errorf("host %s: pinned host key must be one bare key (no options)", h.Alias)
	}
	algos, ok := hostKeyAlgorithms[key.Type()]
	if !ok {
		return pinnedKey{}, fmt.Errorf("host %s: pinned host key type %s not supported", h.Alias, key.Type())
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key)))
	return pinnedKey{line: line, algorithms: algos}, nil
}

// knownHostsLine is the known_hosts entry pinning key for h: OpenSSH looks
// up "[address]:port" for ports other than 22, the bare address for 22.
func knownHostsLine(h Host, key pinnedKey) string {
	name := h.Address
	if h.Port != 22 {
		name = "[" + h.Address + "]:" + strconv.Itoa(h.Port)
	}
	return name + " " + key.line + "\n"
}

// validateSpec checks spec and fills its defaults; it returns the pinned key.
// maxEnvString is the longest NAME=value string exec accepts (Linux's
// MAX_ARG_STRLEN, 32 pages, less the terminating NUL): a longer secret
// would fail every attempt with "argument list too long".
const maxEnvString = 32*4096 - 1

func (r *Runner) validateSpec(spec *Spec) (pinnedKey, error) {
	if spec.JobID == "" {
		return pinnedKey{}, errors.New("spec: empty job id")
	}
	if !playbookRe.MatchString(spec.Playbook) {
		return pinnedKey{}, fmt.Errorf("spec: playbook %q: want a file name under playbooks/ ending in .yml", spec.Playbook)
	}
	st, err := os.Stat(filepath.Join(r.cfg.AnsibleDir, "playbooks", spec.Playbook))
	if err != nil {
		return pinnedKey{}, fmt.Errorf("spec: playbook %s: %w", spec.Playbook, err)
	}
	if !st.Mode().IsRegular() {
		return pinnedKey{}, fmt.Errorf("spec: playbook %s is not a regular file", spec.Playbook)
	}
	key, err := validateHost(&spec.Host)
	if err != nil {
		return pinnedKey{}, fmt.Errorf("spec: %w", err)
	}
	if err := r.validateShared(spec); err != nil {
		return pinnedKey{}, err
	}
	return key, nil
}

func validateEnvName(name string) error {
	if !envNameRe.MatchString(name) {
		return fmt.Errorf("name %q: want [A-Z_][A-Z0-9_]*", name)
	}
	if _, ok := fixedEnvNames[name]; ok {
		return fmt.Errorf("name %s is set by the runner", name)
	}
	if _, ok := reservedEnvNames[name]; ok {
		return fmt.Errorf("name %s is reserved", name)
	}
	for _, p := range reservedEnvPrefixes {
		if strings.HasPrefix(name, p) {
			return fmt.Errorf("name %s: prefix %s is reserved", name, p)
		}
	}
	return nil
}
