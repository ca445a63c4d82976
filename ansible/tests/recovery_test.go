package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/ansible/tests/target"
	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
)

// recoveryReport is the JSON in the "recovery report: ..." message.
type recoveryReport struct {
	Threshold   int  `json:"threshold_percent"`
	Cleaned     bool `json:"cleaned"`
	Freed       int64
	Filesystems []struct {
		Target        string `json:"target"`
		Percent       int    `json:"percent"`
		PercentBefore int    `json:"percent_before"`
		Freed         int64  `json:"freed"`
	} `json:"filesystems"`
	Docker []string `json:"docker"`
}

func findReport(t *testing.T, res *play) recoveryReport {
	t.Helper()
	for _, e := range res.Events {
		if e.Type == ansible.EventHostOK && strings.HasPrefix(e.Msg, "recovery report: ") {
			var r recoveryReport
			if err := json.Unmarshal([]byte(strings.TrimPrefix(e.Msg, "recovery report: ")), &r); err != nil {
				t.Fatalf("parse report %q: %v", e.Msg, err)
			}
			return r
		}
	}
	t.Fatalf("no recovery report event: %s", res.Summary())
	return recoveryReport{}
}

func writeFiller(t *testing.T, path string, mb int) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i)
	}
	for i := 0; i < mb; i++ {
		if _, err := f.Write(chunk); err != nil {
			t.Fatalf("fill %s: %v", path, err)
		}
	}
}

// TestRecovery fills a small target disk (a 300 MB writable layer) with
// Docker images, build cache and apt packages and checks recovery.yml detects
// it and frees the space; then hangs the (stand-in) Docker daemon and checks
// it is restarted and the project stacks come back.
func TestRecovery(t *testing.T) {
	t.Parallel()
	requireTools(t, targetTools...)
	key := newKey(t)
	tgt := startTarget(t, key, targetOpts{rootSizeMB: 300, noPkgCache: true})
	installStandin(t, tgt)
	r := newRunner(t, ansibleDir(t))
	recover := func(vars map[string]any) *play {
		return runPlay(t, r, ansible.Spec{
			Playbook: "recovery.yml", Host: hostFor(tgt, "root"), Vars: vars, SSHKeys: [][]byte{key.PEM},
		})
	}

	t.Run("disk nearly full", func(t *testing.T) {
		writeFiller(t, tgt.Path("/var/lib/docker-standin/images/layers.bin"), 150)
		writeFiller(t, tgt.Path("/var/lib/docker-standin/buildcache/cache.bin"), 40)
		writeFiller(t, tgt.Path("/var/cache/apt/archives/bigpackage_1.0_amd64.deb"), 80)
		res := recover(map[string]any{"recovery_actions": []string{"disk"}})
		mustSucceed(t, res, "srv-test")
		r := findReport(t, res)
		if !r.Cleaned || len(r.Filesystems) != 1 || r.Filesystems[0].Target != "/" {
			t.Fatalf("report: %+v", r)
		}
		fs := r.Filesystems[0]
		if fs.PercentBefore < 85 || fs.Percent >= 85 || fs.Freed < 250<<20 || r.Freed != fs.Freed {
			t.Errorf("report: %+v", r)
		}
		if len(r.Docker) != 3 {
			t.Errorf("docker prune results: %v", r.Docker)
		}
		for _, p := range []string{"/var/lib/docker-standin/images", "/var/lib/docker-standin/buildcache", "/var/cache/apt/archives/bigpackage_1.0_amd64.deb"} {
			if _, err := os.Stat(tgt.Path(p)); err == nil {
				t.Errorf("%s not cleaned", p)
			}
		}
		log := readFile(t, tgt.Path("/var/log/docker-standin.log"))
		for _, want := range []string{"docker container prune --force", "docker image prune --all --force", "docker builder prune --all --force"} {
			if !strings.Contains(log, want) {
				t.Errorf("stand-in log lacks %q", want)
			}
		}
		t.Logf("freed %d MiB: %d%% -> %d%%", fs.Freed>>20, fs.PercentBefore, fs.Percent)
	})

	t.Run("disk fine", func(t *testing.T) {
		res := recover(map[string]any{"recovery_actions": []string{"disk"}})
		st := mustSucceed(t, res, "srv-test")
		if r := findReport(t, res); r.Cleaned {
			t.Errorf("cleaned a disk below the threshold: %+v", r)
		}
		if st.Changed != 0 {
			t.Errorf("changes on a healthy disk: %v", res.Changed())
		}
	})

	t.Run("hung docker daemon", func(t *testing.T) {
		const id = "5f1d2c3b-aaaa-4bbb-8ccc-0123456789ab"
		release := "/srv/autoprov/projects/" + id + "/releases/abc"
		writeTargetFile(t, tgt, release+"/index.html", "stack is back\n")
		rec := map[string]any{
			"project_id": id, "release_dir": release, "compose": []string{"docker", "compose"},
			"compose_project": "autoprov-" + id, "profiles": []string{"web"}, "port": 8181,
		}
		data, _ := json.Marshal(rec)
		writeTargetFile(t, tgt, "/srv/autoprov/projects/"+id+"/deploy.json", string(data))
		writeTargetFile(t, tgt, "/run/docker-standin/hung", "")

		res := recover(map[string]any{
			"recovery_actions":                []string{"docker"},
			"recovery_docker_info_timeout":    2,
			"recovery_docker_verify_delay":    1,
			"recovery_docker_restart_command": []string{"/usr/local/bin/docker", "standin-restart"},
		})
		mustSucceed(t, res, "srv-test")
		found := false
		for _, e := range res.Events {
			if e.Type == ansible.EventHostOK && strings.Contains(e.Msg, "docker daemon hung") {
				found = true
			}
		}
		if !found {
			t.Errorf("the hang was not reported")
		}
		if _, err := os.Stat(tgt.Path("/run/docker-standin/hung")); err == nil {
			t.Errorf("daemon not restarted")
		}
		log := readFile(t, tgt.Path("/var/log/docker-standin.log"))
		if !strings.Contains(log, "docker compose --project-name autoprov-"+id+" --project-directory "+release+" --profile=web up --detach --remove-orphans PORT=8181") {
			t.Errorf("stack not brought back:\n%s", log)
		}
		// "up --detach" returns before the stack listens (the stand-in's
		// server, as a real compose project's): it answers within seconds.
		var body string
		var err error
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			if body, err = httpGetInTarget(tgt, "http://127.0.0.1:8181/index.html"); (err == nil && body == "stack is back\n") || time.Now().After(deadline) {
				break
			}
		}
		if err != nil || body != "stack is back\n" {
			t.Errorf("stack answers %q (%v)", body, err)
		}
	})
}

func writeTargetFile(t *testing.T, tgt *target.Target, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(tgt.Path(path)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tgt.Path(path), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
