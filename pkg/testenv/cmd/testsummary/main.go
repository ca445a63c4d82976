// Command testsummary turns `go test -json` into the log `make test` prints
// and ends it with the slowest packages.
//
//	go test -json ./... | tee lane.json | testsummary stream
//	testsummary table [-n 15] [-wall 612] lane1.json lane2.json
//
// stream prints what a plain `go test` prints (each package's ok/FAIL line,
// build errors, output outside tests) plus the whole output of every failed
// test, and drops the output of tests that passed. It exits 1 when anything
// failed. table reads the saved JSON of every lane and prints the slowest
// packages, the counts and the total time, then each failed test with the
// last lines it logged from a file:line (its t.Error and t.Fatal messages,
// never the logs dumped under them): a log's tail tells why a run failed.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output, build-fail
	Test       string
	Output     string
	Elapsed    float64
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testsummary stream | testsummary table [-n N] [-wall SECONDS] FILE...")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "stream":
		failed, err := stream(os.Stdin, os.Stdout)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testsummary:", err)
			os.Exit(2)
		}
		if failed {
			os.Exit(1)
		}
	case "table":
		fs := flag.NewFlagSet("table", flag.ExitOnError)
		n := fs.Int("n", 15, "packages to list")
		wall := fs.Float64("wall", 0, "wall-clock seconds of the whole run, printed as the total")
		_ = fs.Parse(os.Args[2:])
		if err := table(os.Stdout, fs.Args(), *n, *wall); err != nil {
			fmt.Fprintln(os.Stderr, "testsummary:", err)
			os.Exit(2)
		}
	default:
		fmt.Fprintf(os.Stderr, "testsummary: unknown mode %q\n", os.Args[1])
		os.Exit(2)
	}
}

// stream copies the readable part of the events on r to w; it reports
// whether any test, package or build failed.
func stream(r io.Reader, w io.Writer) (bool, error) {
	// Output of each running top-level test (subtests included), by package.
	buf := map[string]map[string]*strings.Builder{}
	failed := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			// Not an event (go command errors reach stdout this way): show it.
			fmt.Fprintln(w, string(line))
			continue
		}
		switch {
		case e.Action == "build-output":
			fmt.Fprint(w, e.Output)
		case e.Action == "build-fail":
			failed = true
		case e.Test == "":
			switch e.Action {
			case "output":
				if e.Output != "PASS\n" {
					fmt.Fprint(w, e.Output)
				}
			case "fail":
				failed = true
				// Tests cut short (a timeout, a panic) never reported an end:
				// show what they printed.
				for _, b := range buf[e.Package] {
					fmt.Fprint(w, b.String())
				}
				delete(buf, e.Package)
			case "pass", "skip":
				delete(buf, e.Package)
			}
		default:
			top, _, _ := strings.Cut(e.Test, "/")
			tests := buf[e.Package]
			if tests == nil {
				tests = map[string]*strings.Builder{}
				buf[e.Package] = tests
			}
			b := tests[top]
			if b == nil {
				b = &strings.Builder{}
				tests[top] = b
			}
			switch e.Action {
			case "output":
				b.WriteString(e.Output)
			case "fail":
				failed = true
				if e.Test == top {
					fmt.Fprint(w, b.String())
					delete(tests, top)
				}
			case "pass", "skip":
				if e.Test == top {
					delete(tests, top)
				}
			}
		}
	}
	return failed, sc.Err()
}

// pkgResult is one package's end.
type pkgResult struct {
	name    string
	action  string
	elapsed float64
}

// table prints the n slowest packages of the runs saved in files.
func table(w io.Writer, files []string, n int, wall float64) error {
	var results []pkgResult
	for _, f := range files {
		r, err := readResults(f)
		if err != nil {
			return err
		}
		results = append(results, r...)
	}
	sort.Slice(results, func(i, j int) bool { return results[i].elapsed > results[j].elapsed })
	var sum float64
	count := map[string]int{}
	for _, r := range results {
		sum += r.elapsed
		count[r.action]++
	}
	fmt.Fprintf(w, "\nslowest %d packages (of %d with tests):\n", min(n, len(results)), len(results))
	for i, r := range results {
		if i == n {
			break
		}
		fmt.Fprintf(w, "  %8s  %-4s  %s\n", seconds(r.elapsed), r.action, r.name)
	}
	fmt.Fprintf(w, "packages: %d ok, %d failed; sum of package times %s",
		count["pass"], count["fail"], seconds(sum))
	if wall > 0 {
		fmt.Fprintf(w, "; total (wall clock) %s", seconds(wall))
	}
	fmt.Fprintln(w)
	for _, f := range files {
		if err := failures(w, f); err != nil {
			return err
		}
	}
	return nil
}

// failLines is how many of a failed test's file:line lines table shows.
const failLines = 6

// located matches the first line of what t.Log, t.Error and t.Fatal print.
var located = regexp.MustCompile(`^\s*[\w.-]+\.go:\d+: `)

// failures prints the failed tests recorded in file, each with its last
// failLines located lines (cut to 300 bytes).
func failures(w io.Writer, file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	lines := map[string][]string{} // package + test -> its located lines
	subFailed := map[string]bool{} // package + test -> a subtest of it failed
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		if e.Test == "" {
			if e.Action == "fail" { // tests cut short (a timeout, a panic)
				for key, ls := range lines {
					if pkg, test, _ := strings.Cut(key, " "); pkg == e.Package {
						printFailure(w, "UNFINISHED", test, pkg, ls)
						delete(lines, key)
					}
				}
			}
			continue
		}
		key := e.Package + " " + e.Test
		switch e.Action {
		case "output":
			if located.MatchString(e.Output) {
				l := strings.TrimSpace(e.Output)
				if len(l) > 300 {
					l = l[:300] + " …"
				}
				lines[key] = append(lines[key], l)
			}
		case "fail":
			if parent, _, sub := strings.Cut(e.Test, "/"); sub {
				subFailed[e.Package+" "+parent] = true
			}
			// A test whose subtests failed adds nothing to their lines.
			if !subFailed[key] {
				printFailure(w, "FAILED", e.Test, e.Package, lines[key])
			}
			delete(lines, key)
		case "pass", "skip":
			delete(lines, key)
		}
	}
	return sc.Err()
}

// printFailure prints a test's end and its last failLines located lines,
// in their order. A line ending in ":" heads a dump (a log a cleanup
// prints after the failure) and says nothing on its own: those are shown
// only when fewer other lines fill the room, so that the failure's own
// message is not pushed out by them.
func printFailure(w io.Writer, how, test, pkg string, lines []string) {
	fmt.Fprintf(w, "%s %s (%s)\n", how, test, pkg)
	keep := make([]bool, len(lines))
	room := failLines
	for _, headers := range []bool{false, true} {
		for i := len(lines) - 1; i >= 0 && room > 0; i-- {
			if !keep[i] && strings.HasSuffix(lines[i], ":") == headers {
				keep[i] = true
				room--
			}
		}
	}
	for i, l := range lines {
		if keep[i] {
			fmt.Fprintf(w, "    %s\n", l)
		}
	}
}

// readResults returns the package ends recorded in file.
func readResults(file string) ([]pkgResult, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []pkgResult
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Test != "" || e.Package == "" {
			continue
		}
		switch e.Action {
		case "pass", "fail":
			out = append(out, pkgResult{name: e.Package, action: e.Action, elapsed: e.Elapsed})
		}
	}
	return out, sc.Err()
}

func seconds(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(100 * time.Millisecond).String()
}
