package jobqueue

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/pause"
	"github.com/couchrep/couchrep/messages"
)

// MonitorOptions configures an activity Monitor.
type MonitorOptions struct {
	// Interval is how often Run checks every type. Zero means a quarter of
	// the shortest type timeout, clamped to [10ms, 5s]. A silent worker's
	// job is re-enqueued within its type's timeout plus about one interval.
	Interval time.Duration
	// BatchSize bounds the stale entries handled per transaction (default 256).
	BatchSize int
}

// Monitor is the activity monitor: it re-enqueues running jobs whose worker
// has not updated them within their type's activity timeout. Any number of
// monitors (one per node) may run at once: each re-enqueue is a
// transaction that re-checks the job, so a job is re-enqueued once.
//
// It follows couch_jobs' scheme: every Accept and Update writes the job's
// ACTIVITY entry under the transaction's versionstamp, so the entries are
// ordered by the time of each job's last sign of life. Each check samples
// the newest stamp (the last ACTIVITY key of the type; couch_jobs keeps it
// in a separate "watches" key that every update rewrites, which costs a
// write per update and is a hot key on FoundationDB). An entry whose stamp
// is not newer than a sample taken at least one timeout ago has not been
// updated for a whole timeout. Only those entries are read, so a check
// costs in proportion to the stale jobs, not to all running jobs.
type Monitor struct {
	q    *Queue
	opts MonitorOptions

	mu    sync.Mutex
	types map[string]*monitorType
}

type monitorType struct {
	timeout time.Duration
	samples []stampSample // oldest first
}

type stampSample struct {
	at    time.Time
	stamp [kv.VersionstampLength]byte
}

// NewMonitor returns an activity monitor over q's types.
func (q *Queue) NewMonitor(opts MonitorOptions) *Monitor {
	if opts.BatchSize <= 0 {
		opts.BatchSize = 256
	}
	return &Monitor{q: q, opts: opts, types: make(map[string]*monitorType)}
}

// Run checks every registered type periodically until ctx ends, then
// returns nil. Failed checks are logged and retried at the next interval.
func (m *Monitor) Run(ctx context.Context) error {
	for next := time.Duration(0); pause.For(ctx, next) == nil; {
		if _, err := m.Check(ctx, time.Now()); err != nil && ctx.Err() == nil {
			m.q.log.Warn().Err(err).Msg("activity monitor check failed")
		}
		iv := m.interval()
		// ±10% jitter so that the monitors of several nodes spread out.
		next = iv + time.Duration((mrand.Float64()*0.2-0.1)*float64(iv))
	}
	return nil
}

func (m *Monitor) interval() time.Duration {
	if m.opts.Interval > 0 {
		return m.opts.Interval
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	iv := 5 * time.Second
	for _, t := range m.types {
		iv = min(iv, t.timeout/4)
	}
	return max(iv, 10*time.Millisecond)
}

// Check runs one pass over every registered type at time now (a reading of
// the local monotonic clock: samples are compared only with each other) and
// returns how many jobs it re-enqueued (or finished, for canceled ones).
func (m *Monitor) Check(ctx context.Context, now time.Time) (int, error) {
	types, err := m.q.Types(ctx)
	if err != nil {
		return 0, err
	}
	total := 0
	var errs []error
	for typ, timeout := range types {
		n, err := m.checkType(ctx, typ, timeout, now)
		total += n
		if err != nil {
			errs = append(errs, fmt.Errorf("type %q: %w", typ, err))
		}
	}
	return total, errors.Join(errs...)
}

func (m *Monitor) checkType(ctx context.Context, typ string, timeout time.Duration, now time.Time) (int, error) {
	m.mu.Lock()
	st := m.types[typ]
	if st == nil || st.timeout != timeout {
		// New type, or its timeout changed: start sampling afresh.
		st = &monitorType{timeout: timeout}
		m.types[typ] = st
	}
	// The newest sample at least one timeout old.
	idx := -1
	for i, s := range st.samples {
		if now.Sub(s.at) >= timeout {
			idx = i
		}
	}
	var threshold *stampSample
	if idx >= 0 {
		s := st.samples[idx]
		threshold = &s
		st.samples = st.samples[idx+1:]
	}
	m.mu.Unlock()

	// Sample the newest activity stamp before scanning (any order is
	// correct; this one keeps the sample conservative).
	var (
		cur  [kv.VersionstampLength]byte
		have bool
	)
	err := m.q.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		have = false
		// The newest job activity or lease renewal.
		begin, end := m.q.keys.activityRange(typ)
		it := tx.Snapshot().GetRange(begin, end, kv.RangeOptions{Limit: 1, Reverse: true})
		for it.Next() {
			stamp, _, err := m.q.keys.parseActivity(it.KeyValue().Key)
			if err != nil {
				return err
			}
			cur, have = stamp, true
		}
		if err := it.Err(); err != nil {
			return err
		}
		begin, end = m.q.keys.leaseActivityRange(typ)
		it = tx.Snapshot().GetRange(begin, end, kv.RangeOptions{Limit: 1, Reverse: true})
		for it.Next() {
			stamp, _, err := m.q.keys.parseLeaseActivity(it.KeyValue().Key)
			if err != nil {
				return err
			}
			if !have || bytes.Compare(stamp[:], cur[:]) > 0 {
				cur, have = stamp, true
			}
		}
		return it.Err()
	})
	if err != nil {
		return 0, err
	}
	if have {
		m.mu.Lock()
		if m.types[typ] == st {
			st.samples = append(st.samples, stampSample{at: now, stamp: cur})
		}
		m.mu.Unlock()
	}
	if threshold == nil {
		return 0, nil
	}
	n, err := m.expireLeases(ctx, typ, threshold.stamp)
	if err != nil {
		return n, err
	}
	k, err := m.requeueStale(ctx, typ, threshold.stamp)
	return n + k, err
}

// requeueStale re-enqueues the running jobs of typ whose activity stamp is
// at most through.
func (m *Monitor) requeueStale(ctx context.Context, typ string, through [kv.VersionstampLength]byte) (int, error) {
	q := m.q
	begin, end := q.keys.activityRangeThrough(typ, through)
	total := 0
	for {
		var (
			n, seen int
			last    []byte
		)
		err := q.db.Transact(ctx, func(tx kv.Tx) error {
			n, seen, last = 0, 0, nil
			keys, err := kv.Keys(tx.Snapshot().GetRange(begin, end, kv.RangeOptions{Limit: m.opts.BatchSize}))
			if err != nil {
				return err
			}
			seen = len(keys)
			now := q.clock()
			for _, key := range keys {
				last = key
				ok, err := m.requeueEntry(tx, typ, key, through, now)
				if err != nil {
					return err
				}
				if ok {
					n++
				}
			}
			return nil
		})
		if err != nil {
			return total, err
		}
		total += n
		if seen < m.opts.BatchSize {
			return total, nil
		}
		begin = append(last, 0x00)
	}
}

func (m *Monitor) requeueEntry(tx kv.Tx, typ string, key []byte, through [kv.VersionstampLength]byte, now time.Time) (bool, error) {
	q := m.q
	stamp, rec, err := entryRecord(q, tx, typ, "activity", key, q.keys.parseActivity)
	if err != nil {
		return false, err
	}
	if rec == nil || rec.GetState() != messages.JobState_JOB_STATE_RUNNING ||
		!bytes.Equal(rec.GetActivityStamp(), stamp[:]) {
		return false, nil // a leftover entry; the job moved on
	}
	if covered, err := q.leaseCovers(tx, rec, through); err != nil || covered {
		// A live lease proves the worker alive: the job needs no activity
		// entry of its own until its next update.
		return false, err
	}
	if err := q.releaseLease(tx, typ, rec.GetId()); err != nil {
		return false, err
	}
	return true, q.requeueRecord(tx, rec, now)
}

// requeueRecord takes running job rec from its silent worker: back to the
// queue, or finished if a user canceled it. Its activity entry is cleared.
func (q *Queue) requeueRecord(tx kv.Tx, rec *messages.JobRecord, now time.Time) error {
	typ, id := rec.GetType(), rec.GetId()
	ev := q.log.Warn().Str("type", typ).Str("job", id).Str("worker_node", rec.GetWorkerNode()).
		Time("last_update", tsTime(rec.GetUpdatedAt()))
	rec.WorkerLock = nil
	rec.TimeoutCount++
	rec.UpdatedAt = timeTS(now)
	if rec.GetCancelRequested() {
		rec.State = messages.JobState_JOB_STATE_FINISHED
		rec.Canceled = true
		rec.FinishedAt = timeTS(now)
		ev.Msg("activity timeout: canceled job finished")
	} else {
		rec.State = messages.JobState_JOB_STATE_PENDING
		rec.ResubmitRequested = false
		q.enqueue(tx, rec, now)
		ev.Msg("activity timeout: job re-enqueued")
	}
	return q.storeRecord(tx, rec)
}
