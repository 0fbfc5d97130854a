package httpapi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/messages"
)

// RepjobStore adapts internal/repjob's store to the API's Store.
type RepjobStore struct {
	store      *repjob.Store
	serverUUID string

	// summaries is ListSummaries' last listing, kept while the store's
	// job generation (repjob.Store.Generation) stays the same.
	summaries summaryCache
	// changes is SummaryChanges' state.
	changes summaryChanges
}

// summaryMaxAge bounds how long ListSummaries keeps a listing whose
// generation did not change (a node of an older version writes records
// without changing it).
const summaryMaxAge = 5 * time.Minute

// fullListingTimeout bounds SummaryChanges' full listing (every job's
// record, streamed): longer than a scrape's bound (jobsCollector's 5 s),
// which a listing of hundreds of thousands of jobs can pass; cut short, it
// would start over at every scrape and never finish.
const fullListingTimeout = 2 * time.Minute

// summaryCache is a listing of every job and the job generation read
// before it was taken.
type summaryCache struct {
	mu   sync.Mutex
	gen  int64
	at   time.Time
	jobs []*Job // nil: none
}

// NewRepjobStore returns the API's view of s; serverUUID is [couchdb] uuid
// (job ids of transient replications include it).
func NewRepjobStore(s *repjob.Store, serverUUID string) *RepjobStore {
	return &RepjobStore{store: s, serverUUID: serverUUID}
}

var _ Store = (*RepjobStore)(nil)

func notFound(err error) error {
	if errors.Is(err, repjob.ErrNotFound) && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return err
}

// AddTransient implements Store.
func (a *RepjobStore) AddTransient(ctx context.Context, body []byte, user string, admin bool) (*Job, error) {
	res, err := a.store.AddTransientAs(ctx, body, user, admin)
	if errors.Is(err, repjob.ErrOtherUser) {
		return nil, fmt.Errorf("%w: %w", ErrOtherUser, err)
	}
	if err != nil {
		return nil, err
	}
	return JobFromRecord(res.Record), nil
}

// TransientJobID implements Store.
func (a *RepjobStore) TransientJobID(body []byte, user string) (string, error) {
	p, err := replicate.ParseParams(body)
	if err != nil {
		return "", err
	}
	return repjob.TransientJobID(p, user, a.serverUUID), nil
}

// Get implements Store.
func (a *RepjobStore) Get(ctx context.Context, jobID string) (*Job, error) {
	rec, err := a.store.Get(ctx, jobID)
	if err != nil {
		return nil, notFound(err)
	}
	return JobFromRecord(rec), nil
}

// FindByRepID implements Store.
func (a *RepjobStore) FindByRepID(ctx context.Context, repID string) (*Job, error) {
	rec, err := a.store.FindByRepID(ctx, repID)
	if err != nil {
		return nil, notFound(err)
	}
	return JobFromRecord(rec), nil
}

// List implements Store.
func (a *RepjobStore) List(ctx context.Context) ([]*Job, error) {
	recs, err := a.store.List(ctx, repjob.Filter{})
	if err != nil {
		return nil, err
	}
	out := make([]*Job, len(recs))
	for i, r := range recs {
		out[i] = JobFromRecord(r)
	}
	return out, nil
}

// ListSummaries is List without the fields read from each job's body
// (CheckpointInterval, SourceProxy, TargetProxy, and Source and Target of
// a record that has none): what /metrics counts, without a JSON parse of
// every job's document at every scrape.
//
// While no job record was written since the last listing (the store's job
// generation did not change: an idle node, parked jobs) it answers that
// listing again, up to summaryMaxAge: a scrape of an idle node reads a few
// keys, not every job. The jobs it returns are shared: callers must not
// change them (the slice is the caller's).
func (a *RepjobStore) ListSummaries(ctx context.Context) ([]*Job, error) {
	c := &a.summaries
	c.mu.Lock() // one listing at a time: concurrent scrapes share it
	defer c.mu.Unlock()
	gen, err := a.store.Generation(ctx)
	if err != nil {
		return nil, err
	}
	if c.jobs != nil && gen == c.gen && time.Since(c.at) < summaryMaxAge {
		return slices.Clone(c.jobs), nil
	}
	at := time.Now()
	recs, err := a.store.List(ctx, repjob.Filter{})
	if err != nil {
		return nil, err
	}
	out := make([]*Job, len(recs))
	for i, r := range recs {
		out[i] = jobFromRecord(r, false)
	}
	c.gen, c.at, c.jobs = gen, at, out
	return slices.Clone(out), nil
}

// SchedulerJobs implements Store with repjob's listing index: it reads the
// page, not every job.
func (a *RepjobStore) SchedulerJobs(ctx context.Context, skip, limit int) ([]*Job, int, error) {
	p, err := a.store.SchedulerJobs(ctx, skip, limit)
	return jobsOf(p), p.Total, err
}

// SchedulerDocs implements Store with repjob's listing index.
func (a *RepjobStore) SchedulerDocs(ctx context.Context, db string, skip, limit int) ([]*Job, int, error) {
	p, err := a.store.SchedulerDocs(ctx, db, skip, limit)
	return jobsOf(p), p.Total, err
}

// SchedulerDoc implements Store with repjob's listing index.
func (a *RepjobStore) SchedulerDoc(ctx context.Context, db, docID string) (*Job, error) {
	rec, err := a.store.SchedulerDoc(ctx, db, docID)
	if err != nil {
		return nil, notFound(err)
	}
	return JobFromRecord(rec), nil
}

func jobsOf(p repjob.Page) []*Job {
	out := make([]*Job, len(p.Jobs))
	for i, r := range p.Jobs {
		out[i] = JobFromRecord(r)
	}
	return out
}

// Remove implements Store (transient jobs: POST /_replicate cancel). A
// running job is removed together with a cancel request to the node running
// it, whose job server stops it at once (repjob.Store.Cancel).
func (a *RepjobStore) Remove(ctx context.Context, jobID string) error {
	_, err := a.store.Cancel(ctx, jobID, "http_api")
	return notFound(err)
}

// Wait implements Store on the store's per-job watch (no polling).
func (a *RepjobStore) Wait(ctx context.Context, jobID string, done func(*Job) bool) (*Job, error) {
	rec, err := a.store.Get(ctx, jobID)
	for {
		if err != nil {
			return nil, notFound(err)
		}
		if j := JobFromRecord(rec); done(j) {
			return j, nil
		}
		rec, err = a.store.WaitChange(ctx, jobID, rec.Version)
	}
}

func goTime(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}

// JobFromRecord translates a stored replication job.
func JobFromRecord(r *repjob.Record) *Job { return jobFromRecord(r, true) }

// jobFromRecord is JobFromRecord; body: with the fields read from the
// job's document (its replication parameters).
func jobFromRecord(r *repjob.Record, body bool) *Job {
	m := r.ReplicationJob
	j := &Job{
		JobID:       m.GetJobId(),
		RepID:       m.GetRepId(),
		Transient:   m.GetKind() != messages.ReplicationKind_REPLICATION_KIND_PERSISTENT,
		Server:      ServerName(m.GetServer()),
		Database:    m.GetDbName(),
		DocID:       m.GetDocId(),
		User:        m.GetUser(),
		Source:      m.GetSource(),
		Target:      m.GetTarget(),
		State:       r.State(),
		Continuous:  m.GetContinuous(),
		History:     r.History(),
		LastError:   m.GetLastError(),
		ErrorCount:  int(m.GetErrorCount()),
		Node:        m.GetNode(),
		CreatedAt:   goTime(m.GetCreatedAt()),
		LastUpdated: goTime(m.GetLastUpdated()),
		LastStarted: goTime(m.GetLastStarted()),
		FinishedAt:  goTime(m.GetFinishedAt()),
		ParkedSince: goTime(m.GetParkedSince()),
		PausedAt:    goTime(m.GetPausedAt()),
		ResetAt:     goTime(m.GetResetAt()),
		Result:      m.GetResult(),
		FromDoc:     m.GetFromDoc(),
		Stats:       m.GetStats(),
	}
	if r.WorkerNode != "" && j.State == repjob.StateRunning {
		j.Node = r.WorkerNode
	}
	if !body {
		return j
	}
	if p, err := replicate.ParseParams(m.GetBody()); err == nil {
		j.CheckpointInterval = p.CheckpointInterval
		j.SourceProxy, j.TargetProxy = p.Source.Proxy, p.Target.Proxy
		if j.Source == "" {
			j.Source = p.Source.URL
		}
		if j.Target == "" {
			j.Target = p.Target.URL
		}
	}
	return j
}

// summaryChanges is what SummaryChanges remembers between two calls.
type summaryChanges struct {
	mu sync.Mutex
	f  *repjob.Follower
}

// SummaryDelta is what changed in the store since the last SummaryChanges.
type SummaryDelta struct {
	// Full: Jobs is every job (the first call, or the listing was older
	// than summaryMaxAge): whatever was known before is forgotten.
	Full bool
	// Jobs are the jobs written or added since (every job when Full), as
	// ListSummaries gives them.
	Jobs []*Job
	// Each, when set (SummaryChanges' full listing, instead of Jobs),
	// streams every job to yield, one record decoded at a time: a
	// listing held whole kept every record's history, document and stats
	// at once (~1 GB of heap at 200,000 parked jobs, which an idle node's
	// RSS kept after the scrape). Call it once, before the next
	// SummaryChanges; a job may be yielded twice (the store's read
	// retried). After an error the jobs yielded are not all of them, and
	// the next SummaryChanges lists every job again.
	Each func(yield func(*Job)) error
	// Removed are the ids of jobs gone since.
	Removed []string
}

// SummaryChanges answers what changed among the jobs since its last call
// (one caller: the /metrics collector), reading only those: the store's
// generation shard by shard (repjob.Store.GenerationShards: at most 256
// keys) tells which known jobs may have been written, the changes index
// (repjob.Store.ChangedIDs) which were added, and their records are read
// again (repjob.Store.GetSome). A scrape of a node at rest reads the
// shards; one after a job's progress write reads that job and the few
// others of its shard. The whole listing is read again every
// summaryMaxAge (a node of an older version bumps other shards).
func (a *RepjobStore) SummaryChanges(ctx context.Context) (SummaryDelta, error) {
	c := &a.changes
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.f == nil {
		c.f = a.store.NewFollower(summaryMaxAge)
	}
	full, ids, err := c.f.Next(ctx)
	if err != nil {
		return SummaryDelta{}, err
	}
	if full {
		return SummaryDelta{Full: true, Each: func(yield func(*Job)) error {
			c.mu.Lock()
			defer c.mu.Unlock()
			// Bounded by fullListingTimeout, not by the scrape's bound: a
			// listing cut short starts over at the next scrape, and at
			// 200,000 jobs one takes 3-4 s on a loaded 2-core machine.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fullListingTimeout)
			defer cancel()
			c.f.Reset() // uncommitted (an error): the next call lists every job again
			err := a.store.Each(ctx, repjob.Filter{}, func(r *repjob.Record) error {
				j := jobFromRecord(r, false)
				c.f.Seen(j.JobID)
				yield(j)
				return nil
			})
			if err != nil {
				return err
			}
			c.f.Commit()
			return nil
		}}, nil
	}
	if len(ids) == 0 {
		c.f.Commit()
		return SummaryDelta{}, nil
	}
	recs, err := a.store.GetSome(ctx, ids)
	if err != nil {
		return SummaryDelta{}, err
	}
	var d SummaryDelta
	for _, id := range ids {
		r, ok := recs[id]
		if !ok {
			if c.f.Gone(id) {
				d.Removed = append(d.Removed, id)
			}
			continue
		}
		c.f.Seen(id)
		d.Jobs = append(d.Jobs, jobFromRecord(r, false))
	}
	c.f.Commit()
	return d, nil
}
