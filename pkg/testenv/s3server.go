package testenv

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// S3Server is a real S3-compatible server (gofakes3's server, built from
// the Go module proxy as a tool of the pkg module) running as its own
// process on a free loopback port, with its buckets in a directory of the
// test's own, so that it keeps its objects across a Restart.
type S3Server struct {
	t      testing.TB
	bin    string
	Dir    string
	Addr   string
	Bucket string
	cmd    *exec.Cmd
	done   chan struct{}
}

// Endpoint returns the server's URL.
func (s *S3Server) Endpoint() string { return "http://" + s.Addr }

// StartS3Server builds and starts an S3 server with one bucket. Any access
// key and secret are accepted. It is stopped when the test ends.
func StartS3Server(t testing.TB, bucket string) *S3Server {
	t.Helper()
	skipShort(t, "an S3 server")
	bin := filepath.Join(t.TempDir(), "gofakes3")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/johannesboyne/gofakes3/cmd/gofakes3")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the S3 test server (gofakes3): %v\n%s", err, out)
	}
	s := &S3Server{
		t: t, bin: bin, Dir: t.TempDir(), Bucket: bucket,
		Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t))),
	}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// Start starts the server process and waits until it accepts connections.
func (s *S3Server) Start() {
	s.t.Helper()
	s.cmd = exec.Command(s.bin, "-backend", "fs", "-fs.path", s.Dir, "-fs.create",
		"-initialbucket", s.Bucket, "-host", s.Addr, "-quiet")
	s.cmd.Stdout, s.cmd.Stderr = os.Stderr, os.Stderr
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start the S3 test server: %v", err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(s.cmd, s.done)
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-s.done:
			s.t.Fatalf("the S3 test server exited at start")
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("the S3 test server does not listen on %s: %v", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server process (its objects stay in Dir).
func (s *S3Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
	s.cmd = nil
}

// Restart stops the server and starts it again on the same address.
func (s *S3Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.Start()
}
