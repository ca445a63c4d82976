package time4vps

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// ListServers returns the account's active servers (GET /server).
//
// The docs' example shows a single object; the endpoint lists servers, so an
// array is expected and a lone object is accepted as a list of one.
func (c *Client) ListServers(ctx context.Context) ([]ServerSummary, error) {
	var raw json.RawMessage
	if err := c.do(ctx, http.MethodGet, "/server", nil, &raw); err != nil {
		return nil, err
	}
	raw = bytes.TrimSpace(raw)
	var out []ServerSummary
	switch {
	case len(raw) > 0 && raw[0] == '[':
		if err := json.Unmarshal(raw, &out); err != nil {
			return nil, fmt.Errorf("time4vps: GET /server: decode response: %w", err)
		}
	case len(raw) > 0 && raw[0] == '{':
		var one ServerSummary
		if err := json.Unmarshal(raw, &one); err != nil {
			return nil, fmt.Errorf("time4vps: GET /server: decode response: %w", err)
		}
		if one.ID != 0 {
			out = []ServerSummary{one}
		}
	case bytes.Equal(raw, []byte("null")):
	default:
		return nil, errors.New("time4vps: GET /server: response is neither a JSON array nor an object")
	}
	if out == nil {
		out = []ServerSummary{}
	}
	return out, nil
}

// Server returns a server's details (GET /server/{id}), read fresh: its
// address may change, so callers refresh it before using it.
func (c *Client) Server(ctx context.Context, serverID int64) (*Server, error) {
	if err := checkID("server", serverID); err != nil {
		return nil, err
	}
	var s Server
	if err := c.do(ctx, http.MethodGet, fmt.Sprintf("/server/%d", serverID), nil, &s); err != nil {
		return nil, err
	}
	s.ID = serverID
	return &s, nil
}

// OSes returns the OS templates the server can be reinstalled with
// (GET /server/{id}/oses).
func (c *Client) OSes(ctx context.Context, serverID int64) ([]OS, error) {
	if err := checkID("server", serverID); err != nil {
		return nil, err
	}
	var out []OS
	if err := c.do(ctx, http.MethodGet, fmt.Sprintf("/server/%d/oses", serverID), nil, &out); err != nil {
		return nil, err
	}
	if out == nil {
		out = []OS{}
	}
	return out, nil
}

// CheckOS returns nil when os is one of the server's OS templates, and an error
// matching ErrUnknownOS when it is not.
func (c *Client) CheckOS(ctx context.Context, serverID int64, os string) error {
	oses, err := c.OSes(ctx, serverID)
	if err != nil {
		return err
	}
	if HasOS(oses, os) {
		return nil
	}
	return fmt.Errorf("server %d offers %d OS templates, not %q: %w", serverID, len(oses), os, ErrUnknownOS)
}

// HasOS reports whether list holds the template code os.
func HasOS(list []OS, os string) bool {
	for _, o := range list {
		if o.OS == os {
			return true
		}
	}
	return false
}

// Reinstall erases the server and installs req.OS (POST /server/{id}/reinstall)
// and returns the ID of the task doing it; follow it with WaitTask.
//
// It is sent exactly once. On an error matching ErrOutcomeUnknown the API may
// still have started the reinstall: read the server's ActiveTask before
// deciding to call Reinstall again.
func (c *Client) Reinstall(ctx context.Context, serverID int64, req ReinstallRequest) (int64, error) {
	if err := checkID("server", serverID); err != nil {
		return 0, err
	}
	req.OS = strings.TrimSpace(req.OS)
	if req.OS == "" {
		return 0, errors.New("time4vps: reinstall: OS is required")
	}
	if req.ScriptID < 0 {
		return 0, fmt.Errorf("time4vps: reinstall: invalid init script ID %d", req.ScriptID)
	}
	taskID, err := c.startTask(ctx, fmt.Sprintf("/server/%d/reinstall", serverID), req)
	if err != nil {
		return 0, err
	}
	c.log.Info().Int64("server_id", serverID).Str("os", req.OS).Bool("ssh_key", req.SSHKey != "").
		Int64("script_id", req.ScriptID).Int64("task_id", taskID).Msg("time4vps reinstall started")
	return taskID, nil
}

// Reboot reboots the server (POST /server/{id}/reboot) and returns the task ID.
// Like Reinstall, it is never retried.
func (c *Client) Reboot(ctx context.Context, serverID int64) (int64, error) {
	if err := checkID("server", serverID); err != nil {
		return 0, err
	}
	taskID, err := c.startTask(ctx, fmt.Sprintf("/server/%d/reboot", serverID), nil)
	if err != nil {
		return 0, err
	}
	c.log.Info().Int64("server_id", serverID).Int64("task_id", taskID).Msg("time4vps reboot started")
	return taskID, nil
}

func (c *Client) startTask(ctx context.Context, path string, body any) (int64, error) {
	var tc taskCreated
	if err := c.do(ctx, http.MethodPost, path, body, &tc); err != nil {
		return 0, err
	}
	if tc.TaskID <= 0 {
		// The API acted (it answered 2xx) but we cannot follow the task.
		return 0, fmt.Errorf("time4vps: POST %s: response has no task_id: %w", path, ErrOutcomeUnknown)
	}
	return int64(tc.TaskID), nil
}

// Task returns a task's current state (GET /server/{id}/task/{task_id}).
func (c *Client) Task(ctx context.Context, serverID, taskID int64) (*Task, error) {
	if err := checkID("server", serverID); err != nil {
		return nil, err
	}
	if err := checkID("task", taskID); err != nil {
		return nil, err
	}
	var t Task
	if err := c.do(ctx, http.MethodGet, fmt.Sprintf("/server/%d/task/%d", serverID, taskID), nil, &t); err != nil {
		return nil, err
	}
	t.ID = taskID
	return &t, nil
}

func checkID(kind string, id int64) error {
	if id <= 0 {
		return fmt.Errorf("time4vps: invalid %s ID %d", kind, id)
	}
	return nil
}

func decodeJSON(body []byte, out any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return errors.New("empty body")
	}
	return json.Unmarshal(body, out)
}
