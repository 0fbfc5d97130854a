package timerwheel

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"
)

// cpuTime is this process's user+system CPU time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkIdleTimers compares the CPU that n periodic timers cost while
// their functions have nothing to do (an idle job's checkpoint and
// progress timer: look, re-arm): one runtime timer each (time.AfterFunc,
// a goroutine per firing) against one Wheel. The period is 150 ms, a
// hundredth of the engine's 15 s, so that a 3 s run holds as many firings
// as 5 minutes of idle jobs; the metric is CPU per second of wall time
// (% of one core), divided by 100 it is what the same timers cost at 15 s.
//
//	go test -run '^$' -bench IdleTimers -benchtime 1x ./internal/timerwheel/
func BenchmarkIdleTimers(b *testing.B) {
	const period = 150 * time.Millisecond
	const run = 3 * time.Second
	for _, n := range []int{1000, 10000} {
		for _, kind := range []string{"runtime", "wheel"} {
			b.Run(fmt.Sprintf("%s/timers=%d", kind, n), func(b *testing.B) {
				for range b.N {
					stop := make(chan struct{})
					var mu sync.Mutex // the job's state a firing looks at
					look := func() { mu.Lock(); mu.Unlock() }
					var stopAll []func() bool
					w := New()
					for i := range n {
						first := period * time.Duration(i) / time.Duration(n) // spread, as jobs started over time
						switch kind {
						case "runtime":
							var t *time.Timer
							t = time.AfterFunc(time.Hour, func() {
								look()
								select {
								case <-stop:
								default:
									t.Reset(period)
								}
							})
							t.Reset(first) // armed once t is set
							stopAll = append(stopAll, t.Stop)
						case "wheel":
							var t *Timer
							t = w.AfterFunc(time.Hour, func() {
								look()
								select {
								case <-stop:
								default:
									t.Reset(period)
								}
							})
							t.Reset(first)
							stopAll = append(stopAll, t.Stop)
						}
					}
					time.Sleep(period) // all armed and fired once
					c0, t0 := cpuTime(b), time.Now()
					time.Sleep(run)
					c1, t1 := cpuTime(b), time.Now()
					close(stop)
					for _, s := range stopAll {
						s()
					}
					b.ReportMetric(100*float64(c1-c0)/float64(t1.Sub(t0)), "cpu-%")
				}
			})
		}
	}
}
