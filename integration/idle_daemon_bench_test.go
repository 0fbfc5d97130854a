package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkIdleNodeDaemon is BenchmarkIdleNode with couchrepd in a process
// of its own, as deployed (its GC governor; none of the benchmark's own
// data in its RSS), configured as an operator of a large per-user node
// would: N users, each a fan-in job (user database → central) and a
// selector fan-out job (central → user database, {"owner": user}), 2N
// continuous jobs through POST /_replicate against the idle CouchDB-shaped
// fake (a child process whose databases never change and which answers
// _db_updates and POST /_dbs_info as CouchDB 3). Parked jobs take no
// max_jobs slot, so the node runs them all with at most max_jobs starting
// or idling at once (each wave parks after idle_park_after).
//
// It reports the node's peak RSS while the jobs start (sampled every
// second; the run is stopped, and fails, if it passes
// COUCHREP_IDLE_DAEMON_RSS_LIMIT_MB, default 12,000), the time until all
// are parked, then — after a settling pause (COUCHREP_IDLE_DAEMON_SETTLE,
// default 90 s: the GC governor's idle collection) — over
// COUCHREP_IDLE_DAEMON_WINDOW (default 120 s) in which nothing happens and
// nothing scrapes the node: its CPU (% of one core, utime+stime), its
// collections, the rechecks the fake served, and its RSS at the end,
// broken down (daemonMemory).
//
// The knobs (couchrepd's own keys): COUCHREP_IDLE_DAEMON_USERS (N, default
// 1,000), _MAX_JOBS (max_jobs, default 2,000), _STARTUP_CONCURRENCY
// (startup_concurrency, default the node's 20), _PARK_AFTER
// (idle_park_after, default 5 s), _RECHECK (park_recheck, default the
// node's 1800 s). COUCHREP_IDLE_DAEMON_HEAP=file saves the node's heap
// profile after the window, _CPU=file its CPU profile of the window
// ([admin] pprof; the profiler's own cost is then in the figure).
//
//	COUCHREP_IDLE_DAEMON_USERS=10000 go test -run '^$' -bench IdleNodeDaemon -benchtime 1x -timeout 60m ./integration/
func BenchmarkIdleNodeDaemon(b *testing.B) {
	n := envInt(b, "COUCHREP_IDLE_DAEMON_USERS", 1000)
	for range b.N {
		benchIdleDaemon(b, n)
	}
}

func envDuration(tb testing.TB, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		tb.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}

// logf logs to the benchmark and to stderr (a benchmark's log is cut
// to its first lines).
func logf(b *testing.B, format string, args ...any) {
	b.Helper()
	b.Logf(format, args...)
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

func benchIdleDaemon(b *testing.B, n int) {
	b.StopTimer()
	jobs := 2 * n
	maxJobs := envInt(b, "COUCHREP_IDLE_DAEMON_MAX_JOBS", 2000)
	parkAfter := envDuration(b, "COUCHREP_IDLE_DAEMON_PARK_AFTER", 5*time.Second)
	settle := envDuration(b, "COUCHREP_IDLE_DAEMON_SETTLE", 90*time.Second)
	window := envDuration(b, "COUCHREP_IDLE_DAEMON_WINDOW", 120*time.Second)
	limit := uint64(envInt(b, "COUCHREP_IDLE_DAEMON_RSS_LIMIT_MB", 12000)) << 20
	heap, cpuProf := os.Getenv("COUCHREP_IDLE_DAEMON_HEAP"), os.Getenv("COUCHREP_IDLE_DAEMON_CPU")

	base := startIdleCouch(b)
	env := []string{
		fmt.Sprintf("COUCHREP_REPLICATOR_MAX_JOBS=%d", maxJobs),
		"COUCHREP_REPLICATOR_STARTUP_JITTER=0",
		fmt.Sprintf("COUCHREP_REPLICATOR_IDLE_PARK_AFTER=%s", parkAfter),
		"COUCHREP_COUCHREP_WATCH=" + strings.TrimSuffix(base, "/"),
	}
	if c := os.Getenv("COUCHREP_IDLE_DAEMON_STARTUP_CONCURRENCY"); c != "" {
		env = append(env, "COUCHREP_REPLICATOR_STARTUP_CONCURRENCY="+c)
	}
	if r := os.Getenv("COUCHREP_IDLE_DAEMON_RECHECK"); r != "" {
		env = append(env, "COUCHREP_REPLICATOR_PARK_RECHECK="+r)
	}
	if heap != "" || cpuProf != "" {
		env = append(env, "COUCHREP_ADMIN_PPROF=true")
	}
	node := startNode(b, nodeOptions{extra: []string{"--log-level", "warn"}, env: env})
	addr, pid := node.httpAddr(""), node.cmd.Process.Pid
	time.Sleep(5 * time.Second) // the node settles before the baseline
	before := procRSS(pid)
	client := &http.Client{Timeout: 5 * time.Minute}
	logf(b, "couchrepd before the jobs (max_jobs %d, idle_park_after %s): %s", maxJobs, parkAfter, daemonMemory(b, client, addr, pid, node.dataDir))

	// The node's RSS every second: its peak, and a stop before the
	// machine runs out of memory.
	var (
		mu       sync.Mutex
		peak     uint64
		peakAt   time.Duration
		overDone bool
	)
	start := time.Now()
	stopSampler := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopSampler:
				return
			case <-t.C:
			}
			rss := procRSS(pid)
			mu.Lock()
			if rss > peak {
				peak, peakAt = rss, time.Since(start)
			}
			if rss > limit && !overDone {
				overDone = true
				node.kill()
			}
			mu.Unlock()
		}
	}()
	defer func() {
		select {
		case <-stopSampler:
		default:
			close(stopSampler)
		}
		<-sampled
	}()
	over := func() {
		mu.Lock()
		defer mu.Unlock()
		if overDone {
			b.Fatalf("couchrepd's RSS passed %d MB (peak %d MB at %s): stopped", limit>>20, peak>>20, peakAt.Round(time.Second))
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	cpuStart := procCPU(pid)
	b.StartTimer()
	took, err := submitReplicate(ctx, addr, jobs, 8, func(i int) string {
		u := fmt.Sprintf("u%06d", i/2)
		if i%2 == 0 {
			return fmt.Sprintf(`{"source":"%s%s","target":"%scentral","continuous":true}`, base, u, base)
		}
		return fmt.Sprintf(`{"source":"%scentral","target":"%s%s","continuous":true,"selector":{"owner":%q}}`, base, base, u, u)
	})
	over()
	if err != nil {
		b.Fatal(err)
	}
	logf(b, "users=%d jobs=%d: submitted in %s (%.0f a second); couchrepd CPU so far %s; RSS %d MB; load %s", n, jobs, took.Round(time.Millisecond),
		float64(jobs)/took.Seconds(), (procCPU(pid) - cpuStart).Round(time.Millisecond), procRSS(pid)>>20, loadAvg())
	deadline := time.Now().Add(40 * time.Minute)
	parked := 0.0
	for {
		over()
		t0 := time.Now()
		parked = metricSum(b, addr, metricPrefix("couchrep_replication_jobs_parked"))
		mu.Lock()
		pk := peak
		mu.Unlock()
		logf(b, "%s: %.0f of %d parked, RSS %d MB (peak %d MB); the /metrics scrape %s; load %s",
			time.Since(start).Round(time.Second), parked, jobs, procRSS(pid)>>20, pk>>20, time.Since(t0).Round(time.Millisecond), loadAvg())
		if int(parked) == jobs {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%.0f of %d jobs parked after 40 minutes", parked, jobs)
		}
		// Another process: poll. A scrape re-reads the jobs that changed
		// since the last (every job in a start burst): not too often.
		time.Sleep(15*time.Second + time.Duration(jobs/50000)*15*time.Second)
	}
	allParked := time.Since(start)
	b.StopTimer()
	mu.Lock()
	startPeak, startPeakAt := peak, peakAt
	mu.Unlock()
	startCPU := procCPU(pid) - cpuStart
	logf(b, "users=%d jobs=%d: all parked %s after the first POST; couchrepd CPU meanwhile %s (%.2f ms a job); peak RSS %.1f MB at %s; load %s", n, jobs,
		allParked.Round(time.Second), startCPU.Round(time.Millisecond), float64(startCPU)/float64(time.Millisecond)/float64(jobs),
		float64(startPeak)/(1<<20), startPeakAt.Round(time.Second), loadAvg())
	logf(b, "after the start: %s", daemonMemory(b, client, addr, pid, node.dataDir))

	time.Sleep(settle) // the node settles (the GC governor's idle collection): a pause, not a wait for an event
	over()
	logf(b, "after %s settle: %s", settle, daemonMemory(b, client, addr, pid, node.dataDir))
	mem0 := goMetrics(b, addr)
	rc0 := idleRechecks(b, base, true)
	profiled := make(chan error, 1)
	if cpuProf != "" {
		go func() {
			profiled <- fetchToFile(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", node.admin, int(window.Seconds())), cpuProf)
		}()
	} else {
		profiled <- nil
	}
	load0, cpu0, rssMin, rssMax := loadAvg(), procCPU(pid), procRSS(pid), uint64(0)
	for end := time.Now().Add(window); time.Now().Before(end); {
		time.Sleep(time.Second) // the window: sample the RSS, touch nothing else
		rss := procRSS(pid)
		rssMin, rssMax = min(rssMin, rss), max(rssMax, rss)
	}
	cpu := procCPU(pid) - cpu0
	load1 := loadAvg()
	if err := <-profiled; err != nil {
		b.Errorf("CPU profile: %v", err)
	}
	rc1 := idleRechecks(b, base, true)
	mem1 := goMetrics(b, addr)
	over()
	rss := procRSS(pid)
	pct := float64(cpu) / float64(window) * 100
	gets, posts, keys := rc1[0]-rc0[0], rc1[1]-rc0[1], rc1[2]-rc0[2]
	logf(b, "users=%d jobs=%d: idle %s: couchrepd CPU %s = %.3f%% of a core; %.0f collections, %.1f MB allocated; rechecks at the fake: %d GET /db, %d POST /_dbs_info naming %d databases; RSS %.1f..%.1f MB in the window; load %s -> %s",
		n, jobs, window, cpu.Round(time.Millisecond), pct,
		mem1["go_gc_duration_seconds_count"]-mem0["go_gc_duration_seconds_count"],
		(mem1["go_memstats_alloc_bytes_total"]-mem0["go_memstats_alloc_bytes_total"])/(1<<20),
		gets, posts, keys, float64(rssMin)/(1<<20), float64(rssMax)/(1<<20), load0, load1)
	logf(b, "users=%d jobs=%d: after the window: %s; store %.1f MB", n, jobs, daemonMemory(b, client, addr, pid, node.dataDir),
		float64(storeBytes(node.dataDir))/(1<<20))
	logf(b, "users=%d jobs=%d: RSS %.1f -> %.1f MB: %.0f B a job over the idle node; Go %s", n, jobs,
		float64(before)/(1<<20), float64(rss)/(1<<20), (float64(rss)-float64(before))/float64(jobs), goMemory(mem1))
	// What a Prometheus scrape costs the idle node now (its kept sums:
	// nothing changed since the last; a full listing of every job once
	// its last is 5 minutes old).
	for k := range 2 {
		c0, t0 := procCPU(pid), time.Now()
		metricSum(b, addr, metricPrefix("couchrep_replication_jobs_parked"))
		logf(b, "users=%d jobs=%d: idle /metrics scrape %d: %s wall, %s of couchrepd's CPU", n, jobs, k+1,
			time.Since(t0).Round(time.Millisecond), (procCPU(pid) - c0).Round(time.Millisecond))
	}
	if heap != "" {
		saveURL(b, "http://"+node.admin+"/debug/pprof/heap?gc=1", heap)
	}
	mu.Lock()
	allPeak, allPeakAt := peak, peakAt
	mu.Unlock()
	logf(b, "users=%d jobs=%d: peak RSS over the whole run %.1f MB at %s (the start's, to all parked: %.1f MB)", n, jobs,
		float64(allPeak)/(1<<20), allPeakAt.Round(time.Second), float64(startPeak)/(1<<20))
	b.ReportMetric(float64(allPeak)/(1<<20), "peak-RSS-MB-run")
	b.ReportMetric(float64(rss)/(1<<20), "RSS-MB")
	b.ReportMetric((float64(rss)-float64(before))/float64(jobs), "RSS-B/job")
	b.ReportMetric(float64(startPeak)/(1<<20), "peak-RSS-MB")
	b.ReportMetric(pct, "idle-%cpu")
	b.ReportMetric(allParked.Seconds(), "s-to-all-parked")
}
