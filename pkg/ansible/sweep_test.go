package ansible

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

func TestSweepLeftovers(t *testing.T) {
	t.Parallel()
	r, _ := newTestRunner(t, nil)
	root := r.cfg.RunRoot
	mkdir := func(path string) {
		t.Helper()
		if err := os.MkdirAll(path, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	touch := func(path string) {
		t.Helper()
		if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	// A crashed run: marker unlocked, files inside, and a process (standing
	// in for an ssh master) whose command line names its control dir.
	left := filepath.Join(root, runDirPrefix+"left")
	mkdir(filepath.Join(left, "cp"))
	mkdir(filepath.Join(left, "tmp", "deep"))
	touch(filepath.Join(left, markerName))
	touch(filepath.Join(left, "tmp", "deep", "f"))
	straggler := exec.Command("/bin/sh", "-c", "sleep 60; :", filepath.Join(left, "cp", "master"))
	straggler.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := straggler.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = straggler.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-straggler.Process.Pid, syscall.SIGKILL)
		<-exited
	})
	testenv.WaitFor(t, 10*time.Second, "the straggler", func() bool { return len(processesReferring(left)) > 0 })

	// Things the sweep must leave alone.
	live, err := r.newRunDir("live", false) // locked by this process
	if err != nil {
		t.Fatal(err)
	}
	defer live.remove()
	noMarker := filepath.Join(root, runDirPrefix+"nomarker")
	mkdir(noMarker)
	elsewhere := t.TempDir()
	touch(filepath.Join(elsewhere, markerName))
	link := filepath.Join(root, runDirPrefix+"link")
	if err := os.Symlink(elsewhere, link); err != nil {
		t.Fatal(err)
	}
	markerLink := filepath.Join(root, runDirPrefix+"markerlink")
	mkdir(markerLink)
	if err := os.Symlink(filepath.Join(elsewhere, markerName), filepath.Join(markerLink, markerName)); err != nil {
		t.Fatal(err)
	}
	otherName := filepath.Join(root, "other")
	mkdir(otherName)
	touch(filepath.Join(otherName, markerName))
	plainFile := filepath.Join(root, runDirPrefix+"file")
	touch(plainFile)
	keep := []string{live.path, noMarker, link, markerLink, otherName, plainFile, filepath.Join(elsewhere, markerName)}
	if os.Geteuid() == 0 {
		foreign := filepath.Join(root, runDirPrefix+"foreign")
		mkdir(foreign)
		touch(filepath.Join(foreign, markerName))
		if err := os.Chown(foreign, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		keep = append(keep, foreign)
	}

	removed, err := r.SweepLeftovers()
	if err != nil || removed != 1 {
		t.Fatalf("SweepLeftovers = %d, %v; want 1, nil", removed, err)
	}
	if _, err := os.Lstat(left); !os.IsNotExist(err) {
		t.Errorf("leftover still there: %v", err)
	}
	for _, p := range keep {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s was touched: %v", p, err)
		}
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Error("the process referring to the leftover survived the sweep")
	}

	// A second sweep finds nothing; the live run's directory is still usable.
	if removed, err := r.SweepLeftovers(); err != nil || removed != 0 {
		t.Errorf("second sweep = %d, %v", removed, err)
	}
	if err := live.remove(); err != nil {
		t.Fatal(err)
	}
}
