package ansible

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// playUser is the unprivileged user plays run as (scripts/services.sh
// creates it when it runs as root, as `make test` does).
const playUser = "autoprov-play"

// playUserCredential is the play user's, or fails the test (it needs root
// and the user).
func playUserCredential(t *testing.T) *Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (plays run as another user); run it through `make test`")
	}
	u, err := user.Lookup(playUser)
	if err != nil {
		t.Fatalf("user %s: %v (scripts/services.sh deps creates it)", playUser, err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &Credential{UID: uint32(uid), GID: uint32(gid)}
}

// TestRunAsPlayUser runs a play as the unprivileged play user: the
// controller side of the play runs with that uid and gid, a core limit of
// 0 and the private run directory as working directory, and still reaches
// the target (agent socket, inventory and known_hosts are readable to it)
// and the runner (events through the inherited pipe).
func TestRunAsPlayUser(t *testing.T) {
	t.Parallel()
	cred := playUserCredential(t)
	uid, gid := cred.UID, cred.GID
	// The test ansible.cfg takes its plugins from the repository's
	// ansible/: Python caches a root run of an older version left there
	// would stop the play (the runner removes those under its own
	// AnsibleDir only).
	_ = filepath.WalkDir("../../ansible", func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Name() == "__pycache__" {
			_ = os.RemoveAll(path)
			return filepath.SkipDir
		}
		return nil
	})
	s := testenv.StartSSHD(t, testenv.SSHDOptions{})
	for _, guarded := range []bool{true, false} {
		t.Run(fmt.Sprintf("guarded=%v", guarded), func(t *testing.T) {
			r, _ := newTestRunner(t, func(c *Config) {
				c.RunAs = cred
				c.FactCacheDir = shortTempDir(t, "apf") // its parents must be traversable
				if !guarded {
					c.GuardPath = "/nonexistent/runguard"
				}
			})
			if r.Guarded() != guarded {
				t.Fatalf("guarded = %v", r.Guarded())
			}
			sp := watchSpawn(r)
			var events eventLog
			spec := specFor(s, "whoami.yml", nil)
			spec.OnEvent = events.add
			res, err := r.Run(context.Background(), spec)
			if err != nil {
				t.Fatal(err)
			}
			if res.Outcome != OutcomeSucceeded {
				t.Fatalf("result %+v\n%s", res, res.OutputTail)
			}
			want := fmt.Sprintf("controller uid=%d gid=%d core=0 cwd=", uid, gid)
			if !strings.Contains(res.OutputTail, want) {
				t.Errorf("output lacks %q:\n%s", want, res.OutputTail)
			}
			// The event pipe reaches the callback plugin of another user.
			if types := events.types(); len(types) < 2 || types[len(types)-1] != EventStats {
				t.Errorf("events %v: the callback could not write to the runner's pipe", types)
			}
			_, runDir := sp.get()
			if !strings.Contains(res.OutputTail, "cwd="+runDir+"/tmp") {
				t.Errorf("the play's working directory is not its run dir %s/tmp:\n%s", runDir, res.OutputTail)
			}
			pgid, _ := sp.get()
			assertNothingLeft(t, pgid, runDir)
		})
	}
}
