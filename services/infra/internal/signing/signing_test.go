package signing_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/signing"
)

var (
	schedulerKey = []byte("scheduler-key-0123456789abcdef0123456789abcdef")
	deployerKey  = []byte("deployer-key-0123456789abcdef0123456789abcdefgh")
)

// resolver reads keys from files under a root, as infra's own resolver
// would with SECRETS_FILE_ROOT.
func resolver(t *testing.T) signing.Resolve {
	t.Helper()
	dir := t.TempDir()
	for name, key := range map[string][]byte{"scheduler-1": schedulerKey, "deployer-1": deployerKey} {
		if err := os.WriteFile(filepath.Join(dir, name), append(key, '\n'), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	fb, err := secrets.NewFileBackend(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fb.Close() })
	res, err := secrets.NewResolver(secrets.ResolverOptions{File: fb, Redactor: secrets.NewRedactor()})
	if err != nil {
		t.Fatal(err)
	}
	return res.Resolve
}

// TestSignaturesDecideWhatIsHandled runs a real consumer on two request
// streams behind the Checker and appends entries a producer and a forger
// would write: only those a known producer signed for that stream (and,
// in verify mode, unsigned ones) reach the handler; the others are
// dead-lettered with their reason and never handled.
func TestSignaturesDecideWhatIsHandled(t *testing.T) {
	for _, mode := range []string{signing.ModeVerify, signing.ModeRequire} {
		t.Run(mode, func(t *testing.T) {
			rdb := testenv.Redis(t)
			prov, dep := testenv.Unique("prov-"), testenv.Unique("dep-")
			cfg := signing.Config{Mode: mode, Keys: []string{
				"scheduler-1@" + prov + "=file:scheduler-1",
				"deployer-1@" + dep + "=file:deployer-1",
			}}
			checker, err := signing.New(context.Background(), cfg, resolver(t), zerolog.Nop())
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			handled := map[string]bool{}
			h := checker.Handler(stream.HandlerFunc(func(_ context.Context, msg *stream.Message) error {
				mu.Lock()
				defer mu.Unlock()
				handled[string(msg.Data())] = true
				return nil
			}))
			c, err := stream.NewConsumer(rdb, stream.Config{Group: "infra", Streams: []string{prov, dep}, Lease: time.Second}, h)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })

			add := func(s, data, sig string) {
				values := map[string]any{messages.DataField: data}
				if sig != "" {
					values[messages.SigField] = sig
				}
				if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: s, Values: values}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			sign := func(id string, key []byte, s, data string) string {
				sig, err := messages.Sign(id, key, s, []byte(data))
				if err != nil {
					t.Fatal(err)
				}
				return sig
			}
			add(prov, "signed-by-scheduler", sign("scheduler-1", schedulerKey, prov, "signed-by-scheduler"))
			add(dep, "signed-by-deployer", sign("deployer-1", deployerKey, dep, "signed-by-deployer"))
			add(prov, "unsigned", "")
			add(dep, "unsigned-deploy", "")
			add(prov, "deployer-key-on-the-wrong-queue", sign("deployer-1", deployerKey, prov, "deployer-key-on-the-wrong-queue"))
			add(dep, "tampered", sign("deployer-1", deployerKey, dep, "original"))
			add(dep, "forged-key", sign("deployer-1", []byte("guessed-key-0123456789abcdef0123456789"), dep, "forged-key"))
			add(prov, "replayed-from-the-other-queue", sign("deployer-1", deployerKey, dep, "replayed-from-the-other-queue"))

			want := map[string]bool{"signed-by-scheduler": true, "signed-by-deployer": true}
			wantDead := 4
			if mode == signing.ModeVerify {
				want["unsigned"], want["unsigned-deploy"] = true, true
			} else {
				wantDead = 6
			}
			testenv.WaitFor(t, 20*time.Second, "every entry settled", func() bool {
				n1, _ := rdb.XLen(context.Background(), prov+stream.DeadLetterSuffix).Result()
				n2, _ := rdb.XLen(context.Background(), dep+stream.DeadLetterSuffix).Result()
				mu.Lock()
				defer mu.Unlock()
				return int(n1+n2) == wantDead && len(handled) == len(want)
			})
			mu.Lock()
			for d := range handled {
				if !want[d] {
					t.Errorf("handled %q", d)
				}
			}
			mu.Unlock()
			reasons := map[string]int{}
			for _, s := range []string{prov, dep} {
				dead, err := rdb.XRange(context.Background(), s+stream.DeadLetterSuffix, "-", "+").Result()
				if err != nil {
					t.Fatal(err)
				}
				for _, d := range dead {
					reasons[d.Values[stream.DeadFieldReason].(string)]++
				}
			}
			if reasons[signing.ReasonBadSignature] != 4 || reasons[signing.ReasonUnsigned] != wantDead-4 {
				t.Errorf("dead-letter reasons %v", reasons)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	for _, bad := range []signing.Config{
		{Mode: "maybe"},
		{Mode: signing.ModeRequire},
		{Mode: signing.ModeVerify, Keys: []string{"no-stream=file:k"}},
		{Mode: signing.ModeVerify, Keys: []string{"k@s"}},
		{Mode: signing.ModeVerify, Keys: []string{"k@s=not a ref"}},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	if err := (signing.Config{Mode: signing.ModeVerify}).Validate(); err != nil {
		t.Errorf("default: %v", err)
	}
}
