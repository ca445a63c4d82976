package jobs

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/ssh"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
)

// jobHost is one host of an Ansible job.
type jobHost struct {
	name   string             // inventory name
	given  string             // the address or name the inventory gave
	ep     endpoint           // where to connect; ep.address canonical
	server *store.Server      // nil: not a registered server
	target string             // lock key: the deploy path's for the same host
	vars   map[string]any     // inventory vars but the connection ones
	keyRef string             // SSH key reference
	own    bool               // keyRef is the server's own key (else the request's)
	pinned string             // pinned host key, after the check
	reason string             // why the check failed ("": passed)
	kind   messages.ErrorKind // the kind of that failure
}

// connectionVars are the inline inventory variables that say where and as
// whom to connect: read into the host's endpoint, not passed on.
var connectionVars = []string{"ansible_host", "ansible_port", "ansible_user"}

// resolveHosts turns the request's inventory into hosts: where each is,
// whether it is a registered server, its lock key. Git, URL and dynamic
// inventories are resolved by Inventories (ansible-inventory --list).
func (aj *ansibleJob) resolveHosts(ctx context.Context) error {
	inv := aj.m.Inventory
	if inv.Type != messages.InventoryInline {
		return aj.resolveInventory(ctx)
	}
	if len(inv.Hosts) > aj.cfg.MaxHosts {
		return &messages.ValidationError{Fields: []messages.FieldError{{Field: "inventory.hosts",
			Message: fmt.Sprintf("must have at most %d hosts (this infra's INVENTORY_MAX_HOSTS)", aj.cfg.MaxHosts)}}}
	}
	var fields []messages.FieldError
	names := make([]string, 0, len(inv.Hosts))
	for name := range inv.Hosts {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		h, problem, err := aj.inlineHost(ctx, name, inv.Hosts[name])
		if err != nil {
			return err
		}
		if problem != "" {
			fields = append(fields, messages.FieldError{Field: "inventory.hosts[" + name + "]", Message: problem})
			continue
		}
		aj.hosts = append(aj.hosts, h)
	}
	if len(fields) > 0 {
		return &messages.ValidationError{Fields: fields}
	}
	aj.groups = map[string]ansible.JobGroup{}
	for name, g := range inv.Groups {
		aj.groups[name] = ansible.JobGroup{Hosts: g.Hosts, Children: g.Children, Vars: g.Vars}
	}
	return nil
}

// inlineHost reads the connection of inline host name from its variables.
// A problem with the request (for a field error) comes back as text;
// errors are infrastructure failures.
func (aj *ansibleJob) inlineHost(ctx context.Context, name string, vars messages.Vars) (*jobHost, string, error) {
	given, port, user, handle := name, 0, "", ""
	rest := map[string]any{}
	for k, v := range vars {
		if k == ServerVar {
			s, ok := v.(string)
			if !ok || !messages.ValidServerHandle(s) {
				return nil, ServerVar + " must be a server handle", nil
			}
			handle = s
			continue
		}
		if !slices.Contains(connectionVars, k) {
			rest[k] = v
			continue
		}
		switch k {
		case "ansible_host":
			s, ok := v.(string)
			if !ok || s == "" || strings.ContainsAny(s, "{}% \t") {
				return nil, "ansible_host must be an address or a host name", nil
			}
			given = s
		case "ansible_port":
			n, ok := v.(int64)
			if !ok || n < 1 || n > 65535 {
				return nil, "ansible_port must be an integer between 1 and 65535", nil
			}
			port = int(n)
		case "ansible_user":
			s, ok := v.(string)
			if !ok || !sshUserRE.MatchString(s) {
				return nil, "ansible_user must match " + sshUserRE.String(), nil
			}
			user = s
		}
	}
	if handle != "" {
		if given != name || port != 0 {
			return nil, ServerVar + " cannot be combined with ansible_host or ansible_port: the server is reached as registered", nil
		}
		return aj.locateServer(ctx, name, handle, rest)
	}
	return aj.locate(ctx, name, given, port, user, rest)
}

// ServerVar is the inline inventory variable naming a registered server by
// its handle (the deployer checks the same name at submit).
const ServerVar = "autoprov_server"

// notOwned is the problem of a host that is a registered server of other
// projects: refused before anything is resolved or dialed (issue 31).
const notOwned = "is a registered server this job's project does not own (an operator sets a server's projects)"

// locateServer finds inline host name, which names registered server
// handle (autoprov_server): unknown and other projects' servers are
// refused alike.
func (aj *ansibleJob) locateServer(ctx context.Context, name, handle string, vars map[string]any) (*jobHost, string, error) {
	srv, err := store.GetServer(ctx, aj.h.DB, handle)
	if errors.Is(err, store.ErrServerNotFound) {
		return nil, "names no registered server of the job's project", nil
	}
	if err != nil {
		return nil, "", err
	}
	if srv.OwnedByOthers(aj.m.ProjectID) {
		aj.log.Warn().Str("host", name).Str("server", srv.Handle).
			Msg("job host is another project's server: refused, nothing dialed")
		return nil, "names no registered server of the job's project", nil
	}
	h := &jobHost{name: name, given: srv.Address, vars: vars}
	if problem, err := aj.registered(ctx, h, srv); problem != "" || err != nil {
		return nil, problem, err
	}
	h.ep.alias = hostAlias(h.name, h.ep.address)
	return h, "", nil
}

// registered makes h registered server srv, reached as registered (its
// address, port, user, lock), with the SSH key the job may use there: the
// server's own key when the job's project owns the server and every server
// reached with that key (never infra's default key, which is never lent to
// a job), else the job's credentials.ssh; without either it is refused.
func (aj *ansibleJob) registered(ctx context.Context, h *jobHost, srv *store.Server) (string, error) {
	h.server = srv
	h.ep = endpoint{address: srv.Address, port: cmp.Or(srv.SSHPort, messages.DefaultSSHPort), user: cmp.Or(srv.SSHUser, aj.h.cfg.DeploySSHUser)}
	h.target = "server:" + srv.Handle
	ref, err := aj.lendableKey(ctx, srv)
	if err != nil {
		return "", err
	}
	switch {
	case ref != "":
		h.keyRef, h.own = ref, true
	case aj.m.Credentials.SSH != "":
		h.keyRef = aj.m.Credentials.SSH
	default:
		return "is a registered server without a key of the job's project: the job needs credentials.ssh to reach it (infra's own key is never lent to a job)", nil
	}
	return "", nil
}

// lendableKey returns the reference of srv's own SSH key when a job of
// its project may use it: the project owns srv, the key is not infra's
// default one, and every server that has the key is the project's too
// (the run's agent holds the key: a playbook could reach any server that
// accepts it). "" otherwise.
func (aj *ansibleJob) lendableKey(ctx context.Context, srv *store.Server) (string, error) {
	ref := srv.SSHKeyRef
	if ref == "" || ref == aj.h.cfg.DefaultSSHKeyRef || !srv.OwnedBy(aj.m.ProjectID) {
		return "", nil
	}
	if err := CheckServerKeyRef(ref, aj.h.cfg.OwnRefs); err != nil {
		return "", fail(messages.StatusFailed, messages.KindSecretUnavailable, "%v", err)
	}
	var shared bool
	err := aj.h.DB.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM servers
		WHERE ssh_key_ref = $1 AND NOT ($2 = ANY(projects)))`, ref, aj.m.ProjectID).Scan(&shared)
	if err != nil {
		return "", fmt.Errorf("servers sharing the key of %s: %w", srv.Handle, err)
	}
	if shared {
		aj.log.Warn().Str("server", srv.Handle).
			Msg("the server's SSH key also reaches servers of other projects: not lent to the job")
		return "", nil
	}
	return ref, nil
}

// locate finds where host name (at given, an address or a host name) is:
// a registered server at that address (and port, when given) is reached as
// registered, with its own key and lock; any other host at the canonical
// address, with the request's key (or the default) and the address's lock,
// as a deploy to it would be.
func (aj *ansibleJob) locate(ctx context.Context, name, given string, port int, user string, vars map[string]any) (*jobHost, string, error) {
	h := &jobHost{name: name, given: given, vars: vars}
	addr, problem := aj.address(ctx, given)
	if problem != "" {
		return nil, problem, nil
	}
	srv, err := findServer(ctx, aj.h.DB, addr, port)
	if err != nil {
		return nil, "", err
	}
	h.ep = endpoint{address: addr, port: cmp.Or(port, messages.DefaultSSHPort), user: cmp.Or(user, aj.h.cfg.DeploySSHUser)}
	if srv != nil {
		// A registered server belongs to projects: another's is refused
		// before anything is dialed (the deployer refused it at submit;
		// this holds for every producer and for names it could not
		// resolve). It is reached as it is registered.
		if srv.OwnedByOthers(aj.m.ProjectID) {
			aj.log.Warn().Str("host", name).Str("server", srv.Handle).
				Msg("job host is another project's server: refused, nothing dialed")
			return nil, notOwned, nil
		}
		if problem, err := aj.registered(ctx, h, srv); problem != "" || err != nil {
			return nil, problem, err
		}
	} else {
		// A job's playbook is the requester's code, and may use the
		// run's ssh-agent from the controller: the service's own key is
		// never lent to reach a host that is no registered server.
		if h.target, err = store.AddressTarget(addr, h.ep.port); err != nil {
			return nil, err.Error(), nil
		}
		if aj.m.Credentials.SSH == "" {
			return nil, "is not a registered server: the job needs credentials.ssh to reach it (infra's own key is never lent to a job)", nil
		}
		h.keyRef = aj.m.Credentials.SSH
	}
	h.ep.alias = hostAlias(h.name, h.ep.address)
	return h, "", nil
}

// sshUserRE is what a login user may look like (ansible.Host's rule).
var sshUserRE = pattern.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*$`, 32)

// address returns the canonical address of a host given by address or
// name: an IP literal as it is, a name resolved once here (the job then
// connects to that address: what was authorized is what is dialed).
func (aj *ansibleJob) address(ctx context.Context, given string) (string, string) {
	if addr, err := store.CanonicalAddress(given); err == nil {
		return addr, ""
	}
	if _, err := netip.ParseAddr(given); err == nil {
		return "", "is not a usable address"
	}
	if authz.EndsInNumber(given) {
		// ssh would read it as an IPv4 address in another form: refused
		// before any lookup, as the requester's error.
		return "", "is " + authz.NumericNameReason
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupNetIP(rctx, "ip", given)
	if err != nil || len(ips) == 0 {
		return "", "has no address (its name does not resolve)"
	}
	addr, err := store.CanonicalAddress(ips[0].String())
	if err != nil {
		return "", "resolves to an unusable address"
	}
	return addr, ""
}

// findServer returns the registered server at address and SSH port (port
// 0: the only one at the address), or nil.
func findServer(ctx context.Context, db store.Querier, address string, port int) (*store.Server, error) {
	rows, err := db.Query(ctx, `SELECT handle, ssh_port FROM servers WHERE address = $1 ORDER BY handle`, address)
	if err != nil {
		return nil, fmt.Errorf("find server at %s: %w", address, err)
	}
	type row struct {
		handle string
		port   int
	}
	found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.handle, &x.port)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("find server at %s: %w", address, err)
	}
	found = slices.DeleteFunc(found, func(x row) bool {
		return port != 0 && cmp.Or(x.port, messages.DefaultSSHPort) != port
	})
	if len(found) != 1 {
		return nil, nil // none, or several that no port told apart: not one server
	}
	return store.GetServer(ctx, db, found[0].handle)
}

// authorizeHosts refuses the job when any host is one no run may reach,
// before anything is dialed: the requester hears what a silent host would
// say (infra is no port scanner), the log says why.
func (aj *ansibleJob) authorizeHosts(ctx context.Context) error {
	var refused []*jobHost
	for _, h := range aj.hosts {
		if err := aj.h.Authz.Target(ctx, h.ep.address, h.server != nil); err != nil {
			aj.log.Warn().Str("host", h.name).Str("address", h.ep.address).Str("reason", err.Error()).
				Msg("job host refused: nothing resolved, nothing dialed")
			refused = append(refused, h)
		}
	}
	if len(refused) == 0 {
		return nil
	}
	aj.result.Hosts = map[string]messages.HostRecap{}
	for _, h := range refused {
		aj.result.Hosts[h.name] = messages.HostRecap{Unreachable: 1}
	}
	return fail(messages.StatusUnreachable, messages.KindSSHUnreachable, "%s", authz.UnreachableMessage(refused[0].ep.address, refused[0].ep.port))
}

// jobKeys are the SSH keys of a job's hosts.
type jobKeys struct {
	all   [][]byte                // every key, for the run's agent
	byRef map[string]*credentials // by reference
}

// sshKeys resolves the SSH key of every host: a registered server's own
// (lendableKey), the request's credentials.ssh for the others; never the
// service's default key.
func (aj *ansibleJob) sshKeys(ctx context.Context) (*jobKeys, error) {
	keys := &jobKeys{byRef: map[string]*credentials{}}
	for _, h := range aj.hosts {
		if h.keyRef == "" {
			return nil, fail(messages.StatusFailed, messages.KindSecretUnavailable, "host %s: %s", h.name, ErrNoSSHKey)
		}
		if h.own && h.keyRef == aj.h.cfg.DefaultSSHKeyRef {
			return nil, fail(messages.StatusRejected, messages.KindInvalidMessage,
				"host %s: infra's own SSH key is never lent to a job", h.name)
		}
		if _, ok := keys.byRef[h.keyRef]; ok {
			continue
		}
		resolver := aj.project // the request's credentials.ssh
		if h.own {
			resolver = aj.job.res // a server's key, or the default
		}
		v, err := aj.resolveWith(ctx, resolver, "ssh key of "+h.name, h.keyRef)
		if err != nil {
			return nil, err
		}
		signer, err := ParseSSHKey(h.keyRef, v)
		if err != nil {
			v.Wipe()
			return nil, fail(messages.StatusFailed, messages.KindSecretUnavailable, "%v", err)
		}
		key := bytes.Clone(v.Bytes())
		v.Wipe()
		keys.byRef[h.keyRef] = &credentials{signers: []ssh.Signer{signer}, keys: [][]byte{key},
			publicKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey()))),
			clients:   ssh.FingerprintSHA256(signer.PublicKey())}
		keys.all = append(keys.all, key)
	}
	return keys, nil
}

// checkHosts checks every host's SSH (a few at a time), pinning host keys on
// first use. A host that fails keeps its reason and is run as unreachable;
// only infrastructure errors (Postgres) and cancellation end the job here.
func (aj *ansibleJob) checkHosts(ctx context.Context, keys *jobKeys) error {
	// The checks run side by side, each on a copy of the job: the step is
	// their wall time, counted here.
	defer aj.steps.add(stepSSHCheck, time.Now())
	sem := make(chan struct{}, aj.cfg.SSHChecks)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	start := aj.h.Now()
	for _, h := range aj.hosts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			// The deploy path's check, as a job of this one host: its
			// pinned key, its pinning, its words.
			hj := *aj.job
			hj.server = h.server
			hj.log = aj.log.With().Str("host", h.name).Logger()
			pinned, err := hj.checkSSH(ctx, h.ep, keys.byRef[h.keyRef])
			if o, ok := asOutcome(err); ok {
				h.reason, h.kind = o.message, o.kind
				aj.log.Warn().Str("host", h.name).Str("error_kind", string(o.kind)).Str("reason", o.message).
					Msg("job host failed its SSH check: it runs as unreachable")
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("host %s: %w", h.name, err))
				return
			}
			h.pinned = pinned
		}()
	}
	wg.Wait()
	aj.sshCheck = aj.h.Now().Sub(start)
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return errors.Join(errs...)
}

// allBlocked reports whether no host passed its check.
func (aj *ansibleJob) allBlocked() bool {
	return !slices.ContainsFunc(aj.hosts, func(h *jobHost) bool { return h.reason == "" })
}

// blockedOutcome is the outcome of a job none of whose hosts passed its
// check, run as unreachable by none: the hosts' own kind when they share
// one that is no unreachability (every host rejected the key: ssh_auth_failed;
// a changed host key: host_key_mismatch), else hosts_unreachable; its
// message names the first hosts' reasons.
func (aj *ansibleJob) blockedOutcome() *outcome {
	recap := map[string]ansible.Recap{}
	kind := aj.hosts[0].kind
	var reasons []string
	for _, h := range aj.hosts {
		recap[h.name] = ansible.Recap{Unreachable: 1}
		if h.kind != kind {
			kind = ""
		}
		if len(reasons) < 3 {
			reasons = append(reasons, h.name+": "+h.reason)
		}
	}
	if len(aj.hosts) > len(reasons) {
		reasons = append(reasons, fmt.Sprintf("and %d more", len(aj.hosts)-len(reasons)))
	}
	o := &outcome{status: messages.StatusUnreachable, kind: messages.KindHostsUnreachable,
		message: fmt.Sprintf("none of the %d hosts answered SSH (%s)", len(aj.hosts), strings.Join(reasons, "; ")),
		play:    &playReport{playbook: aj.names[0], res: &ansible.Result{Outcome: ansible.OutcomeUnreachable, Hosts: recap}}}
	switch kind {
	case messages.KindSSHAuthFailed, messages.KindHostKeyMismatch:
		o.status, o.kind = messages.StatusFailed, kind
		o.message = fmt.Sprintf("none of the %d hosts let the job in (%s)", len(aj.hosts), strings.Join(reasons, "; "))
	}
	return o
}

// jobHosts is the runner's view of the hosts.
func (aj *ansibleJob) jobHosts() []ansible.JobHost {
	out := make([]ansible.JobHost, 0, len(aj.hosts))
	for _, h := range aj.hosts {
		handle := ""
		if h.server != nil {
			handle = h.server.Handle
		}
		out = append(out, ansible.JobHost{
			Host:    ansible.Host{Alias: h.name, Address: h.ep.address, Port: h.ep.port, User: h.ep.user, KnownHostsKey: h.pinned},
			Vars:    h.vars,
			Blocked: h.reason != "",
			// The deploy path's name of the host: one marker scope for
			// its runs and the jobs', so that each takes over the other's.
			ScopeAlias: hostAlias(handle, h.ep.address),
		})
	}
	return out
}
