package integration

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/testserver"
)

// A one-shot pull costs round trips, not requests (issue 25): 20 documents
// from a PouchDB Server behind a toxiproxy link of 200 ms RTT into a local
// database, counted by a transport that records every request: the
// source is asked exactly these requests, in this many sequential rounds
// (a request's round is one more than the latest round of the source's
// requests that had ended before it was sent; the link's latency keeps
// concurrent requests from looking sequential). Start-up (database info
// and checkpoint together), the changes up to the start-up update_seq (one
// window), then _bulk_get together with the page that reads what came
// since, then the checkpoint, committed before it is written (PouchDB
// Server's instance_start_time is not "0").
func TestPullRoundTrips(t *testing.T) {
	s := testserver.StartPouchDB(t)
	src, tgt := s.CreateDB(t, "src"), s.CreateDB(t, "tgt")
	docs := make([]map[string]any, 20)
	for i := range docs {
		docs[i] = map[string]any{"_id": fmt.Sprintf("d%02d", i), "n": i}
	}
	s.PutDocs(t, src, docs...)
	tp := testserver.StartToxiproxy(t)
	link := tp.Link(t, "roundtrips", s.URL)
	link.Latency(t, 100*time.Millisecond, 0)

	remote := link.URL + "src/"
	p, err := replicate.ParseParams([]byte(fmt.Sprintf(`{"source":%q,"target":%q}`, remote, tgt)))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := couchTransport()
	if err != nil {
		t.Fatal(err)
	}
	rt := newReqTrace(tr)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := replicate.New(p, replicate.Options{ServerUUID: "rounds", Logger: zerolog.Nop(),
		HTTPClient: &http.Client{Transport: rt}}).Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Stats.DocsWritten != 20 {
		t.Errorf("docs_written %d, want 20", res.Stats.DocsWritten)
	}
	u, _ := url.Parse(remote)
	depth, kinds := rt.rounds(u.Host)
	want := map[string]int{
		"GET db": 1, "GET _local": 1, "_changes normal": 2,
		"_bulk_get": 1, "_ensure_full_commit": 1, "PUT _local": 1,
	}
	const wantRounds = 5
	if !maps.Equal(kinds, want) || depth > wantRounds {
		t.Errorf("the source was asked %v in %d rounds, want %v in at most %d; requests (sent, headers, end in ms):\n%s",
			kinds, depth, want, wantRounds, rt)
	}
}
