package main

import (
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
