package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"runtime/trace"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
)

// BenchmarkIdleNode measures what an idle node with N parked per-user
// jobs costs in CPU: a node in this process (couchrep.Start: the actors of
// couchrepd, SQLite store, watching the fake's _replicator database like a
// per-user deployment) runs N continuous jobs from a database of their own
// into one central database plus, unless COUCHREP_IDLE_NODE_FANOUT=0, N
// fan-out jobs central → user database with the selector {"owner": user},
// against the idle CouchDB-shaped fake of BenchmarkParkedMemory (a child
// process; it answers _db_updates like a CouchDB where nothing happens),
// with idle_park_after 1 s. Once every job is parked it waits an activity
// timeout and 15 s more, then measures this process's CPU over COUCHREP_IDLE_NODE_WINDOW (default
// 60 s) in which nothing happens, reported as % of one core.
// COUCHREP_IDLE_NODE_SOURCE=pouchdb runs them as BenchmarkPerUser does
// instead: _replicator documents (one _bulk_docs) on a PouchDB Server with
// a real _db_updates feed. COUCHREP_IDLE_NODE_JOBS sets N (default 1,000);
// COUCHREP_IDLE_NODE_RECHECK sets park_recheck (default 1800 s: no job
// rechecks its source within the window; a short one shows what the
// safety net's rechecks cost once jobs have been parked for long);
// COUCHREP_IDLE_NODE_PROFILE=file writes the window's CPU profile,
// COUCHREP_IDLE_NODE_TRACE=file its runtime trace (go tool trace shows
// every goroutine wake-up; the tracer's own cost is then in the number);
// COUCHREP_IDLE_NODE_HEAP=file measures, once all are parked, what they
// hold per job after a full collection (live heap, heap in use, RSS) and
// writes the heap profile (-test.memprofilerate=1 for an exact one).
//
//	go test -run '^$' -bench IdleNode -benchtime 1x -timeout 30m ./integration/
func BenchmarkIdleNode(b *testing.B) {
	n := envInt(b, "COUCHREP_IDLE_NODE_JOBS", 1000)
	fanOut := os.Getenv("COUCHREP_IDLE_NODE_FANOUT") != "0"
	window := 60 * time.Second
	if v := os.Getenv("COUCHREP_IDLE_NODE_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("COUCHREP_IDLE_NODE_WINDOW=%q: %v", v, err)
		}
		window = d
	}
	b.Run(fmt.Sprintf("users=%d/fanout=%t", n, fanOut), func(b *testing.B) {
		for range b.N {
			benchIdleNode(b, n, fanOut, window)
		}
	})
}

// gcNow is what the Go runtime reports of its collector so far.
type gcNow struct {
	cpu                  float64 // CPU seconds spent in GC
	cycles, live, allocs uint64  // completed cycles; live heap after the last; bytes allocated
}

func gcMetrics() gcNow {
	s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/gc/cycles/total:gc-cycles"}, {Name: "/gc/heap/live:bytes"}, {Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return gcNow{cpu: s[0].Value.Float64(), cycles: s[1].Value.Uint64(), live: s[2].Value.Uint64(), allocs: s[3].Value.Uint64()}
}

func benchIdleNode(b *testing.B, n int, fanOut bool, window time.Duration) {
	b.StopTimer()
	var (
		base string
		pu   *perUser
	)
	if os.Getenv("COUCHREP_IDLE_NODE_SOURCE") == "pouchdb" {
		pu = newPerUserServer(b, n)
		base = pu.srv.URL
	} else {
		base = startIdleCouch(b)
	}
	jobs := n
	if fanOut {
		jobs = 2 * n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	dir := b.TempDir()
	cfg := couchrep.DefaultConfig()
	cfg.Couchrep.DataDir = dir
	cfg.Couchrep.HTTPBind, cfg.Couchrep.AdminBind = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Couchrep.Watch = []string{strings.TrimSuffix(base, "/")}
	cfg.Replicator.MaxJobs = jobs + 10
	cfg.Replicator.StartupJitter = 0
	cfg.Replicator.IdleParkAfter = time.Second
	if v := os.Getenv("COUCHREP_IDLE_NODE_RECHECK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("COUCHREP_IDLE_NODE_RECHECK=%q: %v", v, err)
		}
		cfg.Replicator.ParkRecheck = d
	}
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
	memBefore := measureMem()
	for i := range n {
		if pu != nil {
			pu.writeDocs(b, fanOut)
			break
		}
		u := fmt.Sprintf("u%05d", i)
		body := fmt.Sprintf(`{"source":"%s%s","target":"%scentral","continuous":true}`, base, u, base)
		if _, err := store.AddTransient(ctx, []byte(body), "bench"); err != nil {
			b.Fatal(err)
		}
		if fanOut {
			body := fmt.Sprintf(`{"source":"%scentral","target":"%s%s","continuous":true,"selector":{"owner":%q}}`, base, base, u, u)
			if _, err := store.AddTransient(ctx, []byte(body), "bench"); err != nil {
				b.Fatal(err)
			}
		}
	}
	start := time.Now()
	deadline := start.Add(20 * time.Minute)
	for {
		recs, err := store.List(ctx, repjob.Filter{})
		if err != nil {
			b.Fatal(err)
		}
		parked := 0
		for _, rec := range recs {
			if rec.State() == repjob.StateRunning && rec.GetParkedSince() != nil {
				parked++
			}
		}
		if parked == jobs {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d jobs parked after 20 minutes", parked, jobs)
		}
		time.Sleep(time.Second) // the store: poll
	}
	b.Logf("users=%d jobs=%d: all parked %s after the adds", n, jobs, time.Since(start).Round(time.Millisecond))
	if heap := os.Getenv("COUCHREP_IDLE_NODE_HEAP"); heap != "" {
		// What the parked jobs hold, per job after a full collection,
		// against the node before the jobs; and the heap profile (its
		// sample rate is -test.memprofilerate's: 1 for an exact one).
		mem := measureMem()
		per := func(a, b uint64) float64 { return (float64(a) - float64(b)) / float64(jobs) }
		b.ReportMetric(per(mem.heapAlloc, memBefore.heapAlloc), "heap-live-B/job")
		b.ReportMetric(per(mem.heapInuse, memBefore.heapInuse), "heap-inuse-B/job")
		b.ReportMetric(per(mem.rss, memBefore.rss), "RSS-B/job")
		b.Logf("users=%d jobs=%d parked: heap live %d -> %d (%.0f B/job), in use %d -> %d (%.0f B/job), stacks %d -> %d, runtime %d -> %d, RSS %d -> %d (%.0f B/job), goroutines %d -> %d",
			n, jobs, memBefore.heapAlloc, mem.heapAlloc, per(mem.heapAlloc, memBefore.heapAlloc), memBefore.heapInuse, mem.heapInuse,
			per(mem.heapInuse, memBefore.heapInuse), memBefore.stackInuse, mem.stackInuse, memBefore.runtime, mem.runtime,
			memBefore.rss, mem.rss, per(mem.rss, memBefore.rss), memBefore.goroutines, mem.goroutines)
		f, err := os.Create(heap)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
	// The parks' own store writes are behind the activity monitor (it
	// looks at each job's last write once, an activity timeout later):
	// the window starts after that.
	time.Sleep(cfg.Couchrep.ActivityTimeout + 15*time.Second) // a pause before the window, not a wait for an event

	prefix := os.Getenv("COUCHREP_IDLE_NODE_PROFILE")
	if prefix != "" {
		cf, err := os.Create(prefix)
		if err != nil {
			b.Fatal(err)
		}
		defer cf.Close()
		if err := pprof.StartCPUProfile(cf); err != nil {
			b.Fatal(err)
		}
	}
	if file := os.Getenv("COUCHREP_IDLE_NODE_TRACE"); file != "" {
		tf, err := os.Create(file)
		if err != nil {
			b.Fatal(err)
		}
		defer tf.Close()
		if err := trace.Start(tf); err != nil {
			b.Fatal(err)
		}
		defer trace.Stop()
	}
	load0 := loadAvg()
	gc0 := gcMetrics()
	rc0 := idleRechecks(b, base, pu == nil)
	cpu0 := cpuTime()
	b.StartTimer()
	time.Sleep(window) // the measurement window itself
	b.StopTimer()
	cpu := cpuTime() - cpu0
	if rc := idleRechecks(b, base, pu == nil); pu == nil {
		gets, posts, keys := rc[0]-rc0[0], rc[1]-rc0[1], rc[2]-rc0[2]
		b.Logf("rechecks in the window: %d GET /db, %d POST /_dbs_info naming %d databases: %d a second",
			gets, posts, keys, int64(float64(gets+keys)/window.Seconds()))
		b.ReportMetric(float64(gets+keys)/window.Seconds(), "rechecks/s")
	}
	gc1 := gcMetrics()
	if prefix != "" {
		pprof.StopCPUProfile()
	}
	pct := float64(cpu) / float64(window) * 100
	b.ReportMetric(pct, "idle-%cpu")
	b.ReportMetric(gc1.cpu-gc0.cpu, "gc-cpu-s")
	b.Logf("users=%d jobs=%d: idle %s: CPU %s = %.2f%% of a core (GC %.0f ms in %d cycles, %.1f MB allocated, live heap %.1f MB); goroutines at its end %d; load %s -> %s",
		n, jobs, window, cpu.Round(time.Millisecond), pct, (gc1.cpu-gc0.cpu)*1000, gc1.cycles-gc0.cycles,
		float64(gc1.allocs-gc0.allocs)/(1<<20), float64(gc1.live)/(1<<20), runtime.NumGoroutine(), load0, loadAvg())
}

// idleRechecks reads the idle fake's counts of GET /db, POST /_dbs_info and
// the databases those named (zeros for another source).
func idleRechecks(b *testing.B, base string, fake bool) [3]int64 {
	var out [3]int64
	if !fake {
		return out
	}
	resp, err := http.Get(strings.TrimSuffix(base, "/") + "/_idle_rechecks")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := fmt.Fscan(resp.Body, &out[0], &out[1], &out[2]); err != nil {
		b.Fatal(err)
	}
	return out
}
