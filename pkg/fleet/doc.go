// Package fleet holds the fleet's domain operations over Postgres: the one
// place that changes the scheduler's view of a server.
//
// # States
//
// A server moves through
//
//	NEW -> QUEUED -> PROVISIONING -> READY | FAILED | UNREACHABLE
//
// plus ORPHANED (its source no longer lists it). Every change is a
// compare-and-set on servers.version and writes a row to server_history
// (event, from, to, when, why, job id, by whom) in the same transaction.
//
// Who moves which state:
//
//   - the scheduler's reconcile loop (Queue): NEW, FAILED, UNREACHABLE,
//     READY -> QUEUED, writing the ProvisionerMessage to the outbox in the
//     same transaction, so no message exists without its state change and
//     no QUEUED server exists without its message;
//   - the outbox relay (Relay): QUEUED -> PROVISIONING once the message is
//     in Redis (the job is in infra's hands);
//   - the results consumer (ApplyResult): PROVISIONING (or QUEUED) ->
//     READY, FAILED or UNREACHABLE for the job the server waits for
//     (pending_job_id), deduplicated by job id; infra records runs and may
//     itself mark a server UNREACHABLE or record its outcome (it writes
//     last_job_id); ApplyResult recognises an outcome infra already wrote
//     and only completes the bookkeeping;
//   - the detectors (Sync): create servers (NEW), update what their source
//     says, ORPHANED when the source drops a server and back when it
//     returns; a failing source is never synced, so it orphans nothing;
//   - operators (RequestAction, Pause, Resume): requests recorded durably
//     and turned into messages only by the reconcile loop, so at most one
//     job per server is ever in flight.
//
// # Notifications
//
// A transition into a notifiable state (READY, UNREACHABLE, FAILED with no
// retry left) whose status differs from the server's notified_status writes
// a notifications row and sets notified_status in the same transaction.
// Channels claim undelivered rows (ClaimNotifications) and record each
// delivery durably (MarkDelivered).
package fleet
