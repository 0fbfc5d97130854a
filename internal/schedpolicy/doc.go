// Package schedpolicy is the replication scheduler's policy and per-node
// state, without actors: the scheduler actor wraps a Node and turns its
// decisions into stop messages and queue writes.
//
// It follows CouchDB's couch_replicator_scheduler (3.x) on a shared
// couch_jobs-style queue (internal/jobqueue), as the FoundationDB-era job server
// does:
//
//   - Every Policy.Interval, while jobs are pending, Node.Tick charges the
//     running jobs' time to their share keys and Rotate picks up to
//     Policy.MaxChurn of this node's longest-running continuous jobs to stop
//     (one-shot jobs are never rotated out); the caller stops them and
//     resubmits them (Node.Stopped gives the priority and time) and lets its
//     acceptors take jobs up to Policy.MaxJobs (Decision.Start, Node.Slots).
//     The work per tick is O(running jobs · log), never O(pending jobs).
//   - Priorities are fair-share virtual deadlines from internal/share
//     (create the Ledger with share.Params{Quantum: policy.RunQuantum()});
//     the queue's "lowest priority first" order is the whole pending-side
//     algorithm. Node.Add, Node.Stopped and Node.Crashed return the
//     Placement (priority, scheduled time) for jobs.Add / jobs.Resubmit, and
//     Node.Started must be given the priority the job was accepted with.
//   - A crashed job is resubmitted to run after a backoff of
//     min(MinBackoff·2^(n-1), MaxBackoff) where n counts the job's
//     consecutive crashes as CouchDB does (History.ConsecutiveCrashes): a
//     run longer than HealthThreshold heals the job.
//   - History keeps added/started/stopped/crashed events (newest first, at
//     most MaxHistory) and renders CouchDB's _scheduler/jobs "history" JSON.
//     A job's state is internal/repjob's (repjob.State).
//
// Time comes from a Clock; FakeClock makes every rule testable without
// sleeping.
package schedpolicy
