package main

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/rs/zerolog"
)

// The idle GC governor. A node running thousands of idle continuous jobs
// holds a large heap that hardly changes (their state) and allocates little
// (heartbeats). With Go's default GOGC=100 the runtime lets the heap grow
// to twice what is live before it collects and keeps that much mapped, so
// the process's RSS is about twice its live heap: at 1,000 idle jobs ~120
// MB where ~60 MB would do. While the node is quiet, the governor sets the
// GC's heap growth to [couchrep] idle_gc_percent (25 by default) and
// returns the freed memory to the OS: a quiet node allocating a few percent
// of its heap per minute then collects every few minutes, each collection
// marking the live heap once (tens of milliseconds at 1,000 jobs). As soon
// as the node allocates more (documents moving), Go's default growth comes
// back within one window, so replicating is not slowed by collections. GC
// settings are the process's, so the daemon owns this, not couchrep.Start
// (a program embedding a node keeps its own GC settings). GOGC in the
// environment turns it off: the operator chose.

// gcWindow is how often the governor looks at the allocation rate.
const gcWindow = 10 * time.Second

// quietWindows is how many quiet windows in a row make the node idle.
const quietWindows = 3

// gcGovernor switches the GC's heap growth between busyPercent and
// idlePercent. step is its decision, one window at a time; run feeds it.
type gcGovernor struct {
	idlePercent, busyPercent int
	// setPercent sets the GC percent (debug.SetGCPercent); freeOS returns
	// freed memory to the OS (debug.FreeOSMemory).
	setPercent func(int) int
	freeOS     func()
	log        zerolog.Logger

	quiet int  // quiet windows in a row
	idle  bool // idlePercent is in force
}

// quietAlloc reports whether allocating allocated bytes in one window, with
// live bytes live after the last collection, is quiet: less than a quarter
// of the live heap.
func quietAlloc(allocated, live uint64) bool { return allocated < live/4 }

// step takes one window's verdict and switches the GC percent when the node
// became idle (quietWindows quiet windows in a row) or busy (one busy
// window).
func (g *gcGovernor) step(quiet bool) {
	if !quiet {
		g.quiet = 0
		if g.idle {
			g.idle = false
			g.setPercent(g.busyPercent)
			g.log.Debug().Int("gc_percent", g.busyPercent).Msg("idle gc: busy, default heap growth")
		}
		return
	}
	g.quiet++
	if !g.idle && g.quiet >= quietWindows {
		g.idle = true
		g.setPercent(g.idlePercent)
		g.freeOS()
		g.log.Debug().Int("gc_percent", g.idlePercent).Msg("idle gc: quiet, smaller heap growth")
	}
}

// heapMetrics reads the bytes allocated so far and the live heap after the
// last collection.
func heapMetrics() (allocated, live uint64) {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() == metrics.KindUint64 {
		allocated = s[0].Value.Uint64()
	}
	if s[1].Value.Kind() == metrics.KindUint64 {
		live = s[1].Value.Uint64()
	}
	return allocated, live
}

// governGC runs the idle GC governor until ctx ends, then restores the GC
// percent it found. It does nothing when idlePercent is not positive or
// GOGC is set in the environment.
func governGC(ctx context.Context, idlePercent int, log zerolog.Logger) {
	const busy = 100 // Go's default: GOGC is not set
	if idlePercent <= 0 || idlePercent >= busy || os.Getenv("GOGC") != "" {
		return
	}
	g := &gcGovernor{idlePercent: idlePercent, busyPercent: busy, setPercent: debug.SetGCPercent,
		freeOS: debug.FreeOSMemory, log: log}
	t := time.NewTicker(gcWindow)
	defer t.Stop()
	prev, _ := heapMetrics()
	for {
		select {
		case <-ctx.Done():
			debug.SetGCPercent(busy)
			return
		case <-t.C:
		}
		allocated, live := heapMetrics()
		g.step(quietAlloc(allocated-prev, live))
		prev = allocated
	}
}
