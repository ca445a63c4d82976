package jobs_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"golang.org/x/crypto/ssh"

	"github.com/autoprovisioner/autoprovisioner/pkg/ansible"
	"github.com/autoprovisioner/autoprovisioner/pkg/authz"
	"github.com/autoprovisioner/autoprovisioner/pkg/clock/clocktest"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/runlog"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
	"github.com/autoprovisioner/autoprovisioner/pkg/store"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	"github.com/autoprovisioner/autoprovisioner/services/infra/internal/jobs"
)

// world is what the jobs tests share: a real Postgres database and a real
// Redis database (package jobs talks to both), SSH keys, and the secrets the
// env: backend serves. Each test case uses its own server handles and job
// ids, so cases run in parallel in one world.
type world struct {
	pool *pgxpool.Pool
	rdb  *redis.Client
	// env holds the env: secrets; written only by newWorld.
	env map[string]string
	// clientKey is the default SSH key (PEM), clientPub its public half.
	clientKey []byte
	clientPub string
	// hostKey and otherHostKey are server host keys (authorized_keys).
	hostKey, otherHostKey string
	seq                   atomic.Int64
	// lookups counts the env: reads of each variable, by both resolvers.
	lookups sync.Map // name -> *atomic.Int64
}

// lookupEnv serves w.env and counts the reads.
func (w *world) lookupEnv(name string) (string, bool) {
	n, _ := w.lookups.LoadOrStore(name, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
	v, ok := w.env[name]
	return v, ok
}

// looked returns how often name was read.
func (w *world) looked(name string) int64 {
	if n, ok := w.lookups.Load(name); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

const (
	ghToken   = "ghs_s3cr3tTokenValue0123456789"
	projectEv = "DATABASE_URL=postgres://app:pw-Pr0ject-S3cret@db/app\n"
)

func newWorld(t *testing.T) *world {
	t.Helper()
	opt, err := redis.ParseURL(testenv.RedisDB(t))
	if err != nil {
		t.Fatal(err)
	}
	w := &world{pool: testenv.Pool(t), rdb: redis.NewClient(opt)}
	t.Cleanup(func() { w.rdb.Close() })
	w.clientKey, w.clientPub = newClientKey(t)
	otherKey, _ := newClientKey(t)
	w.hostKey, w.otherHostKey = newHostKey(t), newHostKey(t)
	w.env = map[string]string{
		"AUTOPROV_SECRET_SSH_KEY":   string(w.clientKey),
		"AUTOPROV_SECRET_SSH_KEY_2": string(otherKey),
		"AUTOPROV_SECRET_GH":        ghToken,
		"AUTOPROV_SECRET_PROJECT":   projectEv,
		"AUTOPROV_SECRET_NOT_KEY":   "this is not a private key",
		// What the project resolver serves (PROJECT_SECRETS_ENV_PREFIX).
		"AUTOPROV_PROJECT_GH":  ghToken,
		"AUTOPROV_PROJECT_ENV": projectEv,
	}
	return w
}

func newClientKey(t *testing.T) ([]byte, string) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(block), strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))
}

func newHostKey(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))
}

// fakes are the ports of one handler.
type fakes struct {
	runner   *fakeRunner
	ssh      *fakeSSH
	provider *fakeProvider   // nil: no provider configured
	clock    *clocktest.Fake // nil: the system clock
	runLogs  runlog.Store    // nil: no full run logs kept
	metrics  *prometheus.Registry
}

// newFakes returns fakes whose SSH check passes (the server presenting
// w.hostKey) and whose plays succeed.
func (w *world) newFakes() *fakes {
	return &fakes{
		runner:  newFakeRunner(plays(ansible.OutcomeSucceeded)),
		ssh:     newFakeSSH(passes(w.hostKey)),
		metrics: prometheus.NewRegistry(),
	}
}

// config is a valid handler configuration for the tests.
func config() jobs.Config {
	return jobs.Config{
		Owner:            "test-instance",
		Playbooks:        jobs.DefaultPlaybooks,
		DefaultSSHKeyRef: "env:AUTOPROV_SECRET_SSH_KEY",
		DeploySSHUser:    "deploy",
		MaxDeliveries:    3,
		CancelPoll:       20 * time.Millisecond,
		ProgressTTL:      time.Hour,
		ReinstallOS:      "kvm-debian-12-x86_64",
		ReinstallSSHWait: time.Minute,
		LockCheck:        50 * time.Millisecond,
	}
}

// authzConfig is the operator policy of the tests: unregistered targets in
// 192.0.2.0/24 (TEST-NET-1, never dialed: the SSH checker is a fake), and
// env: references of the project resolver's prefix. The template of a
// server key is an operator's slip that the rule on the service's own
// credentials must catch (TestDeployAuthorization).
var authzConfig = authz.Config{
	AllowNetworks: []string{"192.0.2.0/24"},
	SecretRefs:    []string{"env:AUTOPROV_PROJECT_*", "vault:secret/projects/{project_id}/**", "env:AUTOPROV_SECRET_SERVERKEY"},
}

// handler returns a Handler over the world and f, its config changed by mod.
func (w *world) handler(t *testing.T, f *fakes, mod func(*jobs.Config)) *jobs.Handler {
	t.Helper()
	cfg := config()
	if mod != nil {
		mod(&cfg)
	}
	red := secrets.NewRedactor()
	res, err := secrets.Open(context.Background(), secrets.Config{EnvPrefix: "AUTOPROV_SECRET_"}, secrets.Deps{
		Logger:    zerolog.Nop(),
		Redactor:  red,
		LookupEnv: w.lookupEnv,
	})
	if err != nil {
		t.Fatal(err)
	}
	project, err := secrets.OpenProject(context.Background(), secrets.ProjectConfig{EnvPrefix: "AUTOPROV_PROJECT_"},
		secrets.Config{EnvPrefix: "AUTOPROV_SECRET_"}, secrets.Deps{
			Logger:    zerolog.Nop(),
			Redactor:  red,
			LookupEnv: w.lookupEnv,
		})
	if err != nil {
		t.Fatal(err)
	}
	// This host is loopback only, whatever the test machine's own
	// addresses are (they may be in 192.0.2.0/24 too).
	az, err := authz.New(authzConfig, authz.Options{InterfaceAddrs: func() ([]net.Addr, error) {
		return []net.Addr{&net.IPNet{IP: net.IPv4(127, 0, 0, 1), Mask: net.CIDRMask(8, 32)}}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	deps := jobs.Deps{
		DB:       w.pool,
		Redis:    w.rdb,
		Producer: stream.NewProducer(w.rdb, stream.ProducerOptions{}),
		Secrets:  res,
		Project:  project,
		Authz:    az,
		Redactor: red,
		SSH:      f.ssh,
		Runner:   f.runner,
		Log:      zerolog.New(zerolog.NewTestWriter(t)).With().Timestamp().Logger(),
		Metrics:  jobs.NewMetrics(f.metrics),
	}
	if f.provider != nil {
		deps.Provider = f.provider
	}
	if f.clock != nil {
		deps.Clock = f.clock
	}
	if f.runLogs != nil {
		deps.RunLogs = f.runLogs
	}
	h, err := jobs.New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// addServer registers a server (address in a documentation range: nothing
// is ever dialed) and applies sets, SQL assignments such as "ssh_user =
// 'deploy'".
func (w *world) addServer(t *testing.T, handle string, sets ...string) {
	t.Helper()
	ctx := context.Background()
	if _, err := w.pool.Exec(ctx, `INSERT INTO servers (handle, address, ssh_port, ssh_user) VALUES ($1, '192.0.2.10', 22, 'root')`, handle); err != nil {
		t.Fatal(err)
	}
	for _, set := range sets {
		if _, err := w.pool.Exec(ctx, `UPDATE servers SET `+set+` WHERE handle = $1`, handle); err != nil {
			t.Fatalf("update server %s set %s: %v", handle, set, err)
		}
	}
}

func (w *world) server(t *testing.T, handle string) *store.Server {
	t.Helper()
	s, err := store.GetServer(context.Background(), w.pool, handle)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (w *world) run(t *testing.T, jobID string) *store.Run {
	t.Helper()
	r, err := store.GetRun(context.Background(), w.pool, jobID)
	if err != nil {
		t.Fatalf("run %s: %v", jobID, err)
	}
	return r
}

// message wraps a request as the stream runtime delivers it.
func (w *world) message(t *testing.T, streamName string, req any, deliveries int64) *stream.Message {
	t.Helper()
	data, err := messages.Encode(req)
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("%d-%d", time.Now().UnixMilli(), w.seq.Add(1))
	return &stream.Message{Stream: streamName, ID: id, Values: map[string]any{stream.DataField: string(data)}, Deliveries: max(deliveries, 1)}
}

// provision is a ProvisionerMessage for handle, changed by mods.
func (w *world) provision(t *testing.T, jobID, handle string, deliveries int64, mods ...func(*messages.ProvisionerMessage)) *stream.Message {
	m := &messages.ProvisionerMessage{RequestMeta: messages.RequestMeta{JobID: jobID}, ServerHandle: handle}
	for _, f := range mods {
		f(m)
	}
	return w.message(t, messages.StreamProvisionerQueue, m, deliveries)
}

// entries returns the data of the entries of a stream.
func (w *world) entries(t *testing.T, streamName string) [][]byte {
	t.Helper()
	msgs, err := w.rdb.XRange(context.Background(), streamName, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, m := range msgs {
		s, _ := m.Values[stream.DataField].(string)
		out = append(out, []byte(s))
	}
	return out
}

// provisionResults returns the results published for jobID.
func (w *world) provisionResults(t *testing.T, jobID string) []*messages.ProvisionerResult {
	t.Helper()
	return resultsOf(t, w, messages.StreamProvisionerResults, jobID, messages.DecodeProvisionerResult,
		func(r *messages.ProvisionerResult) string { return r.JobID })
}

// deployResults returns the deploy results published for jobID.
func (w *world) deployResults(t *testing.T, jobID string) []*messages.AnsibleDeployResult {
	t.Helper()
	return resultsOf(t, w, messages.StreamDeployResults, jobID, messages.DecodeAnsibleDeployResult,
		func(r *messages.AnsibleDeployResult) string { return r.JobID })
}

// resultsOf decodes the results on streamName and keeps jobID's.
func resultsOf[R any](t *testing.T, w *world, streamName, jobID string, decode func([]byte) (R, error), job func(R) string) []R {
	t.Helper()
	var out []R
	for _, data := range w.entries(t, streamName) {
		r, err := decode(data)
		if err != nil {
			t.Fatalf("undecodable result on %s: %v", streamName, err)
		}
		if job(r) == jobID {
			out = append(out, r)
		}
	}
	return out
}

// progressTypes returns the types of the progress events of job jobID of
// kind kind.
func (w *world) progressTypes(t *testing.T, kind messages.JobKind, jobID string) []messages.EventType {
	t.Helper()
	var out []messages.EventType
	for _, data := range w.entries(t, messages.ProgressStream(kind, jobID)) {
		ev, err := messages.DecodeProgressEvent(data)
		if err != nil {
			t.Fatalf("undecodable progress event: %v", err)
		}
		out = append(out, ev.Type)
	}
	return out
}

// handle runs h.Handle for msg in the background; interrupt, when set, is
// called once started is closed (the fake Runner's or SSH checker's first
// call) with the cancel function of Handle's context. It returns Handle's
// error.
func handle(t *testing.T, h *jobs.Handler, started <-chan struct{}, msg *stream.Message, interrupt func(cancel context.CancelCauseFunc)) error {
	t.Helper()
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	done := make(chan error, 1)
	go func() { done <- h.Handle(ctx, msg) }()
	if interrupt != nil {
		select {
		case <-started:
		case err := <-done:
			t.Fatalf("Handle returned before the interruption: %v", err)
		case <-time.After(time.Minute):
			t.Fatal("the step to interrupt never started")
		}
		interrupt(cancel)
	}
	select {
	case err := <-done:
		return err
	case <-time.After(2 * time.Minute):
		t.Fatal("Handle did not return")
		return nil
	}
}

// takeLocks takes jobID's run locks from under it, as another run would
// that took them while its session was gone: its leases change holder and
// the Postgres session holding them ends.
func (w *world) takeLocks(t *testing.T, jobID string) {
	t.Helper()
	// One statement: the holder's renewal waits on the leases' rows until
	// it ends, so it cannot see them taken and end its session (its
	// locks) before the session is found here.
	key := store.JobLockKey(jobID)
	var n int
	err := w.pool.QueryRow(context.Background(), `
		WITH taken AS (UPDATE run_leases SET holder = 'another-run' WHERE job = $3)
		SELECT count(pg_terminate_backend(pid)) FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 1 AND classid = $1 AND objid = $2 AND granted
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
		uint32(uint64(key)>>32), uint32(uint64(key)), jobID).Scan(&n)
	if err != nil || n != 1 {
		t.Fatalf("terminate the lock session of %s: %d sessions, %v", jobID, n, err)
	}
}
