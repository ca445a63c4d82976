package contract_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

// producerScript is the Python producer of the documentation.
var producerScript = filepath.Join("..", "..", "..", "docs", "examples", "producer.py")

// TestPythonProducerExample runs docs/examples/producer.py with Debian's
// Python against the test Redis, under a stream prefix of its own. The test
// plays the infra service: it reads the two requests the script XADDs,
// decodes them with the Go decoders, checks every key the script sent, and
// publishes a result for each; the script must find both by job_id.
func TestPythonProducerExample(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Unique("messages-test-") + ":"
	queues := []string{prefix + messages.StreamProvisionerQueue, prefix + messages.StreamAnsibleDeployQueue}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rdb.Del(ctx, append(queues, prefix+messages.StreamProvisionerResults, prefix+messages.StreamDeployResults)...)
	})

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "/usr/bin/python3", producerScript, "--wait", "60")
	cmd.Env = []string{
		"REDIS_URL=" + testenv.RedisURL(t),
		"STREAM_PREFIX=" + prefix,
		"PYTHONDONTWRITEBYTECODE=1",
	}
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", producerScript, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	// Serve the two requests as the infra service would.
	decoded := map[string]any{} // stream + " " + entry id -> decoded request
	positions := []string{queues[0], queues[1], "0", "0"}
	for len(decoded) < 2 {
		select {
		case err := <-done:
			t.Fatalf("producer exited before its requests were served: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
		default:
		}
		streams, err := rdb.XRead(ctx, &redis.XReadArgs{Streams: positions, Block: time.Second}).Result()
		if err != nil && err != redis.Nil {
			t.Fatalf("XREAD: %v", err)
		}
		for _, s := range streams {
			for _, entry := range s.Messages {
				if s.Stream == queues[0] {
					positions[2] = entry.ID
				} else {
					positions[3] = entry.ID
				}
				data, ok := entry.Values[messages.DataField].(string)
				if !ok {
					t.Fatalf("entry %s of %s has no %q field: %v", entry.ID, s.Stream, messages.DataField, entry.Values)
				}
				decoded[s.Stream+" "+entry.ID] = serve(ctx, t, rdb, prefix, s.Stream, entry.ID, []byte(data))
			}
		}
	}

	if err := <-done; err != nil {
		t.Fatalf("producer: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}

	// Check what the script says it sent and received.
	sent, results := 0, 0
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var line struct {
			Event   string         `json:"event"`
			Stream  string         `json:"stream"`
			EntryID string         `json:"entry_id"`
			Message map[string]any `json:"message"`
			Result  map[string]any `json:"result"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("producer printed %q: %v", sc.Text(), err)
		}
		switch line.Event {
		case "sent":
			sent++
			msg, ok := decoded[line.Stream+" "+line.EntryID]
			if !ok {
				t.Fatalf("the script sent entry %s to %s, the test never read it", line.EntryID, line.Stream)
			}
			checkSameKeys(t, line.Message, msg)
		case "result":
			results++
			if line.Result["status"] != string(messages.StatusSucceeded) {
				t.Errorf("result %v, want status succeeded", line.Result)
			}
		default:
			t.Errorf("producer printed %s", sc.Text())
		}
	}
	if sent != 2 || results != 2 {
		t.Errorf("producer sent %d requests and received %d results, want 2 and 2\nstdout:\n%s", sent, results, &stdout)
	}
}

// serve decodes one request with the Go decoder and publishes a successful
// result for it; it returns the decoded request.
func serve(ctx context.Context, t *testing.T, rdb *redis.Client, prefix, stream, entryID string, data []byte) any {
	t.Helper()
	var (
		msg       any
		result    any
		resStream string
	)
	start := time.Now()
	switch stream {
	case prefix + messages.StreamProvisionerQueue:
		m, err := messages.DecodeProvisionerMessage(data)
		if err != nil {
			t.Fatalf("decode the script's ProvisionerMessage: %v", err)
		}
		res := messages.NewProvisionerResult(m, entryID)
		res.Succeed()
		res.SetTimes(start, time.Now())
		msg, result, resStream = m, res, prefix+messages.StreamProvisionerResults
	case prefix + messages.StreamAnsibleDeployQueue:
		m, err := messages.DecodeAnsibleDeployMessage(data)
		if err != nil {
			t.Fatalf("decode the script's AnsibleDeployMessage: %v", err)
		}
		res := messages.NewAnsibleDeployResult(m, entryID)
		res.Succeed()
		res.Playbook = "deploy.yml"
		res.SetTimes(start, time.Now())
		msg, result, resStream = m, res, prefix+messages.StreamDeployResults
	default:
		t.Fatalf("entry from unexpected stream %s", stream)
	}
	out, err := messages.Encode(result)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: resStream, Values: []any{messages.DataField, out}}).Err(); err != nil {
		t.Fatalf("XADD result: %v", err)
	}
	return msg
}

// checkSameKeys checks that each key the script sent (as JSON) has the same
// value in the Go-decoded message.
func checkSameKeys(t *testing.T, sent map[string]any, decoded any) {
	t.Helper()
	data, err := messages.Encode(decoded)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := msgpack.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	for key, want := range sent {
		g, ok := got[key]
		if !ok {
			if reflect.ValueOf(want).IsZero() { // false, "": left out by Encode
				continue
			}
			t.Errorf("key %s sent by the script is not read by the Go decoder", key)
			continue
		}
		if fmt.Sprint(g) != fmt.Sprint(want) {
			t.Errorf("key %s: sent %v, Go decoded %v", key, want, g)
		}
	}
}
