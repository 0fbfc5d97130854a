package main

import (
	"fmt"
	"math"
	"runtime"
	"runtime/metrics"
	"slices"
	"testing"

	"github.com/rs/zerolog"
)

// TestGCGovernor: the governor sets the idle GC percent (and returns freed
// memory) after quietWindows quiet windows in a row, not before, restores
// the default at the first busy window, and does nothing while the state
// does not change.
func TestGCGovernor(t *testing.T) {
	for _, c := range []struct {
		name    string
		windows []bool // quiet?
		want    []int  // GC percents set, in order
		freed   int
	}{
		{"busy", []bool{false, false, false, false}, nil, 0},
		{"quiet but not long enough", []bool{true, true, false, true, true, false}, nil, 0},
		{"quiet", []bool{true, true, true}, []int{25}, 1},
		{"stays quiet", []bool{true, true, true, true, true, true, true}, []int{25}, 1},
		{"quiet then busy", []bool{true, true, true, true, false, false}, []int{25, 100}, 1},
		{"twice", []bool{true, true, true, false, true, true, false, true, true, true}, []int{25, 100, 25}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			var set []int
			freed := 0
			g := &gcGovernor{idlePercent: 25, busyPercent: 100, log: zerolog.Nop(),
				setPercent: func(p int) int { set = append(set, p); return 0 }, freeOS: func() { freed++ }}
			for _, q := range c.windows {
				g.step(q)
			}
			if len(set) != len(c.want) {
				t.Fatalf("set %v, want %v", set, c.want)
			}
			for i := range set {
				if set[i] != c.want[i] {
					t.Errorf("set %v, want %v", set, c.want)
				}
			}
			if freed != c.freed {
				t.Errorf("freed memory %d times, want %d", freed, c.freed)
			}
		})
	}
}

func TestQuietAlloc(t *testing.T) {
	for _, c := range []struct {
		allocated, live uint64
		want            bool
	}{
		{0, 0, false}, // nothing live yet: not known to be quiet
		{1 << 20, 40 << 20, true},
		{9 << 20, 40 << 20, true},
		{10 << 20, 40 << 20, false},
		{500 << 20, 40 << 20, false},
	} {
		if got := quietAlloc(c.allocated, c.live); got != c.want {
			t.Errorf("quietAlloc(%d, %d) = %v, want %v", c.allocated, c.live, got, c.want)
		}
	}
}

// TestGCGovernorMemoryLimit: with a memory limit to set, an idle node has
// the GC percent off and the memory limit set once; the first
// busy window, or a collection at the limit, lifts the limit before Go's
// default percent comes back; going idle again after such a collection
// needs no collection of its own.
func TestGCGovernorMemoryLimit(t *testing.T) {
	var calls []string
	limit := int64(100 << 20)
	g := &gcGovernor{idlePercent: 25, busyPercent: 100, log: zerolog.Nop(),
		setPercent: func(p int) int { calls = append(calls, fmt.Sprintf("percent %d", p)); return 0 },
		freeOS:     func() { calls = append(calls, "free") },
		setLimit:   func(l int64) int64 { calls = append(calls, fmt.Sprintf("limit %d", l)); return 0 },
		idleLimit:  func() int64 { limit += 1 << 20; return limit },
	}
	lim := func(mb int64) string { return fmt.Sprintf("limit %d", mb<<20) }
	lifted := fmt.Sprintf("limit %d", int64(math.MaxInt64))
	for _, c := range []struct {
		name  string
		quiet []bool
		gc    bool // a collection at the limit after the windows
		want  []string
	}{
		{"quiet", []bool{true, true, true}, false, []string{"percent 25", "free", lim(101), "percent -1"}},
		{"stays quiet", []bool{true, true}, false, nil},
		{"a collection at the limit", nil, true, []string{lifted, "percent 100"}},
		{"a collection while busy changes nothing", nil, true, nil},
		{"quiet again: no collection of its own", []bool{true, true, true}, false, []string{"percent 25", lim(102), "percent -1"}},
		{"busy", []bool{false}, false, []string{lifted, "percent 100"}},
		{"quiet after busy: collects", []bool{true, true, true}, false, []string{"percent 25", "free", lim(103), "percent -1"}},
	} {
		calls = nil
		for _, q := range c.quiet {
			g.step(q)
		}
		if c.gc {
			g.collected()
		}
		if !slices.Equal(calls, c.want) {
			t.Fatalf("%s: calls %q, want %q", c.name, calls, c.want)
		}
	}
}

// TestIdleMemoryLimit: the idle limit leaves the live heap and at least
// minIdleHeadroom above it.
func TestIdleMemoryLimit(t *testing.T) {
	keep := make([]byte, 32<<20)
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	live := int64(s[0].Value.Uint64())
	got := idleMemoryLimit(25)
	if got < live+max(live/4, minIdleHeadroom) {
		t.Fatalf("idle memory limit %d for a live heap of %d", got, live)
	}
	runtime.KeepAlive(keep)
}
