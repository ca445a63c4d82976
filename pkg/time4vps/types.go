package time4vps

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Where the field names come from (see docs/time4vps.md for the full list):
//
//   - "docs": the Time4VPS User API reference (billing.time4vps.com/userapi,
//     swagger "Time4VPS User API" v4.20220303), including its example bodies.
//   - "lib": the official PHP library time4vps/time4vps-lib and the official
//     WHMCS module time4vps/whmcs, which read these fields in production code.
//   - "inferred": neither says it; the field is our best reading and the decoder
//     tolerates its absence.
//
// The API is a HostBill "User API"; HostBill tends to send numbers as JSON
// strings in some places, so integer fields use FlexInt, which accepts both.

// FlexInt is an integer that decodes from a JSON number, a numeric JSON string,
// an empty string or null (the last two decode to 0).
type FlexInt int64

// UnmarshalJSON implements json.Unmarshaler.
func (n *FlexInt) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || bytes.Equal(b, []byte("null")) {
		*n = 0
		return nil
	}
	s := string(b)
	if b[0] == '"' {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		s = strings.TrimSpace(s)
		if s == "" {
			*n = 0
			return nil
		}
	}
	if v, err := strconv.ParseInt(s, 10, 64); err == nil {
		*n = FlexInt(v)
		return nil
	}
	// Some HostBill fields carry integral floats ("12.0", 12.0).
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return fmt.Errorf("time4vps: %q is not a number", s)
	}
	*n = FlexInt(int64(f))
	return nil
}

// ServerSummary is one entry of GET /server ("List All Servers": active
// servers only, brief information). All fields are from the docs example.
type ServerSummary struct {
	// ID is the server ID used in every /server/{id} call (docs: server_id).
	ID FlexInt `json:"server_id"`
	// Domain is the server hostname (docs).
	Domain string `json:"domain"`
	// IP is the main IPv4 address (docs).
	IP string `json:"ip"`
	// DateCreated is a date such as "2017-01-31" (docs).
	DateCreated string `json:"date_created"`
	// SynchDate is when the billing system last synced the server, such as
	// "2017-01-31 15:35:00" (docs).
	SynchDate string `json:"synch_date"`
	// Label is the customer label (docs).
	Label string `json:"label"`
	// Type is the virtualisation type, such as "OpenVZ" or "KVM" (docs).
	Type string `json:"type"`
}

// Component is a selectable add-on of a server, such as backups (docs).
type Component struct {
	ID       FlexInt `json:"id"`
	Name     string  `json:"name"`
	Selected bool    `json:"selected"`
}

// Server is the body of GET /server/{id} ("Server Details"). Every JSON field
// below appears in the docs example; the meaning of ActiveTask's and
// LastTasks' elements is from the WHMCS module (lib).
type Server struct {
	// ID is not in the response: the client fills it with the requested ID.
	ID int64 `json:"-"`
	// SynchDate is the last sync time, ISO 8601 (docs).
	SynchDate string `json:"synch_date"`
	// PackageID is the product package (docs).
	PackageID FlexInt `json:"package_id"`
	// Domain is the server hostname (docs; the "Change Hostname" call sets it).
	Domain string `json:"domain"`
	// Label is the customer label (docs).
	Label string `json:"label"`
	// Status is the service status, such as "Active" (docs).
	Status string `json:"status"`
	// CPUFrequency is in MHz (docs).
	CPUFrequency FlexInt `json:"cpu_frequency"`
	// CPUCores is the number of cores (docs).
	CPUCores FlexInt `json:"cpu_cores"`
	// RAMLimit and RAMUsed are in MB (docs; unit from the WHMCS template).
	RAMLimit FlexInt `json:"ram_limit"`
	RAMUsed  FlexInt `json:"ram_used"`
	// DiskLimit and DiskUsage are in MB (docs; unit from the WHMCS template).
	DiskLimit FlexInt `json:"disk_limit"`
	DiskUsage FlexInt `json:"disk_usage"`
	// BWLimit, BWIn and BWOut are in MB (docs; unit from the WHMCS template).
	BWLimit FlexInt `json:"bw_limit"`
	BWIn    FlexInt `json:"bw_in"`
	BWOut   FlexInt `json:"bw_out"`
	// OS is the installed OS template, such as "ubuntu-16.04-x86_64"; empty
	// while no OS is installed (docs; "empty" meaning from WHMCS).
	OS string `json:"os"`
	// IP is the main IPv4 address (docs).
	IP string `json:"ip"`
	// AdditionalIPs are the other IPv4 addresses (docs: additional_ip).
	AdditionalIPs []string `json:"additional_ip"`
	// DNSServers are the resolvers configured on the server, may be null (docs).
	DNSServers []string `json:"dns_servers"`
	// Components are the add-ons (docs).
	Components []Component `json:"components"`
	// ActiveTask is the task running on the server, nil when idle (docs:
	// active_task, null in the example). Its shape is inferred to be a Task:
	// the WHMCS module reads active_task.activated.
	ActiveTask *Task `json:"-"`
	// LastTasks are recent tasks, nil when none (docs: last_tasks; WHMCS reads
	// their name and results). Results may contain a root password.
	LastTasks []Task `json:"-"`
}

// UnmarshalJSON implements json.Unmarshaler. It tolerates active_task and
// last_tasks being null, false, "" or an unexpected shape (treated as absent),
// since the docs show only null.
func (s *Server) UnmarshalJSON(b []byte) error {
	type plain Server
	var aux struct {
		*plain
		ActiveTask json.RawMessage `json:"active_task"`
		LastTasks  json.RawMessage `json:"last_tasks"`
	}
	aux.plain = (*plain)(s)
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	s.ActiveTask = nil
	if raw := bytes.TrimSpace(aux.ActiveTask); len(raw) > 0 && raw[0] == '{' {
		var t Task
		if err := json.Unmarshal(raw, &t); err != nil {
			return fmt.Errorf("active_task: %w", err)
		}
		s.ActiveTask = &t
	}
	s.LastTasks = nil
	if raw := bytes.TrimSpace(aux.LastTasks); len(raw) > 0 && raw[0] == '[' {
		if err := json.Unmarshal(raw, &s.LastTasks); err != nil {
			return fmt.Errorf("last_tasks: %w", err)
		}
	}
	return nil
}

// Addresses returns the main IP followed by the additional ones, without
// empty entries.
func (s *Server) Addresses() []string {
	out := make([]string, 0, 1+len(s.AdditionalIPs))
	if s.IP != "" {
		out = append(out, s.IP)
	}
	for _, ip := range s.AdditionalIPs {
		if ip != "" && ip != s.IP {
			out = append(out, ip)
		}
	}
	return out
}

// Busy reports whether a task is running on the server.
func (s *Server) Busy() bool { return s.ActiveTask != nil }

// OS is one template of GET /server/{id}/oses ("Available OS List", docs).
type OS struct {
	// OS is the template code passed to Reinstall, such as "centos-7-x86_64".
	OS string `json:"os"`
	// Title is the human name, such as "Centos 7".
	Title string `json:"title"`
}

// Task is the body of GET /server/{id}/task/{task_id} ("Task Result", docs).
// All dates are ISO 8601; Assigned, Completed and Results are empty strings
// until the task is assigned or completed (docs).
//
// Results is free text and, for a reinstall (task name "server_recreate") or
// a password reset, contains the new root password (WHMCS module). Treat it
// as a secret: this package never logs it.
type Task struct {
	// ID is not in the response: the client fills it with the requested ID.
	ID int64 `json:"-"`
	// Name is the task kind, such as "server_reboot" or "server_recreate".
	Name string `json:"name"`
	// Activated is when the task was started.
	Activated string `json:"activated"`
	// Assigned is when the task was assigned for execution; "" before.
	Assigned string `json:"assigned"`
	// Completed is when the task finished; "" while pending or running.
	Completed string `json:"completed"`
	// Results is the completion text; "" while pending or running.
	Results string `json:"results"`
}

// Done reports whether the task has completed (successfully or not).
func (t Task) Done() bool { return strings.TrimSpace(t.Completed) != "" }

// State is a short, secret-free description of the task's progress:
// "pending", "running" or "completed".
func (t Task) State() string {
	switch {
	case t.Done():
		return "completed"
	case strings.TrimSpace(t.Assigned) != "":
		return "running"
	default:
		return "pending"
	}
}

// ActivatedAt parses Activated; ok is false when it is empty or unparsable.
func (t Task) ActivatedAt() (time.Time, bool) { return parseTime(t.Activated) }

// CompletedAt parses Completed; ok is false when it is empty or unparsable.
func (t Task) CompletedAt() (time.Time, bool) { return parseTime(t.Completed) }

// LooksFailed is the default test of whether a completed task failed.
//
// The docs define no failure flag for tasks: a task has only name, dates and a
// free-text result. We assume (inferred, not documented) that a failed task
// completes with a result that starts with "error" or "fail" (case-insensitive).
// Callers that know better pass their own test with WithTaskFailureFunc, and
// should confirm a reinstall by reading the server (OS, ActiveTask) afterwards.
func LooksFailed(t Task) bool {
	if !t.Done() {
		return false
	}
	r := strings.ToLower(strings.TrimSpace(t.Results))
	return strings.HasPrefix(r, "error") || strings.HasPrefix(r, "fail")
}

func parseTime(s string) (time.Time, bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, false
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02 15:04:05", "2006-01-02"} {
		if ts, err := time.Parse(layout, s); err == nil {
			return ts, true
		}
	}
	return time.Time{}, false
}

// ReinstallRequest holds the body of POST /server/{id}/reinstall (docs).
type ReinstallRequest struct {
	// OS is the template code from OSes (required).
	OS string `json:"os"`
	// SSHKey is an SSH public key to install for root (optional).
	SSHKey string `json:"ssh_key,omitempty"`
	// ScriptID is the ID of an init script to run after install (optional;
	// the docs call the parameter "script" and type it integer).
	ScriptID int64 `json:"script,omitempty"`
}

// taskCreated is the body of the asynchronous calls (reinstall, reboot). The
// docs say "task ID is returned"; the field name task_id is from the official
// PHP library, which reads $response['task_id'].
type taskCreated struct {
	TaskID FlexInt `json:"task_id"`
}
