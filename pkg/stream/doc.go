// Package stream is the Redis Streams runtime every service uses, and the
// only code of the system that reads or writes streams:
//
//   - Producer appends entries without ever trimming what a consumer group
//     has not read; its BatchPublisher appends best-effort streams (a job's
//     progress) in pipelined batches from a goroutine of its own, dropping
//     only what the caller offered as droppable when Redis falls behind.
//   - Consumer runs a Handler for each entry of one or more streams as a
//     member of a consumer group; Mux routes each stream to its own Handler.
//   - Inspector shows streams, groups (lag, pending, consumers, oldest
//     pending entry) and dead letters, and replays or drops dead letters:
//     what operators' tools build on.
//   - KeyWatcher tells a process when keys come to exist (a job's cancel
//     key), checking all of them in one round trip per interval.
//   - Jobs reads jobs' progress streams (a job followed to its
//     run_finished, many jobs read together for a fan-out, with a polling
//     form on Redis Cluster) and writes their cancel keys: every reader of
//     progress and writer of cancel requests goes through it.
//
// # Delivery model
//
// Entries are delivered at least once. A Consumer acknowledges an entry only
// after its Handler returned nil, that is after the handler made its outcome
// durable (result published, state committed); handlers therefore deduplicate
// by a job id. While a handler runs, the entry is leased: a heartbeat resets
// the entry's idle time every Lease/4, fenced by a check that the entry is
// still owned by this consumer. Other consumers only claim entries idle for at
// least Lease, so a long job is never taken from a live owner, and the entries
// of a dead consumer are taken over after about Lease.
//
// A handler whose lease is lost (another consumer claimed the entry, for
// example after Redis was unreachable for longer than Lease) has its context
// cancelled with ErrLeaseLost as the cause; it must publish nothing, and the
// runtime acknowledges nothing for it.
//
// # Reading
//
// One reader serves all of a consumer's streams: with the handler slots
// that are free it claims idle entries of each stream every ClaimInterval
// and reads new ones of every stream in one blocking XREADGROUP, so a free
// slot serves whichever stream has work the moment it arrives, however
// many streams are quiet. COUNT bounds each stream of a read, not the
// reply: entries beyond the free slots (several streams answering at once)
// are given back to the group at once, their delivery not counted, and
// claimed by whichever consumer has a slot first. Message.Pickup tells a
// handler how long its entry waited with a slot free. On Redis Cluster,
// whose streams may live in different slots, each stream has a reader of
// its own and the readers divide the free slots among them.
//
// # Prefetch and acknowledgements
//
// With Config.Prefetch above zero, a reader asks for up to Concurrency +
// Prefetch entries in all, so that a handler that finishes finds its next
// entry already read instead of waiting a round trip for it. A prefetched
// entry is read with XREADGROUP, so it is owned by this consumer the moment
// it arrives: it is therefore leased exactly like a running one. The
// heartbeat renews it, a lease lost while it waits means it is never
// started (left to its new owner), and if the consumer dies, it is claimed
// by another after about Lease and counts as a second delivery, like the
// entry whose handler ran. At shutdown the prefetched entries that no
// handler started are released at once, before the running handlers are
// waited for, and their delivery is not counted. Delivery counts, the
// delivery limit and dead-lettering are the same with and without prefetch.
// Leave Prefetch at 0 for slow handlers: an entry waiting behind a long job
// is held while another consumer might be idle.
//
// Acknowledgements go out in batches: a settled entry joins a queue that
// one goroutine sends with one XACK per stream, so a busy consumer sends
// a few large XACKs instead of one per entry. Only entries whose handler
// returned nil (or that were dead-lettered) ever join that queue.
//
// # Failures
//
// A handler error makes the entry eligible for redelivery after a backoff that
// doubles with each delivery. When an entry reaches Config.MaxDeliveries (or a
// consumer holding it died that often), it is copied to the dead-letter stream
// "<stream>:dead" with the reason and its original fields, then acknowledged.
// A handler signals "do not retry" (bad input) by returning an error wrapped
// with Permanent: the entry is dead-lettered at once. A panicking handler is
// recovered and counts as a failed delivery.
//
// # Shutdown
//
// When the context given to Consumer.Run is cancelled, the consumer stops
// reading and claiming, lets in-flight handlers finish within
// Config.ShutdownGrace, then cancels them (cause ErrShutdown) and releases
// their entries so that another consumer takes them at once, without counting
// the interrupted delivery.
//
// # Dead letters and replays
//
// A dead letter keeps the original entry's fields next to the DeadField*
// fields. Inspector.Replay appends it to its stream again as a new entry,
// with the fields a caller-given function returns (for example the payload
// with a new job id) plus the ReplayField* fields naming its origin, and
// records the new id in the hash "<stream>:dead:replays"; a dead letter is
// replayed at most once, and stays listed, with its replay, until dropped.
//
// # Observing a consumer
//
// Config.Hook receives an Event for what the consumer did to an entry
// (acknowledged, dead-lettered, released, left to another owner, renewed)
// and for claim rounds and re-created groups. Tests wait on these events
// instead of sleeping; production code leaves the hook nil and uses Metrics.
//
// # Redis deployments
//
// The runtime takes a redis.UniversalClient, so a single node, Sentinel and
// Cluster all work. It never uses MULTI or scripts across keys: every script
// touches one stream, and on Cluster each stream has its own reader, so streams
// may live in different slots. It survives a Redis restart underneath it: reads
// back off and retry, and a consumer group that disappeared (a restart without
// persistence) is created again.
package stream
