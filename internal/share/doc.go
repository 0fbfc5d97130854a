// Package share is couchrep's fair-share arithmetic: how the scheduler turns
// [replicator.shares] into the priority a job gets when it is put into the
// shared job queue.
//
// CouchDB 3.x (couch_replicator_share, RFC 017, after Kay & Lauder's "A Fair
// Share Scheduler") keeps a priority per job and, every interval, rewrites the
// priority of every job: usage is decayed, all priorities are decayed (the
// "uniform boost" that keeps jobs from starving) and running jobs are
// penalised. That is O(jobs) work per interval, and it cannot be done on a
// queue shared by many nodes without rewriting every pending record. The RFC
// notes that scheduling by an absolute deadline would avoid the boosting
// step. This package does exactly that: a job's priority is a virtual
// deadline, fixed when the job is enqueued, and the queue (internal/jobqueue
// Accept: lowest priority first, then scheduled time, then id) does the rest.
// The work is O(1) per enqueue and per charge and nothing is ever rewritten.
//
// # The virtual clock
//
// Priorities are virtual microseconds: one microsecond of running time of a
// job whose key has DefaultShares (100) shares. A key with n shares pays
// 100/n virtual microseconds per microsecond of running time, so a key with
// twice the shares advances half as fast.
//
// Each share key (a _replicator database; the user name for _replicate jobs,
// see Key) has an Account whose Finish is the key's virtual finish time: how
// far along the virtual clock the key has consumed. The Ledger also tracks
// the frontier: the highest priority of any job accepted from the queue
// (Ledger.Accepted). The frontier is the "current time" of the virtual clock:
// it moves forward exactly as fast as the queue is served, which is what a
// wall-clock deadline cannot do without knowing the capacity of the cluster.
//
// Enqueueing a job of key k reserves one quantum (Params.Quantum: the
// running time a job can expect before it is rotated out, which the
// scheduler computes as scheduler.Policy.RunQuantum) of running time for it
// and returns its deadline:
//
//	start    = max(Finish(k), frontier)
//	Finish(k) = start + Quantum·100/shares(k)
//	priority = Finish(k)
//
// Running time is charged as it happens (Ledger.Charge); the first quantum
// of every run was paid at enqueue, so the scheduler charges only the time
// beyond it, and refunds the unused part when a job stops early (a negative
// charge). Over time every key pays exactly its running time × 100/shares.
//
// Why it is fair: while several keys all have more pending jobs than there
// are slots, the queue hands out jobs in deadline order, so the frontier
// moves at one common speed, and each key's Finish can only keep pace with
// the frontier if its running time grows at a rate proportional to its
// shares. A key that runs more than its share pushes its deadlines ahead of
// the frontier and its jobs wait; a key that runs less falls behind, and
// max(·, frontier) stops it from banking credit while it is idle or under
// its share. Many jobs enqueued at once by one key get deadlines one quantum
// apart, so they interleave with other keys' jobs instead of jumping the
// queue together. This is stride scheduling / start-time fair queueing with
// the queue's own order as the clock.
//
// Why it is starvation-free: a job's deadline never changes, every later
// enqueue of any key gets a deadline above the frontier, and each enqueue
// moves its key's Finish forward by at least Quantum/10 (shares ≤ 1000);
// refunds give back only what a run did not use, and a job that crashes
// right away is held back by its backoff (scheduled time), so only finitely
// many jobs can be put ahead of a waiting job. The simulations in
// internal/schedpolicy measure the wait (worst 65 intervals for the 50-share
// database of the scenario, whose fair cycle is about 70).
//
// # Decay
//
// A key's debt is how far its Finish is ahead of the frontier. Debt decays
// exponentially with Params.HalfLife, evaluated lazily from (Finish,
// UpdatedAt) when the account is read, so a key that once ran far more than
// its share (a long one-shot job, or a share cut) is forgiven over time even
// if the frontier hardly moves. Credit (Finish behind the frontier) is never
// kept: idle keys start level with the frontier. Decay trades exactness for
// forgiveness: in steady state a key's debt is about its queueing delay
// times the frontier's speed, so a half-life H shifts a key's share by
// roughly its queueing delay / (H/ln 2); the default of 24 h keeps that to a
// few percent for queueing delays of an hour.
//
// # State
//
// Per key the state is one Account (Finish, UpdatedAt), stored by the caller
// as a messages.ShareAccount record (Account.Proto, AccountFromProto), plus
// one frontier value per node or per cluster (the highest accepted
// priority; seed it with Ledger.Accepted before enqueueing after a restart,
// for example from the lowest priority pending in the queue). Shares come
// from configuration ([replicator.shares]) and can be changed at run time
// with SetShares; a change applies to charges and enqueues from then on and
// rewrites nothing.
//
// The scale is 2^64 virtual microseconds. The frontier advances by about
// (running slots × 100/shares) virtual seconds per second: with 500 slots
// all held by a 1-share key that is 11 years before saturation (additions
// saturate rather than wrap).
//
// A Ledger is not safe for concurrent use; the scheduler actor owns it.
package share
