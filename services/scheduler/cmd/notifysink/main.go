// Command notifysink is a local receiver of Slack incoming webhooks for
// `make run`: it checks each post as Slack would (JSON, text, rate limit),
// answers "ok" and appends the message to its log, so the notifications
// the scheduler sends can be seen without a Slack workspace.
//
//	notifysink -addr 127.0.0.1:9199 -path /services/local/run/webhook -log run/dev/logs/webhook.log
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/autoprovisioner/autoprovisioner/services/scheduler/internal/notify/notifytest"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "notifysink:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("notifysink", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:9199", "address to listen on (loopback)")
	path := fs.String("path", "/services/local/run/webhook", "the webhook's path")
	logPath := fs.String("log", "", "file the received messages are appended to (default stdout)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	out := os.Stdout
	if *logPath != "" {
		f, err := os.OpenFile(*logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		out = f
	}
	sink := notifytest.NewSlack(*path)
	sink.Log = out
	srv := &http.Server{Addr: *addr, Handler: sink, ReadHeaderTimeout: 10 * time.Second}
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
