package jobqueue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/messages"
)

// MaxIDLength is the longest job id (and job type name) accepted, in bytes.
const MaxIDLength = 1024

// DefaultAcceptSpread is how many of the first eligible pending keys Accept
// chooses among at random when Options.AcceptSpread is zero.
const DefaultAcceptSpread = 16

// Options configures a Queue.
type Options struct {
	// Prefix is prepended to every key; the queue's keys live under the
	// tuple subspace (Prefix, "jobs"). Nodes sharing a store must agree.
	Prefix []byte
	// Logger receives structured logs; the zero value logs nothing.
	Logger zerolog.Logger
	// Clock returns the current time for scheduled times and timestamps;
	// nil means time.Now.
	Clock func() time.Time
	// NodeName is recorded in the jobs this node's workers hold.
	NodeName string
	// AcceptSpread is how many of the first eligible pending keys Accept
	// picks among at random (1 = strictly the lowest priority). Zero means
	// DefaultAcceptSpread.
	AcceptSpread int
	// RunLog records every run's accept and last lock-checked commit (see
	// Runs and CheckRuns), to prove afterwards that no job was ever run by
	// two workers at once. It costs one small write per worker call.
	RunLog bool
}

// Queue is the job queue over one kv.Database. It is safe for concurrent use.
type Queue struct {
	db     kv.Database
	log    zerolog.Logger
	clock  func() time.Time
	node   string
	spread int
	runLog bool
	keys   keys

	mu          sync.RWMutex
	types       map[string]struct{}  // types known to be registered (never unregistered)
	lastPromote map[string]time.Time // per type, when Accept last promoted DELAYED jobs

	claimMu sync.Mutex
	claimed map[string]struct{}   // READY keys this process's Accepts are trying (or have cached)
	heads   map[string]*headCache // per type, the head keys an Accept read and left
}

// New returns a Queue storing its jobs in db.
func New(db kv.Database, opts Options) *Queue {
	q := &Queue{
		db:          db,
		log:         opts.Logger.With().Str("component", "jobs").Logger(),
		clock:       opts.Clock,
		node:        opts.NodeName,
		spread:      opts.AcceptSpread,
		runLog:      opts.RunLog,
		keys:        newKeys(opts.Prefix),
		types:       make(map[string]struct{}),
		lastPromote: make(map[string]time.Time),
		claimed:     make(map[string]struct{}),
		heads:       make(map[string]*headCache),
	}
	if q.clock == nil {
		q.clock = time.Now
	}
	if q.spread <= 0 {
		q.spread = DefaultAcceptSpread
	}
	return q
}

// State is a job's couch_jobs state.
type State int

// The job states.
const (
	// StatePending: waiting in the queue.
	StatePending State = State(messages.JobState_JOB_STATE_PENDING)
	// StateRunning: held by a worker.
	StateRunning State = State(messages.JobState_JOB_STATE_RUNNING)
	// StateFinished: neither pending nor running.
	StateFinished State = State(messages.JobState_JOB_STATE_FINISHED)
)

// String returns "pending", "running" or "finished".
func (s State) String() string {
	switch s {
	case StatePending:
		return "pending"
	case StateRunning:
		return "running"
	case StateFinished:
		return "finished"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// JobInfo is a snapshot of one job as stored.
type JobInfo struct {
	Type        string
	ID          string
	State       State
	Priority    uint64
	ScheduledAt time.Time
	// Data is the type-specific payload.
	Data []byte
	// CancelRequested: a user asked the job to stop.
	CancelRequested bool
	// Canceled: the job finished because it was canceled.
	Canceled bool
	// ResubmitRequested: the running job goes back to pending when it finishes.
	ResubmitRequested bool
	// WorkerNode is the node of the current lock holder (running jobs).
	WorkerNode string
	// Version is bumped by every write of the job; see WaitChange.
	Version      uint64
	AcceptCount  uint64
	TimeoutCount uint64
	CreatedAt    time.Time
	UpdatedAt    time.Time
	StartedAt    time.Time
	FinishedAt   time.Time
}

func infoFromRecord(r *messages.JobRecord) *JobInfo {
	return &JobInfo{
		Type:              r.GetType(),
		ID:                r.GetId(),
		State:             State(r.GetState()),
		Priority:          r.GetPriority(),
		ScheduledAt:       tsTime(r.GetScheduledAt()),
		Data:              r.GetData(),
		CancelRequested:   r.GetCancelRequested(),
		Canceled:          r.GetCanceled(),
		ResubmitRequested: r.GetResubmitRequested(),
		WorkerNode:        r.GetWorkerNode(),
		Version:           r.GetVersion(),
		AcceptCount:       r.GetAcceptCount(),
		TimeoutCount:      r.GetTimeoutCount(),
		CreatedAt:         tsTime(r.GetCreatedAt()),
		UpdatedAt:         tsTime(r.GetUpdatedAt()),
		StartedAt:         tsTime(r.GetStartedAt()),
		FinishedAt:        tsTime(r.GetFinishedAt()),
	}
}

func validID(id string) error {
	if len(id) == 0 || len(id) > MaxIDLength {
		return fmt.Errorf("%w: length %d (must be 1..%d bytes)", ErrInvalidID, len(id), MaxIDLength)
	}
	return nil
}

func validType(typ string) error {
	if len(typ) == 0 || len(typ) > MaxIDLength {
		return fmt.Errorf("%w: job type name length %d (must be 1..%d bytes)", ErrUnknownType, len(typ), MaxIDLength)
	}
	return nil
}

// SetTypeTimeout registers job type typ (or changes its activity timeout):
// a running job of this type not updated for d is re-enqueued by the
// activity monitor. Every other call on a type needs it registered first.
func (q *Queue) SetTypeTimeout(ctx context.Context, typ string, d time.Duration) error {
	if err := validType(typ); err != nil {
		return err
	}
	if d < time.Millisecond {
		return fmt.Errorf("jobqueue: activity timeout %v for type %q: must be at least 1ms", d, typ)
	}
	val, err := marshal(&messages.JobTypeConfig{ActivityTimeoutMs: d.Milliseconds()})
	if err != nil {
		return err
	}
	if err := q.db.Transact(ctx, func(tx kv.Tx) error {
		tx.Set(q.keys.typeKey(typ), val)
		return nil
	}); err != nil {
		return fmt.Errorf("jobqueue: set timeout of type %q: %w", typ, err)
	}
	q.mu.Lock()
	q.types[typ] = struct{}{}
	q.mu.Unlock()
	return nil
}

// TypeTimeout returns the activity timeout of a registered type.
func (q *Queue) TypeTimeout(ctx context.Context, typ string) (time.Duration, error) {
	var d time.Duration
	err := q.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		var err error
		d, err = q.readTypeTimeout(tx, typ)
		return err
	})
	return d, err
}

// Types returns every registered job type with its activity timeout.
func (q *Queue) Types(ctx context.Context) (map[string]time.Duration, error) {
	out := make(map[string]time.Duration)
	err := q.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		clear(out)
		begin, end := q.keys.typesRange()
		it := tx.GetRange(begin, end, kv.RangeOptions{})
		for it.Next() {
			e := it.KeyValue()
			typ, err := q.keys.typeFromKey(e.Key)
			if err != nil {
				return err
			}
			var cfg messages.JobTypeConfig
			if err := unmarshal(e.Value, &cfg); err != nil {
				return fmt.Errorf("%w: type %q config: %v", ErrCorrupt, typ, err)
			}
			out[typ] = time.Duration(cfg.GetActivityTimeoutMs()) * time.Millisecond
		}
		return it.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("jobqueue: list types: %w", err)
	}
	return out, nil
}

func (q *Queue) readTypeTimeout(tx kv.ReadTx, typ string) (time.Duration, error) {
	if err := validType(typ); err != nil {
		return 0, err
	}
	v, err := tx.Get(q.keys.typeKey(typ))
	if err != nil {
		return 0, err
	}
	if v == nil {
		return 0, fmt.Errorf("%w: %q", ErrUnknownType, typ)
	}
	var cfg messages.JobTypeConfig
	if err := unmarshal(v, &cfg); err != nil {
		return 0, fmt.Errorf("%w: type %q config: %v", ErrCorrupt, typ, err)
	}
	return time.Duration(cfg.GetActivityTimeoutMs()) * time.Millisecond, nil
}

// checkType returns ErrUnknownType unless typ is registered. Registered
// types are cached: types are never unregistered.
func (q *Queue) checkType(tx kv.ReadTx, typ string) error {
	if err := validType(typ); err != nil {
		return err
	}
	q.mu.RLock()
	_, ok := q.types[typ]
	q.mu.RUnlock()
	if ok {
		return nil
	}
	// A snapshot read: registration is not something to conflict on.
	v, err := tx.Snapshot().Get(q.keys.typeKey(typ))
	if err != nil {
		return err
	}
	if v == nil {
		return fmt.Errorf("%w: %q (register it with SetTypeTimeout)", ErrUnknownType, typ)
	}
	q.mu.Lock()
	q.types[typ] = struct{}{}
	q.mu.Unlock()
	return nil
}

// errNoJob is Accept's internal "nothing eligible" signal.
var errNoJob = errors.New("jobqueue: no eligible job")
