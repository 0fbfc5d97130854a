package repjob_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv/storetest"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/schedpolicy"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkCrashStorm: jobs of three _replicator databases with shares
// 100, 200 and 400 (1:2:4) crash as fast as the store lets them, up to
// COUCHREP_CRASH_STORM_RATE crashes a second (500) for
// COUCHREP_CRASH_STORM_SECONDS (10), on every backend: 40 jobs per database,
// 24 slots (goroutines accepting, starting, "running" 10 ms and crashing;
// backoff 1 ms, so every job is due again at once and the fair share alone
// decides which run; the fair-share quantum is one run). Each store write has a 5 s deadline (a job's write
// timeout). It reports the crashes a second reached, the writes that timed
// out, the store's retries per crash (attempts beyond one) and how far each
// database's share of the runs is from its configured weight (the largest
// deviation, in % of the weight).
func BenchmarkCrashStorm(b *testing.B) {
	rate := envInt("COUCHREP_CRASH_STORM_RATE", 500)
	secs := envInt("COUCHREP_CRASH_STORM_SECONDS", 10)
	keys := []string{"a/_replicator", "b/_replicator", "c/_replicator"}
	weights := map[string]int{"a/_replicator": 100, "b/_replicator": 200, "c/_replicator": 400}
	const jobsPerKey, slots, runFor, writeTimeout = 40, 24, 10 * time.Millisecond, 5 * time.Second
	for _, be := range storetest.Backends {
		b.Run(be.Name, func(b *testing.B) {
			for b.Loop() {
				ctx := context.Background()
				db := &countingDB{Database: be.Open(b)}
				q := jobqueue.New(db, jobqueue.Options{NodeName: "n1"})
				p := schedpolicy.DefaultPolicy()
				p.MinBackoff, p.MaxBackoff, p.MaxJobs = time.Millisecond, time.Millisecond, slots
				// A quantum of one run (RunQuantum: interval × ⌈max_jobs /
				// max_churn⌉): the reservations match the runs, and the
				// split settles within a second rather than after 25
				// minutes of reservations.
				p.Interval, p.MaxChurn = runFor, slots
				store := repjob.New(q, db, repjob.Options{ServerUUID: uuid, Policy: p, Shares: weights})
				for i := range jobsPerKey {
					for _, k := range keys {
						if _, err := store.AddPersistent(ctx, repjob.PersistentDoc{Server: "http://c", DB: k, DocID: fmt.Sprint("d", i),
							Body: body(fmt.Sprintf("http://a/%s-%d", k[:1], i), "http://b/central", `,"continuous":true`)}); err != nil {
							b.Fatal(err)
						}
					}
				}
				var timeouts, crashes, otherErrs atomic.Int64
				var mu sync.Mutex
				runs := map[string]int{}
				stop := make(chan struct{})
				tokens := make(chan struct{}, rate)
				go func() { // rate crashes a second at most
					t := time.NewTicker(time.Second / time.Duration(rate))
					defer t.Stop()
					for {
						select {
						case <-stop:
							return
						case <-t.C:
							select {
							case tokens <- struct{}{}:
							default:
							}
						}
					}
				}()
				write := func(f func(context.Context) error) bool {
					c, cancel := context.WithTimeout(ctx, writeTimeout)
					defer cancel()
					err := f(c)
					switch {
					case err == nil:
						return true
					case errors.Is(err, context.DeadlineExceeded):
						timeouts.Add(1)
					case !errors.Is(err, jobqueue.ErrNotFound):
						otherErrs.Add(1)
					}
					return false
				}
				txs0, retries0 := db.txs.Load(), db.retries()
				start := time.Now()
				var wg sync.WaitGroup
				for range slots {
					wg.Go(func() {
						for {
							select {
							case <-stop:
								return
							default:
							}
							var run *repjob.Run
							if !write(func(c context.Context) (err error) { run, err = store.Accept(c, false); return err }) {
								time.Sleep(time.Millisecond) // nothing due: the backoff
								continue
							}
							if !write(func(c context.Context) error { return run.Start(c, "n1") }) {
								continue
							}
							time.Sleep(runFor)
							select {
							case <-tokens:
							case <-stop:
								_ = write(func(c context.Context) error { return run.Stop(c) })
								return
							}
							if write(func(c context.Context) error { _, err := run.Crash(c, "could not open source"); return err }) {
								crashes.Add(1)
								mu.Lock()
								runs[run.Record().GetShareKey()]++
								mu.Unlock()
							}
						}
					})
				}
				time.Sleep(time.Duration(secs) * time.Second)
				close(stop)
				wg.Wait()
				elapsed := time.Since(start)
				n := crashes.Load()
				total, wsum := 0, 0
				for _, k := range keys {
					total += runs[k]
					wsum += weights[k]
				}
				worst := 0.0
				var split []string
				for _, k := range keys {
					want := float64(weights[k]) / float64(wsum)
					got := float64(runs[k]) / float64(max(total, 1))
					worst = max(worst, math.Abs(got/want-1)*100)
					split = append(split, fmt.Sprintf("%s %d (%.1f%%, weight %.1f%%)", k[:1], runs[k], 100*got, 100*want))
				}
				retries := db.retries() - retries0
				b.ReportMetric(float64(n)/elapsed.Seconds(), "crashes/s")
				b.ReportMetric(float64(timeouts.Load()), "write-timeouts")
				b.ReportMetric(float64(retries)/float64(max(n, 1)), "retries/crash")
				b.ReportMetric(worst, "%share-deviation-max")
				b.Logf("%s: %d crashes in %v (%.0f/s, target %d/s), %d transactions, %d retries, %d write timeouts, %d other errors; runs %v",
					be.Name, n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), rate, db.txs.Load()-txs0, retries,
					timeouts.Load(), otherErrs.Load(), split)
			}
		})
	}
}
