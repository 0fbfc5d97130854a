package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/internal/admin"
	"github.com/couchrep/couchrep/internal/httpapi"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/messages"
)

// fakeCluster answers the status page's cluster questions.
type fakeCluster struct {
	nodes   *messages.NodesResponse
	nodeErr error
}

func (f fakeCluster) Nodes(context.Context) (*messages.NodesResponse, error) {
	return f.nodes, f.nodeErr
}
func (f fakeCluster) Tree(context.Context) (*messages.TreeResponse, error) {
	return &messages.TreeResponse{Node: "n1", Root: &messages.TreeNode{Name: "couchrep_sup", Supervisor: true,
		Strategy: messages.Strategy_STRATEGY_REST_FOR_ONE, State: messages.ChildState_CHILD_STATE_RUNNING,
		Children: []*messages.TreeNode{{Name: "scheduler", State: messages.ChildState_CHILD_STATE_RUNNING, RestartCount: 3, Incarnation: 4}}}}, nil
}
func (f fakeCluster) Shares() map[string]int { return map[string]int{"high/_replicator": 400} }
func (f fakeCluster) Self() string           { return "n1" }

func newStatusEnv(t *testing.T, c httpapi.Cluster) *env {
	t.Helper()
	return newEnvWith(t, httpapi.Options{UUID: uuid, NodeName: "n1", Cluster: c})
}

func TestWelcome(t *testing.T) {
	e := newStatusEnv(t, nil)
	r := e.get("/")
	m := r.json(t)
	if r.status != 200 || m["couchrep"] != "Welcome" || m["uuid"] != uuid || m["version"] != httpapi.Version {
		t.Fatalf("GET /: %d %s", r.status, r.body)
	}
	vendor, _ := m["vendor"].(map[string]any)
	feats, _ := m["features"].([]any)
	if vendor["name"] != "couchrep" || vendor["version"] != httpapi.Version || len(feats) == 0 || feats[0] != "scheduler" {
		t.Fatalf("GET /: vendor or features: %s", r.body)
	}
}

type statusData struct {
	Node            string
	ClusterUnstable bool `json:"cluster_unstable"`
	Counts          map[string]int
	Nodes           []struct {
		Name         string
		Draining     bool
		HeartbeatAge *float64 `json:"heartbeat_age_s"`
	}
	Jobs []struct {
		ID, State, Kind, Source, Target, Database string
		DocID                                     string `json:"doc_id"`
	}
	Shares []struct {
		Database string
		Weight   int
		Waiting  int
		Entitled float64
	}
	Tree *struct {
		Name     string
		Kind     string
		Children []struct {
			Name     string
			Restarts int
		}
	}
	Errors []string
}

func TestStatusPageAndData(t *testing.T) {
	hb := timestamppb.New(time.Now().Add(-7 * time.Second))
	e := newStatusEnv(t, fakeCluster{nodes: &messages.NodesResponse{Unstable: true, Nodes: []*messages.NodeInfo{
		{Name: "n1", Alive: true, Draining: true, LastHeartbeat: hb},
	}}})
	ctx := context.Background()
	if _, err := e.store.AddTransient(ctx, []byte(`{"source":"http://bob:hunter2@a.example/src","target":"`+tgtURL+`","continuous":true}`), "bob"); err != nil {
		t.Fatal(err)
	}
	const xss = `<img src=x onerror=alert(1)>`
	if _, err := e.store.AddPersistent(ctx, repjob.PersistentDoc{Server: "http://c.example/", DB: "high/_replicator", DocID: xss,
		Body: []byte(`{"source":"` + srcURL + `","target":"` + tgtURL + `"}`)}); err != nil {
		t.Fatal(err)
	}

	page := e.get("/_status")
	if page.status != 200 || !strings.HasPrefix(page.header.Get("Content-Type"), "text/html") ||
		!strings.Contains(page.header.Get("Content-Security-Policy"), "script-src 'self'") || !strings.Contains(string(page.body), "/_status/status.js") {
		t.Fatalf("GET /_status: %d %v\n%s", page.status, page.header, page.body)
	}
	r := e.get("/_status/data")
	if r.status != 200 || r.header.Get("Cache-Control") != "no-store" {
		t.Fatalf("GET /_status/data: %d %v %s", r.status, r.header, r.body)
	}
	if strings.Contains(string(r.body), "hunter2") {
		t.Fatalf("status data shows a password: %s", r.body)
	}
	var d statusData
	if err := json.Unmarshal(r.body, &d); err != nil {
		t.Fatal(err)
	}
	if d.Node != "n1" || !d.ClusterUnstable || d.Counts["pending"] != 2 || d.Counts["running"] != 0 || len(d.Jobs) != 2 {
		t.Fatalf("status data: %s", r.body)
	}
	if len(d.Nodes) != 1 || !d.Nodes[0].Draining || d.Nodes[0].HeartbeatAge == nil || *d.Nodes[0].HeartbeatAge < 6 {
		t.Fatalf("nodes: %s", r.body)
	}
	kinds := map[string]string{}
	for _, j := range d.Jobs {
		kinds[j.Kind] = j.DocID
	}
	if kinds["persistent"] != xss || len(kinds) != 2 {
		t.Fatalf("jobs: %s", r.body)
	}
	if len(d.Shares) != 1 || d.Shares[0].Database != "high/_replicator" || d.Shares[0].Weight != 400 || d.Shares[0].Waiting != 1 || d.Shares[0].Entitled != 1 {
		t.Fatalf("shares: %s", r.body)
	}
	if d.Tree == nil || d.Tree.Kind != "rest_for_one" || len(d.Tree.Children) != 1 || d.Tree.Children[0].Restarts != 3 {
		t.Fatalf("tree: %s", r.body)
	}

	// A section that cannot be read is named; the rest is still shown.
	e2 := newStatusEnv(t, fakeCluster{nodeErr: errors.New("clustering: not ready")})
	var d2 statusData
	if err := json.Unmarshal(e2.get("/_status/data").body, &d2); err != nil {
		t.Fatal(err)
	}
	if len(d2.Errors) != 1 || !strings.Contains(d2.Errors[0], "clustering: not ready") || d2.Tree == nil {
		t.Fatalf("errors: %+v", d2)
	}
}

// TestStatusShortIDs: the page's job column tells the one-shot and the
// continuous replication of one pair apart (their replication ids share a
// base), and each short id names its own job to couchrepctl.
func TestStatusShortIDs(t *testing.T) {
	e := newStatusEnv(t, fakeCluster{})
	ctx := context.Background()
	pair := `"source":"` + srcURL + `","target":"` + tgtURL + `"`
	once, err := e.store.AddPersistent(ctx, repjob.PersistentDoc{Server: "http://c.example", DB: "_replicator", DocID: "once", Body: []byte(`{` + pair + `}`)})
	if err != nil {
		t.Fatal(err)
	}
	cont, err := e.store.AddPersistent(ctx, repjob.PersistentDoc{Server: "http://c.example", DB: "_replicator", DocID: "cont", Body: []byte(`{` + pair + `,"continuous":true}`)})
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Jobs []struct {
			ID      string `json:"id"`
			ShortID string `json:"short_id"`
		}
	}
	if err := json.Unmarshal(e.get("/_status/data").body, &d); err != nil {
		t.Fatal(err)
	}
	shown := map[string]string{}
	for _, j := range d.Jobs {
		shown[j.ID] = j.ShortID
	}
	if len(shown) != 2 || shown[once.JobID] == "" || shown[once.JobID] == shown[cont.JobID] {
		t.Fatalf("short ids of a one-shot and a continuous replication of one pair: %v", shown)
	}
	if !strings.HasSuffix(shown[cont.JobID], "+continuous") || len(shown[once.JobID]) != repjob.ShortRepIDLen {
		t.Fatalf("short ids %v", shown)
	}
	for id, short := range shown {
		rec, err := admin.FindJob(ctx, e.store, short)
		if err != nil || rec.GetJobId() != id {
			t.Errorf("couchrepctl job show %s: %v %v, want job %s", short, rec.GetJobId(), err, id)
		}
	}
}
