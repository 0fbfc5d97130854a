package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/couchrep/couchrep/actors/jobrunner"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/postgres/pgtest"
	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/testserver"
)

// failoverParams size a cluster failover run (TestClusterFailover,
// BenchmarkClusterFailover).
type failoverParams struct {
	// jobs is the number of user databases, one continuous job each.
	jobs int
	// timeout is [couchrep] activity_timeout: how long a dead node's
	// jobs stay with it.
	timeout time.Duration
	// sample is how many user databases get a write during and one after
	// the kill (half of them the victim's).
	sample int
	// written is how many user databases (spread evenly over them) hold a
	// document before the jobs are added: their jobs replicate it and
	// checkpoint at the start; the others' databases are empty, as most
	// of a per-user deployment's are idle (0: all empty).
	written int
	// strict: a job that crashes is a finding, and each job must have run
	// exactly once per node it was seen on (else crashes are counted, and
	// a crashed job may run again anywhere).
	strict bool
	// idle is how long the idle cluster is measured before the kill (0:
	// not measured).
	idle time.Duration
	// poll is how often the harness reads every job record.
	poll time.Duration
	// parkAfter is [replicator] idle_park_after, in seconds: every job
	// parks before the kill, and parks again after it.
	parkAfter int
	// settle bounds each wait (all running, failover, writes arriving).
	settle   time.Duration
	logLevel string
	// env is more settings for the nodes.
	env []string
}

// procLoad is what one process cost over a window.
type procLoad struct {
	name string
	cpu  float64 // % of one core
	rss  uint64
	fds  int
	jobs int
}

func (l procLoad) String() string {
	return fmt.Sprintf("%s: %d jobs, %.2f %% CPU, RSS %d MB, %d fds", l.name, l.jobs, l.cpu, l.rss>>20, l.fds)
}

// failoverResult is what a run measured, and what it found wrong.
type failoverResult struct {
	createDBs, addJobs time.Duration
	// allRunning: from the first job added until every job ran; ready:
	// until a write to a user database of each node's reached the target;
	// parked: until every job was parked.
	allRunning, ready, parked time.Duration
	// reparked: from the SIGKILL until every job was parked again.
	reparked time.Duration
	// failover: from the SIGKILL until every job of the victim ran on a
	// survivor (to the harness's poll interval).
	failover time.Duration
	// requeued: from the SIGKILL until none of the victim's jobs was
	// running on it any more (its lease expired, its jobs back in the
	// queue or taken): failover less requeued is the survivors' accepts
	// and starts.
	requeued   time.Duration
	victim     string
	victimJobs int
	perNode    map[string]int
	// idle: each node and the store over the idle window; pgCommits is
	// PostgreSQL's xact_commit rate then (transactions/s).
	idle      []procLoad
	pgIdleCPU float64
	pgCommits float64
	// takeover: PostgreSQL's CPU and commit rate from the SIGKILL until
	// the victim's jobs ran elsewhere.
	pgTakeoverCPU, pgTakeoverCommits float64
	polls                            int
	// crashed is the jobs seen crashing; reruns the runs that followed one
	// that ended (a crash) rather than the kill.
	crashed map[string]bool
	reruns  int
	// sameNode counts the re-runs on the node that ran the job before
	// (a job stopped, or its stop write timed out, and accepted again by
	// the same node): they are in reruns too.
	sameNode   int
	violations []string
}

func (r *failoverResult) violate(format string, args ...any) {
	if len(r.violations) < 200 {
		// Job ids name their server, with its credentials on a CouchDB.
		r.violations = append(r.violations, redact.Text(fmt.Sprintf(format, args...)))
	}
}

// jobSeen is what the polls saw of one job.
type jobSeen struct {
	// current is the node it runs on (last seen running on).
	current string
	// movedTo is the survivor it ran on after the victim was killed, if
	// it ran on the victim then.
	movedTo string
	// gap: seen not running since it was last seen running (it crashed or
	// was requeued: its run ended); rerun: it ran again after such a gap.
	gap, rerun bool
}

// runClusterFailover runs p.jobs per-user continuous replications (each
// from its own database on one PouchDB Server with a real _db_updates
// feed, all into one central database) on three replication nodes sharing
// one PostgreSQL job store, SIGKILLs the node running the most jobs and
// checks, polling the store, that every job of it runs on one of the
// other two and no job ever runs twice: a job's node never changes except
// from the victim to one survivor; the run log (written in the
// lock-checked transactions) has one run per survivor's job and exactly
// two that do not overlap per victim's job; the lease records hold each
// running job once, under a lease of the node running it, and none of the
// victim's; the survivors' supervision trees have each job's actor on one
// node only. Writes to user databases during and after the kill reach the
// central database. With p.parkAfter, every job parks before the kill;
// after it the survivors' parked jobs are still parked since the same time
// (unless a write woke them) and the victim's parked again on a survivor.
func runClusterFailover(tb testing.TB, p failoverParams) *failoverResult {
	res := &failoverResult{perNode: map[string]int{}, crashed: map[string]bool{}}
	ctx := context.Background()
	srv := testserver.StartPouchDBWithDBUpdates(tb)
	central := srv.CreateDB(tb, "central")
	userDB := func(i int) string { return fmt.Sprintf("cluster-user-%05d", i) }

	t0 := time.Now()
	create := ""
	if srv.External() {
		// A CouchDB (COUCHREP_TEST_COUCH_URL): one shard per user
		// database, and they are deleted in parallel at the end (the
		// server's own clean-up deletes one after the other).
		create = "?q=1"
		tb.Cleanup(func() {
			_ = parallel(16, p.jobs, func(i int) error { return deleteDB(srv.DBURL(userDB(i))) })
		})
	}
	if err := parallel(16, p.jobs, func(i int) error { return putDB(srv.DBURL(userDB(i)) + create) }); err != nil {
		tb.Fatalf("creating the user databases: %v", err)
	}
	if p.written > 0 {
		n := min(p.written, p.jobs)
		if err := parallel(16, n, func(k int) error {
			i := k * p.jobs / n
			return putUserDoc(srv.DBURL(userDB(i))+userDB(i)+"-preloaded", p.settle)
		}); err != nil {
			tb.Fatalf("writing to the user databases: %v", err)
		}
	}
	res.createDBs = time.Since(t0)

	pg := pgtest.Start(tb)
	dsn := pg.NewDatabase(tb)
	repl := []string{config.NodeTypeReplication}
	c := startCluster(tb, clusterConfig{ActivityTimeout: p.timeout, MaxJobs: p.jobs/2 + p.jobs/10 + 1, Store: dsn,
		LogLevel: p.logLevel,
		// No rotation: every job runs for good once accepted.
		Env: append([]string{"COUCHREP_REPLICATOR_INTERVAL=60000",
			fmt.Sprintf("COUCHREP_REPLICATOR_IDLE_PARK_AFTER=%d", p.parkAfter),
			"COUCHREP_REPLICATOR_PARK_RECHECK=3600"}, p.env...)}, repl, repl, repl)
	if err := c.store.Init(ctx); err != nil {
		tb.Fatal(err)
	}

	// The jobs, as the _replicator documents of one server would make
	// them (PersistentDoc), in batches of 250 per transaction.
	ids := make([]string, p.jobs)
	byID := make(map[string]int, p.jobs)
	start := time.Now()
	for from := 0; from < p.jobs; from += 250 {
		to := min(from+250, p.jobs)
		if err := c.db.Transact(ctx, func(tx kv.Tx) error {
			for i := from; i < to; i++ {
				body := fmt.Sprintf(`{"source":%q,"target":%q,"continuous":true}`, srv.DBURL(userDB(i)), central)
				r, err := c.store.AddPersistentTx(tx, repjob.PersistentDoc{Server: srv.URL, DB: "_replicator", DocID: userDB(i), Body: []byte(body)})
				if err != nil {
					return err
				}
				ids[i] = r.JobID
			}
			return nil
		}); err != nil {
			tb.Fatalf("adding jobs %d-%d: %v", from, to, err)
		}
	}
	for i, id := range ids {
		byID[id] = i
	}
	res.addJobs = time.Since(start)
	c.logf("%d jobs added in %v", p.jobs, res.addJobs.Round(time.Millisecond))

	seen := make(map[string]*jobSeen, p.jobs)
	var victim string
	var killedAt time.Time
	// poll reads every job record once and checks that no job changed
	// nodes other than from the victim to one survivor; it returns the
	// jobs running (started by the node holding them) per node, and the
	// ids of those that are not running.
	lastReport := time.Now()
	progress := func(what string, running map[string][]string, left []string) {
		if time.Since(lastReport) < 10*time.Second {
			return
		}
		lastReport = time.Now()
		per := map[string]int{}
		for n, js := range running {
			per[n] = len(js)
		}
		c.logf("%s: running %v, %d not running, %d findings", what, per, len(left), len(res.violations))
	}
	// parkedNow: the job's record said parked at the last poll (a parked
	// job hibernates: it has no actor until something wakes it).
	parkedNow := map[string]bool{}
	poll := func() (map[string][]string, []string) {
		res.polls++
		running := map[string][]string{}
		var notRunning []string
		err := c.store.Each(ctx, repjob.Filter{}, func(r *repjob.Record) error {
			id := r.GetJobId()
			if _, ok := byID[id]; !ok {
				return nil
			}
			st := r.State()
			if st == repjob.StateCrashing || st == repjob.StateFailed {
				if p.strict || st == repjob.StateFailed {
					res.violate("job %s (%s) is %s: %s", id, userDBOf(r), st, r.GetLastError())
				}
				res.crashed[id] = true
			}
			s := seen[id]
			node := r.WorkerNode
			parkedNow[id] = r.GetParkedSince() != nil
			if r.QueueState != jobqueue.StateRunning || r.GetNode() != node {
				notRunning = append(notRunning, id)
				// Pending or crashing, or taken by another node (whose
				// accept ended the run it had): the run seen last ended.
				if s != nil && (st != repjob.StateRunning || node != s.current) {
					s.gap = true
				}
				return nil
			}
			running[node] = append(running[node], id)
			switch {
			case s == nil:
				if victim != "" && p.strict {
					res.violate("job %s first seen running after the kill, on %s", id, node)
				}
				seen[id] = &jobSeen{current: node}
			case node == s.current && !s.gap:
			case node == s.current:
				// Its run ended (seen stopped, requeued or crashing) and
				// it runs again on the same node: a re-run too, although
				// the node never changed.
				if p.strict && !res.crashed[id] {
					res.violate("job %s ran again on %s after its run there ended", id, node)
				}
				s.gap, s.rerun = false, true
				res.reruns++
				res.sameNode++
			case s.current == victim && !killedAt.IsZero():
				s.current, s.movedTo, s.gap = node, node, false
			case s.gap && !p.strict:
				s.current, s.gap, s.rerun = node, false, true
				res.reruns++
			default:
				res.violate("job %s ran on %s, then on %s without its run ending in between (victim %s)", id, s.current, node, victim)
			}
			return nil
		})
		if err != nil {
			tb.Fatalf("reading the jobs: %v", err)
		}
		return running, notRunning
	}
	deadline := time.Now().Add(p.settle)
	var running map[string][]string
	for {
		var left []string
		running, left = poll()
		if len(left) == 0 {
			break
		}
		progress("starting", running, left)
		if time.Now().After(deadline) {
			tb.Fatalf("%d of %d jobs not running %v after they were added (e.g. %v); violations: %v",
				len(left), p.jobs, p.settle, left[:min(5, len(left))], res.violations)
		}
		time.Sleep(p.poll) // another process's store: poll
	}
	res.allRunning = time.Since(start)
	for n, js := range running {
		res.perNode[n] = len(js)
		if len(js) > len(running[victim]) {
			victim = n
		}
	}
	c.logf("all %d jobs running after %v: %v", p.jobs, res.allRunning.Round(time.Millisecond), res.perNode)
	if len(running) != len(c.nodes) {
		res.violate("jobs ran on %d nodes, want all %d: %v", len(running), len(c.nodes), res.perNode)
	}

	// Every job runs; the server may still be answering their first
	// requests. A write to a database of each node's jobs, through to the
	// central database, says the cluster is replicating.
	written := map[string]string{} // doc id -> user database
	write := func(when string, dbs []int) {
		for _, i := range dbs {
			id := userDB(i) + "-" + when
			t := time.Now()
			if err := putUserDoc(srv.DBURL(userDB(i))+id, p.settle); err != nil {
				res.violate("write %s: %v", id, err)
				continue
			}
			if d := time.Since(t); d > 10*time.Second {
				c.logf("write %s took %v", id, d.Round(time.Millisecond))
			}
			written[id] = userDB(i)
		}
	}
	arrived := func() {
		deadline := time.Now().Add(p.settle)
		for id, db := range written {
			for !docExists(http.DefaultClient, central, id) {
				if time.Now().After(deadline) {
					tb.Fatalf("%s (written to %s) did not reach the central database within %v; violations: %v", id, db, p.settle, res.violations)
				}
				time.Sleep(50 * time.Millisecond) // another process's state: poll
			}
		}
	}
	var first []int
	for _, js := range running {
		first = append(first, byID[js[0]])
		if len(js) > 1 {
			first = append(first, byID[js[len(js)-1]])
		}
	}
	write("before", first)
	arrived()
	res.ready = time.Since(start)
	c.logf("writes to %d user databases reached the central database %v after the jobs were added", len(first), res.ready.Round(time.Millisecond))

	// Every job parks (idle_park_after): its feed closed, woken by the
	// server's _db_updates feed.
	parkedSince := map[string]time.Time{}
	awaitParked := func(what string) {
		deadline := time.Now().Add(p.settle)
		for {
			clear(parkedSince)
			notParked := 0
			var example string
			if err := c.store.Each(ctx, repjob.Filter{}, func(r *repjob.Record) error {
				if _, ok := byID[r.GetJobId()]; !ok {
					return nil
				}
				if r.State() == repjob.StateRunning && r.GetParkedSince() != nil {
					parkedSince[r.GetJobId()] = r.GetParkedSince().AsTime()
				} else {
					notParked++
					example = fmt.Sprintf("%s: %s on %s", r.GetDocId(), r.State(), r.WorkerNode)
				}
				return nil
			}); err != nil {
				tb.Fatal(err)
			}
			if notParked == 0 {
				return
			}
			if time.Now().After(deadline) {
				tb.Fatalf("%s: %d jobs not parked after %v (e.g. %s); violations: %v", what, notParked, p.settle, example, res.violations)
			}
			time.Sleep(p.poll) // another process's store: poll
		}
	}
	if p.parkAfter > 0 {
		awaitParked("before the kill")
		res.parked = time.Since(start)
		c.logf("all %d jobs parked %v after they were added", p.jobs, res.parked.Round(time.Millisecond))
	}
	parkedBefore := maps.Clone(parkedSince)

	if p.idle > 0 {
		res.idle, res.pgIdleCPU, res.pgCommits = measureIdle(tb, c, pg, dsn, p.idle, res.perNode)
		for _, l := range res.idle {
			c.logf("idle %v: %v", p.idle, l)
		}
		c.logf("idle %v: PostgreSQL %.2f %% CPU, %.1f commits/s", p.idle, res.pgIdleCPU, res.pgCommits)
	}

	// The victim runs the most jobs. Sample databases: half of them its.
	victimIDs := running[victim]
	res.victim, res.victimJobs = victim, len(victimIDs)
	var sample []int
	var survivorsIDs []string
	for n, js := range running {
		if n != victim {
			survivorsIDs = append(survivorsIDs, js...)
		}
	}
	inSample := map[int]bool{}
	for k := range p.sample {
		from := victimIDs
		if k%2 == 1 {
			from = survivorsIDs
		}
		// A small run may pick a database twice: once (a second write of
		// the same document would conflict).
		if i := byID[from[k/2*len(from)/max(1, p.sample/2+1)]]; !inSample[i] {
			inSample[i] = true
			sample = append(sample, i)
		}
	}
	var victimNode *clusterNode
	for _, n := range c.nodes {
		if n.name == victim {
			victimNode = n
		}
	}
	cpu0, commits0 := pgtest.CPU(pg.PID()), pgCommits(tb, dsn)
	c.kill(victimNode)
	killedAt = time.Now()
	c.logf("SIGKILL %s running %d jobs", victim, len(victimIDs))

	// Writes while the victim's jobs are between nodes.
	write("during", sample)

	deadline = time.Now().Add(failoverBound(p.timeout) + p.settle)
	for {
		running, left := poll()
		if res.requeued == 0 && len(running[victim]) == 0 {
			res.requeued = time.Since(killedAt)
			c.logf("none of the %d jobs of %s runs on it %v after the SIGKILL", len(victimIDs), victim, res.requeued.Round(time.Millisecond))
		}
		if len(left) == 0 && len(running[victim]) == 0 {
			break
		}
		progress("failing over", running, left)
		if time.Now().After(deadline) {
			tb.Fatalf("%d jobs not running, %d still on %s, %v after the SIGKILL; violations: %v",
				len(left), len(running[victim]), victim, time.Since(killedAt), res.violations)
		}
		time.Sleep(p.poll) // another process's store: poll
	}
	res.failover = time.Since(killedAt)
	took := res.failover.Seconds()
	res.pgTakeoverCPU = 100 * (pgtest.CPU(pg.PID()) - cpu0).Seconds() / took
	res.pgTakeoverCommits = float64(pgCommits(tb, dsn)-commits0) / took
	c.logf("the %d jobs of %s run on the survivors %v after the SIGKILL", len(victimIDs), victim, res.failover.Round(time.Millisecond))

	write("after", sample)
	arrived()
	if p.parkAfter > 0 {
		// The takeover leaves the survivors' parked jobs parked (their
		// parked_since unchanged unless a write woke them); the victim's
		// parked jobs are adopted by the survivor that took them straight
		// to sleep (their records say parked: no run, no request to their
		// databases), parked_since unchanged too.
		awaitParked("after the kill")
		res.reparked = time.Since(killedAt)
		c.logf("all %d jobs parked again %v after the SIGKILL", p.jobs, res.reparked.Round(time.Millisecond))
		wokenByWrite := map[string]bool{}
		for doc, db := range written {
			if !strings.HasSuffix(doc, "-before") {
				wokenByWrite[ids[dbIndex(db)]] = true
			}
		}
		for _, id := range ids {
			s := seen[id]
			switch {
			case wokenByWrite[id] || res.crashed[id] || s.rerun:
			case s.movedTo != "":
				if !parkedSince[id].Equal(parkedBefore[id]) {
					res.violate("job %s, taken over by %s: parked since %v before the kill, since %v after it (run by the adoption, not put straight to sleep)",
						id, s.movedTo, parkedBefore[id], parkedSince[id])
				}
			case !parkedSince[id].Equal(parkedBefore[id]):
				res.violate("job %s on %s: parked since %v before the kill, since %v after it (woken by the takeover)", id, s.current, parkedBefore[id], parkedSince[id])
			}
		}
	}
	// One more poll with everything settled.
	running, left := poll()
	if len(left) > 0 || len(running[victim]) > 0 {
		res.violate("after the writes: %d jobs not running, %d on %s", len(left), len(running[victim]), victim)
	}
	for _, id := range ids {
		if s := seen[id]; s == nil || s.current == victim || s.current == "" {
			res.violate("job %s was never seen running on a survivor", id)
		}
	}

	// The run log: one run per survivor's job, two per victim's, none
	// overlapping (jobqueue.CheckRuns: in commit order of the store).
	runs, err := c.queue.Runs(ctx, repjob.JobType)
	if err != nil {
		tb.Fatal(err)
	}
	for _, id := range ids {
		rs := runs[id]
		if err := jobqueue.CheckRuns(rs); err != nil {
			res.violate("%v", err)
		}
		s := seen[id]
		if s.rerun || res.crashed[id] {
			continue // crashed and ran again: CheckRuns is the proof
		}
		nodes := []string{s.current}
		if s.movedTo != "" {
			nodes = []string{victim, s.movedTo}
		}
		var got []string
		for _, r := range rs {
			got = append(got, r.Node)
		}
		if !slices.Equal(got, nodes) {
			res.violate("job %s (%s): runs on %v, want %v", id, userDB(byID[id]), got, nodes)
		}
	}
	// The lease records: every job held once, by a lease of the node
	// running it; the victim's lease is gone.
	leases, err := c.queue.Leases(ctx, repjob.JobType)
	if err != nil {
		res.violate("lease records: %v", err)
	}
	heldBy := map[string]string{}
	for _, l := range leases {
		if l.Node == victim {
			res.violate("lease %s of the killed node %s is still in the store (dead %v, %d jobs)", l.ID, victim, l.Dead, len(l.Jobs))
		}
		for _, id := range l.Jobs {
			heldBy[id] = l.Node
		}
	}
	for _, id := range ids {
		want := seen[id].current
		if heldBy[id] != want {
			res.violate("job %s runs on %s, held under a lease of %q", id, want, heldBy[id])
		}
	}
	// The survivors' trees: each job's actor on one node, as many as the
	// store says the node runs; a parked job hibernates (no actor, but a
	// recheck may have woken it for a look: one on its node, if any).
	actorsOn := map[string]string{}
	for _, n := range c.live() {
		tr, err := treeOf(n)
		if err != nil {
			res.violate("tree of %s: %v", n.name, err)
			continue
		}
		count := 0
		for _, pth := range actorPaths(tr) {
			name, ok := strings.CutPrefix(pth, "job_server/jobs_sup/")
			if !ok || strings.Contains(name, "/") {
				continue
			}
			count++
			if other, dup := actorsOn[name]; dup {
				res.violate("job actor %s runs on %s and on %s", name, other, n.name)
			}
			actorsOn[name] = n.name
		}
		awake := 0
		for _, id := range running[n.name] {
			if !parkedNow[id] {
				awake++
			}
		}
		if count < awake || count > len(running[n.name]) {
			res.violate("%s has %d job actors, the store says it runs %d jobs, %d of them parked", n.name, count,
				len(running[n.name]), len(running[n.name])-awake)
		}
	}
	for n, js := range running {
		for _, id := range js {
			if got, ok := actorsOn[jobrunner.Name(id)]; (ok || !parkedNow[id]) && got != n {
				res.violate("job %s runs on %s in the store, its actor is on %q", id, n, got)
			}
		}
	}
	var info struct {
		DocCount int `json:"doc_count"`
	}
	srv.GetJSON(tb, central, &info)
	if want := len(written) + min(p.written, p.jobs); info.DocCount != want {
		res.violate("central database has %d documents, want the %d written", info.DocCount, want)
	}
	return res
}

// dbIndex is the number of user database name ("cluster-user-00042": 42).
func dbIndex(name string) int {
	i, _ := strconv.Atoi(name[strings.LastIndex(name, "-")+1:])
	return i
}

// userDBOf is the user database a job replicates from.
func userDBOf(r *repjob.Record) string { return r.GetDocId() }

// measureIdle measures every live node of c and the PostgreSQL server over
// window: CPU (% of a core), RSS and open fds of each node; the server's
// CPU and xact_commit rate.
func measureIdle(tb testing.TB, c *testCluster, pg *pgtest.Server, dsn string, window time.Duration, jobs map[string]int) ([]procLoad, float64, float64) {
	live := c.live()
	cpu0 := make([]time.Duration, len(live))
	for i, n := range live {
		cpu0[i] = pgtest.CPU(n.proc.cmd.Process.Pid)
	}
	pgCPU0, commits0 := pgtest.CPU(pg.PID()), pgCommits(tb, dsn)
	start := time.Now()
	time.Sleep(window) // the measurement window itself, not a wait for an event
	took := time.Since(start).Seconds()
	var out []procLoad
	for i, n := range live {
		pid := n.proc.cmd.Process.Pid
		out = append(out, procLoad{name: n.name, jobs: jobs[n.name], cpu: 100 * (pgtest.CPU(pid) - cpu0[i]).Seconds() / took,
			rss: procRSS(pid), fds: procFDs(pid)})
	}
	return out, 100 * (pgtest.CPU(pg.PID()) - pgCPU0).Seconds() / took, float64(pgCommits(tb, dsn)-commits0) / took
}

// pgCommits is the xact_commit count of dsn's database (pg_stat_database;
// the statistics are flushed about once a second).
func pgCommits(tb testing.TB, dsn string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		tb.Fatalf("pg_stat_database: %v", err)
	}
	defer conn.Close(ctx)
	var n int64
	if err := conn.QueryRow(ctx, "SELECT pg_stat_force_next_flush()").Scan(new(any)); err != nil {
		_ = err // PostgreSQL < 15: statistics are flushed on their own
	}
	if err := conn.QueryRow(ctx, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").Scan(&n); err != nil {
		tb.Fatalf("pg_stat_database: %v", err)
	}
	return n
}

// putUserDoc writes a new document at u, waiting up to timeout for the answer.
func putUserDoc(u string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, strings.NewReader(`{"by":"cluster failover"}`))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("PUT %s: %d %s", redactedURL(u), resp.StatusCode, b)
	}
	return nil
}

// putDB creates database u (201, or 412 if it exists).
func putDB(u string) error {
	req, err := http.NewRequest(http.MethodPut, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusAccepted && resp.StatusCode != http.StatusPreconditionFailed {
		return fmt.Errorf("PUT %s: %d %s", redactedURL(u), resp.StatusCode, b)
	}
	return nil
}

// deleteDB deletes database u, whatever the answer (the user databases of
// a run on a CouchDB, at its end).
func deleteDB(u string) error {
	req, err := http.NewRequest(http.MethodDelete, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return nil
}

// parallel runs fn(0..n-1) on k goroutines and returns the first error.
func parallel(k, n int, fn func(i int) error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		next int
		errs []error
	)
	for range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				stop := len(errs) > 0
				mu.Unlock()
				if i >= n || stop {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// TestClusterFailover is the failover of runClusterFailover at the size of
// `make test` (COUCHREP_CLUSTER_TEST_JOBS to change it): three nodes on
// PostgreSQL, SIGKILL the busiest; every invariant must hold.
func TestClusterFailover(t *testing.T) {
	skipShort(t)
	n := 900
	if v, err := strconv.Atoi(os.Getenv("COUCHREP_CLUSTER_TEST_JOBS")); err == nil && v >= 6 {
		n = v
	}
	res := runClusterFailover(t, failoverParams{jobs: n, timeout: 10 * time.Second, sample: 20, strict: true, parkAfter: 2,
		poll: 250 * time.Millisecond, settle: 3 * time.Minute})
	t.Logf("%d jobs: databases created in %v, jobs added in %v, all running after %v (%v), replicating after %v, all parked after %v; "+
		"SIGKILL %s (%d jobs): off it after %v, all running on the survivors after %v, all parked again after %v (%d polls); load %s",
		n, res.createDBs.Round(time.Millisecond), res.addJobs.Round(time.Millisecond), res.allRunning.Round(time.Millisecond),
		res.perNode, res.ready.Round(time.Millisecond), res.parked.Round(time.Millisecond), res.victim, res.victimJobs,
		res.requeued.Round(time.Millisecond), res.failover.Round(time.Millisecond), res.reparked.Round(time.Millisecond), res.polls, loadAvg())
	for _, v := range res.violations {
		t.Error(v)
	}
}

// BenchmarkClusterFailover is runClusterFailover at scale: 3,000 per-user
// continuous jobs by default, the largest size that fits this 2-core
// machine with PouchDB Server as the users' server (BENCHMARKS.md, "Cluster
// failover"; the issue's 30,000 is COUCHREP_CLUSTER_BENCH_JOBS=30000), on
// three nodes sharing one PostgreSQL store, at the default activity
// timeout (30 s; COUCHREP_CLUSTER_BENCH_TIMEOUT) and heartbeat. It reports
// the time until every job runs after they were added, until a write
// reaches the central database and until every job parked
// (idle_park_after 10 s, COUCHREP_CLUSTER_BENCH_PARK; 0 never parks), each
// node's and PostgreSQL's load over 30 s idle (COUCHREP_CLUSTER_BENCH_IDLE),
// the time until the jobs of the SIGKILLed node run on the other two and
// park again, and the store's load meanwhile. The user databases are empty
// but for the writes of the checks (their jobs' starts write no
// checkpoint); COUCHREP_CLUSTER_BENCH_WRITTEN=n gives n of them (spread
// evenly) a document before the jobs are added. Each wait (all running,
// parked, failover, a write arriving) is bounded by 10 minutes
// (COUCHREP_CLUSTER_BENCH_SETTLE). COUCHREP_HARNESS_ECHO=1
// shows the progress as it happens.
//
//	go test -run '^$' -bench ClusterFailover -benchtime 1x -timeout 120m ./integration/
func BenchmarkClusterFailover(b *testing.B) {
	n, timeout, idle, park := 3000, 30*time.Second, 30*time.Second, 10
	if v, err := strconv.Atoi(os.Getenv("COUCHREP_CLUSTER_BENCH_JOBS")); err == nil && v >= 6 {
		n = v
	}
	if v, err := time.ParseDuration(os.Getenv("COUCHREP_CLUSTER_BENCH_TIMEOUT")); err == nil && v > 0 {
		timeout = v
	}
	if v, err := time.ParseDuration(os.Getenv("COUCHREP_CLUSTER_BENCH_IDLE")); err == nil && v > 0 {
		idle = v
	}
	if v, err := strconv.Atoi(os.Getenv("COUCHREP_CLUSTER_BENCH_PARK")); err == nil && v >= 0 {
		park = v
	}
	written := 0
	if v, err := strconv.Atoi(os.Getenv("COUCHREP_CLUSTER_BENCH_WRITTEN")); err == nil && v >= 0 {
		written = v
	}
	settle := 10 * time.Minute
	if v, err := time.ParseDuration(os.Getenv("COUCHREP_CLUSTER_BENCH_SETTLE")); err == nil && v > 0 {
		settle = v
	}
	for range b.N {
		res := runClusterFailover(b, failoverParams{jobs: n, timeout: timeout, sample: 20, idle: idle, parkAfter: park, written: written,
			poll: time.Second, settle: settle, logLevel: "warn",
			// The default heartbeat (the harness's is 250 ms): the idle
			// store load is then the jobs' and the leases'.
			env: []string{"COUCHREP_COUCHREP_HEARTBEAT_INTERVAL=5000"}})
		b.ReportMetric(res.allRunning.Seconds(), "s-all-running")
		b.ReportMetric(res.ready.Seconds(), "s-replicating")
		b.ReportMetric(res.failover.Seconds(), "s-failover")
		b.ReportMetric(res.requeued.Seconds(), "s-off-victim")
		b.ReportMetric(res.parked.Seconds(), "s-all-parked")
		b.ReportMetric(res.reparked.Seconds(), "s-reparked")
		b.ReportMetric(res.pgIdleCPU, "%cpu-pg-idle")
		b.ReportMetric(res.pgCommits, "commits/s-idle")
		b.ReportMetric(res.pgTakeoverCPU, "%cpu-pg-takeover")
		b.ReportMetric(res.pgTakeoverCommits, "commits/s-takeover")
		var cpu, rss float64
		for _, l := range res.idle {
			cpu, rss = max(cpu, l.cpu), max(rss, float64(l.rss>>20))
		}
		b.ReportMetric(cpu, "%cpu-node-idle-max")
		b.ReportMetric(rss, "MB-node-rss-max")
		b.ReportMetric(float64(len(res.crashed)), "jobs-crashed")
		nodes := slices.Sorted(maps.Keys(res.perNode))
		var per []string
		for _, nd := range nodes {
			per = append(per, fmt.Sprintf("%s=%d", nd, res.perNode[nd]))
		}
		sort.Strings(per)
		b.Logf("%d jobs (timeout %v, %d databases written before the add): databases created in %v, jobs added in %v, all running after %v (%s), replicating after %v",
			n, timeout, min(written, n), res.createDBs.Round(time.Millisecond), res.addJobs.Round(time.Millisecond), res.allRunning.Round(time.Millisecond),
			strings.Join(per, " "), res.ready.Round(time.Millisecond))
		for _, l := range res.idle {
			b.Logf("idle %v: %v", idle, l)
		}
		b.Logf("idle %v: PostgreSQL %.2f %% CPU, %.1f commits/s", idle, res.pgIdleCPU, res.pgCommits)
		b.ReportMetric(float64(res.reruns), "re-runs")
		b.Logf("jobs seen crashing: %d; re-runs (a job running again after its run ended): %d, %d of them on the same node", len(res.crashed), res.reruns, res.sameNode)
		b.Logf("SIGKILL %s (%d jobs): off it after %v, all running on the survivors after %v; PostgreSQL meanwhile %.1f %% CPU, %.1f commits/s; load %s",
			res.victim, res.victimJobs, res.requeued.Round(time.Millisecond), res.failover.Round(time.Millisecond), res.pgTakeoverCPU, res.pgTakeoverCommits, loadAvg())
		for _, v := range res.violations {
			b.Error(v)
		}
	}
}
