package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep"
	"github.com/couchrep/couchrep/internal/config"
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
	cfg := couchrep.DefaultConfig()
	cfg.Couchrep.NodeTypes = []string{config.NodeTypeReplication}
	cfg.Replicator.MaxJobs = n + 10
	cfg.Replicator.StartupJitter = 0
	store := startInProcessNode(b, cfg, zerolog.Nop()).Store

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

// BenchmarkPerUser is the database-per-user pattern at scale (issue 26):
// N user databases (COUCHREP_PERUSER_BENCH_DBS; default 2,000 so that
// make bench, 60 minutes for every benchmark of the package, finishes:
// the 10,000 is COUCHREP_PERUSER_BENCH_DBS=10000, ~15-25 minutes
// on 2 cores) on one in-memory PouchDB Server with a real _db_updates
// feed, or on the Apache CouchDB of COUCHREP_TEST_COUCH_URL (see
// newPerUserServer: prefixed databases, kept between runs with
// COUCHREP_PERUSER_KEEP_DBS=1), one couchrepd (max_jobs above the jobs, or
// COUCHREP_PERUSER_MAX_JOBS,
// [replicator] defaults otherwise), N continuous replications userdb →
// central plus, unless COUCHREP_PERUSER_FANOUT=0, N fan-out ones central
// → userdb with the selector {"owner": user}, all written as _replicator
// documents in one _bulk_docs. It reports (b.ReportMetric; the goal
// table of issue 26 is these figures):
//
//   - the time from the _bulk_docs' answer until every job is running
//     (the node's /metrics: s-all-running), and until their start-up
//     requests are done (the node sent none for 5 s and has none in
//     flight; jobs that park write their checkpoints first, so this
//     includes parking: s-all-started), the CPU of both processes
//     meanwhile per job, the requests the jobs sent per job, and on a
//     test server its peak of requests in flight at once (feeds apart),
//     counted at the server;
//   - after a settling pause (COUCHREP_PERUSER_SETTLE, default 90 s:
//     longer than idle_park_after, so idle jobs have parked; jobs-parked
//     says how many had), over 60 s with no writes and no scrape of the
//     node: CPU of couchrepd and of the server (pouchdb-server, or
//     CouchDB's beam.smp; % of one core), the requests a test server
//     (or the counting proxy) served, then RSS and open fds of couchrepd;
//   - with COUCHREP_PERUSER_HEAP=file, the node's heap profile after the
//     idle minute ([admin] pprof), written to file; with
//     COUCHREP_PERUSER_CPU=file its CPU profile of the start, from the
//     _bulk_docs on for COUCHREP_PERUSER_CPU_SECONDS (default 90);
//   - write → target latency: COUCHREP_PERUSER_WRITES (default 100)
//     writes, one at a time, each to a random user database, timed from
//     the PUT until a GET of the document at the central database
//     answers (polled every 5 ms); with fan-out as many writes to the
//     central database for random users, timed until they are in the
//     user's database (p50, p99). Most jobs are parked by then: a write
//     wakes its job through _db_updates.
//
// Numbers go to BENCHMARKS.md with the load average it logs.
//
//	go test -run '^$' -bench 'PerUser$' -benchtime 1x -timeout 120m ./integration/
//	COUCHREP_PERUSER_BENCH_DBS=10000 go test -run '^$' -bench 'PerUser$' -benchtime 1x -timeout 120m ./integration/
func BenchmarkPerUser(b *testing.B) {
	n := envInt(b, "COUCHREP_PERUSER_BENCH_DBS", 2000)
	fanOut := os.Getenv("COUCHREP_PERUSER_FANOUT") != "0"
	settle := 90 * time.Second
	if v := os.Getenv("COUCHREP_PERUSER_SETTLE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("COUCHREP_PERUSER_SETTLE=%q: %v", v, err)
		}
		settle = d
	}
	writes := envInt(b, "COUCHREP_PERUSER_WRITES", 100)
	for range b.N {
		benchPerUser(b, n, fanOut, settle, writes)
	}
}

func benchPerUser(b *testing.B, n int, fanOut bool, settle time.Duration, writes int) {
	b.StopTimer()
	p := newPerUserServer(b, n)
	p.jobs = n
	if fanOut {
		p.jobs = 2 * n
	}
	env := []string{"COUCHREP_COUCHREP_WATCH=" + strings.TrimSuffix(p.repSrv.URL, "/")}
	heap, cpuProf := os.Getenv("COUCHREP_PERUSER_HEAP"), os.Getenv("COUCHREP_PERUSER_CPU")
	// pprof on the admin endpoint: the runtime's memory breakdown after
	// the idle minute (runtimeMemory), and the profiles asked for.
	env = append(env, "COUCHREP_ADMIN_PPROF=true")
	if mj := envInt(b, "COUCHREP_PERUSER_MAX_JOBS", 0); mj > 0 {
		// Fewer slots than jobs: the rest wait for the first to park
		// (quiet starts park at once), as on a node with the default 500.
		env = append(env, "COUCHREP_REPLICATOR_MAX_JOBS="+strconv.Itoa(mj))
		b.Logf("per-user: max_jobs %d for %d jobs", mj, p.jobs)
	}
	p.node, p.addr = scaleNode(b, p.jobs, env...)
	nodePID, srvPID, srvName := p.node.cmd.Process.Pid, p.serverPID(), p.serverName()
	if srvPID == 0 {
		b.Fatalf("%s process not found", srvName)
	}
	nodeCPU0, srvCPU0 := procCPU(nodePID), procCPU(srvPID)
	profiled := make(chan error, 1)
	if cpuProf != "" {
		// The node's CPU profile from the _bulk_docs on (pprof on its
		// admin endpoint): where the start's time goes.
		secs := envInt(b, "COUCHREP_PERUSER_CPU_SECONDS", 90)
		go func() {
			profiled <- fetchToFile(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.node.admin, secs), cpuProf)
		}()
	} else {
		profiled <- nil
	}
	b.StartTimer()
	p.writeDocs(b, fanOut)
	running := p.waitRunning(b, 30*time.Minute)
	b.StopTimer()
	started := p.waitStarted(b, 5*time.Second, 30*time.Minute)
	if err := <-profiled; err != nil {
		b.Errorf("CPU profile: %v", err)
	}
	startNodeCPU, startSrvCPU := procCPU(nodePID)-nodeCPU0, procCPU(srvPID)-srvCPU0
	startReqs := p.requests(b, true)
	startFDs := procFDs(nodePID)
	sent := metricSum(b, p.addr, metricPrefix("couchrep_replication_requests_total"))
	b.Logf("users=%d jobs=%d: _bulk_docs answered in %s; all running %s after it, started at the source after %s; "+
		"CPU from the _bulk_docs to started: couchrepd %s, %s %s; the node's jobs sent %.0f requests (%.1f a job); "+
		"server (test server, or the node's through the counting proxy): %d requests (%d failed at the proxy), peak %d in flight at once (feeds apart), peak %d feeds; couchrepd fds %d; load %s",
		n, p.jobs, p.took.Round(time.Millisecond), running.Round(time.Millisecond), started.Round(time.Millisecond),
		startNodeCPU.Round(time.Millisecond), srvName, startSrvCPU.Round(time.Millisecond), sent, sent/float64(p.jobs),
		startReqs.Total, startReqs.Errors, startReqs.Peak, startReqs.PeakFeeds, startFDs, loadAvg())

	time.Sleep(settle) // the measured system settles (idle jobs park): a pause, not a wait for an event
	// Before the window: a scrape of /metrics costs the node CPU.
	mem0 := goMetrics(b, p.addr)
	parked := metricSum(b, p.addr, metricPrefix("couchrep_replication_jobs_parked"))
	load0 := loadAvg()
	nodeCPU, srvCPU := procCPU(nodePID), procCPU(srvPID)
	reqs0 := p.requests(b, true)
	const idle = 60 * time.Second
	time.Sleep(idle) // the measurement window itself
	nodeIdle := float64(procCPU(nodePID)-nodeCPU) / float64(idle) * 100
	srvIdle := float64(procCPU(srvPID)-srvCPU) / float64(idle) * 100
	reqs1 := p.requests(b, false)
	load1 := loadAvg()
	nodeRSS, srvRSS := procRSS(nodePID), procRSS(srvPID)
	nodeFDs, srvFDs := procFDs(nodePID), procFDs(srvPID)
	mem1 := goMetrics(b, p.addr)
	store := storeBytes(p.node.dataDir)
	if heap != "" {
		// The node's heap profile after the idle minute (pprof on its
		// admin endpoint): what the parked jobs hold.
		saveURL(b, "http://"+p.node.admin+"/debug/pprof/heap?gc=1", heap)
	}
	b.Logf("users=%d: couchrepd's job store (SQLite, WAL included): %.1f MB, %.0f bytes a job", n, float64(store)/(1<<20), float64(store)/float64(p.jobs))
	b.Logf("users=%d: idle 60 s (after %s; %.0f of %d jobs parked): couchrepd %.2f%% of a core, %s %.2f%%, %d requests served (test server only: %d feeds open, peak %d); "+
		"RSS couchrepd %.1f MB, %s %.1f MB; fds couchrepd %d, %s %d; load %s -> %s",
		n, settle, parked, p.jobs, nodeIdle, srvName, srvIdle, reqs1.Total-reqs0.Total, reqs1.Feeds, reqs1.PeakFeeds,
		float64(nodeRSS)/(1<<20), srvName, float64(srvRSS)/(1<<20), nodeFDs, srvName, srvFDs, load0, load1)
	b.Logf("users=%d: couchrepd's Go memory after the idle minute: %s; in it, it allocated %.1f MB and ran %.0f GCs",
		n, goMemory(mem1), (mem1["go_memstats_alloc_bytes_total"]-mem0["go_memstats_alloc_bytes_total"])/(1<<20),
		mem1["go_gc_duration_seconds_count"]-mem0["go_gc_duration_seconds_count"])
	rt := runtimeMemory(b, p.node.admin)
	// On stderr too: a benchmark's log is cut to its first lines, and the
	// start's progress lines come first.
	status := fmt.Sprintf("/proc/%d/status", nodePID)
	line := fmt.Sprintf("users=%d: couchrepd's RSS %.1f MiB (peak %.1f MiB; anonymous %.1f, file-backed %.1f: its binary) after the idle minute, the runtime's view (MiB): %s",
		n, float64(nodeRSS)/(1<<20), float64(procPeakRSS(nodePID))/(1<<20),
		float64(statusBytes(status, "RssAnon:"))/(1<<20), float64(statusBytes(status, "RssFile:"))/(1<<20), rt)
	b.Log(line)
	fmt.Fprintln(os.Stderr, line)
	b.ReportMetric(float64(procPeakRSS(nodePID))/(1<<20), "node-peak-RSS-MB")

	client := &http.Client{Timeout: time.Minute}
	rng := rand.New(rand.NewPCG(26, uint64(n)))
	var in, out []time.Duration
	for k := range writes {
		u := p.users[rng.IntN(n)]
		in = append(in, roundTrip(b, client, p.userDB(u), p.central, fmt.Sprintf("in-%s-%d-%s", p.tag, k, u), u))
	}
	if fanOut {
		for k := range writes {
			u := p.users[rng.IntN(n)]
			out = append(out, roundTrip(b, client, p.central, p.userDB(u), fmt.Sprintf("out-%s-%d-%s", p.tag, k, u), u))
		}
	}
	inP50, inP99 := percentiles(in)
	b.ReportMetric(running.Seconds(), "s-all-running")
	b.ReportMetric(started.Seconds(), "s-all-started")
	b.ReportMetric(sent/float64(p.jobs), "start-requests/job")
	b.ReportMetric(float64(startNodeCPU.Milliseconds())/float64(p.jobs), "start-node-cpu-ms/job")
	b.ReportMetric(float64(startSrvCPU.Milliseconds())/float64(p.jobs), "start-server-cpu-ms/job")
	if !p.external || p.proxy != nil {
		b.ReportMetric(float64(startReqs.Peak), "server-peak-inflight")
	}
	b.ReportMetric(nodeIdle, "node-idle-%cpu")
	b.ReportMetric(srvIdle, "server-idle-%cpu")
	b.ReportMetric(float64(nodeRSS)/(1<<20), "node-RSS-MB")
	b.ReportMetric(float64(nodeFDs), "node-fds")
	b.ReportMetric(float64(store)/float64(p.jobs), "store-B/job")
	if !p.external || p.proxy != nil {
		b.ReportMetric(float64(reqs1.Feeds), "server-feeds-idle")
	}
	b.ReportMetric(parked, "jobs-parked")
	b.ReportMetric(inP50.Seconds()*1000, "in-p50-ms")
	b.ReportMetric(inP99.Seconds()*1000, "in-p99-ms")
	msg := fmt.Sprintf("users=%d: write to a random user database → central: p50 %s, p99 %s (%d writes)",
		n, inP50.Round(time.Millisecond), inP99.Round(time.Millisecond), len(in))
	if fanOut {
		outP50, outP99 := percentiles(out)
		b.ReportMetric(outP50.Seconds()*1000, "out-p50-ms")
		b.ReportMetric(outP99.Seconds()*1000, "out-p99-ms")
		msg += fmt.Sprintf("; write to central → the user's database: p50 %s, p99 %s", outP50.Round(time.Millisecond), outP99.Round(time.Millisecond))
	}
	if r := runningJobsTB(b, p.addr); r != p.jobs {
		b.Errorf("%d of %d jobs running at the end", r, p.jobs)
	}
	b.Logf("%s; load %s", msg, loadAvg())
}

// memStatFields are the runtime.MemStats fields runtimeMemory reports:
// where a Go process's mapped memory is.
var memStatFields = []string{"HeapAlloc", "HeapInuse", "HeapIdle", "HeapReleased", "StackInuse",
	"MSpanInuse", "MCacheInuse", "BuckHashSys", "GCSys", "OtherSys", "Sys", "NextGC", "NumGC"}

// runtimeMemory reads the node's runtime.MemStats from the trailer of its
// heap profile in text form (/debug/pprof/heap?debug=1, [admin] pprof on
// its admin endpoint) and describes it in MiB: the live heap (HeapAlloc),
// the heap's spans in use (the gap to the live heap is fragmentation:
// free slots in spans that hold a live object), freed spans kept mapped
// (HeapIdle - HeapReleased), stacks, the span and GC metadata the runtime
// never returns (MSpanInuse, GCSys) and the rest (OtherSys).
func runtimeMemory(tb testing.TB, admin string) string {
	resp, err := http.Get("http://" + admin + "/debug/pprof/heap?debug=1")
	if err != nil {
		tb.Errorf("runtime memory: %v", err)
		return "unknown"
	}
	defer resp.Body.Close()
	v := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		// "# HeapInuse = 123", or in use / obtained: "# Stack = 123 / 456"
		// (StackInuse, StackSys), likewise MSpan and MCache.
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[0] != "#" || f[2] != "=" {
			continue
		}
		k := f[1]
		if len(f) == 6 && f[4] == "/" {
			k += "Inuse"
		}
		v[k], _ = strconv.ParseFloat(f[3], 64)
	}
	if len(v) == 0 {
		tb.Errorf("runtime memory: no MemStats in the heap profile (status %d)", resp.StatusCode)
		return "unknown"
	}
	mib := func(k string) float64 { return v[k] / (1 << 20) }
	var parts []string
	for _, k := range memStatFields {
		if k == "NumGC" {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, v[k]))
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.1f", k, mib(k)))
	}
	return fmt.Sprintf("%s; idle not released %.1f, heap in use / live %.2f",
		strings.Join(parts, ", "), mib("HeapIdle")-mib("HeapReleased"), v["HeapInuse"]/max(v["HeapAlloc"], 1))
}

// procPeakRSS is the peak resident set of process pid (VmHWM).
func procPeakRSS(pid int) uint64 {
	return statusBytes(fmt.Sprintf("/proc/%d/status", pid), "VmHWM:")
}

// saveURL writes what a GET of u answers to file.
func saveURL(tb testing.TB, u, file string) {
	if err := fetchToFile(u, file); err != nil {
		tb.Fatal(err)
	}
}

// fetchToFile writes the body of GET u to file.
func fetchToFile(u, file string) error {
	resp, err := http.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d", u, resp.StatusCode)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// storeBytes is the size of the node's SQLite job store in dataDir: the
// database file, its WAL and shared-memory index.
func storeBytes(dataDir string) int64 {
	var total int64
	ents, _ := os.ReadDir(dataDir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), config.StoreFileName) {
			continue
		}
		if fi, err := e.Info(); err == nil {
			total += fi.Size()
		}
	}
	return total
}

// percentiles returns the p50 and p99 of ds (sorted in place).
func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2], ds[(len(ds)*99-1)/100]
}

// BenchmarkPerUserStart profiles the start of the per-user jobs in this
// process: a node (couchrep.Start, info logs formatted and dropped)
// watching a PouchDB Server with N user databases
// (COUCHREP_PERUSER_BENCH_DBS, default 2,000), from the one _bulk_docs of
// their fan-in jobs' _replicator documents (and with
// COUCHREP_PERUSER_BENCH_FANOUT=1 their selector fan-out jobs', max_jobs
// above both) until the server has served every job's feed and had no
// request in flight for 3 s (with fan-out: and no new request for 3 s). It reports the
// CPU this process used per job; COUCHREP_PERUSER_PROFILE=prefix writes
// its CPU profile to prefix.node-start.cpu. Then it waits until every job
// has parked (idle_park_after; the server holds no feed of theirs) and
// reports what a parked job holds, per job after a full GC: heap and
// stacks, RSS, goroutines (and its heap profile to prefix.parked.heap).
//
//	go test -run '^$' -bench PerUserStart -benchtime 1x -timeout 30m ./integration/
func BenchmarkPerUserStart(b *testing.B) {
	n := envInt(b, "COUCHREP_PERUSER_BENCH_DBS", 2000)
	for range b.N {
		b.StopTimer()
		p := newPerUserServer(b, n)
		ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
		defer cancel()
		cfg := couchrep.DefaultConfig()
		cfg.Couchrep.HTTPBind, cfg.Couchrep.AdminBind = "127.0.0.1:0", "127.0.0.1:0"
		cfg.Couchrep.Watch = []string{strings.TrimSuffix(p.repSrv.URL, "/")}
		fanOut := os.Getenv("COUCHREP_PERUSER_BENCH_FANOUT") != ""
		cfg.Replicator.MaxJobs = n + 10
		if fanOut {
			cfg.Replicator.MaxJobs += n
		}
		cfg.Replicator.StartupJitter = 0
		node := startInProcessNode(b, cfg, zerolog.New(io.Discard).Level(zerolog.InfoLevel))
		store := node.Store
		if prefix := os.Getenv("COUCHREP_PERUSER_PROFILE"); prefix != "" {
			f, err := os.Create(prefix + ".node-start.cpu")
			if err != nil {
				b.Fatal(err)
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				b.Fatal(err)
			}
			defer f.Close()
		}
		before := measureMem()
		cpu0 := cpuTime()
		total0 := p.requests(b, false).Total
		b.StartTimer()
		p.writeDocs(b, fanOut)
		deadline := time.Now().Add(20 * time.Minute)
		last := -1
		for quiet := time.Now(); ; time.Sleep(100 * time.Millisecond) { // another process's state: poll
			r := p.requests(b, false)
			if r.Feeds < n && !fanOut || r.Inflight > 1 || fanOut && r.Total != last {
				quiet, last = time.Now(), r.Total
			} else if time.Since(quiet) > 3*time.Second {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("not started after 20 minutes: %+v", r)
			}
		}
		b.StopTimer()
		cpu := cpuTime() - cpu0
		pprof.StopCPUProfile()
		b.ReportMetric(float64(cpu.Microseconds())/float64(p.jobs), "cpu-µs/job")
		b.Logf("users=%d jobs=%d: started %s after the _bulk_docs' answer, CPU %s; load %s", n, p.jobs, time.Since(p.written).Round(time.Millisecond), cpu.Round(time.Millisecond), loadAvg())

		// Parked: every record says so, and the server holds none of
		// their feeds (the three left are the node's own: _replicator's,
		// and _db_updates'; with fan-out also the central database's
		// shared feed, the parked fan-out jobs' wake-only watch).
		deadline = time.Now().Add(10 * time.Minute)
		ownFeeds := 3
		if p.external {
			// Through the counting proxy: the source server's _db_updates
			// feed (the _replicator feeds are the other server's).
			ownFeeds = 1
		}
		if fanOut {
			ownFeeds++
		}
		for r := p.requests(b, false); r.Feeds > ownFeeds || parkedJobs(ctx, b, store) < p.jobs; r = p.requests(b, false) {
			if time.Now().After(deadline) {
				b.Fatalf("jobs not parked after 10 minutes: %d feeds open at the server, %d of %d jobs parked", r.Feeds, parkedJobs(ctx, b, store), p.jobs)
			}
			time.Sleep(time.Second) // another process's state: poll
		}
		// Every request the server served from the _bulk_docs until all
		// parked, per job (the node's own feeds and this benchmark's
		// polling of the server's counts are not counted: a few).
		reqs := p.requests(b, false).Total - total0 - 1
		b.ReportMetric(float64(reqs)/float64(p.jobs), "requests/job")
		b.Logf("users=%d jobs=%d: %d requests at the server from the _bulk_docs until all parked", n, p.jobs, reqs)
		after := measureMem()
		if prefix := os.Getenv("COUCHREP_PERUSER_PROFILE"); prefix != "" {
			f, err := os.Create(prefix + ".parked.heap")
			if err != nil {
				b.Fatal(err)
			}
			if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
		per := func(a, b uint64) float64 { return (float64(a) - float64(b)) / float64(p.jobs) }
		b.ReportMetric(per(after.heapInuse+after.stackInuse, before.heapInuse+before.stackInuse), "parked-heap+stack-B/job")
		b.ReportMetric(per(after.rss, before.rss), "parked-RSS-B/job")
		b.ReportMetric(float64(after.goroutines-before.goroutines)/float64(p.jobs), "parked-goroutines/job")
		b.Logf("users=%d parked: heap in use %d -> %d (alloc %d -> %d), stacks %d -> %d, RSS %d -> %d, goroutines %d -> %d (by where they wait, groups of at least %d: %s); load %s",
			n, before.heapInuse, after.heapInuse, before.heapAlloc, after.heapAlloc, before.stackInuse, after.stackInuse,
			before.rss, after.rss, before.goroutines, after.goroutines, n/10, goroutineGroups(b, n/10), loadAvg())
		if err := node.stop(); err != nil { // before the next iteration's server and node
			b.Errorf("node stop: %v", err)
		}
	}
}

// parkedJobs counts the jobs whose record in store says they are running
// and parked.
func parkedJobs(ctx context.Context, tb testing.TB, store *repjob.Store) int {
	tb.Helper()
	recs, err := store.List(ctx, repjob.Filter{})
	if err != nil {
		tb.Fatal(err)
	}
	n := 0
	for _, rec := range recs {
		if rec.State() == repjob.StateRunning && rec.GetParkedSince() != nil {
			n++
		}
	}
	return n
}
