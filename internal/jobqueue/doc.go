// Package jobqueue is couchrep's background job queue: CouchDB's couch_jobs
// (RFC 007, "Background jobs with FoundationDB") on the FDB-shaped kv layer.
//
// A job has a type, an id, a priority (lower runs first; the scheduler stores
// a virtual deadline here), a scheduled time before which it is not
// accepted, and opaque type-specific data. Its state is pending, running or
// finished. Users add, resubmit, cancel, remove, read and fold jobs; workers
// Accept a pending job, which gives them a *Job holding a random worker
// lock, and then Update, Finish or Resubmit it. Every worker call checks
// the lock: ErrWorkerConflict means another worker (or the activity monitor)
// took the job and the caller must stop touching it; ErrCanceled means a
// user canceled or removed it. The ...Tx variants run inside the caller's
// own transaction, so a worker's type-specific writes commit only together
// with a successful lock check: that is what keeps mutual exclusion even
// when a worker stalls past its activity timeout.
//
// Key layout, under the subspace (Options.Prefix, "jobs"):
//
//	(DATA, type, id)                      = JobRecord (protobuf)
//	(READY, type, priority, id)           = ""   pending, scheduled time reached
//	(DELAYED, type, scheduled_ns, id)     = ""   pending, scheduled in the future
//	(PENDING_WATCH, type)                 = counter bumped on every enqueue
//	(TYPES, type)                         = JobTypeConfig (activity timeout)
//	(ACTIVITY, type, versionstamp, id)    = ""   one per running job
//	(CORRUPT, type, id)                   = ""   records that failed to decode
//	(GENERATION, type, shard)             = int64 bumped by every record write (Generation)
//	(LEASES ... LEASE_KICK, ...)                 a worker process's lease on its jobs (see Lease)
//
// Accept promotes due DELAYED entries to READY (every 100 ms, or when
// nothing is READY; an attempt that promoted and lost a conflict has its
// retry promote again), snapshot-reads the first
// Options.AcceptSpread READY keys (lowest priority first), picks one at
// random and reads its record with a conflict, so that concurrent
// acceptors on a real FoundationDB cluster do not all collide on the queue
// head. The keys it did not try are kept for the next Accepts of the same
// Queue (for 100 ms): each takes one without reading the head, if its
// record is still pending with that priority and due. The activity monitor (Monitor) samples each type's newest ACTIVITY
// stamp and re-enqueues only the ACTIVITY entries older than a sample at
// least one timeout old: its cost is proportional to the stale jobs, not to
// all running jobs, and it is safe to run on every node at once. A worker
// process that holds many jobs takes them under one Lease: renewing it
// proves every one of them alive, so an idle job writes nothing; the
// monitor drops the own activity entry of a job whose lease is live, and
// re-enqueues all the jobs of a lease not renewed for a whole timeout.
package jobqueue
