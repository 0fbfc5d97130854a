package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/testserver"
)

// benchRounds is the number of rounds of BenchmarkReplicationSideBySide
// (each runs every contestant once, in a rotated order):
// $COUCHREP_BENCH_ROUNDS, default 3.
func benchRounds() int {
	if n, err := strconv.Atoi(os.Getenv("COUCHREP_BENCH_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return 3
}

// benchSet is one corpus of the side-by-side benchmark.
type benchSet struct {
	n int
	// attEvery gives every attEvery-th document a 20 KB attachment (0: none).
	attEvery int
}

func (s benchSet) String() string {
	if s.attEvery > 0 {
		return fmt.Sprintf("docs=%d,atts=%d%%", s.n, 100/s.attEvery)
	}
	return fmt.Sprintf("docs=%d", s.n)
}

const (
	benchDocBytes = 1024      // a document's JSON, about
	benchAttBytes = 20 << 10  // one attachment's bytes
	benchBatch    = 500       // the bound's request size (CouchDB's worker_batch_size)
	benchTimeout  = time.Hour // any one contestant
)

// seedBench fills db on s with set's documents (one revision each, revs
// shaped like CouchDB's: "1-" + 32 hex digits), 500 per request.
func seedBench(b *testing.B, s *testserver.Server, db string, set benchSet) {
	b.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < set.n; i += benchBatch {
		docs := make([]map[string]any, 0, benchBatch)
		for j := i; j < min(i+benchBatch, set.n); j++ {
			id := fmt.Sprintf("doc%07d", j)
			rev := fmt.Sprintf("1-%016x%016x", rng.Uint64(), rng.Uint64())
			// {"_id":…,"_rev":…,"_revisions":{…},"n":…,"pad":"…"} ≈ 1 KB.
			d := testserver.Doc(id, []string{rev}, map[string]any{"n": j, "pad": strings.Repeat("x", benchDocBytes-140)})
			if set.attEvery > 0 && j%set.attEvery == 0 {
				data := make([]byte, benchAttBytes)
				for k := 0; k < len(data); k += 8 {
					v := rng.Uint64()
					for m := 0; m < 8 && k+m < len(data); m++ {
						data[k+m] = byte(v >> (8 * m))
					}
				}
				d = testserver.WithAttachment(d, "blob.bin", "application/octet-stream", data)
			}
			docs = append(docs, d)
		}
		s.PutRevs(b, db, docs...)
	}
}

// benchClient talks to the servers for the bound and the checks: one
// keep-alive connection per host, no gzip, no couchrep code.
var benchClient = &http.Client{Transport: &http.Transport{
	MaxIdleConnsPerHost: 4, DisableCompression: true,
}}

func benchDo(ctx context.Context, method, u string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := benchClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s %s: status %d: %.300s", method, u, resp.StatusCode, out)
	}
	return out, nil
}

// boundWork is what the endpoints' bound sends, built once per corpus
// (untimed): the _bulk_get bodies (500 revisions each, the revisions the
// source's _changes lists) and the _bulk_docs new_edits=false bodies (500
// documents each, exactly as _bulk_get returned them).
type boundWork struct {
	bulkGets  [][]byte
	bulkDocs  [][]byte
	readBytes int64
}

func prepareBound(b *testing.B, srcDB string) *boundWork {
	b.Helper()
	ctx := context.Background()
	raw, err := benchDo(ctx, http.MethodGet, srcDB+"_changes?style=all_docs", nil)
	if err != nil {
		b.Fatal(err)
	}
	var feed struct {
		Results []struct {
			ID      string `json:"id"`
			Changes []struct {
				Rev string `json:"rev"`
			} `json:"changes"`
		} `json:"results"`
	}
	if err := json.Unmarshal(raw, &feed); err != nil {
		b.Fatal(err)
	}
	type item struct {
		ID  string `json:"id"`
		Rev string `json:"rev"`
	}
	var items []item
	for _, r := range feed.Results {
		for _, c := range r.Changes {
			items = append(items, item{r.ID, c.Rev})
		}
	}
	w := &boundWork{}
	for i := 0; i < len(items); i += benchBatch {
		body, _ := json.Marshal(map[string]any{"docs": items[i:min(i+benchBatch, len(items))]})
		w.bulkGets = append(w.bulkGets, body)
		out, err := benchDo(ctx, http.MethodPost, srcDB+"_bulk_get?revs=true&latest=true&attachments=true", body)
		if err != nil {
			b.Fatal(err)
		}
		w.readBytes += int64(len(out))
		var res struct {
			Results []struct {
				Docs []struct {
					OK json.RawMessage `json:"ok"`
				} `json:"docs"`
			} `json:"results"`
		}
		if err := json.Unmarshal(out, &res); err != nil {
			b.Fatal(err)
		}
		var docs bytes.Buffer
		docs.WriteString(`{"new_edits":false,"docs":[`)
		k := 0
		for _, r := range res.Results {
			for _, d := range r.Docs {
				if d.OK == nil {
					continue
				}
				if k > 0 {
					docs.WriteByte(',')
				}
				docs.Write(d.OK)
				k++
			}
		}
		docs.WriteString(`]}`)
		w.bulkDocs = append(w.bulkDocs, docs.Bytes())
	}
	return w
}

// runBound is the endpoints' overlapped bound: the source read (_changes,
// then the _bulk_get requests) running concurrently with the target write
// (the _bulk_docs requests), no replicator logic; the wall time until both
// are done. inFlight requests are kept in flight on each side: 1 is the
// bound as defined (one request at a time); more keeps each server's queue
// full, which hides the client's own scheduling delays on a loaded
// machine (couchrep's 4 workers do that too).
func runBound(ctx context.Context, w *boundWork, srcDB, tgtDB string, inFlight int) (time.Duration, error) {
	var wg sync.WaitGroup
	var readErr, writeErr error
	each := func(bodies [][]byte, u string) error {
		next := make(chan []byte)
		errs := make(chan error, inFlight)
		var pool sync.WaitGroup
		for range inFlight {
			pool.Go(func() {
				for body := range next {
					if _, err := benchDo(ctx, http.MethodPost, u, body); err != nil {
						errs <- err
						for range next {
						}
						return
					}
				}
			})
		}
		for _, body := range bodies {
			next <- body
		}
		close(next)
		pool.Wait()
		close(errs)
		return <-errs
	}
	start := time.Now()
	wg.Go(func() {
		if _, readErr = benchDo(ctx, http.MethodGet, srcDB+"_changes?style=all_docs", nil); readErr != nil {
			return
		}
		readErr = each(w.bulkGets, srcDB+"_bulk_get?revs=true&latest=true&attachments=true")
	})
	wg.Go(func() { writeErr = each(w.bulkDocs, tgtDB+"_bulk_docs") })
	wg.Wait()
	if readErr != nil {
		return 0, readErr
	}
	return time.Since(start), writeErr
}

// docCount reads doc_count of db.
func docCount(db string) (int, error) {
	raw, err := benchDo(context.Background(), http.MethodGet, db, nil)
	if err != nil {
		return 0, err
	}
	var info struct {
		DocCount int `json:"doc_count"`
	}
	return info.DocCount, json.Unmarshal(raw, &info)
}

// cpuTime is this process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// heapPeak samples a runtime/metrics heap figure every 5 ms until stopped
// and returns the largest value seen above the value at the start (what
// the benchmark itself holds, e.g. the bound's prepared requests, is not
// the replicator's):
//
//   - heapObjects counts live and not yet collected objects: the heap's
//     real footprint, but with a large live heap (the side-by-side
//     benchmark keeps 100 MB of prepared requests for 50k documents) the
//     GC lets garbage grow to as much again before collecting;
//   - heapLive is what the last GC found live: the replicator's own
//     memory, whatever else the process holds.
type heapPeak struct {
	stop chan struct{}
	done chan uint64
}

const (
	heapObjects = "/memory/classes/heap/objects:bytes"
	heapLive    = "/gc/heap/live:bytes"
)

func startHeapPeak(metric string) *heapPeak {
	h := &heapPeak{stop: make(chan struct{}), done: make(chan uint64, 1)}
	go func() {
		s := []metrics.Sample{{Name: metric}}
		metrics.Read(s)
		base := s[0].Value.Uint64()
		var peak uint64
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			peak = max(peak, s[0].Value.Uint64())
			select {
			case <-h.stop:
				h.done <- peak - min(base, peak)
				return
			case <-t.C:
			}
		}
	}()
	return h
}

func (h *heapPeak) end() uint64 { close(h.stop); return <-h.done }

// resetPeakRSS resets the kernel's peak-RSS mark (VmHWM) of this process;
// false when the kernel does not allow it.
func resetPeakRSS() bool {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// peakRSS is VmHWM from /proc/self/status, in bytes.
func peakRSS() uint64 { return statusBytes("/proc/self/status", "VmHWM:") }

// statusBytes reads the "key  N kB" line of a /proc/<pid>/status file, in
// bytes (0 if unreadable).
func statusBytes(path, key string) uint64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// couchrepRun is one one-shot couchrep replication with CouchDB's default
// settings, in this process.
type couchrepRun struct {
	wall, cpu time.Duration
	heap      uint64
	written   int64
}

func runCouchrep(ctx context.Context, src, tgt, heapMetric string) (couchrepRun, error) {
	return runCouchrepWith(ctx, src, tgt, heapMetric, replicate.Options{ServerUUID: "bench", Logger: zerolog.Nop()})
}

// runCouchrepWith is runCouchrep with the engine's options o.
func runCouchrepWith(ctx context.Context, src, tgt, heapMetric string, o replicate.Options) (couchrepRun, error) {
	p, err := replicate.ParseParams([]byte(fmt.Sprintf(`{"source":%q,"target":%q}`, src, tgt)))
	if err != nil {
		return couchrepRun{}, err
	}
	runtime.GC()
	hp := startHeapPeak(heapMetric) // right after a GC: the base is what is live

	cpu0, start := cpuTime(), time.Now()
	res, err := replicate.New(p, o).Run(ctx)
	out := couchrepRun{wall: time.Since(start), cpu: cpuTime() - cpu0, heap: hp.end()}
	if err != nil {
		return out, err
	}
	if res.Stats.DocWriteFailures != 0 {
		return out, fmt.Errorf("couchrep: %d doc write failures", res.Stats.DocWriteFailures)
	}
	out.written = res.Stats.DocsWritten
	return out, nil
}

// pouchRun is one PouchDB.replicate run in a node process.
type pouchRun struct {
	MS        float64 `json:"ms"`
	Written   int64   `json:"docs_written"`
	Failures  int64   `json:"doc_write_failures"`
	CPUMillis float64 `json:"cpu_ms"`
}

func runPouchDB(ctx context.Context, script, src, tgt string, batch int) (pouchRun, error) {
	args := []string{script, src, tgt}
	if batch > 0 {
		args = append(args, strconv.Itoa(batch))
	}
	cmd := exec.CommandContext(ctx, "node", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return pouchRun{}, fmt.Errorf("node %v: %w: %s", args, err, stderr.Bytes())
	}
	var r pouchRun
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &r); err != nil {
		return r, fmt.Errorf("node output %q: %w", stdout.Bytes(), err)
	}
	if r.Failures != 0 {
		return r, fmt.Errorf("PouchDB: %d doc write failures", r.Failures)
	}
	return r, nil
}

// pouchScript returns integration/bench/replicate.js, skipping the
// benchmark when node or the pinned npm pouchdb is missing.
func pouchScript(b *testing.B) string {
	b.Helper()
	bin, err := testserver.PouchDBServerBin()
	if err != nil {
		b.Fatal(err)
	}
	dir := filepath.Dir(filepath.Dir(filepath.Dir(bin))) // integration/
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "pouchdb", "package.json")); err != nil {
		b.Skip("integration/node_modules/pouchdb not installed (run `make testdeps`)")
	}
	if _, err := exec.LookPath("node"); err != nil {
		b.Skip("node not found")
	}
	return filepath.Join(dir, "bench", "replicate.js")
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// BenchmarkReplicationSideBySide replicates the same source, one-shot, from
// one in-memory PouchDB Server into a fresh database on a second one, with
// four contestants per round, each into its own fresh target (deleted
// afterwards):
//
//   - couchrep: replication.Run in this process, CouchDB's default
//     settings (4 workers, batches of 500, _bulk_get, checkpoints);
//   - pouchdb-default and pouchdb-bs500: PouchDB.replicate (npm pouchdb
//     9.0.0) run by node (integration/bench/replicate.js) with default
//     settings and with batch_size 500;
//   - bound: the endpoints' overlapped bound, the source read (_changes,
//     then _bulk_get of 500 one at a time) running concurrently with the
//     target write (_bulk_docs new_edits=false of 500 one at a time), no
//     replicator logic;
//   - bound-4: the same with 4 requests in flight on each side.
//
// The order of the contestants rotates from round to round ($COUCHREP_BENCH_ROUNDS,
// default 3); the metrics are medians over the rounds. couchrep's CPU
// seconds (this process: the replicator only, the servers are other
// processes) are reported per 10,000 documents.
//
// $COUCHREP_BENCH_CONTESTANTS (comma-separated) runs only some of them
// (couchrep always).
//
// Corpora: 10,000 and 50,000 documents of about 1 KB, and 10,000 where 5%
// carry a 20 KB attachment. Run only these with
//
//	go test -run '^$' -bench SideBySide -benchtime 1x -timeout 60m ./integration/
func BenchmarkReplicationSideBySide(b *testing.B) {
	script := pouchScript(b)
	for _, set := range []benchSet{{n: 10000}, {n: 10000, attEvery: 20}, {n: 50000}} {
		b.Run(set.String(), func(b *testing.B) { benchSideBySide(b, script, set) })
	}
}

const (
	cCouchrep = "couchrep"
	cDefault  = "pouchdb-default"
	cBS500    = "pouchdb-bs500"
	cBound    = "bound"
	cBound4   = "bound-4"
)

func benchSideBySide(b *testing.B, script string, set benchSet) {
	s1, s2 := testserver.StartPouchDB(b), testserver.StartPouchDB(b)
	src := s1.CreateDB(b, "bench")
	seedBench(b, s1, src, set)
	work := prepareBound(b, src)
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	// Warm both servers up (Node's JIT) with one untimed replication.
	warm := s2.CreateDB(b, "warmup")
	if _, err := runCouchrep(ctx, src, warm, heapLive); err != nil {
		b.Fatal(err)
	}
	s2.Do(b, http.MethodDelete, warm, nil, http.StatusOK)

	srcCPU, tgtCPU := serverCPU(s1), serverCPU(s2)
	if srcCPU == nil || tgtCPU == nil {
		b.Log("pouchdb-server processes not found in /proc: no server CPU figures")
		srcCPU, tgtCPU = func() time.Duration { return 0 }, func() time.Duration { return 0 }
	}
	serverSecs := map[string][]float64{} // contestant+"-src"/"-tgt" -> CPU s per 10k docs
	rates := map[string][]float64{}
	var pctBound, pctBound4, xDefault, xBS500, cpuPer10k, heapMB []float64
	order := []string{cCouchrep, cDefault, cBS500, cBound, cBound4}
	if only := os.Getenv("COUCHREP_BENCH_CONTESTANTS"); only != "" {
		order = slices.DeleteFunc(order, func(c string) bool { return !slices.Contains(strings.Split(only, ","), c) })
		if !slices.Contains(order, cCouchrep) {
			b.Fatal("COUCHREP_BENCH_CONTESTANTS must include couchrep")
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for round := 0; round < benchRounds(); round++ {
			rot := append(slices.Clone(order[round%len(order):]), order[:round%len(order)]...)
			load := loadAvg()
			secs := map[string]float64{}
			line := []string{}
			for _, c := range rot {
				tgt := s2.CreateDB(b, fmt.Sprintf("t-%s-%d-%d", c, i, round))
				var d time.Duration
				var written int64 = -1
				var err error
				src0, tgt0 := srcCPU(), tgtCPU()
				switch c {
				case cCouchrep:
					var r couchrepRun
					r, err = runCouchrep(ctx, src, tgt, heapLive)
					d, written = r.wall, r.written
					cpuPer10k = append(cpuPer10k, r.cpu.Seconds()*10000/float64(set.n))
					heapMB = append(heapMB, float64(r.heap)/(1<<20))
					line = append(line, fmt.Sprintf("cpu=%.2fs live-heap=%.1fMB", r.cpu.Seconds(), float64(r.heap)/(1<<20)))
				case cDefault, cBS500:
					batch := 0
					if c == cBS500 {
						batch = 500
					}
					var r pouchRun
					r, err = runPouchDB(ctx, script, src, tgt, batch)
					d, written = time.Duration(r.MS*float64(time.Millisecond)), r.Written
					line = append(line, fmt.Sprintf("%s-cpu=%.2fs", c, r.CPUMillis/1000))
				case cBound:
					d, err = runBound(ctx, work, src, tgt, 1)
				case cBound4:
					d, err = runBound(ctx, work, src, tgt, 4)
				}
				if err != nil {
					b.Fatalf("%s: %v", c, err)
				}
				per10k := 10000 / float64(set.n)
				serverSecs[c+"-src"] = append(serverSecs[c+"-src"], (srcCPU()-src0).Seconds()*per10k)
				serverSecs[c+"-tgt"] = append(serverSecs[c+"-tgt"], (tgtCPU()-tgt0).Seconds()*per10k)
				line = append(line, fmt.Sprintf("%s-servers-cpu=%.2f+%.2fs", c, (srcCPU()-src0).Seconds(), (tgtCPU()-tgt0).Seconds()))
				if n, err := docCount(tgt); err != nil || n != set.n {
					b.Fatalf("%s: target doc_count %d (%v), want %d", c, n, err, set.n)
				}
				if written >= 0 && written != int64(set.n) {
					b.Fatalf("%s: docs_written %d, want %d", c, written, set.n)
				}
				s2.Do(b, http.MethodDelete, tgt, nil, http.StatusOK)
				secs[c] = d.Seconds()
				rates[c] = append(rates[c], float64(set.n)/d.Seconds())
			}
			ratio := func(c string, scale float64) float64 {
				if secs[c] == 0 {
					return math.NaN()
				}
				return scale * secs[c] / secs[cCouchrep]
			}
			pctBound = append(pctBound, ratio(cBound, 100))
			pctBound4 = append(pctBound4, ratio(cBound4, 100))
			xDefault = append(xDefault, ratio(cDefault, 1))
			xBS500 = append(xBS500, ratio(cBS500, 1))
			b.Logf("%s round %d (load %s → %s; order %v): couchrep %.0f docs/s, pouchdb-default %.0f, pouchdb-bs500 %.0f, bound %.0f, bound-4 %.0f; couchrep %.0f%% of bound, %.0f%% of bound-4; %s",
				set, round+1, load, loadAvg(), rot, float64(set.n)/secs[cCouchrep], float64(set.n)/secs[cDefault],
				float64(set.n)/secs[cBS500], float64(set.n)/secs[cBound], float64(set.n)/secs[cBound4],
				pctBound[len(pctBound)-1], pctBound4[len(pctBound4)-1], strings.Join(line, " "))
		}
	}
	b.StopTimer()
	for _, c := range order {
		b.ReportMetric(median(rates[c]), c+"-docs/s")
	}
	b.ReportMetric(median(pctBound), "%-of-bound")
	b.ReportMetric(median(pctBound4), "%-of-bound-4")
	b.ReportMetric(median(xDefault), "x-pouchdb-default")
	b.ReportMetric(median(xBS500), "x-pouchdb-bs500")
	b.ReportMetric(median(cpuPer10k), "cpu-s/10k-docs")
	b.ReportMetric(median(heapMB), "peak-live-heap-MB")
	for _, c := range order {
		b.ReportMetric(median(serverSecs[c+"-src"]), c+"-src-cpu-s/10k-docs")
		b.ReportMetric(median(serverSecs[c+"-tgt"]), c+"-tgt-cpu-s/10k-docs")
	}
}

// BenchmarkReplicationMemory replicates N documents of about 1 KB one-shot
// between two in-memory PouchDB Servers with couchrep alone and reports the
// replicator's peak Go heap (sampled every 5 ms) and this process's peak
// RSS (VmHWM, reset before the run) for N = 10,000 and 100,000: memory must
// not grow with the document count.
//
//	go test -run '^$' -bench ReplicationMemory -benchtime 1x -timeout 60m ./integration/
func BenchmarkReplicationMemory(b *testing.B) {
	for _, n := range []int{10000, 100000} {
		b.Run(fmt.Sprintf("docs=%d", n), func(b *testing.B) {
			s1, s2 := testserver.StartPouchDB(b), testserver.StartPouchDB(b)
			src := s1.CreateDB(b, "bench")
			seedBench(b, s1, src, benchSet{n: n})
			ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
			defer cancel()
			var heap, rss uint64
			var wall, cpu time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				tgt := s2.CreateDB(b, fmt.Sprintf("t%d", i))
				runtime.GC()
				debug.FreeOSMemory()
				if !resetPeakRSS() {
					b.Log("cannot reset VmHWM: peak RSS includes the seeding")
				}
				r, err := runCouchrep(ctx, src, tgt, heapObjects)
				if err != nil {
					b.Fatal(err)
				}
				if r.written != int64(n) {
					b.Fatalf("docs_written %d, want %d", r.written, n)
				}
				heap, rss = max(heap, r.heap), max(rss, peakRSS())
				wall += r.wall
				cpu += r.cpu
				s2.Do(b, http.MethodDelete, tgt, nil, http.StatusOK)
			}
			b.StopTimer()
			b.ReportMetric(float64(n*b.N)/wall.Seconds(), "docs/s")
			b.ReportMetric(cpu.Seconds()*10000/float64(n*b.N), "cpu-s/10k-docs")
			b.ReportMetric(float64(heap)/(1<<20), "peak-heap-MB")
			b.ReportMetric(float64(rss)/(1<<20), "peak-RSS-MB")
			b.Logf("docs=%d load %s", n, loadAvg())
		})
	}
}

// serverCPU returns a function reading the CPU time (user+system) used so
// far by the pouchdb-server process listening on s's port, found by its
// command line; nil when it cannot be found.
func serverCPU(s *testserver.Server) func() time.Duration {
	pid := serverPID(s)
	if pid == 0 {
		return nil
	}
	return func() time.Duration { return procCPU(pid) }
}

// serverPID is the pid of the pouchdb-server process listening on s's
// port, found by its command line; 0 when it cannot be found.
func serverPID(s *testserver.Server) int {
	u, err := url.Parse(s.URL)
	if err != nil {
		return 0
	}
	want := []byte("--port\x00" + u.Port() + "\x00")
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && bytes.Contains(cmd, want) {
			return pid
		}
	}
	return 0
}

// procCPU is the CPU time (user+system) process pid used so far, from
// /proc/pid/stat; 0 when unreadable.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the parenthesised command: state is field 3,
	// utime and stime are fields 14 and 15, in clock ticks (100 Hz).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}
