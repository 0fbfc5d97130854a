package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// scaleBenchJobs are the job counts BenchmarkScale runs: 1,000, 5,000 and
// 10,000, or COUCHREP_SCALE_BENCH_JOBS (comma separated).
func scaleBenchJobs(b *testing.B) []int {
	v := os.Getenv("COUCHREP_SCALE_BENCH_JOBS")
	if v == "" {
		return []int{1000, 5000, 10000}
	}
	var out []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			b.Fatalf("COUCHREP_SCALE_BENCH_JOBS=%q: %q is not a job count", v, f)
		}
		out = append(out, n)
	}
	return out
}

// BenchmarkScale runs N continuous replications on one couchrepd process
// against one PouchDB Server process (one doc_ids job per document, spread
// over 50 source databases, one target database) and reports:
//
//   - submission: half the jobs through POST /_replicate (32 clients),
//     half as _replicator documents (_bulk_docs of 500, until
//     _scheduler/docs lists them all), in jobs/s;
//   - once every job runs and a settling pause has passed, over 60 s with
//     no writes: CPU of couchrepd and of pouchdb-server (from
//     /proc/<pid>/stat, % of one core), their RSS and open file descriptors;
//   - latency of GET /_scheduler/jobs?limit=100 and of `couchrepctl jobs
//     --limit 100` (median of 10);
//   - propagation: 100 writes spread over the jobs, one every 100 ms, each
//     timed from the PUT at the source until the document shows on a
//     continuous _changes feed of the target (p50, p99).
//
// Numbers go to BENCHMARKS.md with the load average it logs.
//
//	go test -run '^$' -bench Scale -benchtime 1x -timeout 120m ./integration/
func BenchmarkScale(b *testing.B) {
	for _, n := range scaleBenchJobs(b) {
		b.Run(fmt.Sprintf("jobs=%d", n), func(b *testing.B) {
			for range b.N {
				benchScale(b, n)
			}
		})
	}
}

func benchScale(b *testing.B, n int) {
	srv := testserver.StartPouchDB(b)
	plainReplicatorDB(b, srv, true)
	srcs := make([]string, scaleSources)
	for k := range srcs {
		srcs[k] = srv.CreateDB(b, scaleSourceDB(k))
	}
	tgt := srv.CreateDB(b, "tgt")
	node, addr := scaleNode(b, n, "COUCHREP_COUCHREP_WATCH="+strings.TrimSuffix(srv.URL, "/"))
	nodePID, srvPID := node.cmd.Process.Pid, serverPID(srv)
	if srvPID == 0 {
		b.Fatal("pouchdb-server process not found")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	body := func(i int) string { return docIDJob(srcs[i%scaleSources], tgt, scaleDocID(i)) }

	b.ResetTimer()
	half := n / 2
	took, err := submitReplicate(ctx, addr, half, 32, body)
	if err != nil {
		b.Fatal(err)
	}
	postRate := float64(half) / took.Seconds()
	docsRate := submitDocs(ctx, b, srv, addr, half, n, body)
	b.StopTimer()

	start := time.Now()
	for running := 0; running < n; running = runningJobs(b, addr) {
		if time.Since(start) > 30*time.Minute {
			b.Fatalf("%d of %d jobs running after 30 minutes", running, n)
		}
		select {
		case <-node.exited:
			b.Fatalf("couchrepd exited (%v)", node.exitErr)
		case <-time.After(time.Second): // another process's state: poll
		}
	}
	allRunning := time.Since(start)
	// Running in the store is not started at the source: wait until the
	// jobs' start-up requests (checkpoints, catch-ups, feeds) are done,
	// i.e. the node has had no request in flight and sent none for 5 s.
	for last, quiet := -1.0, time.Now(); time.Since(quiet) < 5*time.Second; {
		sent, answered := replicationRequests(b, addr)
		if sent != last || answered < sent {
			last, quiet = sent, time.Now()
		}
		if time.Since(start) > 30*time.Minute {
			b.Fatalf("jobs still starting after 30 minutes (%.0f requests, %.0f answered)", sent, answered)
		}
		time.Sleep(500 * time.Millisecond) // another process's state: poll
	}
	settled := time.Since(start)
	time.Sleep(20 * time.Second) // let the start-up work drain
	load0 := loadAvg()
	nodeCPU, srvCPU := procCPU(nodePID), procCPU(srvPID)
	mem0 := goMetrics(b, addr)
	const idle = 60 * time.Second
	time.Sleep(idle)
	nodeIdle := float64(procCPU(nodePID)-nodeCPU) / float64(idle) * 100
	srvIdle := float64(procCPU(srvPID)-srvCPU) / float64(idle) * 100
	load1 := loadAvg()
	nodeRSS, srvRSS := procRSS(nodePID), procRSS(srvPID)
	nodeFDs, srvFDs := procFDs(nodePID), procFDs(srvPID)
	mem1 := goMetrics(b, addr)
	b.Logf("jobs=%d: couchrepd's Go memory after 60 s idle (RSS %.1f MB): %s; in the idle minute it allocated %.1f MB and ran %.0f GCs",
		n, float64(nodeRSS)/(1<<20), goMemory(mem1), (mem1["go_memstats_alloc_bytes_total"]-mem0["go_memstats_alloc_bytes_total"])/(1<<20),
		mem1["go_gc_duration_seconds_count"]-mem0["go_gc_duration_seconds_count"])

	schedJobs := medianLatency(10, func() error {
		resp, err := http.Get("http://" + addr + "/_scheduler/jobs?limit=100")
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("_scheduler/jobs: %d", resp.StatusCode)
		}
		return nil
	})
	ctlJobs := medianLatency(10, func() error {
		if _, errOut, code := node.ctl("jobs", "--limit", "100"); code != 0 {
			return fmt.Errorf("couchrepctl jobs: exit %d: %s", code, errOut)
		}
		return nil
	})
	p50, p99 := propagation(ctx, b, srv, srcs, tgt, n, 100)

	per := func(v float64) float64 { return v * 1000 / float64(n) }
	b.ReportMetric(postRate, "post-jobs/s")
	b.ReportMetric(docsRate, "doc-jobs/s")
	b.ReportMetric(nodeIdle, "node-idle-%cpu")
	b.ReportMetric(srvIdle, "server-idle-%cpu")
	b.ReportMetric(float64(nodeRSS)/(1<<20), "node-RSS-MB")
	b.ReportMetric(float64(nodeFDs), "node-fds")
	b.ReportMetric(p50.Seconds()*1000, "prop-p50-ms")
	b.ReportMetric(p99.Seconds()*1000, "prop-p99-ms")
	b.ReportMetric(schedJobs.Seconds()*1000, "sched-jobs-ms")
	b.ReportMetric(ctlJobs.Seconds()*1000, "ctl-jobs-ms")
	b.Logf("jobs=%d: submit POST %.0f/s, _replicator %.0f/s; all running %s after the last submission, started at the source after %s; "+
		"idle 60 s: couchrepd %.2f%% of a core (%.2f%% per 1,000 jobs), pouchdb-server %.2f%% (%.2f%% per 1,000); "+
		"RSS couchrepd %.1f MB (%.1f MB per 1,000), pouchdb-server %.1f MB; fds couchrepd %d, pouchdb-server %d; "+
		"_scheduler/jobs?limit=100 %s, couchrepctl jobs --limit 100 %s; propagation p50 %s p99 %s; load %s -> %s",
		n, postRate, docsRate, allRunning.Round(time.Second), settled.Round(time.Second), nodeIdle, per(nodeIdle), srvIdle, per(srvIdle),
		float64(nodeRSS)/(1<<20), per(float64(nodeRSS)/(1<<20)), float64(srvRSS)/(1<<20), nodeFDs, srvFDs,
		schedJobs.Round(time.Millisecond), ctlJobs.Round(time.Millisecond), p50.Round(time.Millisecond),
		p99.Round(time.Millisecond), load0, load1)
}

// submitDocs writes jobs from..to-1 as _replicator documents (_bulk_docs of
// 500) and returns how many per second the node listed in _scheduler/docs,
// counted from the first write.
func submitDocs(ctx context.Context, b *testing.B, srv *testserver.Server, addr string, from, to int, body func(i int) string) float64 {
	start := time.Now()
	for lo := from; lo < to; lo += 500 {
		var docs []json.RawMessage
		for i := lo; i < min(lo+500, to); i++ {
			d := body(i)
			docs = append(docs, json.RawMessage(fmt.Sprintf(`{"_id":"r%05d",%s`, i, d[1:])))
		}
		srv.Do(b, http.MethodPost, srv.DBURL("_replicator")+"_bulk_docs", map[string]any{"docs": docs}, http.StatusCreated)
	}
	written := time.Since(start)
	want := to - from
	for {
		var page struct {
			TotalRows int `json:"total_rows"`
		}
		resp, err := http.Get("http://" + addr + "/_scheduler/docs?limit=1")
		if err == nil {
			_ = json.NewDecoder(resp.Body).Decode(&page)
			resp.Body.Close()
		}
		if page.TotalRows >= want {
			// The server's _bulk_docs (while it serves the starting jobs)
			// and the doc processor's lag after the last write, apart.
			took := time.Since(start)
			b.Logf("_replicator: %d documents written in %s (%.0f/s), all listed %s after the last write",
				want, written.Round(time.Millisecond), float64(want)/written.Seconds(), (took - written).Round(time.Millisecond))
			return float64(want) / took.Seconds()
		}
		if ctx.Err() != nil {
			b.Fatalf("%d of %d _replicator jobs listed", page.TotalRows, want)
		}
		time.Sleep(100 * time.Millisecond) // another process's state: poll
	}
}

// goMetrics is the Go collector's figures from the /metrics of the node at
// addr (go_memstats_*, go_goroutines, go_gc_duration_seconds_count).
func goMetrics(b *testing.B, addr string) map[string]float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	v := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && (strings.HasPrefix(f[0], "go_memstats_") || f[0] == "go_goroutines" || f[0] == "go_gc_duration_seconds_count") {
			v[f[0]], _ = strconv.ParseFloat(f[1], 64)
		}
	}
	return v
}

// goMemory describes the node's Go memory from goMetrics: live heap (and
// garbage not yet collected), heap spans in use, free heap not returned to
// the OS, goroutine stacks, the next GC's heap goal, everything the runtime
// holds, and goroutines.
func goMemory(v map[string]float64) string {
	mb := func(k string) float64 { return v["go_memstats_"+k] / (1 << 20) }
	return fmt.Sprintf("heap alloc %.1f MB, in use %.1f MB, idle not released %.1f MB, stacks %.1f MB, next GC %.1f MB, sys %.1f MB; %.0f goroutines",
		mb("heap_alloc_bytes"), mb("heap_inuse_bytes"), mb("heap_idle_bytes")-mb("heap_released_bytes"),
		mb("stack_inuse_bytes"), mb("next_gc_bytes"), mb("sys_bytes"), v["go_goroutines"])
}

// runningJobs sums couchrep_replication_jobs{state="running"} from the
// node's /metrics.
func runningJobs(b *testing.B, addr string) int {
	return int(metricSum(b, addr, func(line string) bool {
		return strings.HasPrefix(line, "couchrep_replication_jobs{") && strings.Contains(line, `state="running"`)
	}))
}

// metricSum sums the values of the lines of the node's /metrics that match.
func metricSum(tb testing.TB, addr string, match func(line string) bool) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) < 2 || !match(line) {
			continue
		}
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		total += v
	}
	return total
}

// metricPrefix matches the lines of one metric name.
func metricPrefix(name string) func(string) bool {
	return func(line string) bool {
		return strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ")
	}
}

// replicationRequests reads couchrep_replication_requests_total (summed
// over methods) and couchrep_replication_responses_total (over outcomes)
// from the node's /metrics: requests its jobs sent, and those answered (a
// continuous feed counts as answered once its headers arrived).
func replicationRequests(b *testing.B, addr string) (sent, answered float64) {
	return metricSum(b, addr, metricPrefix("couchrep_replication_requests_total")),
		metricSum(b, addr, metricPrefix("couchrep_replication_responses_total"))
}

// medianLatency runs fn k times and returns the median duration.
func medianLatency(k int, fn func() error) time.Duration {
	var ds []time.Duration
	for range k {
		t0 := time.Now()
		if err := fn(); err != nil {
			return -1
		}
		ds = append(ds, time.Since(t0))
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// propagation writes writes documents, one every 100 ms, each read by a
// different job, and returns the p50 and p99 of the time from the PUT at
// the source until the document appears on the target's continuous
// _changes feed.
func propagation(ctx context.Context, b *testing.B, srv *testserver.Server, srcs []string, tgt string, n, writes int) (p50, p99 time.Duration) {
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	seen := map[string]time.Time{}
	req, _ := http.NewRequestWithContext(fctx, http.MethodGet, tgt+"_changes?feed=continuous&heartbeat=1000", nil)
	req.Header.Set("Accept-Encoding", "identity") // PouchDB Server would gzip the feed, holding rows back
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var row struct {
				ID string `json:"id"`
			}
			if bytes.TrimSpace(sc.Bytes()) == nil || json.Unmarshal(sc.Bytes(), &row) != nil {
				continue
			}
			mu.Lock()
			if _, ok := seen[row.ID]; !ok {
				seen[row.ID] = time.Now()
			}
			mu.Unlock()
		}
	}()
	wrote := map[string]time.Time{}
	writes = min(writes, n-1)
	for k := range writes {
		i := 1 + k*(n-1)/writes // distinct documents, each read by another job
		id := scaleDocID(i)
		wrote[id] = time.Now()
		srv.Do(b, http.MethodPut, srcs[i%scaleSources]+id, map[string]any{"k": k}, http.StatusCreated)
		time.Sleep(100 * time.Millisecond) // pacing of the writes
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		mu.Lock()
		got := len(seen)
		mu.Unlock()
		if got >= writes {
			break
		}
		if time.Now().After(deadline) {
			var info map[string]any
			srv.GetJSON(b, tgt, &info)
			b.Fatalf("%d of %d writes seen on the target's feed within 2 minutes (target: %v)", got, writes, info)
		}
		time.Sleep(50 * time.Millisecond) // another process's state: poll
	}
	var ds []time.Duration
	mu.Lock()
	for id, t0 := range wrote {
		ds = append(ds, seen[id].Sub(t0))
	}
	mu.Unlock()
	slices.Sort(ds)
	return ds[len(ds)/2], ds[(len(ds)*99-1)/100]
}

// procRSS is VmRSS of process pid, in bytes (0 if unreadable).
func procRSS(pid int) uint64 {
	return statusBytes(fmt.Sprintf("/proc/%d/status", pid), "VmRSS:")
}

// procFDs counts the open file descriptors of process pid.
func procFDs(pid int) int {
	ents, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	if err != nil {
		return -1
	}
	return len(ents)
}
