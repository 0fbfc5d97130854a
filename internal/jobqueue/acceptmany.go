package jobqueue

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/messages"
)

// maxAcceptMany bounds the jobs one AcceptMany takes (one transaction).
const maxAcceptMany = 256

// AcceptMany is Accept for up to n jobs in one transaction: what a node
// with many free slots uses when many jobs are pending at once (a node's
// start with thousands of jobs queued, or the jobs of a dead node coming
// back to the queue), where one transaction per job made the accept loop
// the bottleneck. It reads a window of the queue head (about 16 n keys,
// lowest priority first) and takes a run of up to n consecutive pending
// jobs starting at a random place among its first Options.AcceptSpread
// keys, the head Accept picks from: no job is passed over by more than
// AcceptSpread-1 others (with AcceptSpread 1, the batch is the head in
// priority order), and the acceptors of several nodes taking batches at
// once start at different places (a collision costs the loser one
// attempt, which reads the head the winner left). Their records are read
// in one round trip where the store allows (kv.GetMany). With opts.Wait it waits, as Accept does, for at
// least one job. n < 2 is Accept. AcceptMany ignores the head keys cached
// by Accept (it reads the head itself). With opts.Share it takes at most
// the worker's share of the pending jobs, and none (ErrOverShare, also
// with opts.Wait) when the worker holds its share already.
func (q *Queue) AcceptMany(ctx context.Context, typ string, n int, opts AcceptOptions) ([]*Job, error) {
	if n < 2 {
		j, err := q.Accept(ctx, typ, opts)
		if err != nil {
			return nil, err
		}
		return []*Job{j}, nil
	}
	n = min(n, maxAcceptMany)
	for {
		var (
			jobs []*Job
			w    kv.Watch
			next time.Time
		)
		promoted := false // as in Accept
		err := q.db.Transact(ctx, func(tx kv.Tx) error {
			if w != nil { // from an attempt that did not commit
				w.Cancel()
			}
			w, next = nil, time.Time{}
			var err error
			jobs, err = q.acceptManyTx(tx, typ, n, opts, &promoted)
			if err != nil || len(jobs) > 0 || !opts.Wait {
				return err
			}
			// Commit anyway: promotions and stale-entry cleanups stick.
			w = tx.Watch(q.keys.pendingWatchKey(typ))
			next, err = q.nextScheduled(tx, typ)
			return err
		})
		if err != nil {
			if w != nil {
				w.Cancel()
			}
			return nil, wrapOp("accept", typ, "", err)
		}
		if len(jobs) > 0 {
			return jobs, nil
		}
		if !opts.Wait {
			return nil, wrapOp("accept", typ, "", fmt.Errorf("%w: no eligible pending job", ErrNotFound))
		}
		if err := q.waitPending(ctx, w, next); err != nil {
			return nil, wrapOp("accept", typ, "", err)
		}
	}
}

// acceptManyTx is one attempt of AcceptMany; promotedBefore is acceptTx's.
func (q *Queue) acceptManyTx(tx kv.Tx, typ string, n int, opts AcceptOptions, promotedBefore *bool) ([]*Job, error) {
	if err := q.checkType(tx, typ); err != nil {
		return nil, err
	}
	now := q.clock()
	promoted := *promotedBefore || q.promoteDue(typ, now)
	*promotedBefore = promoted
	if promoted {
		if err := q.promote(tx, typ, now); err != nil {
			return nil, err
		}
	}
	maxPrio := ^uint64(0)
	if opts.HasMaxPriority {
		maxPrio = opts.MaxPriority
	}
	if opts.Lease != nil {
		// The lease is read once for the whole batch (holdUnder reads it
		// per job).
		v, err := tx.Get(q.keys.leaseKey(opts.Lease.typ, opts.Lease.id))
		if err != nil {
			return nil, err
		}
		if _, dead, ok := leaseValue(v); !ok || dead {
			return nil, ErrLeaseLost
		}
	}
	begin, end := q.keys.readyRange(typ, maxPrio)
	window := max(16*n, q.spread)
	var jobs []*Job
	for len(jobs) < n {
		// Snapshot read: the entries need no conflict (see take); the
		// records read below have one.
		cands, err := kv.Keys(tx.Snapshot().GetRange(begin, end, kv.RangeOptions{Limit: window}))
		if err != nil {
			return nil, err
		}
		if len(cands) == 0 {
			if promoted || len(jobs) > 0 {
				return jobs, nil
			}
			promoted, *promotedBefore = true, true
			if err := q.promote(tx, typ, now); err != nil {
				return nil, err
			}
			continue
		}
		if opts.Share != nil && len(jobs) == 0 && len(cands) < window {
			// This worker's share of what is pending, judged once per
			// transaction on the first read of the head. A full window
			// (16 n jobs or more pending) is not bounded: the count is
			// only a floor there, and with the peers' held jobs a few
			// seconds old it made a node that accepted faster than its
			// peers' last heartbeats wait while thousands were pending.
			if n = min(n, opts.Share(len(cands))); n <= 0 {
				return nil, ErrOverShare
			}
		}
		want := n - len(jobs)
		from := 0
		if len(cands) > want && q.spread > 1 {
			// Within Accept's reach of the head, not anywhere in the
			// window: a run from deep in it started jobs up to 15 n
			// places ahead of their turn.
			from = mrand.IntN(min(len(cands)-want, q.spread-1) + 1)
		}
		run := cands[from:min(len(cands), from+want)]
		ids := make([]string, len(run))
		dataKeys := make([][]byte, len(run))
		prios := make([]uint64, len(run))
		for i, key := range run {
			prio, id, err := q.keys.parseReady(key)
			if err != nil {
				q.log.Error().Err(err).Str("type", typ).Msg("dropping unparsable pending entry")
				tx.Clear(key)
				continue
			}
			ids[i], prios[i], dataKeys[i] = id, prio, q.keys.dataKey(typ, id)
		}
		var fetch [][]byte
		for _, k := range dataKeys {
			if k != nil {
				fetch = append(fetch, k)
			}
		}
		vals, err := kv.GetMany(tx, fetch)
		if err != nil {
			return nil, err
		}
		for i, key := range run {
			if dataKeys[i] == nil {
				continue
			}
			v := vals[0]
			vals = vals[1:]
			tx.Clear(key) // consumed either way (entryRecord)
			if v == nil {
				continue
			}
			rec, err := decodeRecord(typ, ids[i], v)
			if errors.Is(err, ErrCorrupt) {
				q.markCorrupt(tx, typ, ids[i], err)
				continue
			}
			if err != nil {
				return nil, err
			}
			if rec.GetState() != messages.JobState_JOB_STATE_PENDING || rec.GetPriority() != prios[i] {
				continue
			}
			job, err := q.start(tx, typ, rec, now, nil)
			if err != nil {
				return nil, err
			}
			if l := opts.Lease; l != nil {
				q.holdUnderChecked(tx, l, rec)
				job.lease = l
			}
			jobs = append(jobs, job)
		}
		if len(cands) <= want && len(jobs) > 0 {
			break // the head had no more
		}
		// Read the head again for the rest: this transaction's clears
		// hide the entries it consumed (taken or stale).
	}
	return jobs, nil
}

// holdUnderChecked is holdUnder for a lease already checked alive in tx.
func (q *Queue) holdUnderChecked(tx kv.Tx, l *Lease, rec *messages.JobRecord) {
	typ, id := rec.GetType(), rec.GetId()
	tx.Set(q.keys.leaseJobKey(typ, l.id, id), rec.GetWorkerLock())
	tx.Set(q.keys.jobLeaseKey(typ, id), append(append([]byte(nil), rec.GetWorkerLock()...), l.id...))
}
