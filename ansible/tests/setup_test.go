package tests

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/ansible/tests/target"
	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
)

// setupVars are the extra vars of setup_server.yml on a test target: nothing
// may touch the test machine's kernel (sysctl, swapon); Docker comes from
// Debian's mirror (the only one reachable); a small swap file.
func setupVars() map[string]any {
	return map[string]any{
		"autoprov_manage_kernel":         false,
		"docker_install_source":          "debian",
		"system_tuning_swap_size_mb":     64,
		"system_tuning_swap_min_free_mb": 256,
	}
}

// hostState is what the target must never change on the test machine.
type hostState struct {
	nftTables  string
	swappiness string
	swaps      string
	somaxconn  string
}

func readHostState(t *testing.T) hostState {
	t.Helper()
	out, err := exec.Command("nft", "list", "tables").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list tables on the test machine: %v: %s", err, out)
	}
	return hostState{
		nftTables:  inetTables(string(out)),
		swappiness: readFile(t, "/proc/sys/vm/swappiness"),
		swaps:      readFile(t, "/proc/swaps"),
		somaxconn:  readFile(t, "/proc/sys/net/core/somaxconn"),
	}
}

// inetTables keeps, of nft's list of tables, those of the inet family,
// the one the firewall role writes: other processes of the test machine
// (podman's networks, in iptables' ip tables) may add theirs meanwhile.
func inetTables(list string) string {
	var keep []string
	for _, line := range strings.Split(list, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "table inet ") {
			keep = append(keep, strings.TrimSpace(line))
		}
	}
	return strings.Join(keep, "\n")
}

// TestSetupServer provisions a fresh Debian target with setup_server.yml,
// checks the result on its file system and over SSH, runs it again as the
// deploy user (zero changes), then checks nuke.yml's guard and reset.
func TestSetupServer(t *testing.T) {
	t.Parallel()
	requireTools(t, append(targetTools, "nft")...)
	before := readHostState(t)
	key := newKey(t)
	tgt := startTarget(t, key, targetOpts{})
	r := newRunner(t, ansibleDir(t))
	env := map[string]string{"AUTOPROV_DEPLOY_SSH_PUBKEY": key.PubLine}
	run := func(playbook, user string, extra map[string]any) *play {
		vars := setupVars()
		for k, v := range extra {
			vars[k] = v
		}
		return runPlay(t, r, ansible.Spec{
			Playbook: playbook, Host: hostFor(tgt, user),
			Vars: vars, SecretEnv: env, SSHKeys: [][]byte{key.PEM},
		})
	}

	first := run("setup_server.yml", "root", nil)
	mustSucceed(t, first, "srv-test")
	checkProvisioned(t, tgt, key)

	t.Run("host untouched", func(t *testing.T) {
		if after := readHostState(t); after != before {
			t.Errorf("the test machine changed:\nbefore %+v\nafter  %+v", before, after)
		}
	})

	t.Run("second run changes nothing", func(t *testing.T) {
		second := run("setup_server.yml", "deploy", nil)
		st := mustSucceed(t, second, "srv-test")
		if st.Changed != 0 {
			t.Errorf("second run: %d changed tasks: %v", st.Changed, second.Changed())
		}
		t.Logf("second run: %+v in %s", st, second.Duration.Round(time.Millisecond))
	})

	t.Run("nuke refuses without confirmation", func(t *testing.T) {
		for _, confirm := range []any{nil, "", "another-server"} {
			extra := map[string]any{}
			if confirm != nil {
				extra["autoprov_nuke_confirm"] = confirm
			}
			res := run("nuke.yml", "deploy", extra)
			if res.ExitCode == 0 {
				t.Fatalf("nuke ran with confirmation %v", confirm)
			}
			if got := res.Changed(); len(got) != 0 {
				t.Errorf("refused nuke changed %v", got)
			}
			if !strings.Contains(strings.Join(res.Failures(), "\n"), "autoprov_nuke_confirm") {
				t.Errorf("refusal does not explain itself: %v", res.Failures())
			}
		}
		if _, err := os.Stat(tgt.Path("/home/deploy/.ssh/authorized_keys")); err != nil {
			t.Errorf("deploy user touched by a refused nuke: %v", err)
		}
	})

	t.Run("nuke resets the server", func(t *testing.T) {
		res := run("nuke.yml", "deploy", map[string]any{"autoprov_nuke_confirm": "srv-test"})
		mustSucceed(t, res, "srv-test")
		if out, err := key.sshRun(tgt, "root", "id -u"); err != nil || strings.TrimSpace(out) != "0" {
			t.Errorf("root cannot log in after nuke: %v %q", err, out)
		}
		if _, err := key.sshRun(tgt, "deploy", "true"); err == nil {
			t.Errorf("deploy user can still log in after nuke")
		}
		if strings.Contains(readFile(t, tgt.Path("/etc/passwd")), "\ndeploy:") {
			t.Errorf("deploy user still in /etc/passwd")
		}
		for _, p := range []string{
			"/etc/ssh/sshd_config.d/00-autoprov-hardening.conf", "/etc/sudoers.d/90-autoprov-deploy",
			"/etc/nftables.d/autoprov.nft", "/swapfile", "/etc/docker", "/srv/autoprov", "/home/deploy",
			"/etc/fail2ban/jail.d/autoprov.local", "/etc/sysctl.d/60-autoprov.conf",
		} {
			if _, err := os.Lstat(tgt.Path(p)); err == nil {
				t.Errorf("%s still there after nuke", p)
			}
		}
		if strings.Contains(readFile(t, tgt.Path("/etc/fstab")), "/swapfile") {
			t.Errorf("swap file still in fstab")
		}
		if dpkgInstalled(t, tgt, "docker.io") {
			t.Errorf("docker.io still installed")
		}
		if out, err := tgt.Run(context.Background(), "nft", "list", "tables"); err != nil || strings.Contains(string(out), "autoprov") {
			t.Errorf("autoprov table still loaded: %v %s", err, out)
		}
		// setup_server.yml works again from the reset state.
		again := run("setup_server.yml", "root", nil)
		mustSucceed(t, again, "srv-test")
		checkProvisioned(t, tgt, key)
	})
}

// checkProvisioned checks setup_server.yml's results on the target.
func checkProvisioned(t *testing.T, tgt *target.Target, key *testKey) {
	t.Helper()
	ctx := context.Background()
	check := func(name string, f func(t *testing.T)) { t.Run(name, f) }

	check("deploy user", func(t *testing.T) {
		passwd := readFile(t, tgt.Path("/etc/passwd"))
		if !regexp.MustCompile(`(?m)^deploy:x:\d+:\d+:[^:]*:/home/deploy:/bin/bash$`).MatchString(passwd) {
			t.Errorf("no deploy user in /etc/passwd")
		}
		keys := tgt.Path("/home/deploy/.ssh/authorized_keys")
		if !strings.Contains(readFile(t, keys), key.PubLine) {
			t.Errorf("deploy's authorized_keys lacks the key")
		}
		if m := fileMode(t, keys); m != 0o600 {
			t.Errorf("authorized_keys mode %o", m)
		}
		if m := fileMode(t, tgt.Path("/home/deploy/.ssh")); m != 0o700 {
			t.Errorf(".ssh mode %o", m)
		}
		if s := readFile(t, tgt.Path("/etc/sudoers.d/90-autoprov-deploy")); !strings.Contains(s, "deploy ALL=(ALL:ALL) NOPASSWD: ALL") {
			t.Errorf("sudoers: %q", s)
		}
		if shadow := readFile(t, tgt.Path("/etc/shadow")); !regexp.MustCompile(`(?m)^deploy:!`).MatchString(shadow) {
			t.Errorf("deploy's password is not locked")
		}
	})

	check("ssh hardening", func(t *testing.T) {
		conf := readFile(t, tgt.Path("/etc/ssh/sshd_config.d/00-autoprov-hardening.conf"))
		for _, want := range []string{"PermitRootLogin no", "PasswordAuthentication no", "KbdInteractiveAuthentication no", "X11Forwarding no"} {
			if !strings.Contains(conf, want+"\n") {
				t.Errorf("drop-in lacks %q", want)
			}
		}
		out, err := tgt.Run(ctx, "/usr/sbin/sshd", "-T")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"permitrootlogin no", "passwordauthentication no", "pubkeyauthentication yes"} {
			if !strings.Contains(string(out), "\n"+want+"\n") {
				t.Errorf("effective sshd config lacks %q", want)
			}
		}
		// The running sshd was reloaded: root is refused, deploy gets in and can sudo.
		if _, err := key.sshRun(tgt, "root", "true"); err == nil {
			t.Errorf("root can still log in")
		}
		if out, err := key.sshRun(tgt, "deploy", "sudo -n id -u"); err != nil || strings.TrimSpace(out) != "0" {
			t.Errorf("deploy cannot log in and sudo: %v %q", err, out)
		}
	})

	check("firewall", func(t *testing.T) {
		conf := readFile(t, tgt.Path("/etc/nftables.conf"))
		if !strings.Contains(conf, `include "/etc/nftables.d/*.nft"`) || strings.Contains(conf, "flush ruleset") {
			t.Errorf("nftables.conf: %s", conf)
		}
		rules := readFile(t, tgt.Path("/etc/nftables.d/autoprov.nft"))
		for _, want := range []string{"policy drop;", "tcp dport 22 accept", "tcp dport { 80, 443 } accept", "ct state established,related accept"} {
			if !strings.Contains(rules, want) {
				t.Errorf("rules lack %q:\n%s", want, rules)
			}
		}
		out, err := tgt.Run(ctx, "nft", "list", "table", "inet", "autoprov")
		if err != nil {
			t.Fatalf("rules not loaded in the target's namespace: %v", err)
		}
		if !strings.Contains(string(out), "policy drop") || !strings.Contains(string(out), "tcp dport 22 accept") {
			t.Errorf("loaded rules:\n%s", out)
		}
	})

	check("time sync", func(t *testing.T) {
		if !dpkgInstalled(t, tgt, "chrony") {
			t.Errorf("chrony not installed")
		}
		if s := readFile(t, tgt.Path("/etc/chrony/conf.d/autoprov.conf")); !strings.Contains(s, "makestep 1.0 3") {
			t.Errorf("chrony drop-in: %q", s)
		}
	})

	check("sysctl and swap", func(t *testing.T) {
		s := readFile(t, tgt.Path("/etc/sysctl.d/60-autoprov.conf"))
		for _, want := range []string{"vm.swappiness = 10", "net.ipv4.tcp_syncookies = 1", "kernel.panic = 10"} {
			if !strings.Contains(s, want+"\n") {
				t.Errorf("sysctl file lacks %q", want)
			}
		}
		st, err := os.Stat(tgt.Path("/swapfile"))
		if err != nil {
			t.Fatalf("no swap file: %v", err)
		}
		if st.Mode().Perm() != 0o600 || st.Size() != 64<<20 {
			t.Errorf("swap file mode %o size %d", st.Mode().Perm(), st.Size())
		}
		head := make([]byte, 4096)
		f, err := os.Open(tgt.Path("/swapfile"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.Read(head); err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(string(head), "SWAPSPACE2") {
			t.Errorf("swap file has no swap signature (mkswap)")
		}
		if !regexp.MustCompile(`(?m)^/swapfile none swap sw 0 0$`).MatchString(readFile(t, tgt.Path("/etc/fstab"))) {
			t.Errorf("swap file not in fstab")
		}
	})

	check("unattended upgrades", func(t *testing.T) {
		if !dpkgInstalled(t, tgt, "unattended-upgrades") {
			t.Errorf("unattended-upgrades not installed")
		}
		if s := readFile(t, tgt.Path("/etc/apt/apt.conf.d/52autoprov-unattended-upgrades")); !strings.Contains(s, `APT::Periodic::Unattended-Upgrade "1";`) {
			t.Errorf("52autoprov-unattended-upgrades: %q", s)
		}
		out, err := tgt.Run(ctx, "apt-config", "dump", "Unattended-Upgrade::Origins-Pattern")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(out), "label=Debian-Security") || strings.Contains(string(out), "label=Debian\"") {
			t.Errorf("origins:\n%s", out)
		}
	})

	check("fail2ban", func(t *testing.T) {
		if !dpkgInstalled(t, tgt, "fail2ban") {
			t.Errorf("fail2ban not installed")
		}
		s := readFile(t, tgt.Path("/etc/fail2ban/jail.d/autoprov.local"))
		for _, want := range []string{"[sshd]", "enabled = true", "port = 22", "banaction = nftables-multiport"} {
			if !strings.Contains(s, want+"\n") {
				t.Errorf("jail lacks %q:\n%s", want, s)
			}
		}
		if out, err := tgt.Run(ctx, "fail2ban-client", "--test"); err != nil {
			t.Errorf("fail2ban configuration invalid: %v\n%s", err, out)
		}
	})

	check("docker", func(t *testing.T) {
		for _, p := range []string{"docker.io", "docker-compose"} {
			if !dpkgInstalled(t, tgt, p) {
				t.Errorf("%s not installed", p)
			}
		}
		if s := readFile(t, tgt.Path("/etc/docker/daemon.json")); !strings.Contains(s, `"max-size": "10m"`) || !strings.Contains(s, `"live-restore": true`) {
			t.Errorf("daemon.json: %s", s)
		}
		if !regexp.MustCompile(`(?m)^docker:x:\d+:.*\bdeploy\b`).MatchString(readFile(t, tgt.Path("/etc/group"))) {
			t.Errorf("deploy not in the docker group")
		}
	})
}
