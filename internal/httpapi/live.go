package httpapi

import (
	"context"
	"sync"
	"time"

	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/messages"
)

// liveJobs are the stats of the jobs running on this node as their job
// actors last reported them (progress events, about once a second while
// they change). The store has them only every ActivityTimeout/2 and at
// checkpoints; the API shows these instead for a job the store says runs
// on the node that reported it, in the same run. Other nodes' jobs are
// read from the store.
type liveJobs struct {
	mu sync.Mutex
	m  map[string]liveEntry // job id
}

type liveEntry struct {
	node      string
	startedAt time.Time
	stats     *messages.ReplicationStats
}

// ObserveLive records a job event of this node (the job actors publish
// them on the node's event stream): a running job's progress report keeps
// its stats, any other event (a start, a stop, an end) drops them.
func (m *Metrics) ObserveLive(e *messages.ReplicationJobEvent) {
	l := &m.live
	l.mu.Lock()
	defer l.mu.Unlock()
	if !e.GetProgress() || repjob.State(e.GetState()) != repjob.StateRunning || e.GetStats() == nil {
		delete(l.m, e.GetJobId())
		return
	}
	if l.m == nil {
		l.m = map[string]liveEntry{}
	}
	var started time.Time
	if ts := e.GetStartedAt(); ts != nil {
		started = ts.AsTime()
	}
	l.m[e.GetJobId()] = liveEntry{node: e.GetNode(), startedAt: started, stats: e.GetStats()}
}

// withLive returns j with its live stats when this node runs it and has
// them, else j itself.
func (m *Metrics) withLive(j *Job) *Job {
	if j == nil || j.State != repjob.StateRunning {
		return j
	}
	l := &m.live
	l.mu.Lock()
	e, ok := l.m[j.JobID]
	l.mu.Unlock()
	if !ok || e.node != j.Node || !e.startedAt.IsZero() && !j.LastStarted.IsZero() && !e.startedAt.Equal(j.LastStarted) {
		return j
	}
	c := *j
	c.Stats = repjob.OverlayStats(j.Stats, e.stats)
	return &c
}

func (m *Metrics) withLiveAll(jobs []*Job) []*Job {
	for i, j := range jobs {
		jobs[i] = m.withLive(j)
	}
	return jobs
}

// liveJob is a job this node runs with live stats: its kept summary and
// the summary with them (liveOverlay).
type liveJob struct {
	id        string
	kept, now *jobSum
}

// liveOverlay drops the live stats of the jobs jobs (every job in the
// store, by id) does not show running on the node that reported them, as
// pruneLive does, and returns each job this node runs with live stats.
func (m *Metrics) liveOverlay(jobs map[string]*jobSum) []liveJob {
	l := &m.live
	l.mu.Lock()
	var ids []string
	for id, e := range l.m {
		if j := jobs[id]; j == nil || j.state != repjob.StateRunning || j.node != e.node {
			delete(l.m, id)
			continue
		}
		ids = append(ids, id)
	}
	l.mu.Unlock()
	var out []liveJob
	for _, id := range ids {
		s := jobs[id]
		j := s.job(id)
		if lj := m.withLive(j); lj != j {
			ls := *s
			live := sumOf(lj)
			ls.written, ls.pending, ls.hasPending, ls.behindSince = live.written, live.pending, live.hasPending, live.behindSince
			out = append(out, liveJob{id: id, kept: s, now: &ls})
		}
	}
	return out
}

// pruneLive drops the live stats of jobs that all, every job in the store,
// does not show running on the node that reported them: a job actor that
// died without a last event (killed) leaves its entry until then.
func (m *Metrics) pruneLive(all []*Job) {
	l := &m.live
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.m) == 0 {
		return
	}
	running := make(map[string]string, len(all))
	for _, j := range all {
		if j.State == repjob.StateRunning {
			running[j.JobID] = j.Node
		}
	}
	for id, e := range l.m {
		if node, ok := running[id]; !ok || node != e.node {
			delete(l.m, id)
		}
	}
}

// liveStore is the API's view of the store: what it reads, with the live
// stats of the jobs this node runs.
type liveStore struct {
	Store
	m *Metrics
}

func (s liveStore) Get(ctx context.Context, jobID string) (*Job, error) {
	j, err := s.Store.Get(ctx, jobID)
	return s.m.withLive(j), err
}

func (s liveStore) FindByRepID(ctx context.Context, repID string) (*Job, error) {
	j, err := s.Store.FindByRepID(ctx, repID)
	return s.m.withLive(j), err
}

func (s liveStore) List(ctx context.Context) ([]*Job, error) {
	jobs, err := s.Store.List(ctx)
	if err == nil {
		s.m.pruneLive(jobs)
	}
	return s.m.withLiveAll(jobs), err
}

func (s liveStore) SchedulerJobs(ctx context.Context, skip, limit int) ([]*Job, int, error) {
	jobs, total, err := s.Store.SchedulerJobs(ctx, skip, limit)
	return s.m.withLiveAll(jobs), total, err
}

func (s liveStore) SchedulerDocs(ctx context.Context, db string, skip, limit int) ([]*Job, int, error) {
	jobs, total, err := s.Store.SchedulerDocs(ctx, db, skip, limit)
	return s.m.withLiveAll(jobs), total, err
}

func (s liveStore) SchedulerDoc(ctx context.Context, db, docID string) (*Job, error) {
	j, err := s.Store.SchedulerDoc(ctx, db, docID)
	return s.m.withLive(j), err
}
