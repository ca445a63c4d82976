package tests

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// TestAnsibleLint runs Debian's ansible-lint on the production profile
// (ansible/.ansible-lint) over the whole Ansible content.
func TestAnsibleLint(t *testing.T) {
	t.Parallel()
	requireTools(t, "ansible-lint", "ansible-playbook")
	cmd := exec.Command("ansible-lint", "--nocolor", "--offline", "--profile", "production")
	cmd.Dir = ansibleDir(t)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir(), "LANG=C.UTF-8",
		"ANSIBLE_CONFIG=" + filepath.Join(ansibleDir(t), "ansible.cfg")}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ansible-lint --profile production: %v\n%s", err, out)
	}
}

// TestSyntaxCheck runs ansible-playbook --syntax-check on every playbook
// with the project's ansible.cfg.
func TestSyntaxCheck(t *testing.T) {
	t.Parallel()
	requireTools(t, "ansible-playbook")
	playbooks, err := filepath.Glob(filepath.Join(ansibleDir(t), "playbooks", "*.yml"))
	if err != nil || len(playbooks) < 4 {
		t.Fatalf("playbooks: %v %v", playbooks, err)
	}
	for _, pb := range playbooks {
		t.Run(filepath.Base(pb), func(t *testing.T) {
			cmd := exec.Command("ansible-playbook", "--syntax-check", "-i", "localhost,", pb)
			cmd.Dir = ansibleDir(t)
			cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir(), "LANG=C.UTF-8",
				"ANSIBLE_CONFIG=" + filepath.Join(ansibleDir(t), "ansible.cfg")}
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("syntax check of %s: %v\n%s", filepath.Base(pb), err, out)
			}
		})
	}
}
