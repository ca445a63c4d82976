package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// WriteInventory writes an Ansible inventory of this target, as host name,
// under dir the way infra reaches a target (its host key pinned, strict
// checking) but with the private key file keyFile, and returns its path.
// Benchmarks run bare ansible-playbook loops with it.
func (s *SSHD) WriteInventory(tb testing.TB, dir, name, keyFile string) string {
	tb.Helper()
	known := filepath.Join(dir, "known_hosts_"+name)
	writeFile(tb, known, []byte(fmt.Sprintf("[%s]:%d %s\n", s.Host, s.Port, s.HostKey)), 0o600)
	inv := filepath.Join(dir, "inv_"+name+".yml")
	writeFile(tb, inv, []byte(fmt.Sprintf(`all:
  hosts:
    %s:
      ansible_host: %s
      ansible_port: %d
      ansible_user: %s
      ansible_ssh_private_key_file: %s
      ansible_ssh_common_args: -o UserKnownHostsFile=%s -o StrictHostKeyChecking=yes
`, name, s.Host, s.Port, s.User, keyFile, known)), 0o600)
	return inv
}

// ShareClientKey writes the first target's client key into dir, authorizes
// it on every other target, so one key serves all, and returns its path.
func ShareClientKey(tb testing.TB, dir string, sshds []*SSHD) string {
	tb.Helper()
	keyFile := filepath.Join(dir, "id_ed25519")
	writeFile(tb, keyFile, sshds[0].ClientKey, 0o600)
	for _, s := range sshds[1:] {
		f, err := os.OpenFile(filepath.Join(s.Dir, "authorized_keys"), os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			tb.Fatal(err)
		}
		fmt.Fprintln(f, sshds[0].ClientPublicKey)
		if err := f.Close(); err != nil {
			tb.Fatal(err)
		}
	}
	return keyFile
}
