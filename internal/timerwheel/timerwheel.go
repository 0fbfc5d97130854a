// Package timerwheel runs the timer functions of many jobs — each running
// replication's checkpoint and progress timer — from one runtime timer
// instead of one each: a Wheel rounds every deadline up to a tick that
// grows with the delay (1/16 of it, at most MaxTick), keeps the timers due
// at the same tick in one slot, and wakes once per slot that has timers,
// calling them one after the other. Ten thousand idle jobs whose timers
// fire every 15 s so cost about 15 wake-ups per 15 s, not 10,000, and no
// goroutine per firing.
//
// Timer functions run on the wheel's goroutine (the one that wakes for the
// slot) and delay every other timer of the slot while they run: they must
// be short and must not block. A function with slow work to do (a request,
// a store write) starts a goroutine for it.
//
// A Wheel has no goroutine of its own while nothing is due, and needs no
// closing: a wheel whose timers are all stopped holds nothing but memory.
package timerwheel

import (
	"container/heap"
	"sync"
	"time"
)

// MaxTick is the coarsest rounding of a deadline: a timer due in d fires
// up to min(d/16, MaxTick) after it (and never before).
const MaxTick = 1024 * time.Millisecond

// minTick is the finest rounding (timers due in less than 16 ms).
const minTick = time.Millisecond

// tickFor is the rounding of a timer due in d: the largest power-of-two
// multiple of minTick not above d/16, within [minTick, MaxTick]. Ticks are
// powers of two of one unit, so a deadline on a coarse tick is also on
// every finer one and timers of different delays share slots.
func tickFor(d time.Duration) time.Duration {
	g := minTick
	for g*2 <= d/16 && g < MaxTick {
		g *= 2
	}
	return g
}

// Wheel is a set of timers sharing one runtime timer. Its zero value is not
// usable; New returns one. It is safe for concurrent use.
type Wheel struct {
	epoch time.Time // deadlines are offsets from it (monotonic clock)

	mu    sync.Mutex
	slots map[int64]*slot // by deadline
	order slotHeap        // the slots, earliest first
	n     int             // armed timers
	rt    *time.Timer     // wakes for the earliest slot
	// armedFor is the deadline rt is set for; noDeadline when it is not
	// set (or has fired).
	armedFor int64
}

const noDeadline = int64(^uint64(0) >> 1)

// New returns an empty wheel.
func New() *Wheel {
	w := &Wheel{epoch: time.Now(), slots: map[int64]*slot{}, armedFor: noDeadline}
	w.rt = time.AfterFunc(time.Hour, w.fire)
	w.rt.Stop()
	return w
}

var (
	defaultOnce  sync.Once
	defaultWheel *Wheel
)

// Default is the process's wheel, for timers whose owner was given none.
func Default() *Wheel {
	defaultOnce.Do(func() { defaultWheel = New() })
	return defaultWheel
}

// slot is the timers due at one tick.
type slot struct {
	deadline int64
	index    int // in Wheel.order
	timers   []*Timer
}

type slotHeap []*slot

func (h slotHeap) Len() int           { return len(h) }
func (h slotHeap) Less(i, j int) bool { return h[i].deadline < h[j].deadline }
func (h slotHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *slotHeap) Push(x any) {
	s := x.(*slot)
	s.index = len(*h)
	*h = append(*h, s)
}
func (h *slotHeap) Pop() any {
	old := *h
	s := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return s
}

// Timer calls its function once when it is due; Reset arms it again. Make
// one with Wheel.AfterFunc.
type Timer struct {
	w     *Wheel
	f     func()
	slot  *slot // nil while not armed
	index int   // in slot.timers
}

// AfterFunc arms a timer that calls f on the wheel's goroutine once d has
// passed (up to min(d/16, MaxTick) later). f must not block.
func (w *Wheel) AfterFunc(d time.Duration, f func()) *Timer {
	t := &Timer{w: w, f: f}
	w.mu.Lock()
	w.add(t, d)
	w.mu.Unlock()
	return t
}

// Reset arms t to call its function once d has passed, replacing a
// deadline it had; it reports whether t was armed.
func (t *Timer) Reset(d time.Duration) bool {
	w := t.w
	w.mu.Lock()
	defer w.mu.Unlock()
	was := t.slot != nil
	if was {
		w.remove(t)
	}
	w.add(t, d)
	return was
}

// Stop disarms t and reports whether that kept its function from being
// called (false: it was not armed, or its call has already begun or is
// about to begin, as with time.Timer).
func (t *Timer) Stop() bool {
	w := t.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if t.slot == nil {
		return false
	}
	w.remove(t)
	return true
}

// Len is the number of armed timers.
func (w *Wheel) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// add puts t in the slot of now+d rounded up to its tick; w.mu is held.
func (w *Wheel) add(t *Timer, d time.Duration) {
	d = max(d, 0)
	g := int64(tickFor(d))
	due := int64(time.Since(w.epoch) + d)
	deadline := (due + g - 1) / g * g
	s := w.slots[deadline]
	if s == nil {
		s = &slot{deadline: deadline}
		w.slots[deadline] = s
		heap.Push(&w.order, s)
	}
	t.slot, t.index = s, len(s.timers)
	s.timers = append(s.timers, t)
	w.n++
	if deadline < w.armedFor {
		w.armedFor = deadline
		w.rt.Reset(time.Duration(deadline) - time.Since(w.epoch))
	}
}

// remove takes t out of its slot, and an emptied slot out of the wheel;
// w.mu is held.
func (w *Wheel) remove(t *Timer) {
	s := t.slot
	last := len(s.timers) - 1
	s.timers[t.index] = s.timers[last]
	s.timers[t.index].index = t.index
	s.timers[last] = nil
	s.timers = s.timers[:last]
	t.slot = nil
	w.n--
	if len(s.timers) == 0 {
		heap.Remove(&w.order, s.index)
		delete(w.slots, s.deadline)
	}
}

// fire is the runtime timer's function: it calls every timer due by now,
// one at a time and outside w.mu (a function may Reset or Stop timers,
// its own included), then sets the runtime timer for the next slot.
func (w *Wheel) fire() {
	w.mu.Lock()
	w.armedFor = noDeadline
	now := int64(time.Since(w.epoch))
	for {
		t := w.due(now)
		if t == nil {
			break
		}
		w.mu.Unlock()
		t.f()
		w.mu.Lock()
	}
	if len(w.order) > 0 {
		if next := w.order[0].deadline; next < w.armedFor {
			w.armedFor = next
			w.rt.Reset(time.Duration(next - int64(time.Since(w.epoch))))
		}
	}
	w.mu.Unlock()
}

// due disarms and returns a timer of the earliest slot if that slot is due
// by now, else nil; w.mu is held.
func (w *Wheel) due(now int64) *Timer {
	if len(w.order) == 0 || w.order[0].deadline > now {
		return nil
	}
	s := w.order[0]
	t := s.timers[len(s.timers)-1]
	w.remove(t)
	return t
}
