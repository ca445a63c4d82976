package time4vps_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps"
	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps/time4vpstest"
)

func TestWaitTaskSuccess(t *testing.T) {
	t.Parallel()
	h := setup(t, time4vpstest.Config{TaskPolls: 4}, nil)
	ctx := context.Background()
	taskID, err := h.client.Reinstall(ctx, testServerID, time4vps.ReinstallRequest{OS: "centos-7-x86_64"})
	if err != nil {
		t.Fatalf("Reinstall: %v", err)
	}
	task, err := h.client.WaitTask(ctx, testServerID, taskID)
	if err != nil {
		t.Fatalf("WaitTask: %v", err)
	}
	if !task.Done() || task.State() != "completed" || task.Assigned == "" {
		t.Errorf("task = %+v", task)
	}
	if n := h.api.Count(time4vpstest.EndpointTask); n != 4 {
		t.Errorf("polled %d times, want 4", n)
	}
	// Progress: one line per state change, debug lines in between.
	logs := h.logs.String()
	for _, want := range []string{`"state":"running"`, `"state":"completed"`, `"poll":4`, "time4vps task still running"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s:\n%s", want, logs)
		}
	}
}

func TestWaitTaskByDuration(t *testing.T) {
	h := setup(t, time4vpstest.Config{TaskDuration: 150 * time.Millisecond}, func(c *time4vps.Config) {
		c.TaskPollInterval = 20 * time.Millisecond
	})
	ctx := context.Background()
	taskID, err := h.client.Reboot(ctx, testServerID)
	if err != nil {
		t.Fatalf("Reboot: %v", err)
	}
	task, err := h.client.WaitTask(ctx, testServerID, taskID)
	if err != nil || !task.Done() {
		t.Fatalf("WaitTask = %+v, %v", task, err)
	}
	done, _ := task.CompletedAt()
	started, _ := task.ActivatedAt()
	if done.Sub(started) < 150*time.Millisecond-time.Second { // dates have 1s resolution
		t.Errorf("completed %s after activation", done.Sub(started))
	}
}

func TestWaitTaskFailure(t *testing.T) {
	t.Parallel()
	h := setup(t, time4vpstest.Config{}, nil)
	ctx := context.Background()
	h.api.FailNextTask("OS template image is missing")
	taskID, err := h.client.Reinstall(ctx, testServerID, time4vps.ReinstallRequest{OS: "kvm-ubuntu-24.04-gpt-x86_64"})
	if err != nil {
		t.Fatalf("Reinstall: %v", err)
	}
	task, err := h.client.WaitTask(ctx, testServerID, taskID)
	h.errNoSecret(t, err)
	if !errors.Is(err, time4vps.ErrTaskFailed) {
		t.Fatalf("err = %v, want ErrTaskFailed", err)
	}
	var tf *time4vps.TaskFailedError
	if !errors.As(err, &tf) || tf.TaskID != taskID || tf.ServerID != testServerID {
		t.Fatalf("err = %#v", err)
	}
	if task == nil || task.Results != "Error: OS template image is missing" || tf.Task != *task {
		t.Errorf("task = %+v, error task = %+v", task, tf.Task)
	}
	if strings.Contains(err.Error(), task.Results) {
		t.Errorf("error text carries the task results: %v", err)
	}
	s, err := h.client.Server(ctx, testServerID)
	if err != nil {
		t.Fatalf("Server: %v", err)
	}
	if s.OS != "kvm-debian-12-x86_64" || s.Busy() {
		t.Errorf("after a failed reinstall: os=%q busy=%v", s.OS, s.Busy())
	}
}

func TestWaitTaskCustomFailureFunc(t *testing.T) {
	t.Parallel()
	h := setup(t, time4vpstest.Config{}, nil, time4vps.WithTaskFailureFunc(func(t time4vps.Task) bool {
		return !strings.Contains(t.Results, "successfully")
	}))
	ctx := context.Background()
	taskID, err := h.client.Reboot(ctx, testServerID)
	if err != nil {
		t.Fatalf("Reboot: %v", err)
	}
	if _, err := h.client.WaitTask(ctx, testServerID, taskID); err != nil {
		t.Errorf("WaitTask: %v", err)
	}
	taskID, err = h.client.Reinstall(ctx, testServerID, time4vps.ReinstallRequest{OS: "centos-7-x86_64"})
	if err != nil {
		t.Fatalf("Reinstall: %v", err)
	}
	if _, err := h.client.WaitTask(ctx, testServerID, taskID); !errors.Is(err, time4vps.ErrTaskFailed) {
		t.Errorf("WaitTask = %v, want ErrTaskFailed from the custom test", err)
	}
}

func TestWaitTaskDeadline(t *testing.T) {
	h := setup(t, time4vpstest.Config{TaskPolls: 1 << 30}, func(c *time4vps.Config) {
		c.TaskPollInterval = 20 * time.Millisecond
	})
	taskID, err := h.client.Reinstall(context.Background(), testServerID, time4vps.ReinstallRequest{OS: "centos-7-x86_64"})
	if err != nil {
		t.Fatalf("Reinstall: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	task, err := h.client.WaitTask(ctx, testServerID, taskID)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want context.DeadlineExceeded", err)
	}
	if task == nil || task.Done() || task.ID != taskID {
		t.Errorf("last task seen = %+v, want the running task", task)
	}
}

func TestWaitTaskSurvivesTemporaryErrors(t *testing.T) {
	t.Parallel()
	h := setup(t, time4vpstest.Config{TaskPolls: 2}, nil)
	ctx := context.Background()
	taskID, err := h.client.Reboot(ctx, testServerID)
	if err != nil {
		t.Fatalf("Reboot: %v", err)
	}
	// More failures than one GET's retries: the first poll fails for good,
	// WaitTask logs it and polls again.
	failures := h.cfg.RetryMax + 2
	h.api.FailNext(time4vpstest.EndpointTask, failures, http.StatusBadGateway)
	task, err := h.client.WaitTask(ctx, testServerID, taskID)
	if err != nil || !task.Done() {
		t.Fatalf("WaitTask = %+v, %v", task, err)
	}
	if n := h.api.Count(time4vpstest.EndpointTask); n != failures+2 {
		t.Errorf("task endpoint hit %d times, want %d", n, failures+2)
	}
	if !strings.Contains(h.logs.String(), "time4vps task poll failed; polling on") {
		t.Errorf("the failed poll was not logged")
	}
}

func TestWaitTaskStopsOnPermanentError(t *testing.T) {
	t.Parallel()
	h := setup(t, time4vpstest.Config{}, nil)
	task, err := h.client.WaitTask(context.Background(), testServerID, 777)
	if !errors.Is(err, time4vps.ErrNotFound) || task != nil {
		t.Fatalf("WaitTask = %+v, %v; want ErrNotFound", task, err)
	}
	if n := h.api.Count(time4vpstest.EndpointTask); n != 1 {
		t.Errorf("polled %d times, want 1", n)
	}
}
