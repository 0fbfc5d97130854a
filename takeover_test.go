package couchrep_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/couchrep/couchrep"
	"github.com/couchrep/couchrep/internal/takeover/takeovertest"
	"github.com/couchrep/couchrep/messages"
)

// TestTakeoverRequest asks a node watching a CouchDB-shaped fake for the
// takeover's checks: the watched URL's credentials are used (and shown
// nowhere), CouchDB's replicator on is refused with the curl that turns it
// off, and once it is off the node answers ready.
func TestTakeoverRequest(t *testing.T) {
	f := takeovertest.New(t)
	cfg := couchrep.DefaultConfig()
	cfg.Couchrep.DataDir = t.TempDir()
	cfg.Couchrep.HTTPBind = "127.0.0.1:0"
	cfg.Couchrep.Watch = []string{strings.Replace(f.URL, "http://", "http://admin:s3cret@", 1)}
	cfg.CouchDB.UUID = "couchdb-uuid"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := couchrep.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := n.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})

	ask := func() *messages.TakeoverResponse {
		t.Helper()
		r := request[*messages.TakeoverResponse](t, n, &messages.TakeoverRequest{Server: f.URL})
		if b, _ := protojson.Marshal(r); strings.Contains(string(b), "s3cret") {
			t.Fatalf("credentials in the answer: %s", b)
		}
		return r
	}
	results := func(r *messages.TakeoverResponse) map[string]*messages.TakeoverCheck {
		out := map[string]*messages.TakeoverCheck{}
		for _, c := range r.GetChecks() {
			out[c.GetName()] = c
		}
		return out
	}
	r := ask()
	c := results(r)
	if r.GetReady() || r.GetStoreId() == "" || r.GetNode() != n.Name() || c["watched"].GetResult() != "ok" || c["uuid"].GetResult() != "ok" ||
		c["replicator"].GetResult() != "fail" || !strings.Contains(c["replicator"].GetNext(), `-X PUT `+strings.TrimSuffix(f.URL, "/")+`/_node/_local/_config/replicator/max_jobs -d '"0"'`) {
		t.Fatalf("with CouchDB's replicator on: %v", r)
	}

	f.Set(func(f *takeovertest.Fake) { f.NodeConfig = `{"max_jobs":"0"}` })
	if r := ask(); !r.GetReady() {
		t.Fatalf("with CouchDB's replicator off: %v", r)
	}

	_, err = n.Request(ctx, &messages.TakeoverRequest{})
	if !errors.Is(err, couchrep.ErrInvalidRequest) {
		t.Fatalf("no server: %v", err)
	}
}
