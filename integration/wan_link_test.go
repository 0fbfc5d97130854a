package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/testserver"
)

// TestWANLink pulls through toxiproxy (the source behind one link with
// 10 ± 2 ms each way, the target local) while a toxic acts on every
// connection of the link: for the whole run (slicer), or from a point of
// the run (the target holding 60 documents) until toxiproxy's log shows
// that couchrep opened a new connection (reset_peer, limit_data,
// timeout). The replication must complete exactly, and toxiproxy's own
// counters show the traffic. The target is not behind the link: a toxic
// that closes a connection aborts a multipart PUT in flight, and PouchDB
// Server then exits (integration/README.md); toxics act on the answers'
// direction only for the same reason.
func TestWANLink(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PouchDB Server and toxiproxy")
	}
	s := testserver.StartPouchDB(t)
	tp := testserver.StartToxiproxy(t)

	cases := []struct {
		name string
		// whole: the toxic is there from the start to the end.
		whole bool
		toxic func(t *testing.T, l *testserver.Link) string
	}{
		{"latency only", true, nil},
		{"slicer", true, func(t *testing.T, l *testserver.Link) string {
			return l.Slicer(t, testserver.Downstream, 100, 50, 20*time.Microsecond)
		}},
		{"reset_peer", false, func(t *testing.T, l *testserver.Link) string {
			return l.ResetPeer(t, testserver.Downstream, 0)
		}},
		{"limit_data", false, func(t *testing.T, l *testserver.Link) string {
			return l.LimitData(t, testserver.Downstream, 1500)
		}},
		{"timeout", false, func(t *testing.T, l *testserver.Link) string {
			return l.Timeout(t, testserver.Downstream, 0)
		}},
	}
	for i, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			name := strings.ReplaceAll(c.name, " ", "-")
			l := tp.Link(t, "wan-"+name, s.URL)
			l.Latency(t, 10*time.Millisecond, 2*time.Millisecond)
			src := s.CreateDB(t, fmt.Sprintf("lsrc-%d", i))
			tgt := s.CreateDB(t, fmt.Sprintf("ltgt-%d", i))
			fillWAN(t, s, src, tgt)
			var more []map[string]any
			for j := range 240 {
				more = append(more, testserver.Doc(fmt.Sprintf("more-%03d", j), []string{"1-m"}, map[string]any{"j": j}))
			}
			s.PutRevs(t, src, more...)
			if c.whole && c.toxic != nil {
				c.toxic(t, l)
			}
			// A pull across the link: the target is local, as a cut
			// multipart PUT crashes PouchDB Server (integration/README).
			doc := map[string]any{
				"source": l.URL + fmt.Sprintf("lsrc-%d/", i), "target": tgt,
				"worker_batch_size": wanBatch, "retries_per_request": wanRetries, "connection_timeout": wanConnTimout,
			}
			logs := &logLines{}
			log := zerolog.New(logs).Level(zerolog.DebugLevel)

			type outcome struct {
				res replicate.Result
				err error
			}
			p := params(t, doc)
			runOnce := func() <-chan outcome {
				ch := make(chan outcome, 1)
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
					defer cancel()
					res, err := replicate.New(p, replicate.Options{ServerUUID: "wan-uuid", Logger: log}).Run(ctx)
					ch <- outcome{res, err}
				}()
				return ch
			}
			done := runOnce()
			var first outcome
			injected := ""
			if !c.whole {
				// The point: the target holds 60 documents (10 were there).
				point := false
				for deadline := time.Now().Add(time.Minute); !point && time.Now().Before(deadline); {
					var info struct {
						DocCount int `json:"doc_count"`
					}
					s.GetJSON(t, tgt, &info)
					if point = info.DocCount >= 60; !point {
						select {
						case first = <-done:
							t.Fatalf("the run ended (%v) before the target held 60 documents", first.err)
						case <-time.After(10 * time.Millisecond):
						}
					}
				}
				before := l.Connections()
				name := c.toxic(t, l)
				for deadline := time.Now().Add(time.Minute); l.Connections() == before && time.Now().Before(deadline); {
					time.Sleep(5 * time.Millisecond) // polling toxiproxy's log for the condition
				}
				after := l.Connections()
				l.RemoveToxic(t, name)
				if after == before {
					t.Fatalf("couchrep opened no new connection within a minute of the toxic")
				}
				injected = fmt.Sprintf("at 60 documents on the target; couchrep opened %d new connection(s) before the toxic was removed", after-before)
			}
			first = <-done
			runs, res, err := 1, first.res, first.err
			var errs []string
			for err != nil && runs < 3 {
				errs = append(errs, err.Error())
				o := <-runOnce()
				runs, res, err = runs+1, o.res, o.err
			}
			if err != nil {
				t.Fatalf("three runs failed: %q, %v", errs, err)
			}
			verify(t, s, s, src, tgt, nil)
			if res.Stats.DocWriteFailures != 0 {
				t.Errorf("doc_write_failures %d", res.Stats.DocWriteFailures)
			}
			retries, most := logs.retries()
			if most > wanRetries {
				t.Errorf("a request was tried %d times, retries_per_request is %d", most, wanRetries)
			}
			st := l.Stats(t)
			for deadline := time.Now().Add(10 * time.Second); st.SentDown == 0 && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond) // toxiproxy's metrics lag the bytes
				st = l.Stats(t)
			}
			if st.SentDown < 800<<10 || st.ReceivedUp == 0 {
				t.Errorf("toxiproxy counted %+v: not the 800 KiB of attachments and the documents", st)
			}
			state := "completed"
			if len(errs) > 0 {
				state = fmt.Sprintf("crashing ×%d, then completed; %s", len(errs), errs[0])
			}
			t.Logf("| %s | %s | %d connections, %d bytes down, %d up (toxiproxy's counts); retries logged %v; warnings: %s | %s |",
				c.name, injected, l.Connections(), st.SentDown, st.ReceivedUp, retries, logs.warnings(), state)
		})
	}
}
