package time4vpstest_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps/time4vpstest"
)

func call(t *testing.T, s *time4vpstest.Server, method, path, contentType, body string, auth bool) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, s.URL()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if auth {
		req.SetBasicAuth(s.Username(), s.Password())
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func keys(t *testing.T, b []byte) []string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("not an object: %s", b)
	}
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func sorted(s ...string) []string { slices.Sort(s); return s }

// The JSON field names are exactly those of the documented examples.
func TestWireShapesMatchTheDocs(t *testing.T) {
	s := time4vpstest.Start(t, time4vpstest.Config{})
	s.AddServer(time4vpstest.VPS{ID: 101, Domain: "a.example", IP: "192.0.2.1"})

	code, b := call(t, s, "GET", "/server", "", "", true)
	var list []json.RawMessage
	if code != 200 || json.Unmarshal(b, &list) != nil || len(list) != 1 {
		t.Fatalf("GET /server = %d %s", code, b)
	}
	if d := cmp.Diff(sorted("server_id", "domain", "ip", "date_created", "synch_date", "label", "type"), keys(t, list[0])); d != "" {
		t.Errorf("server list item keys (-docs +stand-in):\n%s", d)
	}

	code, b = call(t, s, "POST", "/server/101/reboot", "", "", true)
	if d := cmp.Diff([]string{"task_id"}, keys(t, b)); code != 200 || d != "" {
		t.Errorf("reboot = %d %s", code, b)
	}

	code, b = call(t, s, "GET", "/server/101", "", "", true)
	docs := sorted("synch_date", "package_id", "domain", "label", "status", "cpu_frequency", "cpu_cores",
		"ram_limit", "ram_used", "disk_limit", "disk_usage", "bw_limit", "bw_in", "bw_out", "os", "ip",
		"additional_ip", "dns_servers", "components", "active_task", "last_tasks")
	if d := cmp.Diff(docs, keys(t, b)); code != 200 || d != "" {
		t.Errorf("server details keys (-docs +stand-in):\n%s", d)
	}
	var details struct {
		ActiveTask json.RawMessage `json:"active_task"`
	}
	_ = json.Unmarshal(b, &details)
	if d := cmp.Diff(sorted("name", "activated", "assigned", "completed", "results"), keys(t, details.ActiveTask)); d != "" {
		t.Errorf("active task keys:\n%s", d)
	}

	code, b = call(t, s, "GET", "/server/101/task/1001", "", "", true)
	if d := cmp.Diff(sorted("name", "activated", "assigned", "completed", "results"), keys(t, b)); code != 200 || d != "" {
		t.Errorf("task = %d %s", code, b)
	}
	if !strings.Contains(string(b), `"activated":"20`) || !strings.Contains(string(b), `+00:00"`) {
		t.Errorf("dates are not ISO 8601 with offset as in the docs: %s", b)
	}

	code, b = call(t, s, "GET", "/server/101/oses", "", "", true)
	var oses []map[string]string
	if code != 200 || json.Unmarshal(b, &oses) != nil || len(oses) == 0 || oses[0]["os"] == "" || oses[0]["title"] == "" {
		t.Errorf("oses = %d %s", code, b)
	}
}

func TestAuthRequired(t *testing.T) {
	s := time4vpstest.Start(t, time4vpstest.Config{})
	s.AddServer(time4vpstest.VPS{ID: 101})
	code, b := call(t, s, "GET", "/server", "", "", false)
	if code != http.StatusUnauthorized || strings.TrimSpace(string(b)) != `{"error":["wronglogin"]}` {
		t.Errorf("without auth: %d %s", code, b)
	}
	code, _ = call(t, s, "POST", "/server/101/reboot", "", "", false)
	if code != http.StatusUnauthorized || len(s.Tasks()) != 0 {
		t.Errorf("unauthenticated reboot: %d, tasks %v", code, s.Tasks())
	}
	if s.Count(time4vpstest.EndpointListServers) != 1 || s.Count(time4vpstest.EndpointReboot) != 1 {
		t.Error("refused requests are not counted")
	}
}

// The WHMCS module asks for the latest task of a kind by name.
func TestTaskByName(t *testing.T) {
	s := time4vpstest.Start(t, time4vpstest.Config{TaskPolls: 1})
	s.AddServer(time4vpstest.VPS{ID: 101})
	for range 2 {
		if code, b := call(t, s, "POST", "/server/101/reboot", "", "", true); code != 200 {
			t.Fatalf("reboot: %d %s", code, b)
		}
		last := s.Tasks()[len(s.Tasks())-1]
		call(t, s, "GET", "/server/101/task/"+strconv.FormatInt(last.ID, 10), "", "", true) // completes it
	}
	code, b := call(t, s, "GET", "/server/101/task/server_reboot", "", "", true)
	var got map[string]string
	if code != 200 || json.Unmarshal(b, &got) != nil || got["name"] != "server_reboot" || got["completed"] == "" {
		t.Errorf("by name: %d %s", code, b)
	}
	code, b = call(t, s, "GET", "/server/101/task/server_recreate", "", "", true)
	if code != 200 || !strings.Contains(string(b), time4vpstest.MsgInvalidTask) {
		t.Errorf("unknown name: %d %s", code, b)
	}
}

func TestReinstallFormBody(t *testing.T) {
	s := time4vpstest.Start(t, time4vpstest.Config{})
	s.AddServer(time4vpstest.VPS{ID: 101})
	form := url.Values{"os": {"centos-7-x86_64"}, "script": {"12"}, "ssh_key": {"ssh-ed25519 AAAA x"}}.Encode()
	code, b := call(t, s, "POST", "/server/101/reinstall", "application/x-www-form-urlencoded", form, true)
	if code != 200 {
		t.Fatalf("reinstall: %d %s", code, b)
	}
	want := []time4vpstest.ReinstallCall{{ServerID: 101, OS: "centos-7-x86_64", SSHKey: "ssh-ed25519 AAAA x", Script: 12}}
	if d := cmp.Diff(want, s.Reinstalls()); d != "" {
		t.Errorf("calls (-want +got):\n%s", d)
	}
}

func TestUnknownRoute(t *testing.T) {
	s := time4vpstest.Start(t, time4vpstest.Config{})
	code, b := call(t, s, "GET", "/nothing/here", "", "", true)
	if code != http.StatusNotFound || !strings.Contains(string(b), `"error"`) || s.Count(time4vpstest.EndpointOther) != 1 {
		t.Errorf("unknown route: %d %s", code, b)
	}
}
