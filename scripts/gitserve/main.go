// Command gitserve serves the git repositories under a directory with
// git's smart HTTP protocol (git http-backend as a CGI program), for the
// demo deployment of `make run`. It is a development helper, not a service:
//
//	gitserve --listen 198.51.100.1:18080 --root run/dev/git
//
// serves run/dev/git/acme/demo.git as http://198.51.100.1:18080/acme/demo.git.
package main

import (
	"flag"
	"fmt"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	root := flag.String("root", "", "directory holding the bare repositories")
	flag.Parse()
	abs, err := filepath.Abs(*root)
	if err != nil || *root == "" {
		fmt.Fprintln(os.Stderr, "gitserve: --root is required")
		os.Exit(2)
	}
	out, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gitserve: git --exec-path:", err)
		os.Exit(1)
	}
	backend := &cgi.Handler{
		Path: filepath.Join(strings.TrimSpace(string(out)), "git-http-backend"),
		Root: "/",
		Env:  []string{"GIT_PROJECT_ROOT=" + abs, "GIT_HTTP_EXPORT_ALL=1"},
	}
	srv := &http.Server{Addr: *listen, Handler: backend, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(os.Stderr, "gitserve: serving %s on http://%s\n", abs, *listen)
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, "gitserve:", err)
		os.Exit(1)
	}
}
