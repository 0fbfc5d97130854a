package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/sharedfeed"
	"github.com/couchrep/couchrep/internal/testserver"
)

// runningJob is a continuous replication run by replicate.Start.
type runningJob struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// startJob starts a continuous replication of doc with o; stop cancels it
// and waits for it.
func startJob(t *testing.T, doc map[string]any, o replicate.Options) *runningJob {
	t.Helper()
	doc["continuous"] = true
	ctx, cancel := context.WithCancel(context.Background())
	j := &runningJob{cancel: cancel, done: make(chan struct{})}
	o.ServerUUID, o.Logger = "test-uuid", zerolog.Nop()
	replicate.New(params(t, doc), o).Start(ctx, func(_ replicate.Result, err error) {
		j.err = err
		close(j.done)
	})
	t.Cleanup(j.stop)
	return j
}

func (j *runningJob) stop() {
	j.cancel()
	<-j.done
}

// ended reports whether the job's run has returned.
func (j *runningJob) ended() bool {
	select {
	case <-j.done:
		return true
	default:
		return false
	}
}

// awaitLeaves waits until the target db holds exactly want's leaves
// (polling the servers' state), failing with the difference after timeout.
func awaitLeaves(t *testing.T, ts *testserver.Server, tgt string, want map[string][]map[string]any, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := leaves(t, ts, tgt)
		if reflect.DeepEqual(got, want) {
			return
		}
		if time.Now().After(deadline) {
			for id, w := range want {
				if !reflect.DeepEqual(w, got[id]) {
					t.Errorf("%s: doc %q differs:\n want %v\n got  %v", tgt, id, w, got[id])
				}
			}
			for id := range got {
				if _, ok := want[id]; !ok {
					t.Errorf("%s: unexpected doc %q", tgt, id)
				}
			}
			t.Fatalf("%s did not converge within %s", tgt, timeout)
		}
		time.Sleep(100 * time.Millisecond) // other processes' state: poll
	}
}

func subset(all map[string][]map[string]any, ids ...string) map[string][]map[string]any {
	out := map[string][]map[string]any{}
	for _, id := range ids {
		if l, ok := all[id]; ok {
			out[id] = l
		}
	}
	return out
}

// TestSharedFeedEquivalence runs the same continuous replications twice
// against PouchDB Server, once on feeds of their own and once on one shared
// feed, and checks that both give the same targets, exactly the source's
// leaves (conflicts and deletions included): doc_ids jobs (several to one
// target) and unfiltered jobs, some started before any write, some while
// documents are being written, updated, deleted and made to conflict, one
// after everything (it catches up in pages). The
// shared jobs talk to the server through a counting proxy, which sees one
// continuous feed for all of them.
func TestSharedFeedEquivalence(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDB(t)
	src := s.CreateDB(t, "src")
	proxy := newRequestCounter(t, s.URL)
	psrc := dbVia(s, proxy.URL, "src")
	hub := sharedfeed.New(sharedfeed.Options{Buffer: 2})

	const docs = 16
	id := func(i int) string { return fmt.Sprintf("d%02d", i) }
	// Targets: "ids-<mode>" for the doc_ids jobs (job k replicates docs
	// 2k and 2k+1), "all-<mode>" for the unfiltered one.
	modes := []string{"own", "shared"}
	for _, m := range modes {
		s.CreateDB(t, "ids-"+m)
		s.CreateDB(t, "all-"+m)
		s.CreateDB(t, "late-"+m)
	}
	start := func(k int) {
		for _, m := range modes {
			source, o := src, replicate.Options{}
			if m == "shared" {
				source, o.Feeds = psrc, hub
			}
			doc := map[string]any{"source": source, "target": s.DBURL("ids-" + m)}
			switch {
			case k >= 0:
				doc["doc_ids"] = []any{id(2 * k), id(2*k + 1)}
			case k == -1:
				doc["target"] = s.DBURL("all-" + m)
			default: // joins last, catching up in pages of 3 rows
				doc["target"], doc["worker_batch_size"] = s.DBURL("late-"+m), 3
			}
			startJob(t, doc, o)
		}
	}

	// Before the jobs: plain docs, a conflict, a deletion.
	for i := 0; i < docs; i += 2 {
		s.PutRevs(t, src, testserver.Doc(id(i), []string{"1-a"}, map[string]any{"n": i}))
	}
	s.PutRevs(t, src, testserver.Doc(id(0), []string{"2-b", "1-a"}, map[string]any{"side": "b"}),
		testserver.Doc(id(0), []string{"2-c", "1-a"}, map[string]any{"side": "c"}),
		testserver.Deleted(testserver.Doc(id(2), []string{"2-x", "1-a"}, nil)))
	start(-1)
	for k := 0; k < docs/4; k++ {
		start(k)
	}
	// Jobs join while documents are written: each start is followed by
	// writes to docs of jobs already running and of jobs yet to start.
	for k := docs / 4; k < docs/2; k++ {
		s.PutRevs(t, src, testserver.Doc(id(2*k+1), []string{"1-a"}, map[string]any{"late": k}),
			testserver.Doc(id(2*(k-docs/4)+1), []string{"1-a"}, map[string]any{"early": k}))
		start(k)
		s.PutRevs(t, src, testserver.Doc(id(2*k), []string{"2-u", "1-a"}, map[string]any{"updated": k}))
	}
	// After every job runs: updates, a new conflict branch, deletions
	// (of a conflict's winner too), and a doc no job but the unfiltered
	// one replicates.
	s.PutRevs(t, src,
		testserver.Doc(id(0), []string{"3-d", "2-c", "1-a"}, map[string]any{"side": "d"}),
		testserver.Doc(id(4), []string{"2-y", "1-a"}, map[string]any{"branch": "y"}),
		testserver.Doc(id(4), []string{"2-z", "1-a"}, map[string]any{"branch": "z"}),
		testserver.Deleted(testserver.Doc(id(6), []string{"3-del", "2-u", "1-a"}, nil)),
		testserver.Deleted(testserver.Doc(id(4), []string{"3-del", "2-z", "1-a"}, nil)),
		testserver.Doc("other", []string{"1-o"}, map[string]any{"only": "all"}))
	for i := 1; i < docs; i += 4 {
		s.PutRevs(t, src, testserver.Doc(id(i), []string{"2-v", "1-a"}, map[string]any{"v": 2}))
	}
	// A burst of more rows than a subscription buffers (2 here): the
	// unfiltered job may fall behind and catch up on its own.
	var burst []map[string]any
	for i := range 40 {
		burst = append(burst, testserver.Doc(fmt.Sprintf("burst%02d", i), []string{"1-b"}, map[string]any{"i": i}))
	}
	s.PutRevs(t, src, burst...)
	start(-2)

	want := leaves(t, s, src)
	var ids []string
	for i := range docs {
		ids = append(ids, id(i))
	}
	for _, m := range modes {
		awaitLeaves(t, s, s.DBURL("ids-"+m), subset(want, ids...), 2*time.Minute)
		awaitLeaves(t, s, s.DBURL("all-"+m), want, 2*time.Minute)
		awaitLeaves(t, s, s.DBURL("late-"+m), want, 2*time.Minute)
	}
	if got := leaves(t, s, s.DBURL("ids-shared")); !reflect.DeepEqual(got, leaves(t, s, s.DBURL("ids-own"))) {
		t.Errorf("doc_ids targets differ: shared %v", got)
	}
	st := hub.Stats()
	if st.Feeds != 1 || st.Subscriptions != docs/2+2 {
		t.Errorf("hub: %+v, want 1 feed with %d subscriptions", st, docs/2+2)
	}
	t.Logf("%d subscriptions fell behind and caught up on their own", st.Overflows)
	if open := proxy.open.Load(); open != 1 {
		t.Errorf("%d continuous feeds open at the server for the shared jobs, want 1", open)
	}
}

// cutter is a TCP forwarder in front of a server that a test can break:
// cut drops every connection (and, with down, refuses new ones until
// restore).
type cutter struct {
	t      *testing.T
	addr   string
	target string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
}

func newCutter(t *testing.T, target string) *cutter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cutter{t: t, addr: ln.Addr().String(), target: target, conns: map[net.Conn]struct{}{}}
	c.serve(ln)
	t.Cleanup(func() { c.cut(true) })
	return c
}

func (c *cutter) serve(ln net.Listener) {
	c.mu.Lock()
	c.ln = ln
	c.mu.Unlock()
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", c.target)
			if err != nil {
				in.Close()
				continue
			}
			c.mu.Lock()
			c.conns[in], c.conns[out] = struct{}{}, struct{}{}
			c.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); out.Close() }()
			go func() { _, _ = io.Copy(in, out); in.Close() }()
		}
	}()
}

// cut closes every connection; down also stops accepting new ones.
func (c *cutter) cut(down bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if down && c.ln != nil {
		c.ln.Close()
		c.ln = nil
	}
	for conn := range c.conns {
		conn.Close()
	}
	clear(c.conns)
}

// restore accepts connections again on the same address.
func (c *cutter) restore() {
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		c.t.Fatalf("restore %s: %v", c.addr, err)
	}
	c.serve(ln)
}

// TestSharedFeedFailure checks what a shared feed's failure does, against
// two PouchDB Servers (one behind a forwarder the test breaks) and jobs of
// both on one hub: a feed cut mid-stream makes every subscriber of that
// source resume (each through its own retry path) and keep replicating;
// a source that stays down ends every job of that source with
// changes_req_failed, while the other source's jobs keep running and
// replicating; once the source is back, restarted jobs replicate again,
// documents written during the outage included.
func TestSharedFeedFailure(t *testing.T) {
	skipShort(t)
	s1, s2, ts := testserver.StartPouchDB(t), testserver.StartPouchDB(t), testserver.StartPouchDB(t)
	s1.CreateDB(t, "src")
	src2 := s2.CreateDB(t, "src")
	tgt := ts.CreateDB(t, "tgt")
	s1u, _ := url.Parse(s1.URL)
	cut := newCutter(t, s1u.Host)
	src1 := dbVia(s1, "http://"+cut.addr, "src")
	hub := sharedfeed.New(sharedfeed.Options{})

	const perSource = 4
	// failures counts each job's changes-feed failures, by doc id.
	var fmu sync.Mutex
	failures := map[string]int{}
	failed := func(prefix string) (jobs int) {
		fmu.Lock()
		defer fmu.Unlock()
		for i := range perSource {
			if failures[fmt.Sprintf("%s%d", prefix, i)] > 0 {
				jobs++
			}
		}
		return jobs
	}
	options := func(id string) replicate.Options {
		return replicate.Options{Feeds: hub, RetryBackoff: 50 * time.Millisecond,
			Endpoints: replicate.EndpointConfig{ErrorBudget: -1},
			OnEvent: func(e replicate.Event) {
				if e == replicate.EventChangesReadFailed {
					fmu.Lock()
					failures[id]++
					fmu.Unlock()
				}
			}}
	}
	doc := func(source string, id string) map[string]any {
		return map[string]any{"source": source, "target": tgt, "doc_ids": []any{id}, "retries_per_request": 3}
	}
	start := func(source, prefix string) []*runningJob {
		var jobs []*runningJob
		for i := range perSource {
			id := fmt.Sprintf("%s%d", prefix, i)
			jobs = append(jobs, startJob(t, doc(source, id), options(id)))
		}
		return jobs
	}
	// write stores generation gen of the source's docs (history
	// gen-x ... 1-x: one line of revisions).
	write := func(s *testserver.Server, db, prefix string, gen int) {
		for i := range perSource {
			s.PutRevs(t, db, testserver.Doc(fmt.Sprintf("%s%d", prefix, i), history("x", gen), map[string]any{"gen": gen}))
		}
	}
	jobs1, jobs2 := start(src1, "a"), start(src2, "b")
	awaitSubscriptions(t, hub, 2*perSource)
	write(s1, s1.DBURL("src"), "a", 1)
	write(s2, src2, "b", 1)
	all := func() map[string][]map[string]any {
		w := leaves(t, s1, s1.DBURL("src"))
		for id, l := range leaves(t, s2, src2) {
			w[id] = l
		}
		return w
	}
	awaitLeaves(t, ts, tgt, all(), time.Minute)

	// A cut mid-stream: every subscriber of source 1 sees the failure and
	// resumes; nothing ends.
	cut.cut(false)
	deadline := time.Now().Add(time.Minute)
	for failed("a") < perSource {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the source's %d jobs saw the feed fail after the cut", failed("a"), perSource)
		}
		time.Sleep(20 * time.Millisecond) // the jobs' state: poll
	}
	awaitSubscriptions(t, hub, 2*perSource)
	write(s1, s1.DBURL("src"), "a", 2)
	awaitLeaves(t, ts, tgt, all(), time.Minute)
	if n := failed("b"); n != 0 {
		t.Errorf("%d jobs of the other source saw a feed failure", n)
	}
	for _, j := range append(jobs1, jobs2...) {
		if j.ended() {
			t.Fatalf("a job ended after a transient cut: %v", j.err)
		}
	}

	// Source 1 down for good: its jobs crash with the reason, source 2's
	// jobs keep replicating.
	cut.cut(true)
	for i, j := range jobs1 {
		select {
		case <-j.done:
			if !errors.Is(j.err, replicate.ErrChangesFailed) {
				t.Errorf("job a%d ended with %v, want %v", i, j.err, replicate.ErrChangesFailed)
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("job a%d still running 2 minutes after its source went down", i)
		}
	}
	write(s2, src2, "b", 2)
	want := all()
	s1.PutRevs(t, s1.DBURL("src"), testserver.Doc("a0", history("x", 3), map[string]any{"during": "outage"}))
	awaitLeaves(t, ts, tgt, want, time.Minute)
	for _, j := range jobs2 {
		if j.ended() {
			t.Fatalf("a job of the other source ended: %v", j.err)
		}
	}

	// Back: jobs restarted (as the job server does after the backoff)
	// subscribe again, the feed reopens, and the outage's writes arrive.
	cut.restore()
	start(src1, "a")
	write(s1, s1.DBURL("src"), "a", 4)
	awaitLeaves(t, ts, tgt, all(), time.Minute)
	if st := hub.Stats(); st.Feeds != 2 || st.Subscriptions != 2*perSource {
		t.Errorf("hub: %+v, want 2 feeds with %d subscriptions", st, 2*perSource)
	}
}

// awaitSubscriptions waits until hub has n subscriptions.
func awaitSubscriptions(t *testing.T, hub *sharedfeed.Hub, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for hub.Stats().Subscriptions != n {
		if time.Now().After(deadline) {
			t.Fatalf("hub: %+v, want %d subscriptions", hub.Stats(), n)
		}
		time.Sleep(20 * time.Millisecond) // the jobs' state: poll
	}
}
