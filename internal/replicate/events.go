package replicate

// Event is something a run reports to Options.OnEvent, for the node's
// metrics (CouchDB's couch_replicator stats of the same names).
type Event int

// Events a run reports.
const (
	// EventCheckpointRecorded: a checkpoint was written on both endpoints
	// (checkpoints.success).
	EventCheckpointRecorded Event = iota + 1
	// EventCheckpointFailed: a checkpoint could not be recorded
	// (checkpoints.failure).
	EventCheckpointFailed
	// EventChangesReadFailed: a request to the source's _changes failed
	// (changes_read_failures); the reader retries it unless it was final.
	EventChangesReadFailed
)

// event reports e to Options.OnEvent, if set.
func (r *Replication) event(e Event) {
	if r.o.OnEvent != nil {
		r.o.OnEvent(e)
	}
}
