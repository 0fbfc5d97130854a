package httpapi

import (
	"sync"
	"time"

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
	jobs map[string]*Job
	// names interns the servers, databases and nodes of the kept jobs:
	// a few values shared by thousands of jobs.
	names  map[string]string
	keys   map[aggKey]*aggVals
	shares map[string]*shareVals
}

func (a *jobsAgg) reset() {
	a.jobs = map[string]*Job{}
	a.keys = map[aggKey]*aggVals{}
	a.shares = map[string]*shareVals{}
}

func aggKeyOf(j *Job) aggKey {
	if j.Transient {
		return aggKey{kind: "transient"}
	}
	return aggKey{kind: "persistent", server: j.Server, db: j.Database}
}

// lagSince is when job j fell behind (Job.Lag), zero when it is not.
func lagSince(j *Job) time.Time {
	if j.Paused() || j.State.Terminal() || j.Stats.GetChangesPending() <= 0 || j.Stats.GetBehindSince() == nil {
		return time.Time{}
	}
	return j.Stats.GetBehindSince().AsTime()
}

// apply adds (sign 1) or takes away (sign -1) what j contributes.
func (a *jobsAgg) apply(j *Job, sign int) {
	k := aggKeyOf(j)
	v := a.keys[k]
	if v == nil {
		v = &aggVals{states: map[string]int{}, lagging: map[string]time.Time{}}
		a.keys[k] = v
	}
	v.jobs += sign
	if j.Stats != nil {
		v.written += int64(sign) * j.Stats.DocsWritten
	}
	if j.Parked() {
		v.parked += sign
	}
	if j.Paused() {
		v.paused += sign
	}
	if since := lagSince(j); !since.IsZero() {
		if sign > 0 {
			v.lagging[j.JobID] = since
		} else {
			delete(v.lagging, j.JobID)
		}
	}
	if j.State == repjob.StateRunning && j.Stats != nil && j.Stats.ChangesPending != nil {
		v.pending += int64(sign) * *j.Stats.ChangesPending
	}
	st := j.State.String()
	if v.states[st] += sign; v.states[st] == 0 {
		delete(v.states, st)
	}
	if v.jobs == 0 {
		delete(a.keys, k)
	}
	if j.Transient {
		return
	}
	sh := a.shares[j.Database]
	if sh == nil {
		sh = &shareVals{servers: map[string]int{}}
		a.shares[j.Database] = sh
	}
	sh.jobs += sign
	if j.Server != "" {
		if sh.servers[j.Server] += sign; sh.servers[j.Server] == 0 {
			delete(sh.servers, j.Server)
		}
	}
	switch j.State {
	case repjob.StateRunning:
		sh.running += sign
	case repjob.StatePending, repjob.StateCrashing:
		sh.waiting += sign
	}
	if sh.jobs == 0 {
		delete(a.shares, j.Database)
	}
}

// set makes j the job's summary (nil: the job is gone).
func (a *jobsAgg) set(id string, j *Job) {
	if old := a.jobs[id]; old != nil {
		a.apply(old, -1)
		delete(a.jobs, id)
	}
	if j != nil {
		j = summaryOf(j)
		j.Server, j.Database, j.Node = a.intern(j.Server), a.intern(j.Database), a.intern(j.Node)
		a.jobs[id] = j
		a.apply(j, 1)
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

// summaryOf is what the collector keeps of j between scrapes: the fields
// its sums and this node's live overlay read (Job.Lag, Parked, Paused,
// withLive), not its history, endpoints, document or the rest of its
// stats (their write failures): at 20,000 parked jobs the kept jobs were
// ~1 KB each.
func summaryOf(j *Job) *Job {
	s := &Job{JobID: j.JobID, Server: j.Server, Database: j.Database, Transient: j.Transient, State: j.State,
		Node: j.Node, LastStarted: j.LastStarted, ParkedSince: j.ParkedSince, PausedAt: j.PausedAt}
	if st := j.Stats; st != nil {
		s.Stats = &messages.ReplicationStats{DocsWritten: st.GetDocsWritten(), ChangesPending: st.ChangesPending,
			BehindSince: st.GetBehindSince()}
	}
	return s
}

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
