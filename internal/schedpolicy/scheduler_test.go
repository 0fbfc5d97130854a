package schedpolicy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/internal/share"
	"github.com/couchrep/couchrep/messages"
)

func at(sec int) time.Time { return epoch.Add(time.Duration(sec) * time.Second) }

func TestRotate(t *testing.T) {
	p := schedpolicy.DefaultPolicy()
	p.MaxJobs, p.MaxChurn = 3, 2
	c := func(id string, started int) schedpolicy.RunningJob {
		return schedpolicy.RunningJob{ID: id, Continuous: true, Started: at(started)}
	}
	o := func(id string, started int) schedpolicy.RunningJob {
		return schedpolicy.RunningJob{ID: id, Started: at(started)}
	}
	tests := []struct {
		name      string
		running   []schedpolicy.RunningJob
		pending   int
		policy    func(*schedpolicy.Policy)
		wantStop  []string
		wantStart int
	}{
		{"nothing pending: no churn", []schedpolicy.RunningJob{c("a", 1), c("b", 2), c("c", 3)}, 0, nil, nil, 0},
		{"free slots cover pending: no churn", []schedpolicy.RunningJob{c("a", 1)}, 2, nil, nil, 2},
		{"max_churn bounds rotation, longest running first", []schedpolicy.RunningJob{c("a", 3), c("b", 1), c("c", 2)}, 10, nil, []string{"b", "c"}, 2},
		{"rotation bounded by pending - slots", []schedpolicy.RunningJob{c("a", 3), c("b", 1), c("c", 2)}, 1, nil, []string{"b"}, 1},
		{"one-shot jobs are never rotated", []schedpolicy.RunningJob{o("a", 1), o("b", 2), c("c", 3)}, 10, nil, []string{"c"}, 1},
		{"only one-shot jobs: nothing to rotate", []schedpolicy.RunningJob{o("a", 1), o("b", 2), o("c", 3)}, 10, nil, nil, 0},
		{"excess: continuous stopped first", []schedpolicy.RunningJob{o("a", 1), c("b", 5), o("c", 2), c("d", 4), c("e", 6)}, 0, nil, []string{"d", "b"}, 0},
		{"excess beyond continuous: then one-shot", []schedpolicy.RunningJob{o("a", 1), o("b", 2), o("c", 3), c("d", 4), o("e", 0)}, 0, nil, []string{"d", "e"}, 0},
		{"excess uses up the churn budget", []schedpolicy.RunningJob{c("a", 1), c("b", 2), c("c", 3), c("d", 4)}, 10,
			func(p *schedpolicy.Policy) { p.MaxChurn = 2 }, []string{"a", "b"}, 1},
		{"max_jobs 0 stops everything", []schedpolicy.RunningJob{c("a", 1), o("b", 2)}, 5,
			func(p *schedpolicy.Policy) { p.MaxJobs = 0 }, []string{"a", "b"}, 0},
		{"min run time protects young jobs", []schedpolicy.RunningJob{c("a", 50), c("b", 100), c("c", 10)}, 10,
			func(p *schedpolicy.Policy) { p.MinRunTime = 60 * time.Second }, []string{"c", "a"}, 2},
		{"starting is not limited by max_churn", nil, 10, func(p *schedpolicy.Policy) { p.MaxJobs = 8 }, nil, 8},
		{"ties broken by id", []schedpolicy.RunningJob{c("b", 1), c("c", 1), c("a", 1)}, 10, nil, []string{"a", "b"}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pp := p
			if tc.policy != nil {
				tc.policy(&pp)
			}
			d := schedpolicy.Rotate(tc.running, tc.pending, pp, at(120))
			if !slices.Equal(d.Stop, tc.wantStop) || d.Start != tc.wantStart {
				t.Errorf("Rotate = stop %v start %d, want stop %v start %d", d.Stop, d.Start, tc.wantStop, tc.wantStart)
			}
			if len(tc.running)-len(d.Stop)+d.Start > pp.MaxJobs {
				t.Errorf("decision exceeds max_jobs %d", pp.MaxJobs)
			}
			if len(d.Stop) > max(pp.MaxChurn, len(tc.running)-pp.MaxJobs) {
				t.Errorf("stopped %d > churn budget", len(d.Stop))
			}
		})
	}
}

// TestRotateInCluster: with peers, a node rotates only when its slots are
// full, and only for the pending jobs beyond the live nodes' free slots;
// with no peers it decides as Rotate (CouchDB's rotate_jobs).
func TestRotateInCluster(t *testing.T) {
	p := schedpolicy.DefaultPolicy()
	p.MaxJobs, p.MaxChurn = 3, 2
	c := func(id string, started int) schedpolicy.RunningJob {
		return schedpolicy.RunningJob{ID: id, Continuous: true, Started: at(started)}
	}
	full := []schedpolicy.RunningJob{c("a", 3), c("b", 1), c("c", 2)}
	tests := []struct {
		name      string
		running   []schedpolicy.RunningJob
		pending   int
		woken     int
		peers     schedpolicy.Peers
		wantStop  []string
		wantStart int
	}{
		{"alone, free slots, pending beyond them: CouchDB rotates", full[:2], 5, 0, schedpolicy.Peers{}, []string{"b", "a"}, 3},
		{"alone, woken and pending count alike", full[:2], 1, 1, schedpolicy.Peers{}, []string{"b"}, 2},
		{"peers, free slots, pending beyond them: no rotation", full[:2], 5, 0, schedpolicy.Peers{N: 1}, nil, 1},
		{"peers, one free slot, much pending: no rotation", full[:2], 1000, 0, schedpolicy.Peers{N: 2, Free: 0}, nil, 1},
		{"peers, full, peers' free slots cover pending: no rotation", full, 4, 0, schedpolicy.Peers{N: 2, Free: 4}, nil, 0},
		{"peers, full, pending one beyond peers' slots", full, 5, 0, schedpolicy.Peers{N: 2, Free: 4}, []string{"b"}, 1},
		{"peers, full, peers full: max_churn", full, 10, 0, schedpolicy.Peers{N: 1, Full: 1}, []string{"b", "c"}, 2},
		{"three full nodes split 3 pending: one each", full, 3, 0, schedpolicy.Peers{N: 2, Full: 2}, []string{"b"}, 1},
		{"three full nodes split 4 pending: the first by name takes two", full, 4, 0, schedpolicy.Peers{N: 2, Full: 2}, []string{"b", "c"}, 2},
		{"three full nodes split 4 pending: the second takes one", full, 4, 0, schedpolicy.Peers{N: 2, Full: 2, FullBefore: 1}, []string{"b"}, 1},
		{"two full nodes, 1 pending: the second by name rotates none", full, 1, 0, schedpolicy.Peers{N: 1, Full: 1, FullBefore: 1}, nil, 0},
		{"a free peer's slots first, the full ones split the rest", full, 7, 0, schedpolicy.Peers{N: 2, Free: 3, Full: 1}, []string{"b", "c"}, 2},
		{"peers, full, nothing pending", full, 0, 0, schedpolicy.Peers{N: 1}, nil, 0},
		{"peers, full, a woken job: peers' slots do not serve it", full, 0, 1, schedpolicy.Peers{N: 1, Free: 9}, []string{"b"}, 1},
		{"peers, full, woken and pending: peers take the pending", full, 3, 1, schedpolicy.Peers{N: 1, Free: 3}, []string{"b"}, 1},
		{"peers, above max_jobs: the excess still stops", append(full[:3:3], c("d", 0)), 0, 0, schedpolicy.Peers{N: 1, Free: 9}, []string{"d"}, 0},
		{"peers, above max_jobs, churn left: rotation after the excess", append(full[:3:3], c("d", 0)), 20, 0, schedpolicy.Peers{N: 1}, []string{"d", "b"}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := schedpolicy.RotateIn(tc.running, tc.pending, tc.woken, tc.peers, p, at(120))
			if !slices.Equal(d.Stop, tc.wantStop) || d.Start != tc.wantStart {
				t.Errorf("RotateIn = stop %v start %d, want stop %v start %d", d.Stop, d.Start, tc.wantStop, tc.wantStart)
			}
			if tc.peers == (schedpolicy.Peers{}) {
				if r := schedpolicy.Rotate(tc.running, tc.pending+tc.woken, p, at(120)); !slices.Equal(r.Stop, d.Stop) || r.Start != d.Start {
					t.Errorf("Rotate = %+v, RotateIn with no peers = %+v", r, d)
				}
			}
		})
	}
}

func TestBackoffDoublesAndCaps(t *testing.T) {
	p := schedpolicy.DefaultPolicy()
	p.MinBackoff, p.MaxBackoff = 30*time.Second, 1024*30*time.Second
	// CouchDB's backoff_micros table: 1→1×, 2→2×, ..., 11→1024×, 12→1024×.
	tests := []struct {
		n    int
		want time.Duration
	}{
		{0, 0}, {1, 30 * time.Second}, {2, 60 * time.Second}, {3, 120 * time.Second},
		{4, 240 * time.Second}, {10, 512 * 30 * time.Second}, {11, 1024 * 30 * time.Second},
		{12, 1024 * 30 * time.Second}, {1000, 1024 * 30 * time.Second},
	}
	for _, tc := range tests {
		if got := p.Backoff(tc.n); got != tc.want {
			t.Errorf("Backoff(%d) = %v, want %v", tc.n, got, tc.want)
		}
	}
	p.MaxBackoff = 100 * time.Second // not a power-of-two multiple
	if got := p.Backoff(3); got != 100*time.Second {
		t.Errorf("capped Backoff(3) = %v, want 100s", got)
	}
}

func ev(typ schedpolicy.EventType, sec int) schedpolicy.Event {
	e := schedpolicy.Event{Type: typ, At: at(sec)}
	if typ == schedpolicy.EventCrashed {
		e.Reason = "some_reason"
	}
	return e
}

// TestConsecutiveCrashes is CouchDB's consecutive_crashes_test_ table.
func TestConsecutiveCrashes(t *testing.T) {
	const (
		A = schedpolicy.EventAdded
		S = schedpolicy.EventStarted
		P = schedpolicy.EventStopped
		C = schedpolicy.EventCrashed
	)
	h := func(evs ...schedpolicy.Event) schedpolicy.History { return evs }
	tests := []struct {
		want      int
		hist      schedpolicy.History
		threshold time.Duration
	}{
		{0, h(), 120 * time.Second},
		{0, h(ev(A, 0)), 120 * time.Second},
		{0, h(ev(P, 0)), 120 * time.Second},
		{0, h(ev(C, 0)), 120 * time.Second},
		{1, h(ev(C, 0), ev(A, 0)), 120 * time.Second},
		{1, h(ev(C, 0), ev(C, 0)), 120 * time.Second},
		{1, h(ev(C, 0), ev(P, 0)), 120 * time.Second},
		{3, h(ev(C, 0), ev(C, 0), ev(C, 0), ev(A, 0)), 120 * time.Second},
		{2, h(ev(C, 0), ev(C, 0), ev(P, 0)), 120 * time.Second},
		{1, h(ev(C, 0), ev(S, 0), ev(A, 0)), 120 * time.Second},
		{2, h(ev(C, 3), ev(S, 2), ev(C, 1), ev(S, 0)), 120 * time.Second},
		{0, h(ev(P, 3), ev(S, 2), ev(C, 1), ev(S, 0)), 120 * time.Second},
		{1, h(ev(C, 3), ev(S, 2), ev(P, 1), ev(S, 0)), 120 * time.Second},
		{0, h(ev(C, 999), ev(S, 0)), 120 * time.Second},
		{1, h(ev(C, 999), ev(S, 998), ev(C, 997), ev(S, 0)), 120 * time.Second},
		{0, h(ev(C, 11), ev(S, 0)), 10 * time.Second},
		{1, h(ev(C, 10), ev(S, 0)), 10 * time.Second},
	}
	for i, tc := range tests {
		if got := tc.hist.ConsecutiveCrashes(tc.threshold); got != tc.want {
			t.Errorf("case %d: ConsecutiveCrashes = %d, want %d", i, got, tc.want)
		}
	}
}

func TestHistoryTruncatesAndRenders(t *testing.T) {
	h := schedpolicy.NewHistory(at(0))
	for i := 1; i <= 30; i++ {
		h = h.Append(ev(schedpolicy.EventStarted, i), 20)
	}
	if len(h) != 20 || !h[0].At.Equal(at(30)) || !h[19].At.Equal(at(11)) {
		t.Fatalf("len %d newest %v oldest %v", len(h), h[0].At, h[len(h)-1].At)
	}
	old := h
	h2 := h.Append(ev(schedpolicy.EventCrashed, 31), 20)
	if !old[0].At.Equal(at(30)) || h2[0].Type != schedpolicy.EventCrashed {
		t.Fatal("Append changed its receiver")
	}

	small := schedpolicy.History{ev(schedpolicy.EventCrashed, 5), ev(schedpolicy.EventStarted, 3), ev(schedpolicy.EventAdded, 0)}
	b, err := json.Marshal(small)
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"timestamp":"2025-01-01T00:00:05Z","type":"crashed","reason":"some_reason"},` +
		`{"timestamp":"2025-01-01T00:00:03Z","type":"started"},{"timestamp":"2025-01-01T00:00:00Z","type":"added"}]`
	if string(b) != want {
		t.Errorf("JSON\n got %s\nwant %s", b, want)
	}

	raw, err := proto.Marshal(small.Proto())
	if err != nil {
		t.Fatal(err)
	}
	var m messages.JobHistory
	if err := proto.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	back := schedpolicy.HistoryFromProto(&m)
	if len(back) != len(small) {
		t.Fatalf("proto round trip: %v", back)
	}
	for i := range small {
		if back[i].Type != small[i].Type || !back[i].At.Equal(small[i].At) || back[i].Reason != small[i].Reason {
			t.Errorf("event %d: %+v, want %+v", i, back[i], small[i])
		}
	}
	if got := small.LastStarted(); !got.Equal(at(3)) {
		t.Errorf("LastStarted = %v", got)
	}
}

func newNode(t *testing.T, p schedpolicy.Policy) (*schedpolicy.Node, *schedpolicy.FakeClock) {
	t.Helper()
	clock := schedpolicy.NewFakeClock(epoch)
	n, err := schedpolicy.NewNode(p, share.NewLedger(share.Params{Quantum: p.RunQuantum()}), clock)
	if err != nil {
		t.Fatal(err)
	}
	return n, clock
}

// TestNodeCrashBackoffAndHealing: with a fake clock, a job that crashes
// right after each start is resubmitted after 32 s, 64 s, 128 s, ... capped
// at MaxBackoff; after a run longer than health_threshold a crash starts
// over at MinBackoff.
func TestNodeCrashBackoffAndHealing(t *testing.T) {
	p := schedpolicy.DefaultPolicy()
	p.MinBackoff, p.MaxBackoff = 32*time.Second, 300*time.Second
	n, clock := newNode(t, p)
	job := schedpolicy.Job{ID: "j", Key: "_replicator", Continuous: true}
	pl, h := n.Add(job)

	run := func(d time.Duration, crash bool) time.Duration {
		t.Helper()
		clock.Set(pl.ScheduledAt)
		var err error
		if h, err = n.Started(job, pl.Priority, h); err != nil {
			t.Fatal(err)
		}
		clock.Advance(d)
		if crash {
			pl, h, err = n.Crashed(job.ID, "boom", h)
		} else {
			pl, h, err = n.Stopped(job.ID, h)
		}
		if err != nil {
			t.Fatal(err)
		}
		return pl.ScheduledAt.Sub(clock.Now())
	}
	for i, want := range []time.Duration{32, 64, 128, 256, 300, 300} {
		if got := run(time.Second, true); got != want*time.Second {
			t.Errorf("crash %d: backoff %v, want %v", i+1, got, want*time.Second)
		}
	}
	if n := h.ConsecutiveCrashes(p.HealthThreshold); n != 6 || h[0].Type != schedpolicy.EventCrashed {
		t.Errorf("after 6 crashes: %d consecutive, newest event %v", n, h[0].Type)
	}
	// Healthy run (longer than health_threshold), then a crash: healed.
	if got := run(p.HealthThreshold+time.Second, true); got != p.MinBackoff {
		t.Errorf("crash after healthy run: backoff %v, want %v", got, p.MinBackoff)
	}
	// CouchDB does not count the crash that ended a healthy run, so the new
	// streak is 0 (MinBackoff), 1 (MinBackoff), 2 (2×MinBackoff), ...
	for i, want := range []time.Duration{p.MinBackoff, 2 * p.MinBackoff, 4 * p.MinBackoff} {
		if got := run(time.Second, true); got != want {
			t.Errorf("quick crash %d after healing: backoff %v, want %v", i+1, got, want)
		}
	}
	// A clean stop is due at once.
	if got := run(time.Second, false); got != 0 {
		t.Errorf("stopped job due in %v, want now", got)
	}
	if len(h) > p.MaxHistory {
		t.Errorf("history has %d events > max_history", len(h))
	}
}

func TestNodeErrorsAndSlots(t *testing.T) {
	p := schedpolicy.DefaultPolicy()
	p.MaxJobs = 2
	n, _ := newNode(t, p)
	j := schedpolicy.Job{ID: "a", Key: "k"}
	if _, err := n.Started(j, 0, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Started(j, 0, nil); !errors.Is(err, schedpolicy.ErrAlreadyRunning) {
		t.Errorf("second Started: %v", err)
	}
	if n.Slots() != 1 || n.NumRunning() != 1 {
		t.Errorf("slots %d running %d", n.Slots(), n.NumRunning())
	}
	if _, _, err := n.Stopped("nope", nil); !errors.Is(err, schedpolicy.ErrNotRunning) {
		t.Errorf("Stopped unknown: %v", err)
	}
	if _, _, err := n.Crashed("nope", "x", nil); !errors.Is(err, schedpolicy.ErrNotRunning) {
		t.Errorf("Crashed unknown: %v", err)
	}
	if err := n.Completed("a"); err != nil || n.NumRunning() != 0 {
		t.Errorf("Completed: %v, running %d", err, n.NumRunning())
	}
	if err := n.Completed("a"); !errors.Is(err, schedpolicy.ErrNotRunning) {
		t.Errorf("Completed twice: %v", err)
	}
	bad := p
	bad.MaxChurn = 0
	if err := n.SetPolicy(bad); !errors.Is(err, schedpolicy.ErrInvalidPolicy) {
		t.Errorf("SetPolicy(max_churn 0): %v", err)
	}
	if _, err := schedpolicy.NewNode(bad, share.NewLedger(share.Params{}), schedpolicy.SystemClock{}); !errors.Is(err, schedpolicy.ErrInvalidPolicy) {
		t.Errorf("NewNode(bad): %v", err)
	}
}

func TestPolicyValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*schedpolicy.Policy)
		ok   bool
	}{
		{"default", func(*schedpolicy.Policy) {}, true},
		{"max_jobs 0", func(p *schedpolicy.Policy) { p.MaxJobs = 0 }, true},
		{"max_jobs < 0", func(p *schedpolicy.Policy) { p.MaxJobs = -1 }, false},
		{"interval 0", func(p *schedpolicy.Policy) { p.Interval = 0 }, false},
		{"max backoff < min", func(p *schedpolicy.Policy) { p.MaxBackoff = time.Second }, false},
		{"health 0", func(p *schedpolicy.Policy) { p.HealthThreshold = 0 }, false},
		{"max_history 0", func(p *schedpolicy.Policy) { p.MaxHistory = 0 }, false},
		{"jitter < 0", func(p *schedpolicy.Policy) { p.StartupJitter = -1 }, false},
	}
	for _, tc := range tests {
		p := schedpolicy.DefaultPolicy()
		tc.mod(&p)
		if err := p.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate = %v", tc.name, err)
		}
	}
}

func TestStartupDelay(t *testing.T) {
	p := schedpolicy.DefaultPolicy()
	rnd := rand.New(rand.NewPCG(1, 2))
	seen := map[bool]bool{}
	for range 1000 {
		d := p.StartupDelay(rnd)
		if d < time.Millisecond || d > p.StartupJitter {
			t.Fatalf("delay %v outside [1ms, %v]", d, p.StartupJitter)
		}
		seen[d > p.StartupJitter/2] = true
	}
	if !seen[true] || !seen[false] {
		t.Error("delays not spread over the range")
	}
	p.StartupJitter = 0
	if d := p.StartupDelay(nil); d != time.Millisecond {
		t.Errorf("zero jitter: %v, want 1ms", d)
	}
}

// TestNodeRotationRespectsLimits: with a fake clock, over many ticks the
// node never runs more than max_jobs, stops at most max_churn per tick and
// never stops a one-shot job.
func TestNodeRotationRespectsLimits(t *testing.T) {
	p := schedpolicy.DefaultPolicy()
	p.MaxJobs, p.MaxChurn = 6, 2
	s := newSim(t, 1, p, share.Params{Quantum: p.RunQuantum()})
	for i := range 30 {
		j := schedpolicy.Job{ID: fmt.Sprintf("j%02d", i), Key: "k", Continuous: i%5 != 0}
		pl, h := s.nodes[0].Add(j)
		s.q.add(j.ID, pl.Priority, pl.ScheduledAt, epoch)
		s.jobs[j.ID] = &simJob{job: j, hist: h, node: -1, enqueued: epoch}
		s.order = append(s.order, j.ID)
	}
	n := s.nodes[0]
	for range 200 {
		now := s.clock.Now()
		d := n.Tick(s.q.due(now))
		if len(d.Stop) > p.MaxChurn {
			t.Fatalf("stopped %d > max_churn", len(d.Stop))
		}
		for _, id := range d.Stop {
			if !s.jobs[id].job.Continuous {
				t.Fatalf("one-shot job %s rotated out", id)
			}
			pl, h, err := n.Stopped(id, s.jobs[id].hist)
			if err != nil {
				t.Fatal(err)
			}
			s.jobs[id].hist, s.jobs[id].node = h, -1
			s.q.add(id, pl.Priority, pl.ScheduledAt, now)
		}
		s.fill(0, d.Start)
		if n.NumRunning() > p.MaxJobs {
			t.Fatalf("running %d > max_jobs", n.NumRunning())
		}
		s.advance(p.Interval)
	}
	// The six one-shot jobs take slots and keep them; continuous ones rotate.
	oneshotRunning := 0
	for _, r := range n.Running() {
		if !s.jobs[r.ID].job.Continuous {
			oneshotRunning++
		}
	}
	if oneshotRunning != p.MaxJobs {
		t.Errorf("one-shot jobs running at the end: %d, want %d (they hog the node, as in CouchDB)", oneshotRunning, p.MaxJobs)
	}
}
