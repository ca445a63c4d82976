package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// events is a go test -json run: one passing test with output, one failing
// subtest, a package that timed out inside a test, and a build failure.
const events = `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestOK"}
{"Action":"output","Package":"p","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"p","Test":"TestOK","Output":"quiet when passing\n"}
{"Action":"pass","Package":"p","Test":"TestOK","Elapsed":0.1}
{"Action":"output","Package":"p","Test":"TestBad","Output":"printed by bad\n"}
{"Action":"output","Package":"p","Test":"TestBad/sub","Output":"    a_test.go:4: boom\n"}
{"Action":"output","Package":"p","Test":"TestBad/sub","Output":"    a_test.go:9: log 1 of the server:\n"}
{"Action":"output","Package":"p","Test":"TestBad/sub","Output":"        a line of the log\n"}
{"Action":"output","Package":"p","Test":"TestBad/sub","Output":"    a_test.go:9: log 2 of the server:\n"}
{"Action":"output","Package":"p","Test":"TestBad/sub","Output":"    a_test.go:9: log 3 of the server:\n"}
{"Action":"output","Package":"p","Test":"TestBad/sub","Output":"    a_test.go:9: log 4 of the server:\n"}
{"Action":"output","Package":"p","Test":"TestBad/sub","Output":"    a_test.go:9: log 5 of the server:\n"}
{"Action":"output","Package":"p","Test":"TestBad/sub","Output":"    a_test.go:9: log 6 of the server:\n"}
{"Action":"fail","Package":"p","Test":"TestBad/sub","Elapsed":0}
{"Action":"fail","Package":"p","Test":"TestBad","Elapsed":0}
{"Action":"output","Package":"p","Output":"PASS\n"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t1.5s\n"}
{"Action":"fail","Package":"p","Elapsed":1.5}
{"Action":"output","Package":"q","Test":"TestHang","Output":"last words of a hung test\n"}
{"Action":"output","Package":"q","Test":"TestHang","Output":"    hang_test.go:9: waiting on\n"}
{"Action":"output","Package":"q","Output":"panic: test timed out\n"}
{"Action":"fail","Package":"q","Elapsed":600}
{"ImportPath":"r [r.test]","Action":"build-output","Output":"r/x.go:1: syntax error\n"}
{"ImportPath":"r [r.test]","Action":"build-fail"}
{"Action":"output","Package":"s","Output":"ok  \ts\t0.2s\n"}
{"Action":"pass","Package":"s","Elapsed":0.2}
not json: go: some error
`

func TestStream(t *testing.T) {
	var out strings.Builder
	failed, err := stream(strings.NewReader(events), &out)
	if err != nil || !failed {
		t.Fatalf("failed=%v err=%v, want a failure reported", failed, err)
	}
	got := out.String()
	for _, want := range []string{"printed by bad", "boom", "FAIL\tp\t1.5s", "last words of a hung test",
		"panic: test timed out", "syntax error", "ok  \ts\t0.2s", "not json: go: some error"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, unwanted := range []string{"quiet when passing", "PASS\n"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("output has %q:\n%s", unwanted, got)
		}
	}
}

func TestTable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "lane.json")
	if err := os.WriteFile(file, []byte(events), 0o600); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := table(&out, []string{file}, 2, 612); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) < 4 || !strings.HasSuffix(lines[1], "  q") || !strings.HasSuffix(lines[2], "  p") {
		t.Fatalf("want the two slowest, q then p:\n%s", got)
	}
	// Then the failed subtest with its message, not its parent, and the
	// test a timeout cut short. The headers of the dumps its cleanups
	// printed after the message fill what room is left, not all of it.
	if want := "FAILED TestBad/sub (p)\n    a_test.go:4: boom\n    a_test.go:9: log 2 of the server:\n" +
		"    a_test.go:9: log 3 of the server:\n    a_test.go:9: log 4 of the server:\n" +
		"    a_test.go:9: log 5 of the server:\n    a_test.go:9: log 6 of the server:\nUNFINISHED TestHang (q)\n    hang_test.go:9: waiting on\n"; !strings.HasSuffix(got, want) {
		t.Errorf("the failures do not end the table, want %q:\n%s", want, got)
	}
	if !strings.Contains(got, "1 ok, 2 failed") || !strings.Contains(got, "total (wall clock) 10m12s") {
		t.Errorf("summary line wrong:\n%s", got)
	}
}
