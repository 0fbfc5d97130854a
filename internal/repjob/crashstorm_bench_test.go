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
// COUCHREP_CRASH_STORM_SECONDS (60), on every backend: 80 jobs per database,
// 48 slots (goroutines accepting, starting, "running" 10 ms and crashing;
// backoff 1 ms, so every job is due again at once and the fair share alone
// decides which run; the fair-share quantum is one run). The rate is a
// clock's: the n-th crash may go at n/rate seconds after the start, so a
// slow spell is caught up rather than lost. Each store write has a 5 s
// deadline (a job's write timeout). It reports the crashes a second
// reached, the writes that timed out, the store's retries per crash
// (attempts beyond one), how far each database's share of the runs and of
// the running time is from its configured weight (the largest deviation,
// in % of the weight; the runs begun after the first sixth of the storm,
// the jobs added at once settled), and how far behind the frontier a database's
// account (its charges summed, unfloored) was seen, in its quanta (sampled
// every 50 ms: lag kept as credit).
func BenchmarkCrashStorm(b *testing.B) {
	rate := envInt("COUCHREP_CRASH_STORM_RATE", 500)
	secs := envInt("COUCHREP_CRASH_STORM_SECONDS", 60)
	keys := []string{"a/_replicator", "b/_replicator", "c/_replicator"}
	weights := map[string]int{"a/_replicator": 100, "b/_replicator": 200, "c/_replicator": 400}
	const jobsPerKey, slots, runFor, writeTimeout = 80, 48, 10 * time.Millisecond, 5 * time.Second
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
				// The n-th crash may go at start + n/rate: a token bucket
				// on the clock, not a ticker (whose ticks a loaded
				// machine drops).
				var issued atomic.Int64
				var start time.Time
				token := func() bool {
					at := start.Add(time.Duration(issued.Add(1)-1) * time.Second / time.Duration(rate))
					if d := time.Until(at); d > 0 {
						t := time.NewTimer(d)
						defer t.Stop()
						select {
						case <-t.C:
						case <-stop:
							return false
						}
					}
					return true
				}
				// Lag probe: each database's summed account against the
				// frontier, in its quanta.
				minAhead := map[string]float64{}
				behind := map[string]int{}
				probes := 0
				probeDone := make(chan struct{})
				go func() {
					defer close(probeDone)
					t := time.NewTicker(50 * time.Millisecond)
					defer t.Stop()
					for {
						select {
						case <-stop:
							return
						case <-t.C:
						}
						probes++
						for _, k := range keys {
							ahead, qc, err := store.ShareLag(ctx, k)
							if err != nil {
								continue
							}
							r := float64(ahead) / float64(qc)
							if v, ok := minAhead[k]; !ok || r < v {
								minAhead[k] = r
							}
							if ahead < 0 {
								behind[k]++
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
				ranFor := map[string]time.Duration{}
				// The shares are counted over the runs that began after a
				// warm-up: the jobs added at once reserved one quantum
				// each, their first runs are charged as they end.
				warmUp := time.Duration(secs) * time.Second / 6
				start = time.Now()
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
							began := time.Now()
							time.Sleep(runFor)
							if !token() {
								_ = write(func(c context.Context) error { return run.Stop(c) })
								return
							}
							if write(func(c context.Context) error { _, err := run.Crash(c, "could not open source"); return err }) {
								crashes.Add(1)
								if began.Sub(start) >= warmUp {
									mu.Lock()
									runs[run.Record().GetShareKey()]++
									ranFor[run.Record().GetShareKey()] += time.Since(began)
									mu.Unlock()
								}
							}
						}
					})
				}
				time.Sleep(time.Duration(secs) * time.Second)
				close(stop)
				wg.Wait()
				<-probeDone
				elapsed := time.Since(start)
				n := crashes.Load()
				total, wsum := 0, 0
				var totalRan time.Duration
				for _, k := range keys {
					total += runs[k]
					totalRan += ranFor[k]
					wsum += weights[k]
				}
				worst, worstTime := 0.0, 0.0
				var split, lags []string
				for _, k := range keys {
					want := float64(weights[k]) / float64(wsum)
					got := float64(runs[k]) / float64(max(total, 1))
					gotTime := float64(ranFor[k]) / float64(max(totalRan, 1))
					worst = max(worst, math.Abs(got/want-1)*100)
					worstTime = max(worstTime, math.Abs(gotTime/want-1)*100)
					split = append(split, fmt.Sprintf("%s %d after the warm-up (%.1f%% of runs, %.1f%% of time; weight %.1f%%)", k[:1], runs[k], 100*got, 100*gotTime, 100*want))
					lags = append(lags, fmt.Sprintf("%s min %+.2f quanta, behind in %d of %d samples", k[:1], minAhead[k], behind[k], probes))
				}
				retries := db.retries() - retries0
				b.ReportMetric(float64(n)/elapsed.Seconds(), "crashes/s")
				b.ReportMetric(float64(timeouts.Load()), "write-timeouts")
				b.ReportMetric(float64(retries)/float64(max(n, 1)), "retries/crash")
				b.ReportMetric(worst, "%share-deviation-max")
				b.ReportMetric(worstTime, "%time-share-deviation-max")
				b.Logf("%s: %d crashes in %v (%.0f/s, target %d/s), %d transactions, %d retries, %d write timeouts, %d other errors; runs %v; account against the frontier: %v",
					be.Name, n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), rate, db.txs.Load()-txs0, retries,
					timeouts.Load(), otherErrs.Load(), split, lags)
			}
		})
	}
}
