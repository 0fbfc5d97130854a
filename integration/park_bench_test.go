package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/park"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/testserver"
)

// BenchmarkParkedMemory measures what a parked job holds: a node (in this
// process, couchrep.Start: the actors of couchrepd) runs N continuous jobs,
// each from a database of its own (per-user databases) of the idle
// CouchDB-shaped fake in a child process (idleCouch, which answers
// _db_updates as a CouchDB with _global_changes where nothing happens),
// into one central database, with idle_park_after 1 s. Once every job is
// parked (its record says so; the fake holds no _changes feed and one
// _db_updates feed), it reports per job, after a full GC, against the node
// before the jobs were added: Go heap in use plus stacks, RSS, goroutines.
// COUCHREP_PARKED_JOBS sets N (default 1,000).
//
//	go test -run '^$' -bench ParkedMemory -benchtime 1x -timeout 30m ./integration/
func BenchmarkParkedMemory(b *testing.B) {
	n := envInt(b, "COUCHREP_PARKED_JOBS", 1000)
	b.Run(fmt.Sprintf("jobs=%d", n), func(b *testing.B) {
		for range b.N {
			benchParked(b, n)
		}
	})
	b.Run(fmt.Sprintf("couchrepd/jobs=%d", n), func(b *testing.B) {
		for range b.N {
			benchParkedDaemon(b, n)
		}
	})
}

// benchParkedDaemon is benchParked with couchrepd in a process of its own
// (its GC governor, as deployed) and CouchDB's default max_jobs of 500
// (COUCHREP_PARKED_MAX_JOBS): parked jobs take no slot, so the node runs
// all N with at most max_jobs active at once. N jobs are added through
// POST /_replicate, then couchrepd's RSS is read once every job is parked
// and the node stayed idle for 30 s (RSS-B/job), and again after 90 s
// (RSS-B/job-90s: the GC governor's idle collection, three quiet windows
// of 10 s, has returned the free heap to the OS: the node's steady state),
// against its RSS before the jobs; each is logged with its breakdown
// (daemonMemory).
func benchParkedDaemon(b *testing.B, n int) {
	base := startIdleCouch(b)
	dir := b.TempDir()
	maxJobs := envInt(b, "COUCHREP_PARKED_MAX_JOBS", 500)
	conf := fmt.Sprintf("[replicator]\nmax_jobs = %d\nstartup_jitter = 0\nidle_park_after = 1\n", maxJobs)
	confFile := filepath.Join(dir, "couchrep.ini")
	if err := os.WriteFile(confFile, []byte(conf), 0o644); err != nil {
		b.Fatal(err)
	}
	node := startNode(b, nodeOptions{dataDir: dir, config: confFile, extra: []string{"--log-level", "warn"}})
	addr := node.httpAddr("")
	time.Sleep(5 * time.Second) // the node settles before the baseline
	before := procRSS(node.cmd.Process.Pid)
	b.Logf("couchrepd before the jobs: %s", daemonMemory(b, &http.Client{}, addr, node.cmd.Process.Pid, dir))
	b.ResetTimer()
	start := time.Now()
	client := &http.Client{}
	err := parallel(8, n, func(i int) error {
		body := fmt.Sprintf(`{"source":"%su%05d","target":"%scentral","continuous":true}`, base, i, base)
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/_replicate", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return fmt.Errorf("POST /_replicate: %d", resp.StatusCode)
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^couchrep_replication_jobs_parked\{[^}]*\} (\d+)$`)
	deadline := time.Now().Add(20 * time.Minute)
	for {
		resp, err := client.Get("http://" + addr + "/metrics")
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		p := 0
		for _, m := range re.FindAllSubmatch(body, -1) {
			k, _ := strconv.Atoi(string(m[1]))
			p += k
		}
		if p == n {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d jobs parked after 20 minutes", p, n)
		}
		time.Sleep(2 * time.Second) // another process: poll
	}
	allParked := time.Since(start)
	b.StopTimer()
	time.Sleep(30 * time.Second) // idle: the node's GC governor settles
	after := procRSS(node.cmd.Process.Pid)
	if f, u := idleFeeds(b, base), idleCount(b, base+"_idle_db_updates"); f != 0 || u != 1 {
		b.Fatalf("parked: %d _changes feeds and %d _db_updates feeds open on the server, want 0 and 1", f, u)
	}
	b.ReportMetric((float64(after)-float64(before))/float64(n), "RSS-B/job")
	b.ReportMetric(allParked.Seconds(), "s-to-all-parked")
	b.Logf("couchrepd, jobs=%d, 30 s idle: %s", n, daemonMemory(b, client, addr, node.cmd.Process.Pid, dir))
	time.Sleep(60 * time.Second) // the governor's idle collection has run (three quiet windows of 10 s)
	after90 := procRSS(node.cmd.Process.Pid)
	b.ReportMetric((float64(after90)-float64(before))/float64(n), "RSS-B/job-90s")
	b.Logf("couchrepd, jobs=%d, 90 s idle: %s", n, daemonMemory(b, client, addr, node.cmd.Process.Pid, dir))
	b.Logf("couchrepd, jobs=%d, max_jobs %d: RSS %d -> %d, all parked in %s; load %s", n, maxJobs, before, after,
		allParked.Round(time.Millisecond), loadAvg())
}

func benchParked(b *testing.B, n int) {
	base := startIdleCouch(b)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	cfg := couchrep.DefaultConfig()
	cfg.Couchrep.NodeTypes = []string{config.NodeTypeReplication}
	cfg.Replicator.MaxJobs = n + 10
	cfg.Replicator.StartupJitter = 0
	cfg.Replicator.IdleParkAfter = time.Second
	store := startInProcessNode(b, cfg, zerolog.Nop()).Store
	parked := func() (int, int) {
		recs, err := store.List(ctx, repjob.Filter{})
		if err != nil {
			b.Fatal(err)
		}
		p, r := 0, 0
		for _, rec := range recs {
			if rec.State() == repjob.StateRunning {
				r++
				if rec.GetParkedSince() != nil {
					p++
				}
			}
		}
		return p, r
	}

	before := measureMem()
	b.ResetTimer()
	start := time.Now()
	for i := range n {
		body := fmt.Sprintf(`{"source":"%su%05d","target":"%scentral","continuous":true}`, base, i, base)
		if _, err := store.AddTransient(ctx, []byte(body), "bench"); err != nil {
			b.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Minute)
	for {
		p, r := parked()
		if p == n {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d jobs parked (%d running) after 20 minutes", p, n, r)
		}
		time.Sleep(500 * time.Millisecond) // the store: poll
	}
	allParked := time.Since(start)
	b.StopTimer()
	// A node that stays idle collects at least every two minutes (the
	// runtime's forced GC), and each collection halves the stacks that use
	// less than a quarter of theirs: a few collections show the stacks
	// parked jobs settle at, not those they were started with.
	for range 4 {
		runtime.GC()
	}
	after := measureMem()
	if f, u := idleFeeds(b, base), idleCount(b, base+"_idle_db_updates"); f != 0 || u != 1 {
		b.Fatalf("parked: %d _changes feeds and %d _db_updates feeds open on the server, want 0 and 1", f, u)
	}
	if p := os.Getenv("COUCHREP_PARKED_PROFILE"); p != "" {
		writeIdleProfiles(b, fmt.Sprintf("%s-%d", p, n))
	}
	per := func(a, b uint64) float64 { return (float64(a) - float64(b)) / float64(n) }
	b.ReportMetric(per(after.heapInuse+after.stackInuse, before.heapInuse+before.stackInuse), "heap+stack-B/job")
	b.ReportMetric(per(after.heapAlloc, before.heapAlloc), "heap-alloc-B/job")
	b.ReportMetric(per(after.stackInuse, before.stackInuse), "stack-B/job")
	b.ReportMetric(per(after.rss, before.rss), "RSS-B/job")
	b.ReportMetric(float64(after.goroutines-before.goroutines)/float64(n), "goroutines/job")
	b.ReportMetric(allParked.Seconds(), "s-to-all-parked")
	b.Logf("jobs=%d: goroutines by where they wait (groups of at least %d): %s", n, n/10, goroutineGroups(b, n/10))
	b.Logf("jobs=%d: heap in use %d -> %d, stacks %d -> %d, RSS %d -> %d, goroutines %d -> %d, all parked in %s; load %s",
		n, before.heapInuse, after.heapInuse, before.stackInuse, after.stackInuse,
		before.rss, after.rss, before.goroutines, after.goroutines, allParked.Round(time.Millisecond), loadAvg())
}

// idleCount reads one of idleCouch's counters.
func idleCount(b *testing.B, u string) int {
	resp, err := http.Get(u)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var n int
	if err := json.NewDecoder(resp.Body).Decode(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkParkRecheck measures what the safety net of parked jobs costs
// the source server: PouchDB Server (StartPouchDBWithDBUpdates) with D
// user databases of one document each answers the rechecks of parked jobs
// — GET /db, at the node's pace (park.Rechecks, 20 a second), each from
// a job's own client as a parked job sends it — and the benchmark reports
// the server's CPU time per recheck and the share of a core the node's
// whole recheck rate takes. COUCHREP_RECHECKS sets how many (default 400:
// 20 s at 20 a second).
//
//	go test -run '^$' -bench ParkRecheck -benchtime 1x ./integration/
func BenchmarkParkRecheck(b *testing.B) {
	n := envInt(b, "COUCHREP_RECHECKS", 400)
	const dbs = 200
	s := testserver.StartPouchDBWithDBUpdates(b)
	for i := range dbs {
		db := fmt.Sprintf("user-%d", i)
		s.CreateDB(b, db)
		s.PutDocs(b, s.DBURL(db), map[string]any{"_id": "doc"})
	}
	srvCPU := serverCPU(s)
	if srvCPU == nil {
		b.Fatal("pouchdb-server process not found")
	}
	client := &http.Client{}
	get := func(u string) {
		resp, err := client.Get(u)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("GET %s: %d", u, resp.StatusCode)
		}
	}
	for _, kind := range []string{"GET /db", "GET /db + _changes?limit=1"} {
		b.Run(kind, func(b *testing.B) {
			for range b.N {
				pace := park.NewRechecks(park.DefaultRate)
				idle0, t0 := srvCPU(), time.Now()
				time.Sleep(2 * time.Second) // the server's own idle CPU, to subtract
				idle := float64(srvCPU()-idle0) / float64(time.Since(t0))
				cpu0, start := srvCPU(), time.Now()
				for i := range n {
					if err := pace.Wait(context.Background()); err != nil {
						b.Fatal(err)
					}
					u := s.DBURL(fmt.Sprintf("user-%d", i%dbs))
					get(u)
					if kind != "GET /db" {
						get(u + "_changes?since=1&limit=1")
					}
				}
				wall := time.Since(start)
				cpu := float64(srvCPU()-cpu0) - idle*float64(wall)
				b.ReportMetric(cpu/float64(time.Millisecond)/float64(n), "server-cpu-ms/recheck")
				b.ReportMetric(100*cpu/float64(wall), "server-%core-at-20/s")
				b.Logf("%s: %d rechecks in %s, server CPU %.0f ms beyond its idle %.2f %% of a core; load %s",
					kind, n, wall.Round(time.Millisecond), cpu/float64(time.Millisecond), 100*idle, loadAvg())
			}
		})
	}
}

// daemonMemory breaks couchrepd's RSS down: the Go runtime's view from
// /metrics (heap in use, heap free but not returned, stacks, the runtime's
// own structures), the rest of the RSS (outside the Go runtime: SQLite's
// C memory, modernc.org/libc's allocator, binary text), the process's
// anonymous and file-backed RSS, and the store file's size.
func daemonMemory(b *testing.B, client *http.Client, addr string, pid int, dir string) string {
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	val := func(name string) float64 {
		m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(body)
		if m == nil {
			return -1
		}
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		return v
	}
	mb := func(v float64) string { return fmt.Sprintf("%.1f MB", v/1e6) }
	sys, inuse, idle, released := val("go_memstats_sys_bytes"), val("go_memstats_heap_inuse_bytes"),
		val("go_memstats_heap_idle_bytes"), val("go_memstats_heap_released_bytes")
	stacks := val("go_memstats_stack_sys_bytes")
	rt := val("go_memstats_mspan_sys_bytes") + val("go_memstats_mcache_sys_bytes") +
		val("go_memstats_buck_hash_sys_bytes") + val("go_memstats_gc_sys_bytes") + val("go_memstats_other_sys_bytes")
	rss := float64(procRSS(pid))
	anon := float64(statusBytes(fmt.Sprintf("/proc/%d/status", pid), "RssAnon:"))
	file := float64(statusBytes(fmt.Sprintf("/proc/%d/status", pid), "RssFile:"))
	var store int64
	ents, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, e := range ents {
		if fi, err := os.Stat(e); err == nil && fi.Mode().IsRegular() {
			store += fi.Size()
		}
	}
	return fmt.Sprintf("RSS %s (anon %s, file %s); Go: heap alloc %s, heap in use %s, heap free not released %s, released %s, stacks %s, runtime %s, mapped not released %s; anonymous outside Go (RSS anon - Go mapped) %s; data dir files %s; goroutines %.0f",
		mb(rss), mb(anon), mb(file), mb(val("go_memstats_heap_alloc_bytes")), mb(inuse), mb(idle-released), mb(released), mb(stacks), mb(rt),
		mb(sys-released), mb(anon-(sys-released)), mb(float64(store)), val("go_goroutines"))
}
