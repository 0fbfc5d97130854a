package httpserver_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/actors/httpserver"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/httpapi"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

const waitLimit = 30 * time.Second

type apiNode struct {
	t      *testing.T
	ctx    context.Context
	system *actor.ActorSystem
	sup    *supervisor.Supervisor
	deps   actors.Deps
	dir    string
}

// startActor runs the http_api actor alone under a supervisor, over a job store
// in a temporary SQLite file; types are the node's node_types.
func startActor(t *testing.T, types ...string) *apiNode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	dir := t.TempDir()
	db, err := sqlite.Open(ctx, filepath.Join(dir, "store.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	cfg := config.Default()
	cfg.Couchrep.NodeName, cfg.Couchrep.DataDir, cfg.Couchrep.HTTPBind = "n1", dir, "127.0.0.1:0"
	cfg.Couchrep.NodeTypes = types
	cfg.CouchDB.UUID = "0123456789abcdef0123456789abcdef"
	q := jobqueue.New(db, jobqueue.Options{NodeName: "n1"})
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	deps := actors.Deps{
		Config: cfg, Logger: zerolog.Nop(), System: system, Store: db, Jobs: q,
		RepJobs: repjob.New(q, db, repjob.Options{ServerUUID: cfg.CouchDB.UUID, Policy: schedpolicy.DefaultPolicy()}),
		Metrics: httpapi.NewMetrics(nil),
		Request: func(context.Context, proto.Message) (proto.Message, error) {
			return nil, actors.ErrUnknownRequest
		},
	}
	sup, err := supervisor.Start(ctx, system, actors.RootName, supervisor.Spec{
		Strategy: supervisor.OneForOne, MaxRestarts: 10, Period: time.Minute,
		Children: []supervisor.ChildSpec{httpserver.Spec(deps)},
	})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { _ = sup.Stop(context.Background()) })
	return &apiNode{t: t, ctx: ctx, system: system, sup: sup, deps: deps, dir: dir}
}

// addr waits for the address in <data>/http.addr that differs from not.
func (n *apiNode) addr(not string) string {
	n.t.Helper()
	for {
		b, err := os.ReadFile(filepath.Join(n.dir, httpserver.AddrFile))
		if a := strings.TrimSpace(string(b)); err == nil && strings.HasSuffix(string(b), "\n") && a != not {
			return a
		}
		select {
		case <-n.ctx.Done():
			n.t.Fatalf("no new %s (not %q)", httpserver.AddrFile, not)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func getPath(t *testing.T, addr, path string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// TestServes: the actor listens on http_bind, writes the address to
// <data>/http.addr and serves the API with CouchDB's headers, on answers
// and errors alike.
func TestServes(t *testing.T) {
	n := startActor(t, config.NodeTypeAPIFrontend)
	addr := n.addr("")
	reqID := regexp.MustCompile(`^[0-9a-f]{10}$`)
	for _, c := range []struct {
		path   string
		status int
		key    string
	}{
		{"/", http.StatusOK, "couchrep"},
		{"/_up", http.StatusOK, "status"},
		{"/_scheduler/jobs", http.StatusOK, "jobs"},
		{"/_nope", http.StatusNotFound, "error"},
	} {
		t.Run(c.path, func(t *testing.T) {
			resp, body := getPath(t, addr, c.path)
			var m map[string]any
			if resp.StatusCode != c.status || json.Unmarshal(body, &m) != nil || m[c.key] == nil {
				t.Fatalf("%d %s, want %d with %q", resp.StatusCode, body, c.status, c.key)
			}
			h := resp.Header
			if !reqID.MatchString(h.Get("X-Couch-Request-ID")) || h.Get("X-CouchDB-Body-Time") != "0" ||
				h.Get("Server") != httpapi.ServerHeader || h.Get("Content-Type") != "application/json" ||
				h.Get("Cache-Control") != "must-revalidate" {
				t.Errorf("headers %v", h)
			}
		})
	}
}

// TestNotAPIFrontend: a node without api_frontend opens no listener.
func TestNotAPIFrontend(t *testing.T) {
	n := startActor(t, config.NodeTypeReplication)
	root, err := supervisor.Which(n.ctx, n.system, n.sup.PID())
	if err != nil {
		t.Fatal(err)
	}
	if len(root.Children) != 1 || root.Children[0].State != supervisor.Running {
		t.Fatalf("http_api not running: %+v", root.Children)
	}
	if _, err := os.Stat(filepath.Join(n.dir, httpserver.AddrFile)); !os.IsNotExist(err) {
		t.Fatalf("%s written by a node that serves no API: %v", httpserver.AddrFile, err)
	}
}

// TestRestartRebinds: a killed http_api closes its listener at once and
// its next incarnation listens again.
func TestRestartRebinds(t *testing.T) {
	n := startActor(t, config.NodeTypeAPIFrontend)
	first := n.addr("")
	if err := supervisor.Kill(n.ctx, n.system, actor.NewPID(n.system.Address(), actors.RootName+"/"+httpserver.Name), "test"); err != nil {
		t.Fatal(err)
	}
	second := n.addr(first)
	if resp, _ := getPath(t, second, "/_up"); resp.StatusCode != http.StatusOK {
		t.Fatalf("restarted listener: %d", resp.StatusCode)
	}
	if resp, err := http.Get("http://" + first + "/_up"); err == nil {
		resp.Body.Close()
		t.Fatalf("the killed incarnation's listener %s still accepts", first)
	}
}

// TestLiveStats: the actor feeds the job actors' progress events of this
// node to the API, which shows them for a job the store says runs here,
// in the same run; an event of the job's end drops them, and events that
// do not match the stored run are not shown.
func TestLiveStats(t *testing.T) {
	n := startActor(t, config.NodeTypeAPIFrontend)
	addr := n.addr("")
	store := n.deps.RepJobs
	added, err := store.AddTransient(n.ctx, []byte(`{"source":"http://127.0.0.1:1/a","target":"http://127.0.0.1:1/b","continuous":true}`), "")
	if err != nil {
		t.Fatal(err)
	}
	run, err := store.Accept(n.ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Start(n.ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	rec := run.Record()
	docsWritten := func() any {
		resp, body := getPath(t, addr, "/_scheduler/jobs/"+added.JobID)
		var m struct {
			Info map[string]any `json:"info"`
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &m) != nil {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		return m.Info["docs_written"]
	}
	event := func(node string, progress bool, st repjob.State, started *timestamppb.Timestamp) *messages.ReplicationJobEvent {
		return &messages.ReplicationJobEvent{JobId: added.JobID, Node: node, Progress: progress, State: st.Proto(),
			StartedAt: started, Stats: &messages.ReplicationStats{DocsWritten: 7, DocsRead: 7}}
	}
	stored := docsWritten()
	other := timestamppb.New(rec.GetLastStarted().AsTime().Add(-time.Hour))
	for _, c := range []struct {
		name string
		ev   *messages.ReplicationJobEvent
		want any
	}{
		{"another node's", event("n2", true, repjob.StateRunning, rec.GetLastStarted()), stored},
		{"an earlier run's", event("n1", true, repjob.StateRunning, other), stored},
		{"this run's", event("n1", true, repjob.StateRunning, rec.GetLastStarted()), 7.0},
		{"the run's end", event("n1", false, repjob.StatePending, rec.GetLastStarted()), stored},
	} {
		t.Run(c.name, func(t *testing.T) {
			n.system.EventStream.Publish(c.ev) // delivered before Publish returns
			if got := docsWritten(); got != c.want {
				t.Fatalf("docs_written %v, want %v", got, c.want)
			}
		})
	}
}
