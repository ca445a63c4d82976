package ansible

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/pattern"
)

// factCacheNameRE is what a fact cache file name (an inventory host alias)
// may look like; anything else is never turned into a path.
var factCacheNameRE = pattern.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`, 128)

// ForgetHost drops the cached facts of the inventory host alias, for
// example after its server's OS was rebuilt: Ansible's jsonfile cache keeps
// one file per host, named after it, in FactCacheDir.
func (r *Runner) ForgetHost(alias string) {
	if !factCacheNameRE.MatchString(alias) {
		return
	}
	err := os.Remove(filepath.Join(r.cfg.FactCacheDir, alias))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		r.log.Warn().Err(err).Str("host", alias).Msg("could not drop cached facts")
	}
}
