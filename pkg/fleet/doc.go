// Package fleet holds the fleet's domain operations over Postgres: the one
// place that changes the scheduler's view of a server.
//
// # States
//
// A server moves through
//
//	NEW -> QUEUED -> PROVISIONING -> READY | FAILED | UNREACHABLE
//
// plus ORPHANED (its source no longer lists it). This package is the only
// code that changes a server's status, attempts and last error. Every
// change is a compare-and-set on servers.version and writes its row to
// server_history (event, from, to, when, why, job id, by whom) in the same
// transaction; a status change is recorded once, by whoever made it, and
// never as X -> X.
//
// Who moves which state:
//
//   - the scheduler's reconcile loop (Queue): NEW, FAILED, UNREACHABLE,
//     READY -> QUEUED, writing the ProvisionerMessage to the outbox in the
//     same transaction, so no message exists without its state change and
//     no QUEUED server exists without its message;
//   - the outbox relay (Relay): QUEUED -> PROVISIONING once the message is
//     in Redis (the job is in infra's hands);
//   - infra (StartProvisioning, RecordRun): PROVISIONING when its run
//     starts, then READY, FAILED or UNREACHABLE (attempts, last error) in
//     the transaction that stores the run's result; a deploy that finds a
//     server down marks it UNREACHABLE. So infra alone, without a
//     scheduler (agents publishing to it directly), leaves servers right;
//   - the results consumer (ApplyResult): for the job the server waits for
//     (pending_job_id), deduplicated by job id, the scheduler's bookkeeping
//     of the transition infra made (wait cleared, retry and backoff,
//     notification), with no second transition and no history row; it
//     makes the transition itself only when infra did not (a result
//     published without a run);
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
