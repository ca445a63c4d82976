package sources

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/sources/sourcestest"
)

// BenchmarkCheckout measures the source step of a job on a repository of
// about 50 MB (incompressible files, so the pack is that size too): the
// first checkout (clone) and later ones (fetch of the unchanged
// repository, then the checkout of its files). The goal is that an
// unchanged repository adds under 200 ms to a job.
//
//	go test -run '^$' -bench Checkout -benchtime 10x ./internal/sources/
func BenchmarkCheckout(b *testing.B) {
	srv := sourcestest.NewGitServer(b, "tok")
	repo := srv.NewRepo(b, "acme/big.git")
	const files, size = 200, 256 << 10 // 50 MiB
	for i := range files {
		buf := make([]byte, size)
		_, _ = rand.Read(buf)
		p := filepath.Join(repo.Dir, fmt.Sprintf("data/%03d.bin", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	repo.Commit(b, map[string]string{"site.yml": "- hosts: all\n  tasks: []\n"})
	src := Repo{URL: repo.URL, Ref: "main", Token: "tok"}
	newCache := func(b *testing.B) *Cache {
		c, err := NewCache(Config{CacheDir: filepath.Join(b.TempDir(), "cache"), AllowHTTP: true}, zerolog.Nop())
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	var clone, reuse time.Duration
	b.Run("clone", func(b *testing.B) {
		for b.Loop() {
			c := newCache(b)
			start := time.Now()
			if _, err := c.Checkout(context.Background(), src, filepath.Join(b.TempDir(), "src")); err != nil {
				b.Fatal(err)
			}
			clone = time.Since(start)
		}
	})
	b.Run("unchanged", func(b *testing.B) {
		c := newCache(b)
		if _, err := c.Checkout(context.Background(), src, filepath.Join(b.TempDir(), "src")); err != nil {
			b.Fatal(err)
		}
		var total time.Duration
		n := 0
		for b.Loop() {
			dst := filepath.Join(b.TempDir(), "src")
			start := time.Now()
			if _, err := c.Checkout(context.Background(), src, dst); err != nil {
				b.Fatal(err)
			}
			total += time.Since(start)
			n++
			b.StopTimer()
			_ = os.RemoveAll(dst)
			b.StartTimer()
		}
		reuse = total / time.Duration(n)
	})
	play := playTime(b, src, newCache(b))
	fmt.Printf("BenchmarkCheckout: 50 MiB repository: first checkout (clone) %v, unchanged repository (fetch + checkout) %v per job (goal < 200ms); "+
		"the play's own time beside it: %v (ansible-playbook of the checkout's empty play, local connection, median of 3)\n",
		clone.Round(time.Millisecond), reuse.Round(time.Millisecond), play.Round(time.Millisecond))
}

// playTime checks src out with c and returns the median wall time of
// three ansible-playbook runs of its site.yml on localhost over the local
// connection: the play's own time, with no SSH in it.
func playTime(b *testing.B, src Repo, c *Cache) time.Duration {
	dst := filepath.Join(b.TempDir(), "src")
	if _, err := c.Checkout(context.Background(), src, dst); err != nil {
		b.Fatal(err)
	}
	home := b.TempDir()
	var runs []time.Duration
	for range 3 {
		cmd := exec.Command("ansible-playbook", "-i", "localhost,", "-c", "local", "site.yml")
		cmd.Dir = dst
		cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "LANG=C.UTF-8", "ANSIBLE_GATHERING=explicit"}
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("ansible-playbook: %v\n%s", err, out)
		}
		runs = append(runs, time.Since(start))
	}
	slices.Sort(runs)
	return runs[1]
}
