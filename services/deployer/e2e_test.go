package main

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"golang.org/x/crypto/ssh"

	"github.com/autoprovisioner/autoprovisioner/ansible/tests/target"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// TestEndToEndWithRealInfra deploys a project through the deployer's API
// with the real infra service, real ansible-playbook and deploy_project.yml
// against a Debian target in its own network namespace, fetching the
// project from a git server that requires the token (given to infra as a
// secret reference). It follows the events, reads the full log, and checks
// that the token is nowhere: not in the API's answers, the log, the
// results or the database.
//
// Two projects share the deployer and infra, each with its key and its
// secrets (a canary in its .env); A's key tries to get B's canary written
// to A's server, as issue 19 did: for B's project (403) and with B's
// reference in A's own (422). Nothing is stored or published, A's reads
// never show B's deployment (404 as an unknown id), and B's canary is
// never on the target, in A's answers, log or events, while A's is.
func TestEndToEndWithRealInfra(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test starts a Debian target in a network namespace and needs root (run it through `make test`)")
	}
	for _, tool := range []string{"ansible-playbook", "ip", "git", "debootstrap"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing (make test installs it): %v", tool, err)
		}
	}
	root, err := target.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// The SSH key infra uses, as a file: secret reference.
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	secretDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(secretDir, "id_ed25519"), pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	pub, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		t.Fatal(err)
	}

	img, err := target.EnsureImage(ctx, target.ImageConfig{CacheDir: filepath.Join(root, ".cache", "testtarget"), Progress: io.Discard})
	if err != nil {
		t.Fatalf("target image: %v", err)
	}
	tdir, err := os.MkdirTemp("", "dptgt")
	if err != nil {
		t.Fatal(err)
	}
	tgt, err := target.Start(ctx, img, target.Options{
		Dir: tdir, AuthorizedKeys: []string{strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub)))},
		PackageCache: filepath.Join(root, ".cache", "testtarget", "debs"), Logger: zerolog.Nop(),
	})
	if err != nil {
		t.Fatalf("start target: %v", err)
	}
	t.Cleanup(func() {
		if err := tgt.Stop(); err != nil {
			t.Errorf("stop target: %v", err)
		}
		os.RemoveAll(tdir)
	})
	standin, err := os.ReadFile(filepath.Join(root, "ansible/tests/testdata/docker-standin.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tgt.Path("/usr/local/bin/docker"), standin, 0o755); err != nil {
		t.Fatal(err)
	}

	// The project, on a git server (dumb HTTP) that wants the token.
	var tb [16]byte
	_, _ = rand.Read(tb[:])
	token := "ghs_" + hex.EncodeToString(tb[:])
	gitURL, git := gitServer(t, tgt.HostAddr, token)

	// The two tenants: A deploys to the target; B's canary must never get
	// there.
	const projectA, projectB = "0b6c1a8e-3f55-4f7e-9a41-7d2b5e6c9f10", "5d1f0c2a-7e3b-4a9c-8d6e-2f4b1a3c5e70"
	envOf := func(project string) string {
		return "AUTOPROV_PROJECT_" + strings.ToUpper(strings.ReplaceAll(project, "-", "_"))
	}
	canaryA, canaryB := "canary-a-"+hex.EncodeToString(tb[:8]), "canary-b-"+hex.EncodeToString(tb[8:])

	dsn := testenv.Postgres(t)
	redisURL := testenv.RedisDB(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// The target is project A's server (issue 31): B's deployments may not
	// reach it.
	if _, err := conn.Exec(ctx, `INSERT INTO servers (handle, address, ssh_port, ssh_user, projects)
		VALUES ('e2e-target', $1, $2, 'root', ARRAY[$3])`, tgt.Addr, tgt.Port, projectA); err != nil {
		t.Fatal(err)
	}

	bins := t.TempDir()
	// Built as `make build` builds them (infra finds runguard next to itself).
	const ap = "github.com/autoprovisioner/autoprovisioner/"
	for _, b := range []struct {
		out, pkg string
		static   bool
	}{
		{"infra", ap + "services/infra", false},
		{"runguard", ap + "pkg/ansible/cmd/runguard", true},
		{"deployer", ".", false},
	} {
		if err := testenv.GoBuild(filepath.Join(bins, b.out), b.pkg, b.static); err != nil {
			t.Fatalf("build %s: %v", b.pkg, err)
		}
	}
	runRoot := testenv.RunRoot(t)
	siteVars := filepath.Join(t.TempDir(), "site.json")
	sv := fmt.Sprintf(`{"project_deploy_git_base_url": %q, "project_deploy_wait_timeout": 30}`, gitURL)
	if err := os.WriteFile(siteVars, []byte(sv), 0o644); err != nil {
		t.Fatal(err)
	}
	common := []string{"DATABASE_URL=" + dsn, "REDIS_URL=" + redisURL, "LOG_FORMAT=json"}
	const secretRefs = "env:AUTOPROV_PROJECT_{PROJECT_ID}_*"
	// infra accepts only requests the deployer signed (issue 8's producer
	// signatures): the deployer's key is in infra's secrets as a file.
	const requestKey = "deployer-request-key-0123456789abcdef-0123456789"
	if err := os.WriteFile(filepath.Join(secretDir, "deployer-request-key"), []byte(requestKey), 0o600); err != nil {
		t.Fatal(err)
	}
	infraEnv := testenv.BinaryEnv(append(common,
		fmt.Sprintf("ADMIN_ADDR=127.0.0.1:%d", testenv.FreePort(t)),
		"PLAYBOOK_DIR="+filepath.Join(root, "ansible"), "PLAYBOOK_RUN_ROOT="+runRoot, "PLAYBOOK_VARS_FILE="+siteVars,
		"SECRETS_FILE_ROOT="+secretDir, "SSH_KEY_REF=file:id_ed25519",
		"REQUEST_SIGNATURES=require", "REQUEST_KEYS=deployer-1@ansible:deploy:queue=file:deployer-request-key",
		// The projects' secrets come from the project resolver's
		// environment, each project's variables its own (issue 8's
		// authorization, checked by the deployer too).
		"PROJECT_SECRETS_ENV_PREFIX=AUTOPROV_PROJECT_", "DEPLOY_SECRET_REFS="+secretRefs,
		envOf(projectA)+"_GH="+token, envOf(projectA)+"_ENV=APP_CANARY="+canaryA,
		envOf(projectB)+"_GH="+canaryB, envOf(projectB)+"_ENV=APP_CANARY="+canaryB)...)
	infra := testenv.StartBinary(t, filepath.Join(bins, "infra"), infraEnv)
	api := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	deployer := testenv.StartBinary(t, filepath.Join(bins, "deployer"), testenv.BinaryEnv(append(common, "API_ADDR="+api, "ADMIN_ADDR="+admin,
		"REQUEST_SIGNING_KEY_ID=deployer-1", "REQUEST_SIGNING_KEY="+requestKey, "DEPLOY_SECRET_REFS="+secretRefs)...))
	deployer.WaitHTTP("http://"+admin+"/readyz", 200, 2*time.Minute)

	newKey := func(name, project string) string {
		out, stderr, code := testenv.RunBinary(t, filepath.Join(bins, "deployer"), testenv.BinaryEnv(common...),
			"keys", "create", "--name", name, "--scopes", "deployments:write", "--project", project, "--json")
		if code != 0 {
			t.Fatalf("keys create: %s", stderr)
		}
		var created map[string]any
		if err := json.Unmarshal([]byte(out), &created); err != nil {
			t.Fatal(err)
		}
		return created["key"].(string)
	}
	key, keyB := newKey("e2e", projectA), newKey("e2e-b", projectB)
	callAs := func(key, method, path, body string) (int, string) { return apiCall(t, api, key, method, path, body) }
	call := func(method, path, body string) (int, string) { return callAs(key, method, path, body) }

	requestFor := func(project, server, repo, secretsOf string) string {
		return fmt.Sprintf(`{"project_id":%q,"repo_full_name":%q,"server_ip":%q,"port":8080,"modules":["web"],
			"github_token_ref":"env:%s_GH","secrets_ref":"env:%s_ENV","options":{"timeout_seconds":600}}`,
			project, repo, server, envOf(secretsOf), envOf(secretsOf))
	}
	body := requestFor(projectA, tgt.Addr, "acme/shop", projectA)

	// The attack of issue 19: A's key, B's secrets, A's server.
	bRead := tenantAttacks(t, tenantAttack{
		callA: call, callB: func(method, path, body string) (int, string) { return callAs(keyB, method, path, body) },
		conn: conn, redisURL: redisURL,
		forB:       requestFor(projectB, tgt.Addr, "acme/shop", projectB),
		bRefsInA:   requestFor(projectA, tgt.Addr, "acme/shop", projectB),
		bElsewhere: requestFor(projectB, "192.0.2.10", "acme/shop", projectB),
	})

	// B's key, B's project, A's server: refused before anything is stored.
	if code, resp := callAs(keyB, "POST", "/deployments", requestFor(projectB, tgt.Addr, "acme/shop", projectB)); code != 422 ||
		!strings.Contains(resp, `"field":"server_ip"`) {
		t.Fatalf("B's deployment on A's server: %d %s", code, resp)
	}
	code, resp := call("POST", "/deployments", body)
	if code != 202 {
		t.Fatalf("submit: %d %s", code, resp)
	}
	var d struct {
		ID     string `json:"id"`
		Status string `json:"status"`
		Result *struct {
			Status string         `json:"status"`
			Hosts  map[string]any `json:"hosts"`
			Error  any            `json:"error"`
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(resp), &d); err != nil {
		t.Fatal(err)
	}
	// Follow the events live while it runs.
	events := followEvents(t, "http://"+api+"/api/v1/deployments/"+d.ID+"/events", key)

	code, resp = call("GET", "/deployments/"+d.ID+"?wait=5m", "")
	if err := json.Unmarshal([]byte(resp), &d); err != nil {
		t.Fatal(err)
	}
	if code != 200 || d.Status != "succeeded" || d.Result == nil || d.Result.Hosts["e2e-target"] == nil {
		t.Fatalf("deployment: %d %s\ninfra:\n%s", code, resp, infra.Stderr())
	}
	sse := <-events
	evs, sseText := sse.types, sse.text
	if len(evs) < 5 || evs[0] != "run_started" || evs[len(evs)-1] != "run_finished" {
		t.Errorf("events: %v", evs)
	}
	code, log := call("GET", "/deployments/"+d.ID+"/log", "")
	if code != 200 || !strings.Contains(log, "PLAY RECAP") || !strings.Contains(log, "e2e-target") {
		t.Errorf("log: %d\n%s", code, log)
	}
	if n := git.refused.Load(); n != 0 {
		t.Errorf("the git server refused %d requests", n)
	}
	if got, err := os.ReadFile(tgt.Path("/var/log/docker-standin.log")); err != nil || !strings.Contains(string(got), "compose") {
		t.Errorf("compose was not called on the target: %v %s", err, got)
	}

	// Cancel while running: a release that never comes up keeps the play
	// waiting; the cancel key stops it.
	code, resp2 := call("POST", "/deployments", strings.Replace(body, "acme/shop", "acme/broken", 1))
	if code != 202 {
		t.Fatalf("submit broken: %d %s", code, resp2)
	}
	var running struct{ ID, Status string }
	_ = json.Unmarshal([]byte(resp2), &running)
	testenv.WaitFor(t, 5*time.Minute, "the broken release to be waited for", func() bool {
		got, _ := os.ReadFile(tgt.Path("/var/log/docker-standin.log"))
		return strings.Count(string(got), " up ") >= 2
	})
	if code, r := call("DELETE", "/deployments/"+running.ID, ""); code != 202 {
		t.Fatalf("cancel running: %d %s", code, r)
	}
	code, resp2 = call("GET", "/deployments/"+running.ID+"?wait=3m", "")
	if err := json.Unmarshal([]byte(resp2), &running); err != nil || code != 200 || running.Status != "cancelled" {
		t.Fatalf("cancelled running deployment: %d %s", code, resp2)
	}

	// Cancel while queued: with infra stopped, the deployment is cancelled
	// at once; infra, started again, publishes the cancelled result and
	// never runs it.
	infra.Signal(syscall.SIGTERM)
	if c := infra.Wait(time.Minute); c != 0 {
		t.Errorf("infra exit %d", c)
	}
	code, resp3 := call("POST", "/deployments", body)
	var queued struct{ ID, JobID, Status string }
	if err := json.Unmarshal([]byte(resp3), &queued); err != nil || code != 202 {
		t.Fatalf("submit: %d %s", code, resp3)
	}
	if code, r := call("DELETE", "/deployments/"+queued.ID, ""); code != 200 || !strings.Contains(r, `"status":"cancelled"`) {
		t.Fatalf("cancel queued: %d %s", code, r)
	}
	infra2 := testenv.StartBinary(t, filepath.Join(bins, "infra"), infraEnv)
	testenv.WaitFor(t, 2*time.Minute, "infra to publish the stored cancelled result", func() bool {
		return strings.Contains(infra2.Stderr(), "publishing its stored result again")
	})
	var owner *string
	var state string
	if err := conn.QueryRow(ctx, `SELECT owner, state FROM runs WHERE job_id = $1`, queued.ID).Scan(&owner, &state); err != nil || owner != nil || state != "done" {
		t.Errorf("the cancelled job's run: owner %v, state %q, %v (it must never have started)", owner, state, err)
	}

	// The token is nowhere but where it belongs.
	header := base64.StdEncoding.EncodeToString([]byte("x-access-token:" + token))
	places := map[string]string{"deployment": resp, "log": log, "infra logs": infra.Stderr() + infra2.Stderr(), "deployer logs": deployer.Stderr()}
	// B's canary reached none of A's reads, nor the target; A's own did
	// reach the target (the check can see a canary).
	_, listA := call("GET", "/deployments?limit=100", "")
	for where, text := range map[string]string{"A's deployment": resp, "A's log": log, "A's events": sseText, "A's list": listA,
		"A's reads of B's deployment": bRead, "infra logs": infra.Stderr() + infra2.Stderr(), "deployer logs": deployer.Stderr()} {
		if strings.Contains(text, canaryB) {
			t.Errorf("B's canary is in %s", where)
		}
	}
	onTarget := targetFiles(t, tgt.Path("/"), "srv", "root", "home", "tmp", "var/tmp", "opt", "etc")
	if strings.Contains(onTarget, canaryB) {
		t.Error("B's canary is on A's server")
	}
	if !strings.Contains(onTarget, canaryA) {
		t.Error("A's canary is not on A's server: the check of the target sees nothing")
	}
	rows, err := conn.Query(ctx, `SELECT 'deployments', row_to_json(d)::text FROM deployments d
		UNION ALL SELECT 'runs', row_to_json(r)::text FROM runs r UNION ALL SELECT 'run_logs', encode(content, 'base64') FROM run_logs`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var table, row string
		if err := rows.Scan(&table, &row); err != nil {
			t.Fatal(err)
		}
		places["table "+table] += row
	}
	rows.Close()
	for where, text := range places {
		if strings.Contains(text, token) || strings.Contains(text, header) {
			t.Errorf("the git token is in the %s", where)
		}
		if strings.Contains(text, requestKey) {
			t.Errorf("the request signing key is in the %s", where)
		}
	}
}

// gitServer serves the project's bare repository with git's smart HTTP
// server (git http-backend behind net/http/cgi) on addr, answering only
// requests with the token as GitHub takes it; it returns the base URL and a
// count of refused requests.
func gitServer(t *testing.T, addr, token string) (string, *gitCounts) {
	t.Helper()
	dir := t.TempDir()
	work := filepath.Join(dir, "work")
	bare := filepath.Join(dir, "repos", "acme", "shop.git")
	git := gitRunner(t, dir)
	git("init", "-q", "--initial-branch=main", work)
	compose := "services:\n  web:\n    image: nginx\n    ports: [\"${PORT}:80\"]\n    profiles: [web]\n"
	if err := os.WriteFile(filepath.Join(work, "compose.yml"), []byte(compose), 0o644); err != nil {
		t.Fatal(err)
	}
	git("-C", work, "add", "-A")
	git("-C", work, "commit", "-q", "-m", "release")
	git("clone", "-q", "--bare", work, bare)
	// acme/broken: a release whose stack never comes up (the docker
	// stand-in serves nothing for it), so its deploy waits, then rolls back.
	if err := os.WriteFile(filepath.Join(work, "standin-fail"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git("-C", work, "add", "-A")
	git("-C", work, "commit", "-q", "-m", "broken release")
	git("clone", "-q", "--bare", work, filepath.Join(dir, "repos", "acme", "broken.git"))
	return serveRepos(t, addr, token, filepath.Join(dir, "repos"))
}

// serveRepos serves the bare repositories under root over smart HTTP
// (git http-backend) on addr, to clients that send token as basic
// authentication (x-access-token:<token>); it returns its URL and what it
// counted.
func serveRepos(t testing.TB, addr, token, root string) (string, *gitCounts) {
	t.Helper()
	execPath, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatal(err)
	}
	backend := &cgi.Handler{
		Path: filepath.Join(strings.TrimSpace(string(execPath)), "git-http-backend"),
		Root: "/",
		Env:  []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"},
	}
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+token))
	counts := &gitCounts{}
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != want {
			counts.refused.Add(1)
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/git-upload-pack") {
			counts.uploadPacks.Add(1)
		}
		backend.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return "http://" + l.Addr().String(), counts
}

// gitCounts are what serveRepos counted: requests refused for their
// authentication, and upload-pack requests (each fetch or clone sends one
// or two: ls-refs, then fetch when something is missing).
type gitCounts struct{ refused, uploadPacks atomic.Int32 }

// sseRead is what followEvents read: the event types and the whole text.
type sseRead struct {
	types []string
	text  string
}

// followEvents reads a deployment's SSE stream to its end and sends the
// event types read, with the stream's text.
func followEvents(t *testing.T, url, key string) <-chan sseRead {
	ch := make(chan sseRead, 1)
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer resp.Body.Close()
		var types []string
		var text strings.Builder
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			text.WriteString(sc.Text() + "\n")
			if ev, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
				types = append(types, ev)
			}
		}
		ch <- sseRead{types: types, text: text.String()}
	}()
	return ch
}
