package main

import (
	"context"
	"math"
	"os"
	"runtime"
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
// back within one window, so replicating is not slowed by collections.
//
// While idle the governor also turns off the runtime's forced collection
// (Go collects at least every two minutes, marking the whole live heap:
// with thousands of parked jobs that is most of an idle node's CPU): it
// sets the GC percent to off and a soft memory limit of what the node
// holds after the idle collection plus idle_gc_percent of its live heap
// (at least 8 MiB), so the heap is still collected when it grows by as
// much as GOGC=idle_gc_percent would allow, but not by the clock. A collection while idle (the heap reached the
// limit: the node allocates again) brings Go's default back at once, as a
// busy window does, so a burst of work is not collected at the limit
// again and again. GC settings are the process's, so the daemon owns this, not couchrep.Start
// (a program embedding a node keeps its own GC settings). GOGC in the
// environment turns it off: the operator chose (GOMEMLIMIT keeps the
// governor's percent switch but not the memory limit).

// gcWindow is how often the governor looks at the allocation rate.
const gcWindow = 10 * time.Second

// quietWindows is how many quiet windows in a row make the node idle.
const quietWindows = 3

// gcGovernor switches the GC's heap growth between busyPercent and
// idlePercent. step is its decision, one window at a time; run feeds it.
type gcGovernor struct {
	idlePercent, busyPercent int
	// setPercent sets the GC percent (debug.SetGCPercent); freeOS returns
	// freed memory to the OS (debug.FreeOSMemory); setLimit sets the
	// soft memory limit (debug.SetMemoryLimit), nil when the governor
	// must not (GOMEMLIMIT set); idleLimit is the limit for now while
	// idle (idleMemoryLimit).
	setPercent func(int) int
	freeOS     func()
	setLimit   func(int64) int64
	idleLimit  func() int64
	log        zerolog.Logger

	quiet int  // quiet windows in a row
	idle  bool // idlePercent is in force
	// afterGC: the last switch to busy was a collection at the idle
	// memory limit and no busy window followed; going idle again needs
	// no collection of its own.
	afterGC bool
}

// collected takes a collection that ran while idle with the memory limit
// in force: the heap grew to the limit, so the node allocates again;
// Go's default comes back as for a busy window.
func (g *gcGovernor) collected() {
	if !g.idle || g.setLimit == nil {
		return
	}
	g.busy()
	g.afterGC = true
}

// busy leaves the idle settings.
func (g *gcGovernor) busy() {
	g.quiet = 0
	if !g.idle {
		return
	}
	g.idle = false
	if g.setLimit != nil {
		g.setLimit(math.MaxInt64)
	}
	g.setPercent(g.busyPercent)
	g.log.Debug().Int("gc_percent", g.busyPercent).Msg("idle gc: busy, default heap growth")
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
		g.afterGC = false
		g.busy()
		return
	}
	g.quiet++
	if !g.idle && g.quiet >= quietWindows {
		g.idle = true
		g.setPercent(g.idlePercent)
		if !g.afterGC {
			g.freeOS()
		}
		g.afterGC = false
		if g.setLimit != nil {
			// No collection by the clock: by the memory limit only.
			limit := g.idleLimit()
			g.setLimit(limit)
			g.setPercent(-1)
			g.log.Debug().Int("gc_percent", g.idlePercent).Int64("memory_limit", limit).Msg("idle gc: quiet, collecting only at the memory limit")
			return
		}
		g.log.Debug().Int("gc_percent", g.idlePercent).Msg("idle gc: quiet, smaller heap growth")
	}
}

// minIdleHeadroom is the least the idle memory limit leaves above what the
// node uses.
const minIdleHeadroom = 8 << 20

// idleMemoryLimit is the soft memory limit for an idle node, taken right
// after a collection that returned free memory to the OS: what the
// runtime holds now (the memory the limit counts: everything mapped but
// not released, heap spans with their fragmentation, stacks, metadata)
// and percent of the live heap (at least minIdleHeadroom) for the heap to
// grow into before the next collection.
func idleMemoryLimit(percent int) int64 {
	s := []metrics.Sample{
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
		{Name: "/gc/heap/live:bytes"},
	}
	metrics.Read(s)
	v := make([]int64, len(s))
	for i := range s {
		if s[i].Value.Kind() == metrics.KindUint64 {
			v[i] = int64(s[i].Value.Uint64())
		}
	}
	held, live := v[0]-v[1], v[2]
	return max(held, 0) + max(live*int64(percent)/100, minIdleHeadroom)
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
	if os.Getenv("GOMEMLIMIT") == "" {
		g.setLimit = debug.SetMemoryLimit
		g.idleLimit = func() int64 { return idleMemoryLimit(idlePercent) }
	}
	t := time.NewTicker(gcWindow)
	defer t.Stop()
	// gcRan hears of the first collection after the governor went idle
	// with a memory limit (a finalizer of an object nothing holds runs
	// after the next collection).
	gcRan := make(chan struct{}, 1)
	armed := false
	arm := func() {
		sentinel := new([64]byte) // not a tiny allocation: its finalizer runs
		runtime.SetFinalizer(sentinel, func(*[64]byte) {
			select {
			case gcRan <- struct{}{}:
			default:
			}
		})
		armed = true
	}
	prev, _ := heapMetrics()
	for {
		select {
		case <-ctx.Done():
			if g.setLimit != nil {
				g.setLimit(math.MaxInt64)
			}
			debug.SetGCPercent(busy)
			return
		case <-gcRan:
			armed = false
			g.collected()
			continue
		case <-t.C:
		}
		allocated, live := heapMetrics()
		g.step(quietAlloc(allocated-prev, live))
		prev = allocated
		if g.idle && g.setLimit != nil && !armed {
			arm()
		}
	}
}
