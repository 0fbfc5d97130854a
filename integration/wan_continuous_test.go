package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/sharedfeed"
	"github.com/couchrep/couchrep/internal/testserver"
)

// awaitDocs waits (polling the target's own server, with a deadline) until
// every id is on the target; it fails the test naming the first missing.
func awaitDocs(t testing.TB, s *testserver.Server, tgt string, ids []string, within time.Duration) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	deadline := time.Now().Add(within)
	for _, id := range ids {
		for {
			resp, err := client.Get(strings.TrimSuffix(tgt, "/") + "/" + id)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s is not on the target within %s", id, within)
			}
			time.Sleep(10 * time.Millisecond) // polling another server's state
		}
	}
}

// TestWANQuietFeed: a continuous replication's feed goes quiet behind a
// proxy (toxiproxy's timeout toxic with timeout 0 drops every byte of the
// answers, heartbeats included, and keeps the connection open). couchrep
// must notice it within connection_timeout (a couch.ErrFeedStalled
// "changes feed failed, resuming" warning, or, when not even the headers
// came, the client's "request failed, retrying" of the feed's request: a
// re-open as well), re-open the feed from where it was once the link passes
// data again, and replicate the writes made after. For the job's own feed
// and for the node's shared feed.
func TestWANQuietFeed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PouchDB Server and toxiproxy")
	}
	s := testserver.StartPouchDB(t)
	tp := testserver.StartToxiproxy(t)
	for i, shared := range []bool{false, true} {
		name := "own_feed"
		if shared {
			name = "shared_feed"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l := tp.Link(t, "quiet-"+name, s.URL)
			l.Latency(t, 10*time.Millisecond, 2*time.Millisecond)
			src := s.CreateDB(t, fmt.Sprintf("qsrc-%d", i))
			tgt := s.CreateDB(t, fmt.Sprintf("qtgt-%d", i))
			put := func(from, to int) []string {
				var docs []map[string]any
				var ids []string
				for j := from; j < to; j++ {
					id := fmt.Sprintf("q-%03d", j)
					ids = append(ids, id)
					docs = append(docs, testserver.Doc(id, []string{"1-q"}, map[string]any{"j": j}))
				}
				s.PutRevs(t, src, docs...)
				return ids
			}
			first := put(0, 5)
			p := params(t, map[string]any{
				"source": l.URL + fmt.Sprintf("qsrc-%d/", i), "target": tgt, "continuous": true,
				"connection_timeout": 1000, "retries_per_request": 3, "worker_batch_size": 10,
				// No checkpoint while the link is quiet: a checkpoint that
				// cannot reach the source crashes the job (as CouchDB's),
				// which is not what this test is about.
				"checkpoint_interval": 600000,
			})
			logs := &logLines{}
			o := replicate.Options{ServerUUID: "quiet-uuid", Logger: zerolog.New(logs).With().Timestamp().Logger().Level(zerolog.DebugLevel),
				RetryBackoff: 50 * time.Millisecond}
			if shared {
				o.Feeds = sharedfeed.New(sharedfeed.Options{})
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := replicate.New(p, o).Run(ctx)
				done <- err
			}()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			}()
			awaitDocs(t, s, tgt, first, time.Minute)

			toxic := l.Timeout(t, testserver.Downstream, 0) // answers dropped, connections kept
			stalled := func() bool {
				logs.mu.Lock()
				defer logs.mu.Unlock()
				for _, m := range logs.lines {
					// The feed's body went quiet (the changes reader
					// re-opens it), or it was quiet from its headers on
					// (the client sends it again: a re-open too).
					e := fmt.Sprint(m["error"])
					switch m["message"] {
					case "replication: changes feed failed, resuming":
						if strings.Contains(e, "changes feed stalled") {
							return true
						}
					case "couch: request failed, retrying":
						if strings.Contains(e, "/_changes?feed=continuous") && strings.Contains(e, "stalled") {
							return true
						}
					}
				}
				return false
			}
			for deadline := time.Now().Add(time.Minute); !stalled(); {
				if time.Now().After(deadline) {
					t.Fatalf("no stalled feed noticed within a minute; warnings: %s", logs.errorsOf("replication: changes feed failed, resuming"))
				}
				select {
				case err := <-done:
					done <- nil // for the deferred wait
					t.Fatalf("the run ended while the feed was quiet: %v", err)
				case <-time.After(10 * time.Millisecond): // polling the log for the condition
				}
			}
			l.RemoveToxic(t, toxic)
			later := put(5, 15)
			awaitDocs(t, s, tgt, later, time.Minute)
			verify(t, s, s, src, tgt, nil)
			t.Logf("warnings: %s", logs.warnings())
		})
	}
}

// errorsOf lists the "error" fields of the lines whose message is msg.
func (l *logLines) errorsOf(msg string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, m := range l.lines {
		if m["message"] == msg {
			out = append(out, fmt.Sprint(m["error"]))
		}
	}
	return out
}
