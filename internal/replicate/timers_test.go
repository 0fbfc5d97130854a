package replicate

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/timerwheel"
)

// countCheckpointWrites makes f count the PUTs of _local documents (two per
// checkpoint: source and target), passing every request on to the hook it
// had.
func countCheckpointWrites(f *fakeCouch) *atomic.Int64 {
	var n atomic.Int64
	prev := f.hook
	f.hook = func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/_local/") {
			n.Add(1)
		}
		return prev != nil && prev(w, r)
	}
	return &n
}

// awaitCheckpoint waits until db's checkpoint document records seq.
func awaitCheckpoint(t *testing.T, f *fakeCouch, db, id, seq string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if ck := f.localDoc(db, id); ck != nil && ck["source_last_seq"] == seq {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no checkpoint at %s within a minute (have %v)", db, seq, f.localDoc(db, id))
		}
		time.Sleep(5 * time.Millisecond) // the fake server's state: poll
	}
}

// eventually polls cond until it holds, failing the test after a minute.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// firings records what a run's timer function found due.
type firings struct {
	mu    sync.Mutex
	calls int
	busy  int // calls that found a checkpoint or a report due
	kick  chan struct{}
}

func newFirings() *firings { return &firings{kick: make(chan struct{}, 1)} }

func (fr *firings) fired(ckpt, prog bool) {
	fr.mu.Lock()
	fr.calls++
	if ckpt || prog {
		fr.busy++
	}
	fr.mu.Unlock()
	select {
	case fr.kick <- struct{}{}:
	default:
	}
}

func (fr *firings) counts() (calls, busy int) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	return fr.calls, fr.busy
}

// await waits until the timer function has been called n more times.
func (fr *firings) await(t *testing.T, n int) {
	t.Helper()
	from, _ := fr.counts()
	deadline := time.After(time.Minute)
	for {
		if c, _ := fr.counts(); c >= from+n {
			return
		}
		select {
		case <-fr.kick:
		case <-deadline:
			t.Fatalf("the run's timer did not fire %d times within a minute", n)
		}
	}
}

// TestTimersCheckpointOnlyWhenMoved: a continuous run's timer (on the
// wheel it is given) checkpoints while documents move, writes no
// checkpoint and reports no progress while nothing moves however often it
// fires, checkpoints again once a document moves, and leaves the wheel when
// the run stops.
func TestTimersCheckpointOnlyWhenMoved(t *testing.T) {
	f, fs := continuousSource(t)
	puts := countCheckpointWrites(f)
	wheel := timerwheel.New()
	progress, o := progressOptions()
	var reports atomic.Int64
	report := o.OnProgress
	o.OnProgress = func(s Stats) { reports.Add(1); report(s) }
	o.Timers = wheel
	p := fakeParams(t, `,"continuous":true,"checkpoint_interval":20`, f.URL+"/src", f.URL+"/tgt")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	r := New(p, o)
	fr := newFirings()
	r.timerFired = fr.fired
	r.Start(ctx, func(_ Result, err error) { done <- err })
	base, _, _ := ID(p, "u")

	// Documents moved: the timer checkpoints while the run goes on.
	awaitWritten(t, progress, done, 1)
	awaitCheckpoint(t, f, "src", base, seqStr(1))
	awaitCheckpoint(t, f, "tgt", base, seqStr(1))

	// Nothing moves: firing after firing finds nothing to do. (Wait for
	// one such firing first: a checkpoint or report may still be under
	// way.)
	deadline := time.Now().Add(time.Minute)
	for {
		c, b := fr.counts()
		fr.await(t, 1)
		if c2, b2 := fr.counts(); b2 == b && c2 > c {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the idle run's timer kept finding work for a minute")
		}
	}
	idlePuts, idleReports := puts.Load(), reports.Load()
	_, busyBefore := fr.counts()
	fr.await(t, 20) // 20 firings: several checkpoint intervals and many progress intervals
	if _, b := fr.counts(); b != busyBefore {
		t.Errorf("%d firings found work while nothing moved", b-busyBefore)
	}
	if n := puts.Load(); n != idlePuts {
		t.Errorf("%d checkpoint writes while nothing moved, want 0", n-idlePuts)
	}
	if n := reports.Load(); n != idleReports {
		t.Errorf("%d progress reports while nothing moved, want 0", n-idleReports)
	}
	eventually(t, "the idle run's one timer on the wheel", func() bool { return wheel.Len() == 1 })

	// A document moves: reported and checkpointed again.
	f.put("src", map[string]any{"_id": "b"})
	fs.notify <- struct{}{}
	awaitWritten(t, progress, done, 2)
	awaitCheckpoint(t, f, "src", base, seqStr(2))
	awaitCheckpoint(t, f, "tgt", base, seqStr(2))
	if n := puts.Load(); n < idlePuts+2 {
		t.Errorf("%d checkpoint writes after a document moved, want at least 2", n-idlePuts)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("stopped: %v", err)
	}
	if l := wheel.Len(); l != 0 {
		t.Errorf("wheel holds %d timers after the run stopped, want 0", l)
	}
}

// TestTimersFireForEachRun: many continuous runs share one wheel; each
// run's timer fires and checkpoints its own replication, each holds one
// timer while it runs, and none is left once they stopped.
func TestTimersFireForEachRun(t *testing.T) {
	f, _ := continuousSource(t)
	const runs = 20
	wheel := timerwheel.New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, runs)
	var fired [runs]atomic.Int64
	bases := make([]string, runs)
	for i := range runs {
		tgt := fmt.Sprintf("tgt%02d", i)
		f.mu.Lock()
		f.addDB(tgt)
		f.mu.Unlock()
		_, o := progressOptions()
		o.OnProgress, o.ProgressInterval = nil, 50*time.Millisecond
		o.Timers = wheel
		p := fakeParams(t, `,"continuous":true,"checkpoint_interval":20`, f.URL+"/src", f.URL+"/"+tgt)
		bases[i], _, _ = ID(p, "u")
		r := New(p, o)
		r.timerFired = func(bool, bool) { fired[i].Add(1) }
		r.Start(ctx, func(_ Result, err error) { done <- err })
	}
	for i := range runs {
		awaitCheckpoint(t, f, fmt.Sprintf("tgt%02d", i), bases[i], seqStr(1))
	}
	eventually(t, fmt.Sprintf("%d timers on the wheel for %d idle runs", runs, runs),
		func() bool { return wheel.Len() == runs })
	for i := range runs {
		if fired[i].Load() == 0 {
			t.Errorf("run %d: its timer never fired", i)
		}
	}
	cancel()
	for range runs {
		if err := <-done; err != nil {
			t.Fatalf("stopped: %v", err)
		}
	}
	if l := wheel.Len(); l != 0 {
		t.Errorf("wheel holds %d timers after every run stopped, want 0", l)
	}
}

// TestIdleProgressBacksOff: while nothing moves, an idle continuous run's
// progress checks back off (each wait doubles, up to 16 progress
// intervals), so an idle job costs about as few timer calls as before
// progress was shown live; a batch cut brings the next check back to one
// interval, so the moved document is reported.
func TestIdleProgressBacksOff(t *testing.T) {
	f, fs := continuousSource(t)
	wheel := timerwheel.New()
	progress, o := progressOptions()
	o.ProgressInterval = 10 * time.Millisecond
	o.Timers = wheel
	p := fakeParams(t, `,"continuous":true,"checkpoint_interval":600000`, f.URL+"/src", f.URL+"/tgt")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	r := New(p, o)
	var mu sync.Mutex
	var idle []time.Time // when checks found nothing to report
	fr := newFirings()
	r.timerFired = func(ckpt, prog bool) {
		if !ckpt && !prog {
			mu.Lock()
			idle = append(idle, time.Now())
			mu.Unlock()
		}
		fr.fired(ckpt, prog)
	}
	r.Start(ctx, func(_ Result, err error) { done <- err })
	awaitWritten(t, progress, done, 1)

	// Idle: wait for 6 checks in a row that found nothing.
	mu.Lock()
	idle = nil
	mu.Unlock()
	for {
		fr.await(t, 1)
		mu.Lock()
		n := len(idle)
		mu.Unlock()
		if n >= 6 {
			break
		}
	}
	mu.Lock()
	gap := idle[5].Sub(idle[4])
	mu.Unlock()
	// The waits were 20, 40, 80, 160 ms... (at least; a slower machine
	// only makes them longer): the fifth gap is at least 8 intervals.
	if gap < 8*o.ProgressInterval {
		t.Errorf("gap between idle checks %v, want at least %v (backing off)", gap, 8*o.ProgressInterval)
	}

	f.put("src", map[string]any{"_id": "b"})
	fs.notify <- struct{}{}
	awaitWritten(t, progress, done, 2)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("stopped: %v", err)
	}
}

// TestPokeBringsProgressCheckForward: a batch cut while the progress
// checks are backed off brings the next one to within one progress
// interval (so a job's first batch after a quiet while is shown within a
// second), and does nothing while the checks are at their shortest.
func TestPokeBringsProgressCheckForward(t *testing.T) {
	const iv = time.Hour // no firing during the test
	s := &runState{r: New(Params{}, Options{ProgressInterval: iv, Timers: timerwheel.New()}), tracker: newSeqTracker(nil)}
	tm := s.startTimers(context.Background(), func(error) {})
	defer tm.stop()
	tm.mu.Lock()
	far := time.Now().Add(idleProgressFactor * iv)
	tm.progWait, tm.nextProg = idleProgressFactor*iv, far
	tm.mu.Unlock()

	before := time.Now()
	s.pokeProgress()
	tm.mu.Lock()
	next, wait := tm.nextProg, tm.progWait
	tm.mu.Unlock()
	if wait != iv || next.After(time.Now().Add(iv)) || next.Before(before.Add(iv)) {
		t.Fatalf("after a poke: next check in %v (wait %v), want one interval %v", next.Sub(before), wait, iv)
	}

	s.pokeProgress() // already at the shortest: unchanged
	tm.mu.Lock()
	again := tm.nextProg
	tm.mu.Unlock()
	if !again.Equal(next) {
		t.Fatalf("a second poke moved the check from %v to %v", next, again)
	}
}
