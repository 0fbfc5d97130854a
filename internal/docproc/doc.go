// Package docproc turns documents in _replicator databases into replication
// jobs, as CouchDB's couch_replicator_doc_processor does, without actors: the
// doc_processor actor (actors/docprocessor) runs a Processor in a goroutine.
//
// A Processor watches the CouchDB servers of [couchrep] watch. On each it
// discovers the _replicator databases (a database named "_replicator" or
// ending in "/_replicator"): from _db_updates where the server has it
// (Apache CouchDB), by polling _all_dbs otherwise (PouchDB Server). For each
// database it follows the _changes feed from a sequence checkpointed in the
// job store, so a restarted node does not reprocess every document, and
// decides per document (Decide) whether to add, update or remove its job
// through a JobStore (internal/repjob in the node). Deleting a database
// removes its jobs.
//
// The feed is read with include_docs=true and processed in batches: the
// rows that arrived while the previous batch was being processed (at most
// 500, each document once) are decided, and their jobs, records and the
// feed checkpoint committed, in one store transaction. An invalid document
// fails alone (its reason is written back after the commit); the rest of its
// batch goes on.
//
// Like CouchDB it skips _design/ and _local/ documents and never runs a
// document carrying a terminal state (_replication_state "completed" or
// "failed"): one it did not write itself (another replicator's, a user's,
// or an edit keeping the state) is recorded as a finished job in that state
// whose _scheduler/docs entry is read from the document, as CouchDB's
// info_from_doc reads it (DocEntry). It writes only terminal states back
// to documents (_replication_state, _replication_state_time,
// _replication_id, _replication_stats or _replication_state_reason). Its own
// writes do not start jobs again: for every document it records in the store
// a fingerprint of the replication-relevant fields (every field not starting
// with "_"); a document whose fingerprint is unchanged is never re-added,
// while a user's removal of the terminal state runs it again, as in
// CouchDB. An invalid document gets "failed" with the reason
// replication.ParseParams gives, which names the field.
//
// # One processor per database
//
// When several api_frontend nodes watch the same server, only one processes
// a given _replicator database at a time: it holds a lease in the store, a key
// with the owner node and an expiry, taken and renewed in transactions
// (every TTL/3). A node that loses its lease stops following the database; a
// node that stops releases its leases so another takes over at once. Leases
// rather than "everyone processes, AddPersistent is idempotent" because the
// doc processor also writes to documents and checkpoints its feed: several
// writers would race on document revisions (conflicts, repeated writes) and
// on the checkpoint, and every node would read every feed.
//
// # Store layout
//
// Under the subspace (Options.Prefix, "docproc"):
//
//	("seq", server, db)          = last processed _changes seq (JSON)
//	("doc", server, db, doc_id)  = docRecord (JSON): job id, fingerprint, rev, written
//	("lease", server, db)        = lease (JSON): owner node, expiry
//	("watching", node)           = the servers node's watch list named at its last start (JSON)
//
// server is the watched server's URL without credentials.
//
// # A server no longer watched
//
// At start-up (ForgetUnwatched; there is no configuration reload) a node
// records its watch list and forgets every server the doc processor knew
// that no node watches any more: its documents' jobs are removed (a running
// one stopped at once) and its records, checkpoints and leases cleared, so
// that nothing of it runs again. The replication checkpoints stay on the
// endpoints. A server another node's recorded list names, or on whose
// databases another node holds a live lease, is still watched.
package docproc
