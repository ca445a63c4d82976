package tests

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCallbackKeepsSecretsWholeForRedaction: the callback plugin knows no
// secrets, so it must not cut a message where a secret may straddle the
// cut. A failure quoting a secret at 4 KiB (where it used to cut) reaches
// the event whole, so that infra's redactor can mask it; a message longer
// than the plugin keeps is marked, so that infra masks a piece at the cut.
func TestCallbackKeepsSecretsWholeForRedaction(t *testing.T) {
	t.Parallel()
	requireTools(t, "ansible-playbook")
	const secret = "s3cr3t-Cut-Token-0123456789abcdef"
	dir := t.TempDir()
	events := filepath.Join(dir, "events.jsonl")
	cmd := exec.Command("ansible-playbook", "-i", "localhost,", "-c", "local",
		"-e", "ansible_python_interpreter=/usr/bin/python3",
		filepath.Join(repoRoot(t), "ansible/tests/testdata/cut.yml"))
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir, "ANSIBLE_LOCAL_TEMP=" + dir,
		"ANSIBLE_CONFIG=" + filepath.Join(repoRoot(t), "ansible/ansible.cfg"),
		"AUTOPROV_EVENTS_PATH=" + events, "CUT_SECRET=" + secret}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ansible-playbook: %v\n%s", err, out)
	}
	f, err := os.Open(events)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type event struct {
		Event       string `json:"event"`
		Task        string `json:"task"`
		Msg         string `json:"msg"`
		MsgCutStart bool   `json:"msg_cut_start"`
		MsgCutEnd   bool   `json:"msg_cut_end"`
	}
	failed := map[string]event{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 128<<10), 128<<10)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatal(err)
		}
		if e.Event == "host_failed" {
			failed[e.Task] = e
		}
	}
	at4k, ok := failed["A failure quoting a secret at 4 KiB"]
	if !ok || !strings.Contains(at4k.Msg, secret) || at4k.MsgCutStart || at4k.MsgCutEnd {
		t.Fatalf("secret at 4 KiB: the event does not hold it whole (%d bytes, cut %v/%v)", len(at4k.Msg), at4k.MsgCutStart, at4k.MsgCutEnd)
	}
	long, ok := failed["A failure longer than the plugin keeps"]
	if !ok || !long.MsgCutEnd || len(long.Msg) > 32<<10 || len(long.Msg) < 4<<10 {
		t.Fatalf("long message: %d bytes, cut end %v", len(long.Msg), long.MsgCutEnd)
	}
}
