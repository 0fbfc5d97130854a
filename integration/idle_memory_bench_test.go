package integration

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/repjob"
)

// idleFeedEnv makes TestIdleFeedServerProcess serve; the benchmark sets it
// when it starts this test binary again as its fake source.
const idleFeedEnv = "COUCHREP_IDLE_FEED_SERVER"

// TestIdleFeedServerProcess is not a test of its own: it is the fake
// CouchDB of BenchmarkIdleContinuousMemory, run in a child process (this
// test binary started again with idleFeedEnv set) so that the server side
// of a thousand open feeds is not counted in the replicator's memory. It
// prints its address on stdout and serves until stdin is closed.
func TestIdleFeedServerProcess(t *testing.T) {
	if os.Getenv(idleFeedEnv) == "" {
		t.Skip("helper process of BenchmarkIdleContinuousMemory")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: newIdleCouch()}
	go srv.Serve(ln)
	fmt.Printf("%s\n", ln.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	srv.Close()
}

// idleCouch is a CouchDB-shaped server whose databases are all empty and
// never change: GET /db answers like CouchDB 3.x for an empty database,
// _local documents do not exist, and a longpoll or continuous _changes feed
// stays open without a row until its timeout= and then ends with last_seq,
// as CouchDB does (sending a newline every heartbeat= meanwhile); a
// checkpoint PUT is accepted (and forgotten). GET /_idle_feeds counts the
// feeds open now. GET /_db_updates answers as CouchDB 3 with
// _global_changes for a server where nothing happens: since=now at once,
// a continuous feed with heartbeats and no row (GET /_idle_db_updates
// counts those open).
//
// POST /_dbs_info answers as CouchDB 3 does (each database's GET /db
// answer), or, with COUCHREP_IDLE_COUCH_NO_DBS_INFO=1 in its environment,
// 404 as PouchDB Server does; GET /_idle_rechecks counts the GET /db and
// POST /_dbs_info requests and the databases they named ("gets posts
// keys").
type idleCouch struct {
	open      atomic.Int64
	dbUpdts   atomic.Int64
	noDBsInfo bool
	gets      atomic.Int64
	posts     atomic.Int64
	keys      atomic.Int64
}

func newIdleCouch() *idleCouch {
	return &idleCouch{noDBsInfo: os.Getenv("COUCHREP_IDLE_COUCH_NO_DBS_INFO") == "1"}
}

// idleDBInfo is what the fake answers for database name.
func idleDBInfo(name string) string {
	return fmt.Sprintf(`{"db_name":%q,"doc_count":0,"doc_del_count":0,"update_seq":"0-g1AAAAB","purge_seq":"0-g1AAAAB",`+
		`"instance_start_time":"0","sizes":{"file":16692,"external":0,"active":0}}`, name)
}

func (c *idleCouch) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.URL.Path == "/_idle_feeds":
		fmt.Fprintf(w, "%d\n", c.open.Load())
	case r.URL.Path == "/_idle_db_updates":
		fmt.Fprintf(w, "%d\n", c.dbUpdts.Load())
	case r.URL.Path == "/_db_updates":
		c.dbUpdates(w, r)
	case r.URL.Path == "/_idle_rechecks":
		fmt.Fprintf(w, "%d %d %d\n", c.gets.Load(), c.posts.Load(), c.keys.Load())
	case r.URL.Path == "/_dbs_info" && r.Method == http.MethodPost && !c.noDBsInfo:
		var body struct {
			Keys []string `json:"keys"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || len(body.Keys) > 100 {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":"bad_request","reason":"keys"}`)
			return
		}
		c.posts.Add(1)
		c.keys.Add(int64(len(body.Keys)))
		io.WriteString(w, "[")
		for i, k := range body.Keys {
			if i > 0 {
				io.WriteString(w, ",")
			}
			fmt.Fprintf(w, `{"key":%q,"info":%s}`, k, idleDBInfo(k))
		}
		io.WriteString(w, "]")
	case r.URL.Path == "/":
		io.WriteString(w, `{"couchdb":"Welcome","version":"3.3.3","uuid":"85fb71bf700c17267fef77535820e371"}`)
	case len(parts) == 1 && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		c.gets.Add(1)
		io.WriteString(w, idleDBInfo(parts[0]))
	case len(parts) == 1 && r.Method == http.MethodPut:
		w.WriteHeader(http.StatusPreconditionFailed)
		io.WriteString(w, `{"error":"file_exists","reason":"The database could not be created, the file already exists."}`)
	case len(parts) >= 2 && parts[1] == "_local" && r.Method == http.MethodPut:
		// A checkpoint (a feed that ended moved through_seq to its
		// last_seq): accepted, never stored.
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"ok":true,"id":%q,"rev":"0-1"}`, strings.Join(parts[1:], "/"))
	case len(parts) >= 2 && parts[1] == "_local":
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"error":"not_found","reason":"missing"}`)
	case len(parts) == 2 && parts[1] == "_ensure_full_commit":
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"ok":true,"instance_start_time":"0"}`)
	case len(parts) == 2 && parts[1] == "_changes":
		c.changes(w, r)
	default:
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"error":"not_found","reason":"missing"}`)
	}
}

func (c *idleCouch) changes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	feed := q.Get("feed")
	if feed != "continuous" && feed != "longpoll" {
		io.WriteString(w, `{"results":[],"last_seq":"0-g1AAAAB","pending":0}`)
		return
	}
	timeout := 60 * time.Second // CouchDB's default
	if ms, err := strconv.Atoi(q.Get("timeout")); err == nil {
		timeout = time.Duration(ms) * time.Millisecond
	}
	var beat <-chan time.Time
	if ms, err := strconv.Atoi(q.Get("heartbeat")); err == nil && ms > 0 {
		t := time.NewTicker(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		beat = t.C
	}
	c.open.Add(1)
	defer c.open.Add(-1)
	w.WriteHeader(http.StatusOK)
	if feed == "longpoll" {
		io.WriteString(w, `{"results":[`)
	}
	w.(http.Flusher).Flush()
	end := time.NewTimer(timeout)
	defer end.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-beat:
			io.WriteString(w, "\n")
			w.(http.Flusher).Flush()
		case <-end.C:
			if feed == "longpoll" {
				io.WriteString(w, `],"last_seq":"0-g1AAAAB","pending":0}`)
			} else {
				io.WriteString(w, `{"last_seq":"0-g1AAAAB","pending":0}`+"\n")
			}
			return
		}
	}
}

func (c *idleCouch) dbUpdates(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Get("feed") != "continuous" {
		io.WriteString(w, `{"results":[],"last_seq":"1-g1AAAAB"}`+"\n")
		return
	}
	var beat <-chan time.Time
	if ms, err := strconv.Atoi(q.Get("heartbeat")); err == nil && ms > 0 {
		t := time.NewTicker(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		beat = t.C
	}
	c.dbUpdts.Add(1)
	defer c.dbUpdts.Add(-1)
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-beat:
			io.WriteString(w, "\n")
			w.(http.Flusher).Flush()
		}
	}
}

// startIdleCouch runs the fake CouchDB in a child process and returns its
// root URL.
func startIdleCouch(b *testing.B) string {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestIdleFeedServerProcess$", "-test.short")
	cmd.Env = append(os.Environ(), idleFeedEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("fake CouchDB did not start: %v", err)
	}
	return "http://" + strings.TrimSpace(line) + "/"
}

// memNow is this process's memory after a full collection.
type memNow struct {
	heapInuse, stackInuse, heapAlloc, rss uint64
	// runtime is what the Go runtime holds beside heap spans and stacks:
	// span and GC metadata, profiling buckets and the rest of OtherSys.
	runtime    uint64
	goroutines int
}

func measureMem() memNow {
	runtime.GC()
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	meta := ms.MSpanInuse + ms.MCacheInuse + ms.GCSys + ms.BuckHashSys + ms.OtherSys
	return memNow{heapInuse: ms.HeapInuse, stackInuse: ms.StackInuse, heapAlloc: ms.HeapAlloc, runtime: meta,
		rss: vmRSS(), goroutines: runtime.NumGoroutine()}
}

// vmRSS is VmRSS from /proc/self/status, in bytes (0 if unreadable).
func vmRSS() uint64 { return statusBytes("/proc/self/status", "VmRSS:") }

func idleFeeds(b *testing.B, base string) int {
	resp, err := http.Get(base + "_idle_feeds")
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

// BenchmarkIdleContinuousMemory measures the memory of continuous
// replications that have nothing to do: a node (in this process, started
// with couchrep.Start: the same actors as couchrepd, jobs run through
// job_server, connection_pool and rate_limiter) runs N continuous jobs
// whose source is a CouchDB-shaped fake in a child process holding every
// _changes feed open with no changes (see idleCouch). Once all N feeds are
// open, it reports per job, after a full GC: the Go heap in use plus
// goroutine stacks, the RSS delta, and goroutines, each against the same
// node before the jobs were added. Target: under 64 KB per job at 1,000.
//
//	go test -run '^$' -bench IdleContinuousMemory -benchtime 1x -timeout 20m ./integration/
func BenchmarkIdleContinuousMemory(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("jobs=%d", n), func(b *testing.B) {
			for range b.N {
				benchIdleJobs(b, n)
			}
		})
	}
}

func benchIdleJobs(b *testing.B, n int) {
	base := startIdleCouch(b)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cfg := couchrep.DefaultConfig()
	cfg.Couchrep.NodeTypes = []string{config.NodeTypeReplication}
	cfg.Replicator.MaxJobs = n + 10
	cfg.Replicator.StartupJitter = 0
	// Every job holds a feed of its own (all read one source: shared, they
	// would hold one between them), which is what this measures.
	cfg.Replicator.ShareChangesFeeds = false
	cfg.Replicator.IdleParkAfter = 0 // idle jobs with their feeds (BenchmarkParkedMemory: parked)
	store := startInProcessNode(b, cfg, zerolog.Nop()).Store

	before := measureMem()
	b.ResetTimer()
	for i := range n {
		body := fmt.Sprintf(`{"source":"%ssrc","target":"%stgt%04d","continuous":true}`, base, base, i)
		if _, err := store.AddTransient(ctx, []byte(body), "bench"); err != nil {
			b.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Minute)
	for idleFeeds(b, base) < n {
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d feeds open after 10 minutes", idleFeeds(b, base), n)
		}
		time.Sleep(100 * time.Millisecond) // state of another process: poll
	}
	b.StopTimer()
	after := measureMem()
	if p := os.Getenv("COUCHREP_IDLE_PROFILE"); p != "" {
		writeIdleProfiles(b, fmt.Sprintf("%s-%d", p, n))
	}
	if open := idleFeeds(b, base); open < n*9/10 {
		b.Fatalf("%d of %d feeds open while measuring", open, n)
	}
	recs, err := store.List(ctx, repjob.Filter{})
	if err != nil {
		b.Fatal(err)
	}
	runningJobs := 0
	for _, r := range recs {
		if r.State() == running {
			runningJobs++
		}
	}
	if runningJobs != n {
		b.Fatalf("%d of %d jobs running", runningJobs, n)
	}
	per := func(a, b uint64) float64 { return (float64(a) - float64(b)) / float64(n) }
	heapStacks := per(after.heapInuse+after.stackInuse, before.heapInuse+before.stackInuse)
	b.ReportMetric(heapStacks, "heap+stack-B/job")
	b.ReportMetric(per(after.heapAlloc, before.heapAlloc), "heap-alloc-B/job")
	b.ReportMetric(per(after.stackInuse, before.stackInuse), "stack-B/job")
	b.ReportMetric(per(after.rss, before.rss), "RSS-B/job")
	b.ReportMetric(float64(after.goroutines-before.goroutines)/float64(n), "goroutines/job")
	b.ReportMetric(per(after.runtime, before.runtime), "runtime-B/job")
	b.Logf("jobs=%d: goroutines by where they wait (groups of at least %d): %s", n, n/10, goroutineGroups(b, n/10))
	b.Logf("jobs=%d: heap in use %d -> %d, stacks %d -> %d, runtime metadata %d -> %d, RSS %d -> %d, goroutines %d -> %d; load %s",
		n, before.heapInuse, after.heapInuse, before.stackInuse, after.stackInuse, before.runtime, after.runtime,
		before.rss, after.rss, before.goroutines, after.goroutines, loadAvg())
}

// goroutineGroups is this process's goroutines grouped by what they are:
// the outermost frame of ours (the function the goroutine runs), else the
// innermost of net/http; the groups of at least min goroutines, largest
// first.
func goroutineGroups(b *testing.B, min int) string {
	var buf strings.Builder
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		b.Fatal(err)
	}
	_, profile, _ := strings.Cut(buf.String(), "\n") // "goroutine profile: total N"
	counts := map[string]int{}
	for block := range strings.SplitSeq(profile, "\n\n") {
		var n int
		if _, err := fmt.Sscanf(block, "%d @", &n); err != nil {
			continue
		}
		var ours, nethttp string
		for line := range strings.SplitSeq(block, "\n") {
			f := strings.Fields(line)
			if len(f) < 3 || f[0] != "#" {
				continue
			}
			fn, _, _ := strings.Cut(f[2], "+")
			switch {
			case strings.Contains(fn, "couchrep/couchrep"):
				ours = strings.TrimPrefix(fn, "github.com/couchrep/couchrep/")
			case nethttp == "" && strings.HasPrefix(fn, "net/http."):
				nethttp = fn
			}
		}
		where := cmp.Or(ours, nethttp, "other")
		counts[where] += n
	}
	type group struct {
		where string
		n     int
	}
	var groups []group
	for w, n := range counts {
		if n >= min {
			groups = append(groups, group{w, n})
		}
	}
	slices.SortFunc(groups, func(a, b group) int { return b.n - a.n })
	var out []string
	for _, g := range groups {
		out = append(out, fmt.Sprintf("%d %s", g.n, g.where))
	}
	return strings.Join(out, ", ")
}

// writeIdleProfiles writes the heap and goroutine profiles of the idle node
// to prefix.heap and prefix.goroutines (COUCHREP_IDLE_PROFILE=prefix), and
// two more heap profiles 20 s (the jobs' first progress reports are
// written in between) and 50 s later to prefix.settled.heap and
// prefix.idle.heap: what the idle jobs allocate is the alloc_space of the
// last less the one before (go tool pprof -sample_index=alloc_space -base
// prefix.settled.heap prefix.idle.heap).
func writeIdleProfiles(b *testing.B, prefix string) {
	write := func(name, file string, debug int) {
		f, err := os.Create(file)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := pprof.Lookup(name).WriteTo(f, debug); err != nil {
			b.Fatal(err)
		}
	}
	write("heap", prefix+".heap", 0)
	write("goroutine", prefix+".goroutines", 1)
	for _, name := range []string{".settled.heap", ".idle.heap"} {
		time.Sleep(map[string]time.Duration{".settled.heap": 20 * time.Second, ".idle.heap": 30 * time.Second}[name])
		runtime.GC() // the heap profile is as of the last GC
		write("heap", prefix+name, 0)
	}
}
