package ansible

import "path/filepath"

// fixedEnvNames are the variables the runner sets in the child.
var fixedEnvNames = map[string]struct{}{
	"PATH": {}, "HOME": {}, "LANG": {}, "LC_ALL": {}, "TMPDIR": {},
	"ANSIBLE_CONFIG": {}, "ANSIBLE_LOCAL_TEMP": {}, "ANSIBLE_SSH_CONTROL_PATH_DIR": {}, "ANSIBLE_SSH_ARGS": {},
	"ANSIBLE_CACHE_PLUGIN_CONNECTION": {}, "ANSIBLE_NOCOLOR": {}, "PYTHONUNBUFFERED": {}, "PYTHONDONTWRITEBYTECODE": {},
	"SSH_AUTH_SOCK": {}, "AUTOPROV_EVENTS_PATH": {}, "AUTOPROV_GATE_PATH": {},
}

// childEnv is the complete environment of the child: an allow-list, then
// the run's secrets.
func (r *Runner) childEnv(d *runDir, spec *Spec) []string {
	controlDir := d.controlDir
	if d.warm != nil {
		controlDir = d.warm.sockDir
	}
	env := []string{
		"PATH=" + safePath,
		"HOME=" + d.path, // ~/.ansible and friends die with the run dir
		"LANG=C.UTF-8",
		"LC_ALL=C.UTF-8",
		"TMPDIR=" + d.tmpDir,
		"ANSIBLE_CONFIG=" + filepath.Join(r.cfg.AnsibleDir, "ansible.cfg"),
		"ANSIBLE_LOCAL_TEMP=" + d.tmpDir,
		"ANSIBLE_SSH_CONTROL_PATH_DIR=" + controlDir,
		"ANSIBLE_CACHE_PLUGIN_CONNECTION=" + r.cfg.FactCacheDir,
		"ANSIBLE_NOCOLOR=1",
		"PYTHONUNBUFFERED=1",
		// No __pycache__ in the source tree: plays write nothing there (a
		// private cache dir left by one user breaks plays of another).
		"PYTHONDONTWRITEBYTECODE=1",
		"SSH_AUTH_SOCK=" + d.agentSock,
		"AUTOPROV_EVENTS_PATH=/dev/fd/3",
	}
	if d.warm != nil {
		// The play's ssh uses the warm master and never starts one.
		env = append(env, "ANSIBLE_SSH_ARGS="+r.warmArgs)
	}
	env = append(env, spec.env...) // a job's own (RunJob)
	if d.gate != "" {
		env = append(env, "AUTOPROV_GATE_PATH="+d.gate)
	}
	for name, value := range spec.SecretEnv {
		env = append(env, name+"="+value)
	}
	return env
}
