package supervisor_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/couchrep/couchrep/supervisor"
)

// BenchmarkRestartLatency measures kill → restarted child running again
// (acknowledged) under a supervisor of 8 idle workers; the 4th is killed.
// ns/op is the whole heal (for rest_for_one: the killed child and the 4
// after it restarted); child-ns/op is until the killed child itself runs.
func BenchmarkRestartLatency(b *testing.B) {
	const children, victim = 8, 3
	for _, tc := range []struct {
		strategy supervisor.Strategy
		last     int // index of the last child restarted
	}{
		{supervisor.OneForOne, victim},
		{supervisor.RestForOne, children - 1},
	} {
		b.Run(tc.strategy.String(), func(b *testing.B) {
			system := newSystem(b)
			restarted := make(chan string, children)
			sub := system.EventStream.Subscribe(func(evt any) {
				if e, ok := evt.(*supervisor.Event); ok && e.Kind == supervisor.ChildRestarted {
					restarted <- e.Child
				}
			})
			defer system.EventStream.Unsubscribe(sub)
			var specs []supervisor.ChildSpec
			for i := range children {
				specs = append(specs, idleChild(fmt.Sprintf("w%d", i), supervisor.Permanent))
			}
			sup := startTree(b, system, "bench", supervisor.Spec{Strategy: tc.strategy, MaxRestarts: 1 << 30, Period: time.Hour, Children: specs})
			victimPID := actor.NewPID("nonhost", fmt.Sprintf("%s/w%d", sup.PID().Id, victim))
			victimName, lastName := fmt.Sprintf("w%d", victim), fmt.Sprintf("w%d", tc.last)
			ctx := testContext(b)
			var childTime time.Duration
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				if err := supervisor.Kill(ctx, system, victimPID, "bench"); err != nil {
					b.Fatal(err)
				}
				for name := ""; name != lastName; {
					select {
					case name = <-restarted:
						if name == victimName {
							childTime += time.Since(start)
						}
					case <-ctx.Done():
						b.Fatal("heal did not complete")
					}
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(childTime.Nanoseconds())/float64(b.N), "child-ns/op")
		})
	}
}

// BenchmarkStartChildren starts 20,000 dynamic children under one
// simple_one_for_one supervisor (a node's job actors after a _bulk_docs of
// 20,000 _replicator documents), one StartChild after the other or 64 at
// once (the accept loop's batch), and reports the time per child: a start
// among thousands of children must not walk them all.
func BenchmarkStartChildren(b *testing.B) {
	const children = 20000
	for _, batch := range []int{1, 64} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			for range b.N {
				system := newSystem(b)
				sup := startTree(b, system, "jobs", supervisor.Spec{Strategy: supervisor.SimpleOneForOne,
					MaxRestarts: 10, Period: time.Hour, Children: []supervisor.ChildSpec{idleChild("job", supervisor.Temporary)}})
				ctx := testContext(b)
				start := time.Now()
				for i := 0; i < children; i += batch {
					var wg sync.WaitGroup
					for k := i; k < min(i+batch, children); k++ {
						wg.Add(1)
						go func() {
							defer wg.Done()
							if _, err := supervisor.StartChild(ctx, system, sup.PID(), fmt.Sprintf("job-%08d", k), nil); err != nil {
								b.Error(err)
							}
						}()
					}
					wg.Wait()
				}
				b.ReportMetric(float64(time.Since(start).Microseconds())/children, "µs/child")
			}
		})
	}
}
