package api_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
	dt "github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployertest"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/deployments"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/fakeinfra"
)

func TestEvents(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	big := strings.Repeat("x", 4000)
	e := dt.Start(t, dt.Options{PlanFor: func(m *messages.AnsibleDeployMessage) fakeinfra.Plan {
		switch m.Branch {
		case "many":
			return fakeinfra.Plan{Tasks: 600, Hold: hold, EventMessage: big}
		case "steps":
			return fakeinfra.Plan{Tasks: 6, TaskDelay: 30 * time.Millisecond}
		}
		return fakeinfra.Plan{Tasks: 1, Hold: hold}
	}})
	submit := func(branch string) deployments.Deployment {
		req := dt.Request()
		req["branch"] = branch
		_, body := e.Do("POST", "/api/v1/deployments", e.CI, req)
		return dt.JSON[deployments.Deployment](t, body)
	}

	t.Run("whole run, ending with the terminal event, then resume", func(t *testing.T) {
		d := submit("steps")
		s := e.OpenSSE(t, d.Links.Events, e.CI, "")
		if s.Resp.StatusCode != 200 || s.Resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("events: %d %v", s.Resp.StatusCode, s.Resp.Header)
		}
		var got []dt.SSEEvent
		for len(got) < 3 {
			ev, ok := s.Next()
			if !ok {
				t.Fatal("stream ended early")
			}
			got = append(got, ev)
		}
		s.Close() // the client drops, then resumes where it was
		s2 := e.OpenSSE(t, d.Links.Events, e.CI, got[2].ID)
		got = append(got, s2.All()...)
		if s.Retry == "" {
			t.Error("no retry: advice at the start")
		}
		want, err := e.Redis.XRange(context.Background(), messages.ProgressStream(messages.JobKindDeploy, d.JobID), "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("got %d events, the stream has %d", len(got), len(want))
		}
		for i := range want {
			if got[i].ID != want[i].ID {
				t.Fatalf("event %d: id %s, want %s (resume lost or repeated events)", i, got[i].ID, want[i].ID)
			}
		}
		last := got[len(got)-1]
		if last.Event != "run_finished" || !strings.Contains(last.Data, `"status":"succeeded"`) {
			t.Errorf("last event %+v", last)
		}
		if got[0].Event != "run_started" || !strings.Contains(got[1].Data, `"play":"Deploy the project"`) {
			t.Errorf("first events %+v", got[:2])
		}
	})

	t.Run("an EventSource reconnecting after the real end gets 204, not a second end", func(t *testing.T) {
		d := submit("steps")
		// What a browser does: follow, and when the stream closes
		// reconnect with the last id until answered 204.
		evs, connects := e.FollowAsEventSource(t, d.Links.Events, e.CI, 5)
		want, err := e.Redis.XRange(context.Background(), messages.ProgressStream(messages.JobKindDeploy, d.JobID), "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		finished := 0
		for _, ev := range evs {
			if ev.Event == "run_finished" {
				finished++
			}
		}
		if finished != 1 || len(evs) != len(want) || connects != 2 {
			t.Fatalf("an EventSource got %d events (the stream has %d), %d run_finished, in %d connections; want each event once and 2 connections: %+v",
				len(evs), len(want), finished, connects, evs)
		}
		real := evs[len(evs)-1]
		if real.ID != want[len(want)-1].ID || strings.Contains(real.Data, `"synthetic"`) {
			t.Errorf("last event %+v, want the stream's run_finished %s", real, want[len(want)-1].ID)
		}
		// Directly: the real end's id, and any later id, answer 204.
		for _, id := range []string{real.ID, "99999999999999-0"} {
			s := e.OpenSSE(t, d.Links.Events, e.CI, id)
			if s.Resp.StatusCode != 204 {
				t.Errorf("reconnect with %s after the end: %d, want 204; events %+v", id, s.Resp.StatusCode, s.All())
			}
		}
		// A client that dropped before the end gets the rest, ending with
		// the real run_finished, and the stream closes.
		s := e.OpenSSE(t, d.Links.Events, e.CI, evs[1].ID)
		rest := s.All()
		if len(rest) != len(evs)-2 || rest[len(rest)-1].ID != real.ID || rest[0].ID != evs[2].ID {
			t.Errorf("resume from the 2nd event after the end: got %+v, want the %d events after it", rest, len(evs)-2)
		}
	})

	t.Run("a slow client does not slow a fast one", func(t *testing.T) {
		d := submit("many")
		// The slow client reads its headers and then nothing at all.
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", d.Links.Events, e.CI)
		buf := make([]byte, 512)
		if _, err := conn.Read(buf); err != nil || !strings.Contains(string(buf), "200 OK") {
			t.Fatalf("slow client: %v %q", err, buf)
		}
		fast := e.OpenSSE(t, d.Links.Events, e.CI, "")
		hold <- struct{}{} // release the run: 600 events of 4 KB, far more than the slow client's socket takes
		start := time.Now()
		evs := fast.All()
		if len(evs) < 600 || evs[len(evs)-1].Event != "run_finished" {
			t.Fatalf("fast client got %d events, last %+v", len(evs), evs[len(evs)-1].Event)
		}
		t.Logf("fast client read %d events (%d KB) in %v while the slow one read nothing", len(evs), len(evs)*4, time.Since(start))
		// Another fresh client is served too.
		if n := len(e.OpenSSE(t, d.Links.Events, e.CI, "").All()); n != len(evs) {
			t.Errorf("a later client got %d events, want %d", n, len(evs))
		}
	})

	t.Run("a job that never ran ends with a made-up terminal event, then 204", func(t *testing.T) {
		// Stop the stand-in from taking it: cancel before it starts is
		// raced by infra, so use a job the API cancels while infra holds
		// another one? Simpler: an unknown job id gets no run; cancel it
		// through the API while the queue is not read.
		e2 := dt.Start(t, dt.Options{NoInfra: true})
		_, body := e2.Do("POST", "/api/v1/deployments", e2.CI, dt.Request())
		d := dt.JSON[deployments.Deployment](t, body)
		if resp, body := e2.Do("DELETE", d.Links.Self, e2.CI, nil); resp.StatusCode != 200 {
			t.Fatalf("cancel: %d %s", resp.StatusCode, body)
		}
		evs := e2.OpenSSE(t, d.Links.Events, e2.CI, "").All()
		if len(evs) != 1 || evs[0].Event != "run_finished" || evs[0].ID != "end" || !strings.Contains(evs[0].Data, `"status":"cancelled"`) {
			t.Fatalf("events of a cancelled queued job: %+v", evs)
		}
		s := e2.OpenSSE(t, d.Links.Events, e2.CI, "end")
		if s.Resp.StatusCode != 204 {
			t.Errorf("resume after the end: %d, want 204", s.Resp.StatusCode)
		}
	})

	t.Run("shutdown ends streams with a retry hint", func(t *testing.T) {
		d := submit("held")
		s := e.OpenSSE(t, d.Links.Events, e.CI, "")
		testenv.WaitFor(t, 30*time.Second, "the run to start", func() bool {
			_, body := e.Do("GET", d.Links.Self, e.CI, nil)
			return dt.JSON[deployments.Deployment](t, body).Status == deployments.StatusRunning
		})
		ev, ok := s.Next()
		if !ok || ev.Event != "run_started" {
			t.Fatalf("first event %+v %v", ev, ok)
		}
		s.Retry = ""
		done := make(chan []dt.SSEEvent)
		go func() { done <- s.All() }()
		start := time.Now()
		e.Parts.API.Shutdown()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the stream did not end at shutdown")
		}
		if s.Retry == "" {
			t.Error("the stream ended without a retry hint")
		}
		t.Logf("stream ended %v after shutdown began", time.Since(start))
		close(hold)
	})
}
