package cli

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/mattn/go-isatty"
)

// progressAfter is how long a step runs before its progress shows: quick
// steps print nothing.
const progressAfter = time.Second

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

// progress shows on stderr that a step (what) is running, once it has run
// for progressAfter: on a terminal, a spinner line with the elapsed time,
// redrawn until the step ends and then cleared; elsewhere one plain line;
// with --json nothing (scripts read stdout, and stderr stays for errors).
// Call the returned function when the step ends.
func (g *globals) progress(what string) (done func()) {
	if g.json {
		return func() {}
	}
	after := g.progressAfter
	if after == 0 {
		after = progressAfter
	}
	w := g.env.Stderr
	tty := isTerminal(w)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		start := time.Now()
		select {
		case <-stop:
			return
		case <-time.After(after):
		}
		if !tty {
			fmt.Fprintf(w, "autoprov: %s ...\n", what)
			return
		}
		frames := []rune("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			fmt.Fprintf(w, "\r\033[K%c %s (%ds)", frames[i%len(frames)], what, int(time.Since(start).Seconds()))
			select {
			case <-stop:
				fmt.Fprint(w, "\r\033[K")
				return
			case <-t.C:
			}
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			close(stop)
			wg.Wait()
		})
	}
}
