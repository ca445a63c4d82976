package proc

import (
	"bufio"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"
)

// start starts argv in its own process group and reaps it in the
// background; the returned channel is closed once it was reaped.
func start(t *testing.T, argv ...string) (*exec.Cmd, chan struct{}) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	reaped := make(chan struct{})
	go func() { _ = cmd.Wait(); close(reaped) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-reaped
	})
	return cmd, reaped
}

func TestKillerWaitsOnTheProcesses(t *testing.T) {
	t.Parallel()
	term, _ := start(t, "/bin/sleep", "300")
	// Ignores SIGTERM, as a stuck process might; it says when the trap is set.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	stubborn := exec.Command("/bin/sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done")
	stubborn.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stubborn.Stdout = w
	if err := stubborn.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	defer func() { _ = syscall.Kill(-stubborn.Process.Pid, syscall.SIGKILL); _ = stubborn.Wait() }()
	if _, err := bufio.NewReader(r).ReadString('\n'); err != nil {
		t.Fatalf("the stubborn shell never got ready: %v", err)
	}

	var k Killer
	defer k.Close()
	k.Signal(term.Process.Pid, syscall.SIGTERM)
	k.Signal(stubborn.Process.Pid, syscall.SIGTERM)
	if k.Held() != 2 {
		t.Fatalf("held %d, want 2", k.Held())
	}
	// The sleep ends at once; Wait returns then, not after its timeout.
	began := time.Now()
	k.Wait(time.Minute)
	if took := time.Since(began); took > 30*time.Second {
		t.Fatalf("Wait took %s: it did not return when the first process exited", took)
	}
	if k.Held() != 1 {
		t.Fatalf("held %d after the sleep exited, want 1 (the stubborn shell)", k.Held())
	}
	// The stubborn one outlives a short wait, and a repeated SIGTERM.
	k.Signal(stubborn.Process.Pid, syscall.SIGTERM)
	if k.WaitAll(time.Now().Add(200 * time.Millisecond)) {
		t.Fatal("WaitAll reported a SIGTERM-ignoring process gone")
	}
	k.Signal(stubborn.Process.Pid, syscall.SIGKILL)
	if !k.WaitAll(time.Now().Add(time.Minute)) {
		t.Fatal("SIGKILLed process still held after a minute")
	}
	if k.Held() != 0 {
		t.Fatalf("held %d, want 0", k.Held())
	}
}

func TestStatAndGroups(t *testing.T) {
	t.Parallel()
	cmd, _ := start(t, "/bin/sleep", "300")
	pid := cmd.Process.Pid
	st, err := ReadStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	if st.PPid != os.Getpid() || st.Pgrp != pid || !st.Live() {
		t.Errorf("stat %+v: want ppid %d, pgrp %d, live", st, os.Getpid(), pid)
	}
	if got := GroupMembers(pid); !slices.Equal(got, []int{pid}) {
		t.Errorf("group %d members %v, want just the sleep", pid, got)
	}
	if (Stat{State: 'Z'}).Live() || (Stat{State: 'X'}).Live() {
		t.Error("zombies count as live")
	}
}
