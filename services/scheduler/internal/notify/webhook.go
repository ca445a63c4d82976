package notify

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/autoprovisioner/autoprovisioner/pkg/hmacsig"
	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
)

// Webhook posts a job notification as JSON to a rule's URL, signed as
// the deployer signs its webhooks (pkg/hmacsig: Autoprov-Signature with
// the rule's secret), with Autoprov-Event job.<event>,
// Autoprov-Webhook-Id notification-<id> (the same at every attempt: a
// receiver drops what it has seen) and Autoprov-Webhook-Attempt. A 2xx
// answer delivers it; 429 waits for Retry-After.
type Webhook struct {
	URL      string
	Secret   secrets.Value
	Net      *Net
	Redactor *secrets.Redactor
}

// WebhookBody is what a webhook notification posts.
type WebhookBody struct {
	Event          string          `json:"event"`
	NotificationID string          `json:"notification_id"`
	Rule           string          `json:"rule"`
	ProjectID      string          `json:"project_id"`
	JobID          string          `json:"job_id"`
	Template       WebhookTemplate `json:"template"`
	Status         string          `json:"status"`
	ErrorKind      string          `json:"error_kind,omitempty"`
	CorrelationID  string          `json:"correlation_id,omitempty"`
	// Workflow names the approval of a workflow.approval_needed event
	// (which has no job_id nor template).
	Workflow *WebhookWorkflow `json:"workflow,omitempty"`
	SentAt   time.Time        `json:"sent_at"`
}

// WebhookWorkflow is the approval a workflow run waits for.
type WebhookWorkflow struct {
	Name        string `json:"name"`
	RunID       string `json:"run_id"`
	Node        string `json:"node"`
	Description string `json:"description,omitempty"`
}

// webhookEvent is n's event as a webhook names it: job.<event>, or
// workflow.approval_needed.
func webhookEvent(n *JobNotification) string {
	if n.WorkflowRunID != "" {
		return "workflow." + n.Event
	}
	return "job." + n.Event
}

// WebhookTemplate names the template version of a notification's job.
type WebhookTemplate struct {
	ID      string `json:"id,omitempty"`
	Name    string `json:"name"`
	Version int    `json:"version"`
}

// Send posts n (its attempt-th try).
func (w *Webhook) Send(ctx context.Context, n *JobNotification, attempt int) error {
	now := time.Now().UTC()
	b := WebhookBody{Event: webhookEvent(n), NotificationID: "notification-" + strconv.FormatInt(n.ID, 10),
		Rule: n.Rule.Name, ProjectID: n.ProjectID, JobID: n.JobID,
		Template: WebhookTemplate{ID: n.TemplateID, Name: n.Template, Version: n.Version},
		Status:   n.Status, ErrorKind: n.ErrorKind, CorrelationID: n.CorrelationID, SentAt: now}
	if n.WorkflowRunID != "" {
		b.Workflow = &WebhookWorkflow{Name: n.Workflow, RunID: n.WorkflowRunID, Node: n.Node, Description: n.Description}
	}
	body, err := json.Marshal(b)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("webhook: the rule's URL is unusable")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "autoprov-scheduler")
	req.Header.Set(hmacsig.HeaderEvent, webhookEvent(n))
	req.Header.Set(hmacsig.HeaderID, "notification-"+strconv.FormatInt(n.ID, 10))
	req.Header.Set(hmacsig.HeaderAttempt, strconv.Itoa(attempt))
	req.Header.Set(hmacsig.HeaderSignature, hmacsig.Sign(w.Secret.Reveal(), now, body))
	resp, err := w.Net.client.Do(req)
	if err != nil {
		// The URL (its path may hold a token) and secrets stay out.
		return fmt.Errorf("webhook: %s", w.Redactor.RedactString(stripURL(err, w.URL)))
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		return &RetryAfterError{After: retryAfter(resp.Header.Get("Retry-After")), Err: fmt.Errorf("webhook: 429")}
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return fmt.Errorf("webhook: status %d", resp.StatusCode)
	}
	return nil
}

// stripURL is err's text without url.
func stripURL(err error, url string) string {
	return string(bytes.ReplaceAll([]byte(err.Error()), []byte(url), []byte("(the rule's URL)")))
}
