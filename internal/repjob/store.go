package repjob

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/internal/share"
	"github.com/couchrep/couchrep/messages"
)

// JobType is the couch_jobs type of replication jobs.
const JobType = "replication"

// DefaultActivityTimeout is the activity timeout of replication jobs: a
// running job its worker has not updated for this long is taken back by the
// activity monitor ([couchrep] activity_timeout). The FDB-era replicator's
// ?REP_JOBS_TIMEOUT_SEC was 61 s; 30 s keeps a dead node's jobs away for
// well under a minute (timeout plus the monitor's interval).
const DefaultActivityTimeout = 30 * time.Second

// DefaultTransientMaxAge is how long finished transient jobs are kept
// (transient_job_max_age_sec, one day).
const DefaultTransientMaxAge = 24 * time.Hour

// Sentinel errors callers branch on; returned errors wrap them.
var (
	// ErrNotFound: no job with that id (or replication id).
	ErrNotFound = errors.New("repjob: job not found")
	// ErrInvalid: the replication body does not parse; the message names
	// the field as CouchDB's does. It also wraps replication.ErrInvalidParams.
	ErrInvalid = errors.New("repjob: invalid replication")
	// ErrDuplicate: another pending or running job owns the replication id
	// (see Duplicate for which).
	ErrDuplicate = errors.New("repjob: duplicate replication")
	// ErrDocumentJob: the job is a _replicator document's; it follows its
	// document and cannot be canceled (as in CouchDB, where only deleting
	// or changing the document stops it for good).
	ErrDocumentJob = errors.New("repjob: the job of a _replicator document follows its document")
	// ErrOtherUser: AddTransientAs by a user who is not a server admin
	// for a replication whose id another user's live job owns (CouchDB
	// 3.4.3's couch_replicator:check_authorization: 401 "You are not a
	// server admin."); nothing changed.
	ErrOtherUser = errors.New("repjob: another user's job runs this replication")
)

// Duplicate is the error a starting job gets when another live job owns its
// replication id. It wraps ErrDuplicate.
type Duplicate struct {
	RepID string
	// OwnerJobID and OwnerKind name the job owning RepID.
	OwnerJobID string
	OwnerKind  messages.ReplicationKind
}

func (d *Duplicate) Error() string {
	return fmt.Sprintf("Duplicate job running: %s (replication %s)", d.OwnerJobID, d.RepID)
}

// Unwrap makes errors.Is(err, ErrDuplicate) true.
func (d *Duplicate) Unwrap() error { return ErrDuplicate }

// Options configures a Store.
type Options struct {
	// Prefix is prepended to every key of the store's own subspace; nodes
	// sharing a store must agree. (The queue has its own prefix.)
	Prefix []byte
	// Logger receives structured logs.
	Logger zerolog.Logger
	// Clock tells the time; nil is the system clock.
	Clock schedpolicy.Clock
	// ServerUUID is [couchdb] uuid, the first element of replication ids.
	ServerUUID string
	// Policy gives the backoff, history length and run quantum; the zero
	// value means scheduler.DefaultPolicy().
	Policy schedpolicy.Policy
	// Shares is [replicator.shares]: share key → shares.
	Shares map[string]int
	// HalfLife is share.Params.HalfLife (zero: share's default).
	HalfLife time.Duration
	// TransientMaxAge is how long finished transient jobs are kept; zero
	// means DefaultTransientMaxAge.
	TransientMaxAge time.Duration
	// ActivityTimeout is the job type's activity timeout; zero means
	// DefaultActivityTimeout.
	ActivityTimeout time.Duration
}

// Store is the replication job store. It is safe for concurrent use.
type Store struct {
	q    *jobqueue.Queue
	db   kv.Database
	k    keys
	log  zerolog.Logger
	uuid string

	mu       sync.Mutex
	clock    schedpolicy.Clock
	policy   schedpolicy.Policy
	params   share.Params
	shares   map[string]int
	maxAge   time.Duration
	timeout  time.Duration
	typeDone bool

	lease atomic.Pointer[jobqueue.Lease] // see KeepLease
	// leaseMu guards leasing and leaseOpen: while KeepLease runs
	// (leasing) and no lease is open, a waiting Accept waits on
	// leaseOpen, closed when one is (see acceptLease).
	leaseMu   sync.Mutex
	leasing   bool
	leaseOpen chan struct{}
	// leaseKick ends KeepLease's wait for its next round (an Accept found
	// the lease lost); kicked records a kick that came while it was not
	// waiting.
	leaseKick func()
	kicked    bool
}

// New returns the store of replication jobs in queue (whose database is db).
func New(queue *jobqueue.Queue, db kv.Database, opts Options) *Store {
	s := &Store{q: queue, db: db, k: newKeys(opts.Prefix), log: opts.Logger, uuid: opts.ServerUUID,
		clock: opts.Clock, policy: opts.Policy, maxAge: opts.TransientMaxAge, timeout: opts.ActivityTimeout}
	if s.clock == nil {
		s.clock = schedpolicy.SystemClock{}
	}
	if s.policy.MaxJobs == 0 && s.policy.Interval == 0 {
		s.policy = schedpolicy.DefaultPolicy()
	}
	if s.maxAge <= 0 {
		s.maxAge = DefaultTransientMaxAge
	}
	if s.timeout <= 0 {
		s.timeout = DefaultActivityTimeout
	}
	s.params = share.Params{Quantum: s.policy.RunQuantum(), HalfLife: opts.HalfLife}
	s.shares = map[string]int{}
	for k, v := range opts.Shares {
		s.shares[k] = share.ClampShares(v)
	}
	return s
}

// Queue returns the job queue the store keeps its jobs in.
func (s *Store) Queue() *jobqueue.Queue { return s.q }

// ActivityTimeout is the replication job type's activity timeout: workers
// update their jobs at least twice per timeout.
func (s *Store) ActivityTimeout() time.Duration { return s.timeout }

// Policy returns the scheduling policy in force.
func (s *Store) Policy() schedpolicy.Policy {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.policy
}

// SetPolicy changes the policy (max_jobs, backoff, ...) at run time. The
// fair-share quantum follows it.
func (s *Store) SetPolicy(p schedpolicy.Policy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.policy = p
	s.params.Quantum = p.RunQuantum()
	return nil
}

// SetShares changes the shares of the given keys (clamped to
// share.MinShares..share.MaxShares; 0 resets a key to the default) and
// returns every configured key's shares. Changes apply to later enqueues and
// charges.
func (s *Store) SetShares(shares map[string]int) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range shares {
		if v == 0 {
			delete(s.shares, k)
			continue
		}
		s.shares[k] = share.ClampShares(v)
	}
	return s.sharesLocked()
}

// Shares returns every configured key's shares; other keys have
// share.DefaultShares.
func (s *Store) Shares() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sharesLocked()
}

func (s *Store) sharesLocked() map[string]int {
	out := make(map[string]int, len(s.shares))
	for k, v := range s.shares {
		out[k] = v
	}
	return out
}

func (s *Store) sharesOf(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n, ok := s.shares[key]; ok {
		return n
	}
	return share.DefaultShares
}

func (s *Store) shareParams() share.Params {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.params
}

func (s *Store) now() time.Time { return s.clock.Now() }

// Init registers the replication job type with its activity timeout. Every
// other method calls it when needed; calling it at start surfaces store
// errors early.
func (s *Store) Init(ctx context.Context) error {
	s.mu.Lock()
	done := s.typeDone
	s.mu.Unlock()
	if done {
		return nil
	}
	if err := s.q.SetTypeTimeout(ctx, JobType, s.timeout); err != nil {
		return fmt.Errorf("repjob: register job type: %w", err)
	}
	if err := s.buildListing(ctx); err != nil {
		return fmt.Errorf("repjob: index jobs for listing: %w", err)
	}
	s.mu.Lock()
	s.typeDone = true
	s.mu.Unlock()
	return nil
}

// Record is one replication job as read from the store: the stored record
// and the queue's view of it.
type Record struct {
	*messages.ReplicationJob
	// QueueState is the couch_jobs state (pending, running, finished).
	QueueState jobqueue.State
	// Version changes with every write of the job (see WaitState).
	Version uint64
	// Priority is the job's fair-share deadline in the queue.
	Priority uint64
	// ScheduledAt is when a pending job may run (after a crash: the end of
	// its backoff).
	ScheduledAt time.Time
	// WorkerNode is the node holding a running job.
	WorkerNode string
	// Canceled: the job was canceled through the queue.
	Canceled bool
}

// State is the job's state as _scheduler/jobs and _scheduler/docs show it,
// from the stored state and the queue state: a running job is running, a
// job a node gave up on silently (re-enqueued by the activity monitor) is
// pending, a finished job is completed or failed.
func (r *Record) State() State {
	stored := State(r.GetState())
	switch r.QueueState {
	case jobqueue.StateRunning:
		return StateRunning
	case jobqueue.StateFinished:
		if stored == StateCompleted {
			return StateCompleted
		}
		return StateFailed
	default:
		if stored == StateCrashing {
			return StateCrashing
		}
		return StatePending
	}
}

// NotScheduled reports a _replicator document's job that crashed before it
// had a replication id: its named filter could not be fetched from the
// source yet. CouchDB's document processor keeps such a document out of its
// scheduler (state "error" in _scheduler/docs, absent from _scheduler/jobs)
// and retries it with backoff; couchrep's crash backoff retries it, and
// the listings show it as CouchDB does.
func (r *Record) NotScheduled() bool {
	return r.GetKind() == messages.ReplicationKind_REPLICATION_KIND_PERSISTENT && r.State() == StateCrashing && r.GetRepId() == ""
}

// History returns the job's scheduler history.
func (r *Record) History() schedpolicy.History {
	return schedpolicy.HistoryFromProto(r.GetHistory())
}

func recordFromInfo(info *jobqueue.JobInfo) (*Record, error) {
	m := &messages.ReplicationJob{}
	if err := proto.Unmarshal(info.Data, m); err != nil {
		return nil, fmt.Errorf("repjob: decode job %q: %w", info.ID, err)
	}
	if m.JobId == "" {
		m.JobId = info.ID
	}
	return &Record{ReplicationJob: m, QueueState: info.State, Version: info.Version, Priority: info.Priority,
		ScheduledAt: info.ScheduledAt, WorkerNode: info.WorkerNode, Canceled: info.Canceled}, nil
}

// maxRecordBytes bounds the encoded record of a job (its data in the
// queue): the job store refuses values above kv.MaxValueSize on every
// backend, and the queue's record adds the job id (at most 1,024 bytes),
// the node name and a few times. replicate.MaxDocumentBytes keeps the
// replication body well within it.
const maxRecordBytes = kv.MaxValueSize - 4_096

// maxReasonBytes bounds an error text kept in a record (the last error, a
// crash in the history): CouchDB's are a line; ours may quote a server's
// answer.
const maxReasonBytes = 1_000

// marshal encodes m to be stored, fitting it in maxRecordBytes: error texts
// are clipped and, if that is not enough, the oldest history events
// dropped (m is changed to what is stored). A record that still does not
// fit is an error wrapping kv.ErrValueTooLarge, never a silent loss.
func marshal(m *messages.ReplicationJob) ([]byte, error) {
	m.LastError = clip(m.LastError, maxReasonBytes)
	h := m.GetHistory()
	for _, e := range h.GetEvents() {
		e.Reason = clip(e.Reason, maxReasonBytes)
	}
	b, err := proto.Marshal(m)
	for err == nil && len(b) > maxRecordBytes && len(h.GetEvents()) > 1 {
		h.Events = h.Events[:len(h.Events)-1] // newest first
		b, err = proto.Marshal(m)
	}
	if err != nil {
		return nil, fmt.Errorf("repjob: encode job %q: %w", m.GetJobId(), err)
	}
	if len(b) > maxRecordBytes {
		return nil, fmt.Errorf("repjob: job %q: its record is %d bytes, at most %d: %w", m.GetJobId(), len(b), maxRecordBytes, kv.ErrValueTooLarge)
	}
	return b, nil
}

// clip shortens s to at most n bytes (whole UTF-8 characters), marking the
// cut with "…".
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// TransientJobID is the job id of a POST /_replicate job, as the FDB-era
// couch_replicator_ids:job_id/3: a hash of the server UUID, the source and
// target without credentials, the user and the options other than
// "continuous" and "cancel", so that the same request (or its cancel) finds
// the same job.
func TransientJobID(p replicate.Params, user, serverUUID string) string {
	p.Continuous = false
	p.FilterCode = ""
	p.Source = withoutCreds(p.Source)
	p.Target = withoutCreds(p.Target)
	b, _ := json.Marshal(struct {
		UUID, User string
		Params     replicate.Params
	}{serverUUID, user, p})
	sum := md5.Sum(b)
	return hex.EncodeToString(sum[:])
}

func withoutCreds(ep replicate.EndpointParams) replicate.EndpointParams {
	ep.BasicUser, ep.BasicPass, ep.HasBasic, ep.Token = "", "", false, nil
	ep.URL = redact.StripUserinfo(ep.URL)
	hs := ep.Headers[:0:0]
	for _, h := range ep.Headers {
		if !strings.EqualFold(h.Name, "Authorization") {
			hs = append(hs, h)
		}
	}
	ep.Headers = hs
	return ep
}

// PersistentJobID is the job id of the replication defined by document
// docID of _replicator database db on server: "server|db|docID". (CouchDB
// uses the database's UUID, which needs a request; couchrep's doc processor
// removes a deleted database's jobs instead.)
func PersistentJobID(server, db, docID string) string {
	return strings.TrimRight(server, "/") + "|" + db + "|" + docID
}

func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}
