package timerwheel

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestTickFor(t *testing.T) {
	for _, c := range []struct {
		d, want time.Duration
	}{
		{0, time.Millisecond},
		{time.Millisecond, time.Millisecond},
		{31 * time.Millisecond, time.Millisecond},
		{32 * time.Millisecond, 2 * time.Millisecond},
		{time.Second, 32 * time.Millisecond},
		{15 * time.Second, 512 * time.Millisecond},
		{30 * time.Second, MaxTick},
		{time.Hour, MaxTick},
	} {
		if got := tickFor(c.d); got != c.want {
			t.Errorf("tickFor(%s) = %s, want %s", c.d, got, c.want)
		}
	}
}

// TestEveryTimerFiresOnceNotEarly: many timers with different delays each
// fire exactly once, never before their delay, and leave the wheel empty.
func TestEveryTimerFiresOnceNotEarly(t *testing.T) {
	w := New()
	const n = 2000
	var fired [n]atomic.Int32
	var early atomic.Int32
	var wg sync.WaitGroup
	wg.Add(n)
	for i := range n {
		d := time.Duration(i%97) * time.Millisecond
		armed := time.Now()
		w.AfterFunc(d, func() {
			if time.Since(armed) < d {
				early.Add(1)
			}
			fired[i].Add(1)
			wg.Done()
		})
	}
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(time.Minute):
		t.Fatal("not every timer fired within a minute")
	}
	for i := range n {
		if got := fired[i].Load(); got != 1 {
			t.Errorf("timer %d fired %d times", i, got)
		}
	}
	if e := early.Load(); e > 0 {
		t.Errorf("%d timers fired before their delay", e)
	}
	if l := w.Len(); l != 0 {
		t.Errorf("Len after every timer fired = %d, want 0", l)
	}
}

// TestTimersShareSlots: timers due at about the same time, with a coarse
// tick, sit in one slot (one wake-up for all of them).
func TestTimersShareSlots(t *testing.T) {
	w := New()
	for range 1000 {
		w.AfterFunc(time.Hour, func() { t.Error("fired") })
	}
	w.mu.Lock()
	slots := len(w.slots)
	w.mu.Unlock()
	// One hour rounds to MaxTick: the 1,000 deadlines, armed within a few
	// milliseconds of each other, fall in one or two slots.
	if slots > 2 {
		t.Errorf("1,000 timers due in an hour take %d slots, want at most 2", slots)
	}
	if l := w.Len(); l != 1000 {
		t.Errorf("Len = %d, want 1000", l)
	}
}

func TestStopAndReset(t *testing.T) {
	for _, c := range []struct {
		name string
		// do acts on a timer armed for an hour and reports what Stop or
		// Reset returned.
		do       func(tm *Timer) bool
		want     bool
		wantLen  int
		wantFire bool
	}{
		{"stop armed", func(tm *Timer) bool { return tm.Stop() }, true, 0, false},
		{"stop twice", func(tm *Timer) bool { tm.Stop(); return tm.Stop() }, false, 0, false},
		{"reset armed to now", func(tm *Timer) bool { return tm.Reset(0) }, true, 0, true},
		{"reset stopped to now", func(tm *Timer) bool { tm.Stop(); return tm.Reset(0) }, false, 0, true},
		{"reset armed to later", func(tm *Timer) bool { return tm.Reset(2 * time.Hour) }, true, 1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := New()
			fired := make(chan struct{}, 1)
			tm := w.AfterFunc(time.Hour, func() { fired <- struct{}{} })
			if got := c.do(tm); got != c.want {
				t.Errorf("returned %v, want %v", got, c.want)
			}
			if c.wantFire {
				select {
				case <-fired:
				case <-time.After(time.Minute):
					t.Fatal("timer reset to fire now did not fire within a minute")
				}
			}
			if l := w.Len(); l != c.wantLen {
				t.Errorf("Len = %d, want %d", l, c.wantLen)
			}
			if !c.wantFire {
				select {
				case <-fired:
					t.Error("fired")
				default:
				}
			}
		})
	}
}

// TestPeriodic: a function that re-arms its own timer fires again and
// again; a function may stop other timers; after Stop the wheel is empty
// (nothing is left to fire).
func TestPeriodic(t *testing.T) {
	w := New()
	var count atomic.Int32
	tenth := make(chan struct{})
	var tm *Timer
	var mu sync.Mutex
	stopped := false
	victim := w.AfterFunc(time.Hour, func() { t.Error("stopped timer fired") })
	mu.Lock()
	tm = w.AfterFunc(time.Millisecond, func() {
		victim.Stop()
		if count.Add(1) == 10 {
			close(tenth)
		}
		mu.Lock()
		if !stopped {
			tm.Reset(time.Millisecond)
		}
		mu.Unlock()
	})
	mu.Unlock()
	select {
	case <-tenth:
	case <-time.After(time.Minute):
		t.Fatalf("%d firings within a minute, want 10", count.Load())
	}
	mu.Lock()
	stopped = true
	tm.Stop()
	mu.Unlock()
	if l := w.Len(); l != 0 {
		t.Errorf("Len after stop = %d, want 0", l)
	}
}

// TestConcurrentUse arms, resets and stops timers from many goroutines
// while the wheel fires them (run with -race).
func TestConcurrentUse(t *testing.T) {
	w := New()
	var fired atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []*Timer
			for i := range 500 {
				d := time.Duration((g+i)%5) * time.Millisecond
				mine = append(mine, w.AfterFunc(d, func() { fired.Add(1) }))
				if i%3 == 0 {
					mine[i/2].Stop()
				}
				if i%7 == 0 {
					mine[i/3].Reset(time.Millisecond)
				}
			}
			for _, tm := range mine {
				tm.Stop()
			}
		}()
	}
	wg.Wait()
	if l := w.Len(); l != 0 {
		t.Errorf("Len after every timer was stopped = %d, want 0", l)
	}
}
