// Command webhooksink is a local receiver of the deployer's webhooks for
// `make run`: it verifies each delivery's Autoprov-Signature with the
// webhook secrets in a file (one whsec_... a line, read at each delivery,
// so a key created after it started counts), answers 204 when one matches
// and 401 otherwise, appends a line per delivery to its log, and keeps the
// last delivery's raw body and signature header (DIR/last.json,
// DIR/last.sig) so the signature can be checked by hand as docs/webhooks.md
// describes.
//
//	webhooksink -addr 127.0.0.1:9197 -secrets run/dev/secrets/webhook.secret \
//	    -dir run/dev/webhooks -log run/dev/logs/deliveries.log
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/hmacsig"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "webhooksink:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("webhooksink", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:9197", "address to listen on (loopback)")
	secrets := fs.String("secrets", "", "file of webhook secrets (whsec_..., one a line), read at each delivery")
	dir := fs.String("dir", "", "directory the last delivery is kept in (last.json: raw body, last.sig: signature header)")
	logPath := fs.String("log", "", "file a line per delivery is appended to (default stdout)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *secrets == "" || *dir == "" {
		return errors.New("-secrets and -dir are required")
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return err
	}
	out := os.Stdout
	if *logPath != "" {
		f, err := os.OpenFile(*logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return err
		}
		defer f.Close()
		out = f
	}
	s := &sink{secrets: *secrets, dir: *dir, log: out}
	srv := &http.Server{Addr: *addr, Handler: s, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// sink verifies and records deliveries.
type sink struct {
	secrets, dir string
	mu           sync.Mutex
	log          io.Writer
}

// delivery is the log line of one delivery.
type delivery struct {
	Time         time.Time `json:"time"`
	ID           string    `json:"webhook_id"`
	Attempt      string    `json:"attempt"`
	Event        string    `json:"event"`
	DeploymentID string    `json:"deployment_id,omitempty"`
	Status       string    `json:"status,omitempty"`
	Signature    string    `json:"signature"` // "valid", or why not
}

func (s *sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
		return
	}
	header := r.Header.Get(hmacsig.HeaderSignature)
	d := delivery{Time: time.Now().UTC(), ID: r.Header.Get(hmacsig.HeaderID),
		Attempt: r.Header.Get(hmacsig.HeaderAttempt), Event: r.Header.Get(hmacsig.HeaderEvent)}
	var b struct {
		DeploymentID string `json:"deployment_id"`
		Deployment   struct {
			Status string `json:"status"`
		} `json:"deployment"`
	}
	if json.Unmarshal(body, &b) == nil {
		d.DeploymentID, d.Status = b.DeploymentID, b.Deployment.Status
	}
	d.Signature = s.verify(header, body)

	s.mu.Lock()
	defer s.mu.Unlock()
	// The raw body and header, as received, for a check by hand.
	_ = os.WriteFile(filepath.Join(s.dir, "last.json"), body, 0o600)
	_ = os.WriteFile(filepath.Join(s.dir, "last.sig"), []byte(header+"\n"), 0o600)
	line, _ := json.Marshal(d)
	fmt.Fprintf(s.log, "%s\n", line)
	if d.Signature != "valid" {
		http.Error(w, "signature: "+d.Signature, http.StatusUnauthorized)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// verify checks header against body with each secret of the file.
func (s *sink) verify(header string, body []byte) string {
	data, err := os.ReadFile(s.secrets)
	if err != nil {
		return "no secrets: " + err.Error()
	}
	defer clear(data)
	why := "no secret in " + s.secrets
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		secret := strings.TrimSpace(sc.Text())
		if secret == "" {
			continue
		}
		err := hmacsig.Verify(secret, header, body, 5*time.Minute, time.Now())
		if err == nil {
			return "valid"
		}
		why = err.Error()
	}
	return why
}
