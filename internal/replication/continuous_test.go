package replication

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// continuousFeed makes f answer feed=continuous _changes requests on db
// as CouchDB does: the rows since since= one per line, then further rows
// as they arrive (notify is signalled after a put), until timeout= passes
// without a row; then {"last_seq"}.
func continuousFeed(f *fakeCouch, db string, notify <-chan struct{}) func(w http.ResponseWriter, r *http.Request) bool {
	return func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/"+db+"/_changes" || r.URL.Query().Get("feed") != "continuous" {
			return false
		}
		sent := 0
		fmt.Sscanf(r.URL.Query().Get("since"), "%d", &sent)
		timeout := time.Minute
		if ms, err := strconv.Atoi(r.URL.Query().Get("timeout")); err == nil {
			timeout = time.Duration(ms) * time.Millisecond
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
			case <-notify:
				send()
				end.Reset(timeout)
			case <-end.C:
				fmt.Fprintf(w, `{"last_seq":%q,"pending":0}`+"\n", seqStr(sent))
				return true
			}
		}
	}
}

// TestContinuousIdleFeed: a continuous replication started with Start
// replicates what is there, waits on its feed, replicates a change that
// arrives later (a partial batch flushed once the feed is quiet, a worker
// started for it), and when its context is cancelled checkpoints and calls
// done once, without an error.
func TestContinuousIdleFeed(t *testing.T) {
	f := newFakeCouch(t)
	f.addDB("src")
	f.addDB("tgt")
	f.put("src", map[string]any{"_id": "a"})
	notify := make(chan struct{}, 1)
	f.hook = continuousFeed(f, "src", notify)

	progress := make(chan Stats, 1)
	o := Options{ServerUUID: "u", Logger: zerolog.Nop(), RetryBackoff: time.Millisecond,
		ProgressInterval: 5 * time.Millisecond, OnProgress: func(s Stats) {
			select {
			case <-progress:
			default:
			}
			progress <- s
		}}
	p := fakeParams(t, `,"continuous":true`, f.URL+"/src", f.URL+"/tgt")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type outcome struct {
		res Result
		err error
	}
	done := make(chan outcome, 2)
	New(p, o).Start(ctx, func(res Result, err error) { done <- outcome{res, err} })

	written := func(n int64) {
		t.Helper()
		deadline := time.After(time.Minute)
		for {
			select {
			case s := <-progress:
				if s.DocsWritten >= n {
					return
				}
			case o := <-done:
				t.Fatalf("replication ended while waiting for %d docs: %v", n, o.err)
			case <-deadline:
				t.Fatalf("%d docs not written within a minute", n)
			}
		}
	}
	written(1)
	f.put("src", map[string]any{"_id": "b"})
	notify <- struct{}{}
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
