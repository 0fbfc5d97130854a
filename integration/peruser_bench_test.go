package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
)

// envInt is the integer in environment variable name, else def.
func envInt(tb testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		tb.Fatalf("%s=%q: not a positive integer", name, v)
	}
	return n
}

// BenchmarkPerUserMemory measures what a per-user job holds and costs to
// start, in this process: a node (couchrep.Start, the same actors as
// couchrepd) runs N continuous replications (COUCHREP_PERUSER_MEM_JOBS,
// default 10,000), each from a database of its own ("u<i>", as one per
// user) on the CouchDB-shaped fake of BenchmarkIdleContinuousMemory (in a
// child process; every database empty, every feed held open) into one
// target, with the node's defaults (shared feeds: one per source, so one
// per job here; startup_concurrency). It reports the time from the jobs'
// submission until every feed is open, the CPU this process used
// meanwhile per job, and per job once idle, after a full GC: heap and
// stacks, RSS, goroutines. COUCHREP_PERUSER_PROFILE=prefix writes a CPU
// profile of the start (prefix.start.cpu) and the idle profiles
// (prefix.heap, prefix.goroutines; see writeIdleProfiles).
//
//	go test -run '^$' -bench PerUserMemory -benchtime 1x -timeout 30m ./integration/
func BenchmarkPerUserMemory(b *testing.B) {
	n := envInt(b, "COUCHREP_PERUSER_MEM_JOBS", 10000)
	for range b.N {
		benchPerUserMemory(b, n)
	}
}

func benchPerUserMemory(b *testing.B, n int) {
	base := startIdleCouch(b)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	dir := b.TempDir()
	cfg := couchrep.DefaultConfig()
	cfg.Couchrep.DataDir = dir
	cfg.Couchrep.NodeTypes = []string{config.NodeTypeReplication}
	cfg.Replicator.MaxJobs = n + 10
	cfg.Replicator.StartupJitter = 0
	if err := cfg.Complete(); err != nil {
		b.Fatal(err)
	}
	node, err := couchrep.Start(ctx, cfg, couchrep.WithLogger(zerolog.Nop()))
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := node.Stop(c); err != nil {
			b.Errorf("node stop: %v", err)
		}
	}()
	db, err := sqlite.Open(ctx, filepath.Join(dir, config.StoreFileName), sqlite.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	store := repjob.NewFromConfig(jobqueue.New(db, jobqueue.Options{NodeName: "bench", Logger: zerolog.Nop()}), db, cfg, zerolog.Nop())
	if err := store.Init(ctx); err != nil {
		b.Fatal(err)
	}

	before := measureMem()
	prefix := os.Getenv("COUCHREP_PERUSER_PROFILE")
	if prefix != "" {
		f, err := os.Create(prefix + ".start.cpu")
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		defer f.Close()
	}
	b.ResetTimer()
	cpu0, start := cpuTime(), time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	for range 8 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				body := fmt.Sprintf(`{"source":"%su%05d","target":"%scentral","continuous":true}`, base, i, base)
				if _, err := store.AddTransient(ctx, []byte(body), "bench"); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	submitted := time.Since(start)
	deadline := time.Now().Add(20 * time.Minute)
	for idleFeeds(b, base) < n {
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d feeds open after 20 minutes", idleFeeds(b, base), n)
		}
		time.Sleep(100 * time.Millisecond) // state of another process: poll
	}
	open, cpu := time.Since(start), cpuTime()-cpu0
	b.StopTimer()
	if prefix != "" {
		pprof.StopCPUProfile()
	}
	after := measureMem()
	if prefix != "" {
		writeIdleProfiles(b, prefix)
	}
	per := func(a, b uint64) float64 { return (float64(a) - float64(b)) / float64(n) }
	b.ReportMetric(open.Seconds(), "s-all-feeds-open")
	b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu-µs/job-start")
	b.ReportMetric(per(after.heapInuse+after.stackInuse, before.heapInuse+before.stackInuse), "heap+stack-B/job")
	b.ReportMetric(per(after.stackInuse, before.stackInuse), "stack-B/job")
	b.ReportMetric(per(after.rss, before.rss), "RSS-B/job")
	b.ReportMetric(float64(after.goroutines-before.goroutines)/float64(n), "goroutines/job")
	b.Logf("jobs=%d: submitted in %s, every feed open after %s, CPU %s; goroutines by where they wait (groups of at least %d): %s",
		n, submitted.Round(time.Millisecond), open.Round(time.Millisecond), cpu.Round(time.Millisecond), n/10, goroutineGroups(b, n/10))
	b.Logf("jobs=%d: heap in use %d -> %d, stacks %d -> %d, runtime metadata %d -> %d, RSS %d -> %d, goroutines %d -> %d; load %s",
		n, before.heapInuse, after.heapInuse, before.stackInuse, after.stackInuse, before.runtime, after.runtime,
		before.rss, after.rss, before.goroutines, after.goroutines, loadAvg())
}
