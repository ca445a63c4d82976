package app

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/service"
)

// checkPlayUserReads checks that PLAYBOOK_USER can read PLAYBOOK_DIR and its
// playbooks/: every directory on the way must be searchable by that user
// (owner, group or other bits, by its uid, primary and supplementary
// groups; ACLs are not consulted), the two directories readable too.
// Without it every play fails with Ansible's "the playbook ... could not
// be found", as a clone under a private home (/root is 0700) makes it.
func (p PlaybookConfig) checkPlayUserReads() error {
	if p.User == "" {
		return nil
	}
	u, err := user.Lookup(p.User)
	if err != nil {
		return nil // RunAs reports it
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	var gids []uint64
	ids, _ := u.GroupIds()
	for _, s := range append(ids, u.Gid) {
		if g, err := strconv.ParseUint(s, 10, 32); err == nil {
			gids = append(gids, g)
		}
	}
	return p.checkReads(p.User+" (PLAYBOOK_USER", uid, gids)
}

// checkJobUsersRead is checkPlayUserReads for the sandbox's job users
// (PLAYBOOK_SANDBOX_UIDS), which belong to no group: their sandboxes
// show PLAYBOOK_DIR (ansible.cfg and its plugins) from its own path.
// Infra logs its failure as an error when it serves jobs (the fleet's own
// runs do not need it).
func (p PlaybookConfig) checkJobUsersRead(sb *ansible.Sandbox) error {
	if sb == nil || sb.UIDs.Count == 0 {
		return nil
	}
	return p.checkReads("of Ansible jobs (PLAYBOOK_SANDBOX_UIDS", uint64(sb.UIDs.First), nil)
}

// checkJobUsersReach checks that the sandbox's job users can traverse to
// dir (a job's directory is under JOB_WORK_DIR, its run directory under
// PLAYBOOK_RUN_ROOT): bubblewrap, as the job's user, binds them by path.
func checkJobUsersReach(sb *ansible.Sandbox, setting, dir string) error {
	if sb == nil || sb.UIDs.Count == 0 {
		return nil
	}
	uid := uint32(sb.UIDs.First)
	for d := filepath.Dir(filepath.Clean(dir)); ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			if ok, why := allowed(d, uid, nil, 0o1); !ok {
				return service.Invalid(setting, "the sandbox's job users (PLAYBOOK_SANDBOX_UIDS) cannot reach %s: %s, so every Ansible job "+
					"would fail (bwrap: Permission denied); pick a directory whose parents others may traverse, or chmod o+x %s", dir, why, d)
			}
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

func (p PlaybookConfig) checkReads(who string, uid uint64, gids []uint64) error {
	dir, err := filepath.Abs(p.Dir)
	if err != nil {
		return &service.FieldError{Var: "PLAYBOOK_DIR", Err: err}
	}
	fail := func(path, why string) error {
		return service.Invalid("PLAYBOOK_DIR", "the play user %s, uid %d) cannot read %s: %s, so every play would fail "+
			"(\"the playbook ... could not be found\"); put the Ansible content where that user can read it (a clone outside a "+
			"private home such as /root, e.g. under /srv or /opt, or a copy of ansible/ there), or open the directory on the way "+
			"(chmod o+x %s)", who, uid, dir, why, path)
	}
	// The ancestors need search (x) permission, the directory and its
	// playbooks/ read and search.
	var chain []string
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		chain = append([]string{d}, chain...)
		if d == filepath.Dir(d) {
			break
		}
	}
	for _, d := range chain {
		if ok, why := allowed(d, uint32(uid), gids, 0o1); !ok {
			return fail(d, why)
		}
	}
	for _, d := range []string{dir, filepath.Join(dir, "playbooks")} {
		if _, err := os.Stat(d); os.IsNotExist(err) {
			continue // PLAYBOOK_DIR's own checks name a missing directory
		}
		if ok, why := allowed(d, uint32(uid), gids, 0o5); !ok {
			return fail(d, why)
		}
	}
	return nil
}

// allowed tells whether uid (in groups gids) has the permission bits want
// (a mask of r=4, w=2, x=1) on path, and when not, why.
func allowed(path string, uid uint32, gids []uint64, want os.FileMode) (bool, string) {
	st, err := os.Stat(path)
	if err != nil {
		return false, err.Error()
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return true, ""
	}
	mode := st.Mode().Perm()
	var bits os.FileMode
	switch {
	case sys.Uid == uid:
		bits = mode >> 6
	case slices.Contains(gids, uint64(sys.Gid)):
		bits = mode >> 3
	default:
		bits = mode
	}
	if bits&want == want {
		return true, ""
	}
	return false, fmt.Sprintf("%s is mode %04o, owner uid %d, group gid %d", path, mode, sys.Uid, sys.Gid)
}
