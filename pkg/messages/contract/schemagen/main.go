// Command schemagen writes the JSON Schemas of the wire messages into a
// directory. `go generate` (`make generate`) runs it in
// pkg/messages/contract:
//
//	go run ./schemagen -src .. -out ../schema
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages/contract"
)

func main() {
	out := flag.String("out", "schema", "directory to write the *.schema.json files into")
	src := flag.String("src", ".", "directory of package messages (for doc comments)")
	flag.Parse()
	if err := run(*src, *out); err != nil {
		fmt.Fprintln(os.Stderr, "schemagen:", err)
		os.Exit(1)
	}
}

func run(src, out string) error {
	files, err := contract.Generate(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", out, err)
	}
	for _, f := range files {
		path := filepath.Join(out, f.Name)
		if err := os.WriteFile(path, f.Data, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return nil
}
