package httpapi

import (
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/messages"
)

// The per-database gauges of /metrics are kept, not recomputed: the
// collector holds every job's summary as the store last gave it and, per
// series (kind, server, database), the sums those jobs contribute; a
// scrape applies what changed since the last one (RepjobStore's
// SummaryChanges: nothing at rest, the jobs written since otherwise) and
// the live stats of this node's running jobs, so that its cost follows the
// changes and the series, not the number of jobs.

// aggKey is a series' labels.
type aggKey struct{ kind, server, db string }

// aggVals are the sums of one series' jobs.
type aggVals struct {
	jobs             int
	states           map[string]int
	written, pending int64
	parked, paused   int
	// lagging are the jobs behind (Job.Lag): job id → since when.
	lagging map[string]time.Time
}

// shareVals are the counts of one _replicator database name's jobs for
// the fair-share gauges (shareUsage).
type shareVals struct {
	jobs, running, waiting int
	servers                map[string]int
}

// jobsAgg is the collector's state.
type jobsAgg struct {
	mu   sync.Mutex
	jobs map[string]*jobSum
	// names interns the servers, databases and nodes of the kept jobs:
	// a few values shared by thousands of jobs.
	names  map[string]string
	keys   map[aggKey]*aggVals
	shares map[string]*shareVals
}

// jobSum is what the collector keeps of a job between scrapes: what its
// sums and this node's live overlay read (aggKey, states, documents
// written, changes pending, parked, paused, behind since; the node and
// start time withLive compares), in 96 bytes. Not the job's history,
// endpoints, document, or its stats message (at 20,000 parked jobs a kept
// *Job with its stats was ~850 bytes of heap each, the largest item of a
// parked job).
type jobSum struct {
	server, database, node string // interned (jobsAgg.intern)
	// lastStarted, behindSince: unix nanoseconds, 0 for none.
	lastStarted, behindSince int64
	written, pending         int64 // pending: when hasPending
	state                    repjob.State
	transient, parked        bool
	paused, hasPending       bool
}

// sumOf is j's summary.
func sumOf(j *Job) jobSum {
	s := jobSum{server: j.Server, database: j.Database, node: j.Node, state: j.State, transient: j.Transient,
		parked: j.Parked(), paused: j.Paused(), lastStarted: unixNano(j.LastStarted)}
	if st := j.Stats; st != nil {
		s.written = st.GetDocsWritten()
		if st.ChangesPending != nil {
			s.pending, s.hasPending = *st.ChangesPending, true
		}
		if b := st.GetBehindSince(); b != nil {
			s.behindSince = unixNano(b.AsTime())
		}
	}
	return s
}

// unixNano is t in unix nanoseconds, 0 for the zero time.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// job is the summary as a Job of id with the fields withLive reads (state,
// node, start time, stats).
func (s *jobSum) job(id string) *Job {
	j := &Job{JobID: id, State: s.state, Node: s.node, Stats: &messages.ReplicationStats{DocsWritten: s.written}}
	if s.lastStarted != 0 {
		j.LastStarted = time.Unix(0, s.lastStarted)
	}
	if s.hasPending {
		n := s.pending
		j.Stats.ChangesPending = &n
	}
	if s.behindSince != 0 {
		j.Stats.BehindSince = timestamppb.New(time.Unix(0, s.behindSince))
	}
	return j
}

func (a *jobsAgg) reset() {
	a.jobs = map[string]*jobSum{}
	a.keys = map[aggKey]*aggVals{}
	a.shares = map[string]*shareVals{}
}

func aggKeyOf(s *jobSum) aggKey {
	if s.transient {
		return aggKey{kind: "transient"}
	}
	return aggKey{kind: "persistent", server: s.server, db: s.database}
}

// lagSince is when the job fell behind (Job.Lag), zero when it is not.
func lagSince(s *jobSum) time.Time {
	if s.paused || s.state.Terminal() || !s.hasPending || s.pending <= 0 || s.behindSince == 0 {
		return time.Time{}
	}
	return time.Unix(0, s.behindSince)
}

// apply adds (sign 1) or takes away (sign -1) what job id's summary s
// contributes.
func (a *jobsAgg) apply(id string, j *jobSum, sign int) {
	k := aggKeyOf(j)
	v := a.keys[k]
	if v == nil {
		v = &aggVals{states: map[string]int{}, lagging: map[string]time.Time{}}
		a.keys[k] = v
	}
	v.jobs += sign
	v.written += int64(sign) * j.written
	if j.parked {
		v.parked += sign
	}
	if j.paused {
		v.paused += sign
	}
	if since := lagSince(j); !since.IsZero() {
		if sign > 0 {
			v.lagging[id] = since
		} else {
			delete(v.lagging, id)
		}
	}
	if j.state == repjob.StateRunning && j.hasPending {
		v.pending += int64(sign) * j.pending
	}
	st := j.state.String()
	if v.states[st] += sign; v.states[st] == 0 {
		delete(v.states, st)
	}
	if v.jobs == 0 {
		delete(a.keys, k)
	}
	if j.transient {
		return
	}
	sh := a.shares[j.database]
	if sh == nil {
		sh = &shareVals{servers: map[string]int{}}
		a.shares[j.database] = sh
	}
	sh.jobs += sign
	if j.server != "" {
		if sh.servers[j.server] += sign; sh.servers[j.server] == 0 {
			delete(sh.servers, j.server)
		}
	}
	switch j.state {
	case repjob.StateRunning:
		sh.running += sign
	case repjob.StatePending, repjob.StateCrashing:
		sh.waiting += sign
	}
	if sh.jobs == 0 {
		delete(a.shares, j.database)
	}
}

// set makes j the job's summary (nil: the job is gone).
func (a *jobsAgg) set(id string, j *Job) {
	if old := a.jobs[id]; old != nil {
		a.apply(id, old, -1)
		delete(a.jobs, id)
	}
	if j != nil {
		s := sumOf(j)
		s.server, s.database, s.node = a.intern(s.server), a.intern(s.database), a.intern(s.node)
		a.jobs[id] = &s
		a.apply(id, &s, 1)
	}
}

// intern returns the kept copy of s (a server, database or node name).
func (a *jobsAgg) intern(s string) string {
	if s == "" {
		return ""
	}
	if v, ok := a.names[s]; ok {
		return v
	}
	if a.names == nil || len(a.names) >= maxInterned {
		a.names = map[string]string{} // bounded: a store of many servers starts over
	}
	a.names[s] = s
	return s
}

// maxInterned bounds jobsAgg.names.
const maxInterned = 4096

// lag is the series' longest lag as of now.
func (v *aggVals) lag(now time.Time) float64 {
	var d time.Duration
	for _, since := range v.lagging {
		d = max(d, now.Sub(since))
	}
	return d.Seconds()
}

// sharesOf is shareUsage from the kept counts.
func (a *jobsAgg) sharesOf(weights map[string]int) []statusShare {
	t := newShareTable(weights, len(a.shares))
	for db, v := range a.shares {
		sh := t.row(db)
		for s := range v.servers {
			sh.Servers = append(sh.Servers, s)
		}
		sh.Running, sh.Waiting = v.running, v.waiting
		t.running += v.running
	}
	return t.rows()
}
