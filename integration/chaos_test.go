package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv/postgres/pgtest"
	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/testserver"
	"github.com/couchrep/couchrep/messages"
)

// chaosParams size a chaos run.
type chaosParams struct {
	seed uint64
	// duration is how long the chaos phase runs at least; it goes on past
	// it (up to maxDuration) until the minimum kill counts are reached.
	duration, maxDuration time.Duration
	minNodeKills          int
	minActorKills         int
	// replications: a fifth from real _replicator documents, the rest
	// split between persistent jobs of two more _replicator databases and
	// transient (_replicate) jobs; half one-shot, half continuous.
	replications int
	docsPerDB    int
	timeout      time.Duration // activity timeout
	// store is the shared job store ("": a file; else a postgres:// URL).
	store string
	// spread: every replication node must have run jobs.
	spread bool
}

// chaosResult is what a run measured.
type chaosResult struct {
	nodeKills, sigterms, actorKills int
	docsReplicated                  int
	docsWrittenDuringChaos          int64
	failovers                       []time.Duration
	handovers                       int // jobs run by more than one lock holder
	runs                            int
	violations                      []string
}

func (r *chaosResult) violate(format string, args ...any) {
	r.violations = append(r.violations, fmt.Sprintf(format, args...))
}

// TestChaos is the short chaos run of `make test`: 3 node processes, 30
// replications, at least 5 node kills and 50 actor kills; every invariant
// must hold.
func TestChaos(t *testing.T) {
	skipShort(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("COUCHREP_CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("COUCHREP_CHAOS_SEED: %v", err)
		}
		seed = v
	}
	runChaos(t, chaosParams{seed: seed, duration: 60 * time.Second, maxDuration: 100 * time.Second,
		minNodeKills: 5, minActorKills: 50, replications: 30, docsPerDB: 30, timeout: 4 * time.Second})
}

// TestChaosSoak is `make chaos`: the same run for COUCHREP_CHAOS_DURATION
// (a Go duration), seeded by COUCHREP_CHAOS_SEED (printed either way).
func TestChaosSoak(t *testing.T) {
	skipShort(t)
	ds := os.Getenv("COUCHREP_CHAOS_DURATION")
	if ds == "" {
		t.Skip("set COUCHREP_CHAOS_DURATION (make chaos)")
	}
	d, err := time.ParseDuration(ds)
	if err != nil {
		t.Fatalf("COUCHREP_CHAOS_DURATION: %v", err)
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("COUCHREP_CHAOS_SEED"); s != "" {
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("COUCHREP_CHAOS_SEED: %v", err)
		}
	}
	p := chaosParams{seed: seed, duration: d, maxDuration: d + time.Minute,
		minNodeKills: int(d / (20 * time.Second)), minActorKills: int(d / (1200 * time.Millisecond)),
		replications: 30, docsPerDB: 100, timeout: 4 * time.Second}
	switch st := os.Getenv("COUCHREP_CHAOS_STORE"); st {
	case "", "sqlite":
	case "postgres":
		p.store = pgtest.Start(t).NewDatabase(t)
	default:
		t.Fatalf("COUCHREP_CHAOS_STORE=%q: want sqlite or postgres", st)
	}
	runChaos(t, p)
}

// TestChaosPostgres is the multi-node proof of the PostgreSQL store: three
// node processes share one database while nodes are SIGKILLed and actors
// killed; jobs spread over both replication nodes, a killed node's jobs
// run elsewhere within the failover bound, every one-shot replication
// completes with its exact documents and the run log shows no job run by
// two nodes at once (the checks of TestChaos).
func TestChaosPostgres(t *testing.T) {
	skipShort(t)
	seed := uint64(time.Now().UnixNano())
	runChaos(t, chaosParams{seed: seed, duration: 20 * time.Second, maxDuration: 60 * time.Second,
		minNodeKills: 2, minActorKills: 10, replications: 20, docsPerDB: 20, timeout: 4 * time.Second,
		store: pgtest.Start(t).NewDatabase(t), spread: true})
}

// chaosJob is one replication of the workload.
type chaosJob struct {
	id         string
	src, tgt   string
	continuous bool
	kind       string // "doc", "persistent", "transient"
	added      bool
}

func runChaos(t *testing.T, p chaosParams) {
	t.Logf("chaos seed %d (replay with COUCHREP_CHAOS_SEED=%d)", p.seed, p.seed)
	rng := rand.New(rand.NewPCG(p.seed, p.seed^0x9e3779b97f4a7c15))
	srv := testserver.StartPouchDB(t)
	plainReplicatorDB(t, srv, true)
	server := strings.TrimSuffix(srv.URL, "/")

	// The workload's databases.
	var work []*chaosJob
	for i := range p.replications {
		j := &chaosJob{continuous: i%2 == 1}
		switch {
		case i < p.replications/5:
			j.kind = "doc"
		case i < p.replications*3/5:
			j.kind = "persistent"
		default:
			j.kind = "transient"
		}
		j.src = srv.CreateDB(t, fmt.Sprintf("chaos-src-%02d", i))
		j.tgt = srv.CreateDB(t, fmt.Sprintf("chaos-tgt-%02d", i))
		var docs []map[string]any
		for d := range p.docsPerDB {
			docs = append(docs, map[string]any{"_id": fmt.Sprintf("pre-%04d", d), "n": d, "pad": strings.Repeat("p", 200)})
		}
		srv.PutDocs(t, j.src, docs...)
		work = append(work, j)
	}

	c := startCluster(t, clusterConfig{ActivityTimeout: p.timeout, MaxJobs: 40, Watch: []string{server}, Store: p.store},
		[]string{config.NodeTypeReplication, config.NodeTypeAPIFrontend},
		[]string{config.NodeTypeReplication},
		[]string{config.NodeTypeAPIFrontend})
	ctx := context.Background()
	res := &chaosResult{}

	add := func(j *chaosJob, i int) {
		body := fmt.Sprintf(`{"source":%q,"target":%q,"continuous":%v}`, j.src, j.tgt, j.continuous)
		switch j.kind {
		case "doc":
			docID := fmt.Sprintf("rep-%02d", i)
			srv.Do(t, http.MethodPut, srv.DBURL("_replicator")+docID, json.RawMessage(body), http.StatusCreated)
			j.id = repjob.PersistentJobID(srv.URL, "_replicator", docID)
		case "persistent":
			db := []string{"a/_replicator", "b/_replicator"}[i%2]
			r, err := c.store.AddPersistent(ctx, repjob.PersistentDoc{Server: "http://other.invalid/", DB: db,
				DocID: fmt.Sprintf("rep-%02d", i), Body: []byte(body)})
			if err != nil {
				t.Fatalf("add persistent %d: %v", i, err)
			}
			j.id = r.JobID
		default:
			r, err := c.store.AddTransient(ctx, []byte(body), "chaos")
			if err != nil {
				t.Fatalf("add transient %d: %v", i, err)
			}
			j.id = r.JobID
		}
		j.added = true
		c.logf("added %s job %d %s (continuous %v)", j.kind, i, j.id, j.continuous)
	}
	// Continuous jobs start now; one-shot jobs are added during the chaos.
	for i, j := range work {
		if j.continuous {
			add(j, i)
		}
	}

	// Writers: new documents keep arriving at the continuous sources.
	var written atomic.Int64
	stopWriters := make(chan struct{})
	var writersDone sync.WaitGroup
	var continuous []*chaosJob
	for _, j := range work {
		if j.continuous {
			continuous = append(continuous, j)
		}
	}
	writersDone.Add(1)
	go func() {
		defer writersDone.Done()
		wrng := rand.New(rand.NewPCG(p.seed+1, p.seed+2))
		for n := 0; ; n++ {
			select {
			case <-stopWriters:
				return
			case <-time.After(time.Duration(50+wrng.IntN(150)) * time.Millisecond):
			}
			j := continuous[wrng.IntN(len(continuous))]
			doc := fmt.Sprintf(`{"docs":[{"_id":"chaos-%06d","n":%d}]}`, n, n)
			resp, err := http.Post(j.src+"_bulk_docs", "application/json", bytes.NewBufferString(doc))
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusCreated {
					written.Add(1)
				}
			}
		}
	}()

	// Failover measurements run beside the chaos; a SIGKILLed replication
	// node stays down until its jobs run elsewhere (or the bound passed).
	type downNode struct {
		n     *clusterNode
		ready chan struct{}
	}
	var down []*downNode
	var fmu sync.Mutex
	measure := func(victim string, killedAt time.Time, ids []string) chan struct{} {
		ready := make(chan struct{})
		go func() {
			defer close(ready)
			bound := failoverBound(p.timeout)
			left := slices.Clone(ids)
			for len(left) > 0 && time.Since(killedAt) < bound+10*time.Second {
				time.Sleep(50 * time.Millisecond) // polling another process's store: no event reaches us
				left = slices.DeleteFunc(left, func(id string) bool {
					r, err := c.store.Get(ctx, id)
					if err != nil {
						return true // removed
					}
					return r.State().Terminal() || (r.QueueState == jobqueue.StateRunning && r.WorkerNode != victim)
				})
			}
			took := time.Since(killedAt)
			fmu.Lock()
			defer fmu.Unlock()
			if len(left) > 0 {
				res.violate("failover: %d jobs of %s not running elsewhere %v after SIGKILL: %v", len(left), victim, took.Round(time.Millisecond), left)
				return
			}
			res.failovers = append(res.failovers, took)
			c.logf("failover of %s (%d jobs): %v", victim, len(ids), took.Round(time.Millisecond))
			if took > bound {
				res.violate("failover of %s took %v, bound %v (activity timeout %v + monitor)", victim, took, bound, p.timeout)
			}
		}()
		return ready
	}
	runningOn := func(node string) []string {
		var ids []string
		_ = c.store.Each(ctx, repjob.Filter{}, func(r *repjob.Record) error {
			if r.QueueState == jobqueue.StateRunning && r.WorkerNode == node {
				ids = append(ids, r.GetJobId())
			}
			return nil
		})
		return ids
	}

	oneShots := []int{}
	for i, j := range work {
		if !j.continuous {
			oneShots = append(oneShots, i)
		}
	}
	start := time.Now()
	addEvery := p.duration * 2 / 3 / time.Duration(len(oneShots)+1)
	nextAdd := start
	for iter := 0; ; iter++ {
		elapsed := time.Since(start)
		if elapsed >= p.duration && res.nodeKills >= p.minNodeKills && res.actorKills >= p.minActorKills && len(oneShots) == 0 {
			break
		}
		if elapsed >= p.maxDuration {
			break
		}
		if len(oneShots) > 0 && time.Now().After(nextAdd) {
			i := oneShots[0]
			oneShots = oneShots[1:]
			add(work[i], i)
			nextAdd = time.Now().Add(addEvery)
		}
		// Bring back nodes whose failover was measured.
		down = slices.DeleteFunc(down, func(d *downNode) bool {
			select {
			case <-d.ready:
				c.start(d.n)
				return true
			default:
				return false
			}
		})
		// Any node that died without the harness killing it is a finding.
		for _, n := range c.nodes {
			if n.proc != nil && !n.up() && !slices.ContainsFunc(down, func(d *downNode) bool { return d.n == n }) {
				res.violate("node %s exited on its own: %v", n.name, n.proc.exitErr)
				c.logf("node %s exited on its own: %v", n.name, n.proc.exitErr)
				c.start(n)
			}
		}
		live := c.live()
		// A node action about every eighth step (more often when behind).
		wantNode := iter%8 == 7 || (elapsed > p.duration*2/3 && res.nodeKills < p.minNodeKills && iter%3 == 2)
		if wantNode && len(live) == len(c.nodes) {
			victim := pick(rng, live)
			replicationUp := 0
			for _, n := range live {
				if n.has(config.NodeTypeReplication) {
					replicationUp++
				}
			}
			switch {
			case rng.IntN(4) == 0:
				// A clean stop (drain) and restart.
				if err := c.drain(victim); err != nil {
					res.violate("SIGTERM %s: %v", victim.name, err)
				}
				res.sigterms++
				c.start(victim)
			case victim.has(config.NodeTypeReplication) && replicationUp > 1:
				ids := runningOn(victim.name)
				c.kill(victim)
				res.nodeKills++
				down = append(down, &downNode{n: victim, ready: measure(victim.name, time.Now(), ids)})
			default:
				c.kill(victim)
				res.nodeKills++
				down = append(down, &downNode{n: victim, ready: closedChan()})
			}
			continue
		}
		// An actor kill on a random live node.
		if len(live) > 0 {
			n := pick(rng, live)
			tr, err := treeOf(n)
			if err == nil {
				paths := actorPaths(tr)
				var jobActors []string
				for _, pth := range paths {
					if strings.HasPrefix(pth, "job_server/jobs_sup/") {
						jobActors = append(jobActors, pth)
					}
				}
				target := pick(rng, paths)
				if len(jobActors) > 0 && rng.IntN(2) == 0 {
					target = pick(rng, jobActors)
				}
				if _, errOut, code := n.proc.ctl("kill", target, "chaos"); code == 0 {
					res.actorKills++
					c.logf("killed %s on %s", target, n.name)
				} else {
					c.logf("kill %s on %s: %s", target, n.name, strings.TrimSpace(errOut))
				}
			}
		}
		time.Sleep(time.Duration(200+rng.IntN(400)) * time.Millisecond) // chaos pacing, not synchronisation
	}
	chaosTook := time.Since(start)
	close(stopWriters)
	writersDone.Wait()
	res.docsWrittenDuringChaos = written.Load()
	for _, d := range down {
		<-d.ready
		c.start(d.n)
	}
	for _, n := range c.nodes {
		if !n.up() {
			c.start(n)
		}
	}
	c.logf("chaos over after %v; verifying", chaosTook.Round(time.Second))

	// Invariant: no job stuck pending while capacity is free — every
	// one-shot job completes and every continuous job runs, within a bound.
	settle := 3*failoverBound(p.timeout) + 60*time.Second
	deadline := time.Now().Add(settle)
	for {
		var bad []string
		for _, j := range work {
			r, err := c.store.Get(ctx, j.id)
			switch {
			case err != nil:
				bad = append(bad, fmt.Sprintf("%s: %v", j.id, err))
			case j.continuous && r.State() != repjob.StateRunning:
				bad = append(bad, fmt.Sprintf("%s (continuous %s): %s %s", j.id, j.kind, r.State(), r.LastError))
			case !j.continuous && r.State() != repjob.StateCompleted:
				bad = append(bad, fmt.Sprintf("%s (one-shot %s): %s %s", j.id, j.kind, r.State(), r.LastError))
			}
		}
		if len(bad) == 0 {
			break
		}
		if time.Now().After(deadline) {
			res.violate("jobs not completed/running %v after the chaos with every node up: %v", settle, bad)
			break
		}
		time.Sleep(200 * time.Millisecond) // polling the shared store
	}

	// Invariant: continuous jobs caught up with every write; one-shot
	// targets equal their sources document by document.
	for _, j := range work {
		if j.continuous {
			waitCaughtUp(t, srv, j, 90*time.Second, res)
		}
	}
	for _, j := range work {
		before := len(res.violations)
		n := verifyChaos(t, srv, j.src, j.tgt, res)
		if len(res.violations) == before {
			res.docsReplicated += n
		}
	}

	// Invariant: no job was ever run by two nodes at once, from the run
	// log written inside the lock-checked transactions.
	runs, err := c.queue.Runs(ctx, repjob.JobType)
	if err != nil {
		t.Fatal(err)
	}
	for id, rs := range runs {
		res.runs += len(rs)
		if err := jobqueue.CheckRuns(rs); err != nil {
			res.violate("%v", err)
		}
		holders := map[string]bool{}
		for _, r := range rs {
			holders[string(r.Lock)] = true
			if r.Node == "n2" {
				res.violate("job %s ran on the api_frontend-only node n2", id)
			}
		}
		if len(holders) > 1 {
			res.handovers++
		}
	}
	if res.runs == 0 {
		res.violate("the run log is empty")
	}
	if p.spread {
		ran := map[string]int{}
		for _, rs := range runs {
			for _, r := range rs {
				ran[r.Node]++
			}
		}
		for _, n := range c.nodes {
			if n.has(config.NodeTypeReplication) && ran[n.name] == 0 {
				res.violate("replication node %s ran no job (runs per node: %v)", n.name, ran)
			}
		}
		c.logf("runs per node: %v", ran)
	}

	// Invariant: every node's supervision tree is whole; node types hold.
	for _, n := range c.nodes {
		tr, err := treeOf(n)
		if err == nil {
			err = treeWhole(tr)
		}
		if err != nil {
			res.violate("node %s tree: %v", n.name, err)
		}
	}
	nodes, err := c.nodesView(c.nodes[0])
	if err != nil {
		res.violate("nodes: %v", err)
	} else {
		for _, ni := range nodes.GetNodes() {
			if !ni.GetAlive() {
				res.violate("node %s not alive after the chaos: %v", ni.GetName(), ni)
			}
			if ni.GetName() == "n1" && ni.GetHttpAddress() != "" {
				res.violate("replication-only node n1 serves HTTP at %s", ni.GetHttpAddress())
			}
			if ni.GetName() == "n2" && ni.GetRunningJobs() != 0 {
				res.violate("api_frontend-only node n2 runs %d jobs", ni.GetRunningJobs())
			}
		}
		if len(nodes.GetNodes()) != len(c.nodes) {
			res.violate("nodes: %d registered, want %d", len(nodes.GetNodes()), len(c.nodes))
		}
	}
	if _, err := os.Stat(filepath.Join(c.nodes[1].opts.dataDir, "http.addr")); err == nil {
		res.violate("replication-only node n1 wrote http.addr")
	}
	if err := integrityCheck(c.storePath); err != nil {
		res.violate("store: %v", err)
	}
	if res.nodeKills < p.minNodeKills || res.actorKills < p.minActorKills {
		res.violate("only %d node kills and %d actor kills (want %d and %d)", res.nodeKills, res.actorKills, p.minNodeKills, p.minActorKills)
	}

	slices.Sort(res.failovers)
	p50, maxF := time.Duration(0), time.Duration(0)
	if len(res.failovers) > 0 {
		p50, maxF = res.failovers[len(res.failovers)/2], res.failovers[len(res.failovers)-1]
	}
	t.Logf("chaos summary: store=%s seed=%d chaos=%v node_kills=%d sigterms=%d actor_kills=%d replications=%d runs=%d handovers=%d docs_replicated=%d docs_written_during_chaos=%d failovers=%d failover_p50=%v failover_max=%v (bound %v) violations=%d",
		storeKind(p.store), p.seed, chaosTook.Round(time.Second), res.nodeKills, res.sigterms, res.actorKills, len(work), res.runs, res.handovers,
		res.docsReplicated, res.docsWrittenDuringChaos, len(res.failovers), p50.Round(time.Millisecond), maxF.Round(time.Millisecond),
		failoverBound(p.timeout), len(res.violations))
	for _, v := range res.violations {
		t.Error(v)
	}
	if len(res.violations) > 0 {
		t.Logf("replay with COUCHREP_CHAOS_SEED=%d", p.seed)
	}
}

// storeKind names a store location for logs without its password.
func storeKind(store string) string {
	if store == "" {
		return "sqlite"
	}
	return redact.Text(store)
}

func closedChan() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// treeOf asks n for its tree (an error rather than a test failure: the node
// may be restarting).
func treeOf(n *clusterNode) (*messages.TreeResponse, error) {
	out, errOut, code := n.proc.ctl("--json", "tree")
	if code != 0 {
		return nil, fmt.Errorf("couchrepctl tree: exit %d: %s", code, errOut)
	}
	var tr messages.TreeResponse
	if err := protojson.Unmarshal([]byte(out), &tr); err != nil {
		return nil, fmt.Errorf("couchrepctl tree --json: %w", err)
	}
	return &tr, nil
}

// dbDocCount reads a database's doc_count without failing the test.
func dbDocCount(u string) (int, error) {
	resp, err := http.Get(u)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var info struct {
		DocCount int `json:"doc_count"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		return 0, err
	}
	return info.DocCount, nil
}

// waitCaughtUp waits until a continuous job's target has as many documents
// as its source (no more writes arrive now).
func waitCaughtUp(t *testing.T, srv *testserver.Server, j *chaosJob, timeout time.Duration, res *chaosResult) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s, err1 := dbDocCount(j.src)
		d, err2 := dbDocCount(j.tgt)
		if err1 == nil && err2 == nil && s == d {
			return
		}
		if time.Now().After(deadline) {
			res.violate("continuous job %s (%s) did not catch up in %v: source %d docs, target %d (%v %v)", j.id, j.kind, timeout, s, d, err1, err2)
			return
		}
		time.Sleep(200 * time.Millisecond) // polling PouchDB Server: no event to await
	}
}

// verifyChaos compares target and source leaves document by document and
// returns how many documents the target has.
func verifyChaos(t *testing.T, srv *testserver.Server, src, tgt string, res *chaosResult) int {
	t.Helper()
	want, got := leaves(t, srv, src), leaves(t, srv, tgt)
	for id, w := range want {
		if !jsonEqual(w, got[id]) {
			res.violate("%s -> %s: doc %q differs: source %v target %v", src, tgt, id, w, got[id])
		}
	}
	for id := range got {
		if _, ok := want[id]; !ok {
			res.violate("%s -> %s: target has unexpected doc %q", src, tgt, id)
		}
	}
	return len(got)
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}
