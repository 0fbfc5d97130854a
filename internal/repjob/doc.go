// Package repjob is the replication job store: CouchDB's FDB-era
// couch_replicator_jobs on internal/jobqueue. It is the one place where
// replication jobs are created, read, followed and finished, for every other
// part of couchrep: the HTTP API (POST /_replicate, _scheduler/*), the doc
// processor (_replicator documents), the job actors and the scheduler.
//
// # Jobs
//
// Every replication, transient (POST /_replicate) or persistent (a document
// in a _replicator database), is one job of type JobType in the shared
// queue, whose data is a messages.ReplicationJob record (Record): kind,
// origin, the replication body as given, replication id, state, scheduler
// history, stats, last error, node and times. Jobs survive node restarts
// because the queue does; finished transient jobs are kept for
// Options.TransientMaxAge and then removed by CleanupTransient.
//
// Job ids are derived without network calls (TransientJobID,
// PersistentJobID). Replication ids need the server UUID and, for a named
// filter, the filter's code from the source: they are computed when possible
// at Add and always when a job starts (Run.ClaimRepID), so that a filtered
// replication whose filter changed restarts under its new id.
//
// # Collisions
//
// An index rep_id → job_id records which job owns a replication id, as in
// the FDB-era replicator's check_ownership: when a starting job finds its
// replication id owned by another pending or running job, it is a duplicate
// (ErrDuplicate): a duplicate of a transient job waits as crashing, a
// duplicate of a persistent job fails. An owner that finished or vanished is
// usurped.
//
// # The job view
//
// A job is a Record everywhere: the HTTP API (internal/httpapi's Job), the
// doc processor (internal/docproc's Job), the admin API
// (internal/admin.JobSummary) and the job actors read it and map it to
// their view in one function each. Its state has one type, State, with
// CouchDB's names (Record.State derives it from the stored state and the
// queue's own state); its stats have one list of names, Stats, which every
// view encodes in its own way (seq_encode'd for _scheduler/jobs, as stored
// for _replication_stats).
//
// # Fair share
//
// Priorities are share.Account virtual deadlines. The accounts
// (messages.ShareAccount) and the queue's frontier live in the store, next to
// the jobs, and are read and written inside the same transactions that add,
// start, resubmit, finish and remove jobs, so that every node sharing the
// store agrees on them. A charge (a job's run, a quantum reserved at
// enqueue, a refund) is an atomic add to the key's SHARE_CHARGES counter,
// read without a conflict: the job ends of one _replicator database never
// abort each other on its account (a crash storm's hundreds a second did).
// An enqueue finding the account record a minute old folds the counter into
// it (share.Account.Fold). Shares come from [replicator.shares] (SetShares
// changes them at run time).
//
// # Following jobs
//
// Get, List and FindByRepID read; WaitState and WaitFinished block on one
// job (kv watches, no polling); Changes and WaitChanges follow every job's
// state changes in commit order across processes (a versionstamped index
// holding the newest change of each job), which is how the doc processor
// writes terminal states back to documents.
//
// # Job control
//
// A stop, restart or cancel of a running job may be asked of any node: the
// node asked writes a JobControl request addressed to the node running the
// job (RequestControl, or Cancel together with the cancellation), that
// node's job server follows its requests (Controls, a kv watch), stops the
// job's actor and clears the request (ClearControl), and the asker waits
// for that (WaitControl). A request ends with the run it was written for:
// one whose job no longer runs there is stale and is cleared by whoever
// finds it (CleanupControls among them).
//
// # Key layout
//
// Under the subspace (Options.Prefix, "repjob"):
//
//	(REPIDS, rep_id)               = job_id
//	(SHARES, key)                  = ShareAccount
//	(SHARE_CHARGES, key)           = int64 LE, virtual µs charged since (atomic adds)
//	(FRONTIER)                     = uint64, big-endian
//	(CHANGES, versionstamp, id)    = ""    newest state change of job id
//	(LAST_CHANGE, id)              = versionstamp of that entry
//	(CHANGES_WATCH)                = counter bumped with every change
//	(EXPIRE, finished_ns, id)      = ""    finished transient jobs
//	(CONTROL, node, id)            = JobControl   stop/restart/cancel for node
//	(CONTROL_WATCH, node)          = counter bumped with every new request
//	(SCHED, shown_id, id)          = ""    jobs not finished, _scheduler/jobs order
//	(DOCS, db, doc_id, id)         = ""    jobs of documents, _scheduler/docs order
//	(LISTED, id)                   = the job's SCHED and DOCS keys (every job)
//	(COUNT, name)                  = entries of SCHED, DOCS and LISTED
//	(LISTING_BUILT)                = set once the jobs before these indexes are in
//
// The last five make listings page without reading every job (listing.go).
package repjob
