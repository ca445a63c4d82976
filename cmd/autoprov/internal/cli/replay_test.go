package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/stream"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// replayLog returns the JSON log line of `dead replay` on stderr.
func replayLog(t *testing.T, stderr string) map[string]any {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(stderr))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["command"] == "dead replay" {
			return m
		}
	}
	t.Fatalf("no replay log line on stderr:\n%s", stderr)
	return nil
}

// osUser is the operator autoprov names: the OS user running the test.
func osUser(t *testing.T) string {
	t.Helper()
	u, err := user.Current()
	if err != nil || u.Username == "" {
		t.Fatalf("current user: %v", err)
	}
	return u.Username
}

// TestReplayForgedRequest: an unsigned request injected into the queue is
// dead-lettered by the real infra (REQUEST_SIGNATURES=require); `dead
// replay` refuses it, as does --resign answered "n" or with no terminal to
// ask on; --resign --yes re-signs it with autoprov's key and a new job id,
// and infra accepts it. A dead letter infra refused for another reason goes
// back with the producer's data and sig bytes unchanged, and infra still
// accepts that signature. Each replay is logged with the operator and the
// dead letter's id, and the operator is recorded on the replayed entry.
func TestReplayForgedRequest(t *testing.T) {
	t.Parallel()
	bin := serviceBinaries(t)
	url, rdb := redisDB(t)
	ctx := context.Background()
	ansibleDir := t.TempDir()
	playbooks := filepath.Join(ansibleDir, "playbooks")
	if err := os.Mkdir(playbooks, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ansibleDir, "ansible.cfg"), []byte("[defaults]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runRoot := testenv.RunRoot(t)
	admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	infra := testenv.StartBinary(t, filepath.Join(bin, "infra"), testenv.BinaryEnv(
		"REDIS_URL="+url,
		"DATABASE_URL="+testenv.Postgres(t),
		"ADMIN_ADDR="+admin,
		"LOG_FORMAT=json",
		"PLAYBOOK_DIR="+ansibleDir,
		"PLAYBOOK_RUN_ROOT="+runRoot,
		"PLAYBOOK_FACT_CACHE="+t.TempDir(),
		"STREAM_LEASE=2s",
		"STREAM_RETRY_BACKOFF=200ms",
		"SHUTDOWN_GRACE=5s",
		"REQUEST_SIGNATURES=require",
		"REQUEST_KEYS=scheduler-1@"+messages.StreamProvisionerQueue+"=env:AUTOPROV_SECRET_SCHEDULER_KEY,"+
			"autoprov-1@"+messages.StreamProvisionerQueue+"=env:AUTOPROV_SECRET_AUTOPROV_KEY",
		"AUTOPROV_SECRET_SCHEDULER_KEY="+schedulerKey,
		"AUTOPROV_SECRET_AUTOPROV_KEY="+cliKey,
	))
	infra.WaitHTTP("http://"+admin+"/readyz", 200, time.Minute)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("infra logs:\n%s", infra.Stderr())
		}
	})
	me := osUser(t)
	q := messages.StreamProvisionerQueue
	deadStream := q + stream.DeadLetterSuffix
	env := map[string]string{"REDIS_URL": url, "REQUEST_SIGNING_KEY_ID": "autoprov-1", "REQUEST_SIGNING_KEY": cliKey}

	// The forged request: unsigned, written by someone with Redis access.
	forged := provisionRequest(t, "forged-1", "web-forged")
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: q, Values: map[string]any{messages.DataField: forged}}).Err(); err != nil {
		t.Fatal(err)
	}
	// A request the scheduler signed, refused for a playbook infra lacks.
	msg := &messages.ProvisionerMessage{RequestMeta: messages.RequestMeta{JobID: "extra-1"}, ServerHandle: "web-2", Playbooks: []string{"later.yml"}}
	extra, err := messages.Encode(msg)
	if err != nil {
		t.Fatal(err)
	}
	extraSig, err := messages.Sign("scheduler-1", []byte(schedulerKey), q, extra)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: q, Values: map[string]any{messages.DataField: extra, stream.SigField: extraSig}}).Err(); err != nil {
		t.Fatal(err)
	}
	var dead []redis.XMessage
	for range 1500 {
		if dead, _ = rdb.XRange(ctx, deadStream, "-", "+").Result(); len(dead) == 2 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	byReason := map[string]redis.XMessage{}
	for _, d := range dead {
		byReason[fmt.Sprint(d.Values[stream.DeadFieldReason])] = d
	}
	unsigned, ok1 := byReason[messages.ReasonUnsigned]
	invalid, ok2 := byReason[string(messages.KindInvalidMessage)]
	if len(dead) != 2 || !ok1 || !ok2 {
		t.Fatalf("dead letters %v, want one unsigned and one invalid_message", byReason)
	}
	queued := func() int64 {
		n, err := rdb.XLen(ctx, q).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := queued()
	refused := func(what string, code int, errOut string, want string) {
		t.Helper()
		if code != 1 || !strings.Contains(errOut, want) {
			t.Fatalf("%s: exit %d, want 1 saying %q:\n%s", what, code, want, errOut)
		}
		if n := queued(); n != before {
			t.Fatalf("%s: %d entries appended", what, n-before)
		}
		if rec, _ := rdb.HGet(ctx, q+stream.ReplaysSuffix, unsigned.ID).Result(); rec != "" {
			t.Fatalf("%s: replay recorded as %q", what, rec)
		}
		l := replayLog(t, errOut)
		if l["level"] != "warn" || l["operator"] != me || l["dead_id"] != unsigned.ID || l["original_id"] != unsigned.Values[stream.DeadFieldID] {
			t.Fatalf("%s: log line %v, want the operator %s and dead letter %s", what, l, me, unsigned.ID)
		}
	}

	// A routine replay refuses the unsigned request.
	_, errOut, code := runStdin(t, env, nil, "dead", "replay", q, unsigned.ID)
	refused("replay of the unsigned dead letter", code, errOut, "--resign")
	// --resign answered "n": the request is shown, nothing is replayed.
	_, errOut, code = runStdin(t, env, strings.NewReader("n\n"), "dead", "replay", q, unsigned.ID, "--resign")
	refused("--resign answered n", code, errOut, "not confirmed")
	if !strings.Contains(errOut, `"server_handle": "web-forged"`) || !strings.Contains(errOut, "[y/N]") {
		t.Fatalf("--resign did not show the decoded request and ask:\n%s", errOut)
	}
	// --resign without a terminal to ask on, nor --yes.
	_, errOut, code = runStdin(t, env, nil, "dead", "replay", q, unsigned.ID, "--resign")
	refused("--resign without a terminal", code, errOut, "--yes")
	// --resign without a key to sign with.
	if _, errOut, code := runStdin(t, map[string]string{"REDIS_URL": url}, nil, "dead", "replay", q, unsigned.ID, "--resign", "--yes"); code != 2 || !strings.Contains(errOut, "REQUEST_SIGNING_KEY") {
		t.Fatalf("--resign without a key: exit %d: %s", code, errOut)
	}

	// --resign --yes: signed with autoprov's key under a new job id; infra
	// accepts it (a result, server_not_found, instead of a dead letter).
	out, errOut, code := runStdin(t, env, nil, "--json", "dead", "replay", q, unsigned.ID, "--resign", "--yes")
	if code != 0 {
		t.Fatalf("--resign --yes: exit %d: %s", code, errOut)
	}
	if strings.Contains(out+errOut, cliKey) {
		t.Fatal("the signing key was printed")
	}
	var r struct {
		NewID    string `json:"new_id"`
		JobID    string `json:"job_id"`
		Resigned bool   `json:"resigned"`
		KeyID    string `json:"key_id"`
		Operator string `json:"operator"`
	}
	mustJSON(t, out, &r)
	if !r.Resigned || r.KeyID != "autoprov-1" || r.Operator != me || r.JobID == "" || r.JobID == "forged-1" {
		t.Fatalf("--resign --yes: %s", out)
	}
	l := replayLog(t, errOut)
	if l["level"] != "info" || l["operator"] != me || l["key_id"] != "autoprov-1" || l["dead_id"] != unsigned.ID || l["new_id"] != r.NewID || l["original_id"] != unsigned.Values[stream.DeadFieldID] {
		t.Fatalf("log line %v", l)
	}
	e := entry(t, rdb, q, r.NewID)
	if e.Values[stream.ReplayFieldBy] != me || e.Values[stream.ReplayFieldDeadID] != unsigned.ID {
		t.Fatalf("replayed entry %v does not name the operator and the dead letter", e.Values)
	}
	res := waitResult(t, rdb, r.JobID)
	if res.Error == nil || res.Error.Kind != messages.KindServerNotFound || res.ServerHandle != "web-forged" {
		t.Fatalf("result of the re-signed request: %+v", res)
	}

	// The other dead letter goes back as the scheduler wrote it; with the
	// playbook now there, infra accepts its signature and handles it.
	if err := os.WriteFile(filepath.Join(playbooks, "later.yml"), []byte("- hosts: all\n  tasks: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = runStdin(t, env, nil, "--json", "dead", "replay", q, invalid.ID)
	if code != 0 {
		t.Fatalf("replay of the invalid_message dead letter: exit %d: %s", code, errOut)
	}
	r.KeyID = ""
	mustJSON(t, out, &r)
	if r.Resigned || r.KeyID != "" || r.JobID != "extra-1" {
		t.Fatalf("plain replay: %s", out)
	}
	e = entry(t, rdb, q, r.NewID)
	if e.Values[messages.DataField] != invalid.Values[messages.DataField] || e.Values[stream.SigField] != invalid.Values[stream.SigField] || e.Values[stream.SigField] != extraSig {
		t.Fatalf("replayed entry's data and sig differ from the dead letter's:\n%q\n%q", e.Values, invalid.Values)
	}
	if e.Values[stream.ReplayFieldBy] != me {
		t.Fatalf("replayed entry %v does not name the operator", e.Values)
	}
	l = replayLog(t, errOut)
	if l["operator"] != me || l["dead_id"] != invalid.ID || l["key_id"] != nil || l["job_id"] != "extra-1" {
		t.Fatalf("log line %v", l)
	}
	var got *messages.ProvisionerResult
	for range 1500 {
		if got = lastResult(t, rdb, "extra-1"); got != nil && got.Error != nil && got.Error.Kind == messages.KindServerNotFound {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got == nil || got.Error == nil || got.Error.Kind != messages.KindServerNotFound {
		t.Fatalf("the replayed request was not handled past its playbooks: %+v", got)
	}
	if n, _ := rdb.XLen(ctx, deadStream).Result(); n != 2 {
		t.Fatalf("%d dead letters, want the 2 (a replay was refused again)", n)
	}
}

// entry returns the entry id of name.
func entry(t *testing.T, rdb *redis.Client, name, id string) redis.XMessage {
	t.Helper()
	e, err := rdb.XRange(context.Background(), name, id, id).Result()
	if err != nil || len(e) != 1 {
		t.Fatalf("entry %s of %s: %v", id, name, err)
	}
	return e[0]
}

// lastResult returns the last provisioning result of job, or nil.
func lastResult(t *testing.T, rdb *redis.Client, job string) *messages.ProvisionerResult {
	t.Helper()
	rs, err := rdb.XRange(context.Background(), messages.StreamProvisionerResults, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var last *messages.ProvisionerResult
	for _, m := range rs {
		data, _ := m.Values[messages.DataField].(string)
		r, err := messages.DecodeProvisionerResult([]byte(data))
		if err == nil && r.JobID == job {
			last = r
		}
	}
	return last
}

// waitResult waits for the provisioning result of job.
func waitResult(t *testing.T, rdb *redis.Client, job string) *messages.ProvisionerResult {
	t.Helper()
	for range 1500 {
		if r := lastResult(t, rdb, job); r != nil {
			return r
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no result for job %s", job)
	return nil
}

// TestReplayHelp: the help of `dead` and `dead replay` tells that a replay
// keeps the signature and that a signature failure needs --resign.
func TestReplayHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"dead", "--help"}, {"dead", "replay", "--help"}} {
		out, _, code := run(t, nil, args...)
		if code != 0 {
			t.Fatalf("%q: exit %d", args, code)
		}
		text := strings.Join(strings.Fields(out), " ")
		for _, want := range []string{"signature unchanged", messages.ReasonUnsigned, messages.ReasonBadSignature, "--resign"} {
			if !strings.Contains(text, want) {
				t.Errorf("%q lacks %q:\n%s", args, want, out)
			}
		}
	}
}
