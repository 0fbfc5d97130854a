package replicate

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// feedServer makes f answer feed=continuous _changes requests on db as
// CouchDB does: the rows since since= one per line, then further rows as
// they arrive (notify is signalled after a put), a newline every
// heartbeat= while idle (heartbeat overrides timeout, so such a feed never
// ends), else {"last_seq"} once timeout= passes without a row. It counts
// the requests and the heartbeats it sent, and breaks the feeds open at a
// dropFeeds call.
type feedServer struct {
	f      *fakeCouch
	db     string
	notify chan struct{}

	mu       sync.Mutex
	requests []string // raw queries, in order
	open     int      // feeds being answered
	beats    int
	beat     chan struct{} // signalled after each heartbeat
	drop     chan struct{}
}

func newFeedServer(f *fakeCouch, db string) *feedServer {
	fs := &feedServer{f: f, db: db, notify: make(chan struct{}, 1), beat: make(chan struct{}, 1), drop: make(chan struct{})}
	f.hook = fs.serve
	return fs
}

func (fs *feedServer) queries() []string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return slices.Clone(fs.requests)
}

func (fs *feedServer) counts() (requests, beats int) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return len(fs.requests), fs.beats
}

// openFeeds is the number of feeds being answered.
func (fs *feedServer) openFeeds() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.open
}

// dropFeeds ends every open feed as a broken connection would.
func (fs *feedServer) dropFeeds() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	close(fs.drop)
	fs.drop = make(chan struct{})
}

func (fs *feedServer) serve(w http.ResponseWriter, r *http.Request) bool {
	f, db := fs.f, fs.db
	if r.URL.Path != "/"+db+"/_changes" || r.URL.Query().Get("feed") != "continuous" {
		return false
	}
	fs.mu.Lock()
	fs.requests = append(fs.requests, r.URL.RawQuery)
	fs.open++
	drop := fs.drop
	fs.mu.Unlock()
	defer func() {
		fs.mu.Lock()
		fs.open--
		fs.mu.Unlock()
	}()
	sent := 0
	fmt.Sscanf(r.URL.Query().Get("since"), "%d", &sent)
	timeout := time.Minute
	if ms, err := strconv.Atoi(r.URL.Query().Get("timeout")); err == nil {
		timeout = time.Duration(ms) * time.Millisecond
	}
	var beat <-chan time.Time
	if ms, err := strconv.Atoi(r.URL.Query().Get("heartbeat")); err == nil && ms > 0 {
		t := time.NewTicker(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		beat = t.C
	}
	w.WriteHeader(http.StatusOK)
	send := func() {
		f.mu.Lock()
		d := f.dbs[db]
		for seq := sent + 1; seq <= d.seq; seq++ {
			for id, doc := range d.docs {
				if doc.seq == seq {
					row, _ := json.Marshal(map[string]any{"seq": seqStr(seq), "id": id,
						"changes": []any{map[string]string{"rev": doc.rev}}})
					w.Write(append(row, '\n'))
				}
			}
		}
		sent = d.seq
		f.mu.Unlock()
		w.(http.Flusher).Flush()
	}
	send()
	end := time.NewTimer(timeout)
	defer end.Stop()
	for {
		select {
		case <-r.Context().Done():
			return true
		case <-drop:
			panic(http.ErrAbortHandler) // the connection breaks mid-stream
		case <-fs.notify:
			send()
			if beat == nil {
				end.Reset(timeout)
			}
		case <-beat:
			w.Write([]byte("\n"))
			w.(http.Flusher).Flush()
			fs.mu.Lock()
			fs.beats++
			fs.mu.Unlock()
			select {
			case fs.beat <- struct{}{}:
			default:
			}
		case <-end.C:
			if beat != nil {
				continue
			}
			fmt.Fprintf(w, `{"last_seq":%q,"pending":0}`+"\n", seqStr(sent))
			return true
		}
	}
}

// continuousSource is a fake server with databases src (holding doc "a",
// its continuous feed served by the returned feedServer) and tgt.
func continuousSource(t *testing.T) (*fakeCouch, *feedServer) {
	f := newFakeCouch(t)
	f.addDB("src")
	f.addDB("tgt")
	f.put("src", map[string]any{"_id": "a"})
	return f, newFeedServer(f, "src")
}

// progressOptions are a test run's options whose OnProgress keeps the
// latest report in the returned channel.
func progressOptions() (chan Stats, Options) {
	progress := make(chan Stats, 1)
	return progress, Options{ServerUUID: "u", Logger: zerolog.Nop(), RetryBackoff: time.Millisecond,
		ProgressInterval: 5 * time.Millisecond, OnProgress: func(s Stats) {
			select {
			case <-progress:
			default:
			}
			progress <- s
		}}
}

// awaitWritten waits until a progress report counts n docs written; it
// fails the test if the run ends (done) first or a minute passes.
func awaitWritten[T any](t *testing.T, progress <-chan Stats, done <-chan T, n int64) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case s := <-progress:
			if s.DocsWritten >= n {
				return
			}
		case o := <-done:
			t.Fatalf("replication ended while waiting for %d docs: %+v", n, o)
		case <-deadline:
			t.Fatalf("%d docs not written within a minute", n)
		}
	}
}

// TestContinuousIdleFeed: a continuous replication started with Start
// replicates what is there, waits on its feed, replicates a change that
// arrives later (a partial batch flushed once the feed is quiet, a worker
// started for it), and when its context is cancelled checkpoints and calls
// done once, without an error.
func TestContinuousIdleFeed(t *testing.T) {
	f, fs := continuousSource(t)

	progress, o := progressOptions()
	p := fakeParams(t, `,"continuous":true`, f.URL+"/src", f.URL+"/tgt")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type outcome struct {
		res Result
		err error
	}
	done := make(chan outcome, 2)
	New(p, o).Start(ctx, func(res Result, err error) { done <- outcome{res, err} })

	written := func(n int64) { t.Helper(); awaitWritten(t, progress, done, n) }
	written(1)
	f.put("src", map[string]any{"_id": "b"})
	fs.notify <- struct{}{}
	written(2)

	cancel()
	o2 := <-done
	if o2.err != nil {
		t.Fatalf("stopped continuous replication: %v", o2.err)
	}
	select {
	case <-done:
		t.Fatal("done called twice")
	default:
	}
	if o2.res.Stats.DocsWritten != 2 {
		t.Errorf("docs written %d, want 2", o2.res.Stats.DocsWritten)
	}
	f.mu.Lock()
	_, okA := f.dbs["tgt"].docs["a"]
	_, okB := f.dbs["tgt"].docs["b"]
	f.mu.Unlock()
	if !okA || !okB {
		t.Errorf("target has a: %v, b: %v", okA, okB)
	}
	base, _, _ := ID(p, "u")
	for _, db := range []string{"src", "tgt"} {
		ck := f.localDoc(db, base)
		if ck == nil || ck["source_last_seq"] != seqStr(2) {
			t.Errorf("%s checkpoint %v, want source_last_seq %s", db, ck, seqStr(2))
		}
	}
	if !strings.HasPrefix(o2.res.ID, base) {
		t.Errorf("result id %q", o2.res.ID)
	}
}

// TestContinuousFeedIsOneLongRequest: a continuous replication holds one
// _changes request with heartbeat= (a third of connection_timeout) and no
// timeout=, so an idle job sends no requests while the server heartbeats;
// changes arrive on the same request; after the connection breaks it
// re-opens the feed once, from the last seq it saw.
func TestContinuousFeedIsOneLongRequest(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for heartbeats (seconds)")
	}
	f, fs := continuousSource(t)

	progress, o := progressOptions()
	p := fakeParams(t, `,"continuous":true,"connection_timeout":3000`, f.URL+"/src", f.URL+"/tgt")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	New(p, o).Start(ctx, func(_ Result, err error) { done <- err })
	written := func(n int64) { t.Helper(); awaitWritten(t, progress, done, n) }
	heartbeats := func(n int) {
		t.Helper()
		_, from := fs.counts()
		deadline := time.After(time.Minute)
		for {
			if _, b := fs.counts(); b >= from+n {
				return
			}
			select {
			case <-fs.beat:
			case err := <-done:
				t.Fatalf("replication ended while idle: %v", err)
			case <-deadline:
				t.Fatalf("fewer than %d heartbeats within a minute", n)
			}
		}
	}
	written(1)
	heartbeats(3)
	if n, _ := fs.counts(); n != 1 {
		t.Fatalf("%d _changes requests after three idle heartbeats, want 1: %q", n, fs.queries())
	}
	q, _ := url.ParseQuery(fs.queries()[0])
	if q.Get("heartbeat") != "1000" || q.Has("timeout") {
		t.Errorf("feed query %q: want heartbeat=1000 and no timeout", fs.queries()[0])
	}
	f.put("src", map[string]any{"_id": "b"})
	fs.notify <- struct{}{}
	written(2)
	heartbeats(1)
	if n, _ := fs.counts(); n != 1 {
		t.Fatalf("%d _changes requests after a change on the open feed, want 1", n)
	}

	fs.dropFeeds()
	heartbeats(2) // on the re-opened feed
	if n, _ := fs.counts(); n != 2 {
		t.Fatalf("%d _changes requests after one broken connection, want 2: %q", n, fs.queries())
	}
	q, _ = url.ParseQuery(fs.queries()[1])
	if q.Get("since") != seqStr(2) {
		t.Errorf("re-opened feed since=%q, want %q", q.Get("since"), seqStr(2))
	}
	f.put("src", map[string]any{"_id": "c"})
	fs.notify <- struct{}{}
	written(3)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("stopped: %v", err)
	}
}
