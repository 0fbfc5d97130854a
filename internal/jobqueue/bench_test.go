package jobqueue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/postgres"
	"github.com/couchrep/couchrep/internal/kv/postgres/pgtest"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
)

// Benchmarks on the embedded backend (and BenchmarkCycle on PostgreSQL
// too). See BENCHMARKS.md "## Job queue".

const (
	benchType    = "bench"
	benchQueued  = 100_000
	benchTimeout = time.Minute
)

var durabilities = []struct {
	name string
	d    kv.Durability
}{{"normal", kv.DurabilityNormal}, {"full", kv.DurabilityFull}}

// benchStore is a store file kept for the whole benchmark run, so that the
// 100,000-job queue is built once per durability.
type benchStore struct {
	path string // the file, or the postgres:// URL
	db   kv.Database
	q    *Queue
	next atomic.Int64 // next job number to add
}

var (
	benchStoresMu sync.Mutex
	benchStores   = map[string]*benchStore{}
	benchDir      string
	benchPGPid    int // the PostgreSQL server's pid, for its CPU time
)

func getBenchStore(b *testing.B, name string, d kv.Durability, queued int) *benchStore {
	b.Helper()
	benchStoresMu.Lock()
	defer benchStoresMu.Unlock()
	if s := benchStores[name]; s != nil {
		return s
	}
	if benchDir == "" {
		dir, err := os.MkdirTemp("", "jobs-bench-")
		if err != nil {
			b.Fatal(err)
		}
		benchDir = dir
	}
	path := filepath.Join(benchDir, name+".db")
	// Kept open for the whole run: benchmarks do not close shared stores.
	var db kv.Database
	var err error
	if strings.HasPrefix(name, "postgres") {
		// A server with its data flushed to disk as in production
		// (pgtest turns fsync off for tests). JOBS_BENCH_PG names an
		// empty database of a server of your own instead (for instance
		// one with pg_stat_statements), JOBS_BENCH_PG_PID its
		// postmaster's pid for server-cpu-µs/cycle.
		if dsn := os.Getenv("JOBS_BENCH_PG"); dsn != "" {
			path = dsn
			benchPGPid = envInt("JOBS_BENCH_PG_PID", 0)
		} else {
			srv := pgtest.Shared(b, "fsync = on", "full_page_writes = on")
			path = srv.NewDatabase(b)
			benchPGPid = srv.PID()
		}
		opts := postgres.Options{MaxConns: 32}
		if d == kv.DurabilityFull {
			opts.Durability = kv.DurabilityFull // synchronous_commit as the server says (on)
		}
		db, err = postgres.Open(context.Background(), path, opts)
	} else {
		db, err = sqlite.Open(context.Background(), path, sqlite.Options{Durability: d})
	}
	if err != nil {
		b.Fatal(err)
	}
	s := &benchStore{path: path, db: db, q: New(db, Options{NodeName: "bench", AcceptSpread: envInt("JOBS_BENCH_SPREAD", 0)})}
	ctx := context.Background()
	if err := s.q.SetTypeTimeout(ctx, benchType, benchTimeout); err != nil {
		b.Fatal(err)
	}
	s.addBulk(b, queued)
	benchStores[name] = s
	return s
}

// closeBenchStores closes and deletes the shared benchmark stores.
func closeBenchStores() {
	benchStoresMu.Lock()
	defer benchStoresMu.Unlock()
	for name, s := range benchStores {
		_ = s.db.Close()
		delete(benchStores, name)
	}
	if benchDir != "" {
		_ = os.RemoveAll(benchDir)
		benchDir = ""
	}
}

// addBulk adds n jobs, 1,000 per transaction, with random priorities.
func (s *benchStore) addBulk(b *testing.B, n int) {
	b.Helper()
	ctx := context.Background()
	for n > 0 {
		batch := min(n, 1000)
		start := s.next.Add(int64(batch)) - int64(batch)
		if err := s.db.Transact(ctx, func(tx kv.Tx) error {
			for i := range int64(batch) {
				id := "job-" + strconv.FormatInt(start+i, 10)
				if err := s.q.AddTx(tx, benchType, id, AddOptions{Priority: uint64(rand.IntN(1 << 20)), Data: []byte("{}")}); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		n -= batch
	}
}

// BenchmarkAdd measures Add, one job per transaction.
func BenchmarkAdd(b *testing.B) {
	for _, dur := range durabilities {
		for _, workers := range []int{1, 8} {
			b.Run(fmt.Sprintf("durability=%s/goroutines=%d", dur.name, workers), func(b *testing.B) {
				db := openSQLite(b, filepath.Join(b.TempDir(), "add.db"), sqlite.Options{Durability: dur.d})
				q := New(db, Options{})
				ctx := context.Background()
				if err := q.SetTypeTimeout(ctx, benchType, benchTimeout); err != nil {
					b.Fatal(err)
				}
				var next atomic.Int64
				b.ResetTimer()
				start := time.Now()
				runWorkers(b, workers, func() bool {
					i := next.Add(1)
					if i > int64(b.N) {
						return false
					}
					if err := q.Add(ctx, benchType, "job-"+strconv.FormatInt(i, 10), AddOptions{Priority: uint64(i)}); err != nil {
						b.Error(err)
						return false
					}
					return true
				})
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
			})
		}
	}
}

// runWorkers runs fn on n goroutines until it returns false.
func runWorkers(b *testing.B, n int, fn func() bool) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for fn() {
			}
		})
	}
	wg.Wait()
}

// cycle runs one Accept+Update+Finish; it returns the Accept latency.
func cycle(ctx context.Context, q *Queue) (time.Duration, error) {
	t0 := time.Now()
	j, err := q.Accept(ctx, benchType, AcceptOptions{})
	lat := time.Since(t0)
	if err != nil {
		return lat, err
	}
	if err := j.Update(ctx, []byte(`{"progress":1}`)); err != nil {
		return lat, err
	}
	return lat, j.Finish(ctx, []byte(`{"done":true}`))
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, int(p*float64(len(d))))]
}

// BenchmarkCycle measures full Accept+Update+Finish cycles with 100,000
// jobs queued, and Accept latency. procs=2 (procs=3 on PostgreSQL) runs
// more processes doing the same on the same store at the same time (their
// cycles are counted too).
func BenchmarkCycle(b *testing.B) {
	type variant struct {
		name, store string
		d           kv.Durability
		procs       int
	}
	var variants []variant
	for _, dur := range durabilities {
		for _, procs := range []int{1, 2} {
			variants = append(variants, variant{"durability=" + dur.name, "cycle-" + dur.name, dur.d, procs})
		}
	}
	for _, procs := range []int{1, 3} {
		variants = append(variants, variant{"store=postgres/durability=normal", "postgres-cycle", kv.DurabilityNormal, procs})
	}
	variants = append(variants, variant{"store=postgres/durability=full", "postgres-cycle-full", kv.DurabilityFull, 1})
	for _, v := range variants {
		procs := v.procs
		for _, workers := range []int{1, 8} {
			name := fmt.Sprintf("%s/procs=%d/workers=%d", v.name, procs, workers)
			b.Run(name, func(b *testing.B) {
				s := getBenchStore(b, v.store, v.d, benchQueued)
				// Keep at least 100,000 queued during the run.
				s.addBulk(b, b.N*procs)
				ctx := context.Background()
				var children []*benchChild
				for range procs - 1 {
					children = append(children, startBenchChild(b, "cycler", s.path, workers, v.d))
				}
				lats := make([][]time.Duration, workers)
				var done atomic.Int64
				var rt0 int64
				if pg, ok := s.db.(interface{ RoundTrips() int64 }); ok {
					rt0 = pg.RoundTrips()
				}
				b.ResetTimer()
				start := time.Now()
				cpu0 := processCPU()
				scpu0 := pgtest.CPU(benchPGPid)
				var wg sync.WaitGroup
				for w := range workers {
					wg.Go(func() {
						for done.Add(1) <= int64(b.N) {
							lat, err := cycle(ctx, s.q)
							if err != nil {
								b.Error(err)
								return
							}
							lats[w] = append(lats[w], lat)
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)
				cpu := processCPU() - cpu0
				scpu := pgtest.CPU(benchPGPid) - scpu0
				b.StopTimer()
				total := float64(b.N)
				for _, child := range children {
					total += float64(child.stop(b))
				}
				all := slices.Concat(lats...)
				b.ReportMetric(total/elapsed.Seconds(), "cycles/s")
				b.ReportMetric(float64(percentile(all, 0.50).Microseconds()), "accept-p50-µs")
				b.ReportMetric(float64(percentile(all, 0.99).Microseconds()), "accept-p99-µs")
				// CPU per cycle of this process (the machine is shared, so
				// wall-clock rates move with other load; this moves less).
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/cycle")
				if pg, ok := s.db.(interface{ RoundTrips() int64 }); ok {
					b.ReportMetric(float64(pg.RoundTrips()-rt0)/float64(b.N), "round-trips/cycle")
					// The server's CPU per cycle (of every process's cycles).
					b.ReportMetric(float64(scpu.Microseconds())/total, "server-cpu-µs/cycle")
				}
			})
		}
	}
}

// BenchmarkMonitorScan measures one activity monitor check that finds 100
// stale jobs among N running ones (N = 10,000 and 100,000, to show the
// cost does not grow with healthy jobs). procs=2 runs a second monitor in
// another process at the same moment; together they re-enqueue each stale
// job exactly once. Each invocation builds its own scenario once; ns/op is
// the whole scenario, the scan-ms metric is the check itself.
func BenchmarkMonitorScan(b *testing.B) {
	for _, running := range []int{10_000, 100_000} {
		for _, procs := range []int{1, 2} {
			b.Run(fmt.Sprintf("running=%d/stale=100/procs=%d", running, procs), func(b *testing.B) {
				benchMonitorScan(b, running, 100, procs)
			})
		}
	}
}

func benchMonitorScan(b *testing.B, running, stale, procs int) {
	path := filepath.Join(b.TempDir(), "scan.db")
	db := openSQLite(b, path, sqlite.Options{})
	q := New(db, Options{})
	ctx := context.Background()
	if err := q.SetTypeTimeout(ctx, benchType, benchTimeout); err != nil {
		b.Fatal(err)
	}
	// Stale jobs have priority 0 so they can be accepted first.
	if err := bulk(ctx, db, stale, func(tx kv.Tx, i int) error {
		return q.AddTx(tx, benchType, fmt.Sprintf("stale-%d", i), AddOptions{Priority: 0})
	}); err != nil {
		b.Fatal(err)
	}
	if err := bulk(ctx, db, running-stale, func(tx kv.Tx, i int) error {
		return q.AddTx(tx, benchType, fmt.Sprintf("live-%06d", i), AddOptions{Priority: 1})
	}); err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	var live []*Job
	accept := func(n int, opts AcceptOptions) {
		// Small batches: each Accept in a transaction skips the pending
		// keys taken earlier in it.
		if err := bulkN(ctx, db, n, 50, func(tx kv.Tx, i int) error {
			j, err := q.AcceptTx(tx, benchType, opts)
			if err == nil {
				mu.Lock()
				live = append(live, j)
				mu.Unlock()
			}
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	accept(stale, AcceptOptions{MaxPriority: 0, HasMaxPriority: true})
	var child *benchChild
	if procs == 2 {
		child = startBenchChild(b, "scanner", path, 1, kv.DurabilityNormal)
	}
	// The sample: every job accepted (or updated) after it is healthy.
	m := q.NewMonitor(MonitorOptions{})
	t0 := time.Now()
	if _, err := m.Check(ctx, t0); err != nil {
		b.Fatal(err)
	}
	if child != nil {
		child.send(b, "SAMPLE")
		child.expect(b, "OK")
	}
	live = nil
	accept(running-stale, AcceptOptions{})
	if child != nil {
		child.send(b, "CHECK")
	}
	start := time.Now()
	n, err := m.Check(ctx, t0.Add(benchTimeout))
	scan := time.Since(start)
	if err != nil {
		b.Fatal(err)
	}
	if child != nil {
		var cn int
		var cms float64
		line := child.line(b)
		if _, err := fmt.Sscanf(line, "DONE %d %g", &cn, &cms); err != nil {
			b.Fatalf("scanner said %q", line)
		}
		n += cn
		b.ReportMetric(cms, "child-scan-ms")
		child.stop(b)
	}
	if n != stale {
		b.Fatalf("re-enqueued %d, want %d", n, stale)
	}
	b.ReportMetric(float64(scan.Microseconds())/1000, "scan-ms")
}

// bulk runs fn n times, 1,000 per transaction.
func bulk(ctx context.Context, db kv.Database, n int, fn func(tx kv.Tx, i int) error) error {
	return bulkN(ctx, db, n, 1000, fn)
}

// bulkN runs fn n times, per per transaction.
func bulkN(ctx context.Context, db kv.Database, n, per int, fn func(tx kv.Tx, i int) error) error {
	for start := 0; start < n; start += per {
		end := min(n, start+per)
		if err := db.Transact(ctx, func(tx kv.Tx) error {
			for i := start; i < end; i++ {
				if err := fn(tx, i); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// benchChild is a helper process used by the procs=2 benchmarks.
type benchChild struct{ p *helperProc }

func startBenchChild(b *testing.B, mode, path string, workers int, d kv.Durability) *benchChild {
	b.Helper()
	p := startHelper(b, mode, path, fmt.Sprintf("%s=%d", envWorkers, workers), fmt.Sprintf("%s=%d", envDurability, d))
	c := &benchChild{p: p}
	c.expect(b, "READY")
	return c
}

func (c *benchChild) send(b *testing.B, cmd string) {
	if _, err := fmt.Fprintln(c.p.stdin, cmd); err != nil {
		b.Fatal(err)
	}
}

func (c *benchChild) line(b *testing.B) string {
	line, ok := <-c.p.lines
	if !ok {
		b.Fatalf("helper exited: %s", c.p.stderr.String())
	}
	return line
}

func (c *benchChild) expect(b *testing.B, want string) {
	if got := c.line(b); got != want {
		b.Fatalf("helper said %q, want %q", got, want)
	}
}

// stop ends a cycler and returns its cycle count (0 for others).
func (c *benchChild) stop(b *testing.B) int {
	_ = c.p.stdin.Close()
	n := 0
	for line := range c.p.lines {
		if v, ok := strings.CutPrefix(line, "CYCLES "); ok {
			n, _ = strconv.Atoi(v)
		}
	}
	if err := c.p.cmd.Wait(); err != nil {
		b.Fatalf("helper: %v %s", err, c.p.stderr.String())
	}
	return n
}

// runBenchHelper is the child side of the procs=2 benchmarks.
func runBenchHelper(ctx context.Context, mode string, db kv.Database, q *Queue, say func(string, ...any)) error {
	switch mode {
	case "cycler":
		var n atomic.Int64
		var wg sync.WaitGroup
		say("READY")
		for range envInt(envWorkers, 1) {
			wg.Go(func() {
				for ctx.Err() == nil {
					if _, err := cycle(ctx, q); err != nil {
						if ctx.Err() == nil && !errors.Is(err, ErrNotFound) {
							say("ERROR %v", err)
						}
						return
					}
					n.Add(1)
				}
			})
		}
		wg.Wait()
		say("CYCLES %d", n.Load())
		return nil
	case "scanner":
		m := q.NewMonitor(MonitorOptions{})
		say("READY")
		var t0 time.Time
		for {
			var cmd string
			select {
			case <-ctx.Done():
				return nil
			case cmd = <-helperCommands:
			}
			switch cmd {
			case "SAMPLE":
				t0 = time.Now()
				if _, err := m.Check(ctx, t0); err != nil {
					return err
				}
				say("OK")
			case "CHECK":
				start := time.Now()
				n, err := m.Check(ctx, t0.Add(benchTimeout))
				if err != nil {
					return err
				}
				say("DONE %d %g", n, float64(time.Since(start).Microseconds())/1000)
			}
		}
	}
	return fmt.Errorf("unknown bench helper %q", mode)
}

// processCPU returns the user+system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
