package schedpolicy_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/internal/share"
)

var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

type simJob struct {
	job      schedpolicy.Job
	hist     schedpolicy.History
	node     int // -1 when pending
	enqueued time.Time
	runs     int
	maxWait  time.Duration
}

// sim is a deterministic cluster: nodes sharing one queue and one fair-share
// ledger (as they share the store), a fake clock, continuous jobs.
type sim struct {
	t      testing.TB
	clock  *schedpolicy.FakeClock
	ledger *share.Ledger
	nodes  []*schedpolicy.Node
	q      *memQueue
	jobs   map[string]*simJob
	order  []string
	ran    map[string]time.Duration // per key, while measuring
	accum  bool
}

func newSim(t testing.TB, nodes int, p schedpolicy.Policy, lp share.Params) *sim {
	s := &sim{
		t:      t,
		clock:  schedpolicy.NewFakeClock(epoch),
		ledger: share.NewLedger(lp),
		q:      &memQueue{},
		jobs:   make(map[string]*simJob),
		ran:    make(map[string]time.Duration),
	}
	for range nodes {
		n, err := schedpolicy.NewNode(p, s.ledger, s.clock)
		if err != nil {
			t.Fatal(err)
		}
		s.nodes = append(s.nodes, n)
	}
	return s
}

func (s *sim) addJobs(key string, n int) {
	for i := range n {
		j := schedpolicy.Job{ID: fmt.Sprintf("%s/%03d", key, i), Key: key, Continuous: true}
		pl, h := s.nodes[0].Add(j)
		now := s.clock.Now()
		s.q.add(j.ID, pl.Priority, pl.ScheduledAt, now)
		s.jobs[j.ID] = &simJob{job: j, hist: h, node: -1, enqueued: now}
		s.order = append(s.order, j.ID)
	}
}

// fill lets node i's acceptors take up to max jobs.
func (s *sim) fill(i, limit int) {
	n := s.nodes[i]
	now := s.clock.Now()
	for k := 0; k < limit && n.Slots() > 0; k++ {
		it, ok := s.q.accept(now)
		if !ok {
			return
		}
		sj := s.jobs[it.id]
		h, err := n.Started(sj.job, it.priority, sj.hist)
		if err != nil {
			s.t.Fatal(err)
		}
		sj.hist, sj.node, sj.runs = h, i, sj.runs+1
		sj.maxWait = max(sj.maxWait, now.Sub(sj.enqueued))
	}
}

// tick is node i's reschedule: rotate, resubmit the stopped jobs, accept.
func (s *sim) tick(i int) {
	n := s.nodes[i]
	now := s.clock.Now()
	d := n.Tick(s.q.due(now))
	for _, id := range d.Stop {
		sj := s.jobs[id]
		pl, h, err := n.Stopped(id, sj.hist)
		if err != nil {
			s.t.Fatal(err)
		}
		sj.hist, sj.node, sj.enqueued = h, -1, now
		s.q.add(id, pl.Priority, pl.ScheduledAt, now)
	}
	s.fill(i, d.Start)
}

// advance moves the clock, crediting running time per key while measuring.
func (s *sim) advance(d time.Duration) {
	if s.accum {
		for _, sj := range s.jobs {
			if sj.node >= 0 {
				s.ran[sj.job.Key] += d
			}
		}
	}
	s.clock.Advance(d)
}

// run simulates intervals rescheduling intervals; with several nodes their
// ticks are spread evenly over the interval.
func (s *sim) run(intervals int) {
	iv := s.nodes[0].Policy().Interval
	step := iv / time.Duration(len(s.nodes))
	for range intervals {
		for i := range s.nodes {
			s.tick(i)
			s.advance(step)
		}
	}
}

func (s *sim) measure(intervals int) map[string]float64 {
	clear(s.ran)
	s.accum = true
	s.run(intervals)
	s.accum = false
	var total time.Duration
	for _, d := range s.ran {
		total += d
	}
	out := make(map[string]float64)
	for k, d := range s.ran {
		out[k] = float64(d) / float64(total)
	}
	return out
}

func (s *sim) resetWaits() {
	for _, sj := range s.jobs {
		sj.maxWait, sj.runs = 0, 0
	}
}

// worstWait is the longest any job waited between being enqueued and
// accepted, counting jobs still waiting, and whether every job ran.
func (s *sim) worstWait() (time.Duration, string, bool) {
	now := s.clock.Now()
	var worst time.Duration
	var who string
	all := true
	for _, id := range s.order {
		sj := s.jobs[id]
		w := sj.maxWait
		if sj.node < 0 {
			w = max(w, now.Sub(sj.enqueued))
		}
		if w > worst {
			worst, who = w, id
		}
		if sj.runs == 0 {
			all = false
		}
	}
	return worst, who, all
}

func checkShares(t *testing.T, got map[string]float64, weights map[string]int, tol float64) {
	t.Helper()
	sum := 0
	for _, w := range weights {
		sum += w
	}
	for k, w := range weights {
		want := float64(w) / float64(sum)
		if r := got[k] / want; r < 1-tol || r > 1+tol {
			t.Errorf("key %s: running-time share %.4f, want %.4f ±%.0f%% (ratio %.3f)", k, got[k], want, tol*100, r)
		} else {
			t.Logf("key %s: running-time share %.4f, want %.4f (ratio %.3f)", k, got[k], want, r)
		}
	}
}

// TestFairShare is the fairness scenario: three _replicator
// databases with shares 100/200/50 and 50 continuous jobs each, max_jobs 20
// per node, every job ever enqueued through the real Ledger and rotated by
// the real Rotate. The running-time split must be within ±10% of 2:4:1, and
// must follow a run-time change of shares. Starvation bound: every job runs
// within 80 intervals of the start, and no job ever waits more than 100
// intervals between runs (the fair cycle of the 50-share database is
// 50 jobs × 4 intervals / ~2.9 slots ≈ 70 intervals).
func TestFairShare(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation: several thousand intervals")
	}
	tests := []struct {
		name     string
		nodes    int
		maxJobs  int
		maxChurn int
	}{
		{"one node, max_jobs 20, churn 5", 1, 20, 5},
		{"one node, max_jobs 20, churn 20", 1, 20, 20},
		{"two nodes x max_jobs 10, churn 3", 2, 10, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := schedpolicy.DefaultPolicy()
			p.MaxJobs, p.MaxChurn = tc.maxJobs, tc.maxChurn
			s := newSim(t, tc.nodes, p, share.Params{Quantum: p.RunQuantum()})
			s.ledger.SetShares("a/_replicator", 100)
			s.ledger.SetShares("b/_replicator", 200)
			s.ledger.SetShares("c/_replicator", 50)
			for _, k := range []string{"a/_replicator", "b/_replicator", "c/_replicator"} {
				s.addJobs(k, 50)
			}
			for i := range s.nodes {
				s.fill(i, p.MaxJobs)
			}

			s.run(80)
			if w, who, all := s.worstWait(); !all {
				t.Fatalf("after 80 intervals some job never ran (longest wait %v: %s)", w, who)
			}

			s.run(200) // warm-up
			s.resetWaits()
			got := s.measure(2000)
			checkShares(t, got, map[string]int{"a/_replicator": 100, "b/_replicator": 200, "c/_replicator": 50}, 0.10)
			bound := 100 * p.Interval
			if w, who, all := s.worstWait(); !all || w > bound {
				t.Errorf("starvation: worst wait %v (%s), every job ran: %v; bound %v", w, who, all, bound)
			} else {
				t.Logf("worst wait between runs: %v (%.0f intervals)", w, w.Minutes()/p.Interval.Minutes())
			}

			// Shares changed at run time: c goes from 50 to 400.
			s.ledger.SetShares("c/_replicator", 400)
			s.run(300)
			got = s.measure(2000)
			checkShares(t, got, map[string]int{"a/_replicator": 100, "b/_replicator": 200, "c/_replicator": 400}, 0.10)
		})
	}
}

// TestLateJoinerInterleaves: a database that appears with 50 jobs at once
// while two others are saturating the node gets deadlines one quantum apart,
// so its jobs interleave with the others' instead of taking the node over,
// and within a few rotation cycles the split is 1:1:1.
func TestLateJoinerInterleaves(t *testing.T) {
	p := schedpolicy.DefaultPolicy()
	p.MaxJobs, p.MaxChurn = 20, 5
	s := newSim(t, 1, p, share.Params{Quantum: p.RunQuantum()})
	s.addJobs("a/_replicator", 50)
	s.addJobs("b/_replicator", 50)
	s.fill(0, p.MaxJobs)
	s.run(500)

	s.addJobs("c/_replicator", 50)
	got := s.measure(20)
	if got["c/_replicator"] > 0.45 {
		t.Errorf("newcomer took %.2f of the node in its first 20 intervals, want at most 0.45", got["c/_replicator"])
	}
	if got["a/_replicator"] < 0.25 || got["b/_replicator"] < 0.25 {
		t.Errorf("incumbents squeezed out by the newcomer's bulk add: %v", got)
	}
	s.run(20)
	// Not only on average: every 20-interval window is within ±10%.
	for range 10 {
		checkShares(t, s.measure(20), map[string]int{"a/_replicator": 100, "b/_replicator": 100, "c/_replicator": 100}, 0.10)
	}
}
