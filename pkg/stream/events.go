package stream

// EventKind names something a Consumer did.
type EventKind string

// The events a Consumer reports to Config.Hook.
const (
	// EventAcked: the entry was acknowledged (its handler succeeded, or it
	// was dead-lettered).
	EventAcked EventKind = "acked"
	// EventDeadLettered: the entry was copied to the dead-letter stream (its
	// acknowledgement follows as EventAcked).
	EventDeadLettered EventKind = "dead_lettered"
	// EventRetry: the handler failed (or returned Later); the entry was
	// made claimable again after the retry backoff (or Later's delay).
	EventRetry EventKind = "retry"
	// EventReleased: the entry was given back to the group at once without
	// counting a delivery (shutdown, or a prefetched entry never started).
	EventReleased EventKind = "released"
	// EventLeft: the consumer let go of the entry without acknowledging it:
	// its lease was lost, or Redis did not take the acknowledgement or the
	// dead-letter copy. It stays pending for whoever owns it.
	EventLeft EventKind = "left"
	// EventClaimRound: one XAUTOCLAIM round over the stream finished (ID is
	// empty).
	EventClaimRound EventKind = "claim_round"
	// EventRenewed: a heartbeat renewed the lease of the entry.
	EventRenewed EventKind = "renewed"
	// EventGroupCreated: the consumer group was found missing and created
	// again (ID is empty).
	EventGroupCreated EventKind = "group_created"
	// EventHandedOff: a handler that ended handed its slot to the entry
	// (HandOff), which was claimed and dispatched at once.
	EventHandedOff EventKind = "handed_off"
)

// Event is reported to Config.Hook.
type Event struct {
	Kind   EventKind
	Stream string
	ID     string // the entry's id, for events about one entry
}

// emit reports an event to the hook, if any.
func (c *Consumer) emit(kind EventKind, stream, id string) {
	if c.cfg.Hook != nil {
		c.cfg.Hook(Event{Kind: kind, Stream: stream, ID: id})
	}
}

// emitEach reports one event per delivery.
func (c *Consumer) emitEach(kind EventKind, ds []*delivery) {
	if c.cfg.Hook == nil {
		return
	}
	for _, d := range ds {
		c.cfg.Hook(Event{Kind: kind, Stream: d.st.name, ID: d.msg.ID})
	}
}
