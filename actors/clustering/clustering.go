// Package clustering is the clustering actor: it keeps this node's
// membership record in the shared store (a heartbeat every
// [couchrep] heartbeat_interval), watches the other nodes' records, and
// publishes a *messages.ClusterEvent on the node's event stream when the
// membership it sees changes ("cluster unstable") and again once it stayed
// unchanged for [couchrep] cluster_quiet_period ("cluster stable"). It
// answers *messages.NodesRequest (couchrepctl nodes) with every registered
// node, the jobs each runs and whether it is drained (the job server keeps
// that flag in the node's record). Each heartbeat carries the node's free
// job slots (actors.Deps.Slots, kept by the scheduler), which the other
// nodes' schedulers read before they rotate.
//
// It is also the node's store health check: its first heartbeat is written
// while it starts, so a node whose store cannot be written fails to start
// with that error; and when heartbeats keep failing for longer than the job
// activity timeout (after which other nodes take this node's jobs anyway),
// it exits with an error wrapping ErrStoreUnavailable. Its restarts fail the
// same way at once, so the node's top supervisor gives up and the node stops
// with the store error, rather than run on without a store; except while
// the store only cannot be reached (kv.ErrUnavailable: a PostgreSQL server
// restarting), which it waits out. It never writes anything but its own
// membership record. When another process claimed the node's name while
// this node missed its heartbeats for longer than its lease (cluster.Claim),
// it exits with an error wrapping cluster.ErrNameTaken, and so do its
// restarts: the node stops rather than run beside the new holder.
package clustering

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/internal/cluster"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/pause"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

// Name is the actor's name under the node's root supervisor.
const Name = "clustering"

// ErrStoreUnavailable is the exit reason (wrapped) when the node cannot
// write its heartbeat to the store.
var ErrStoreUnavailable = errors.New("clustering: job store unavailable")

// forgetAfter is how long a dead or departed node's record is kept.
const forgetAfter = 24 * time.Hour

// Options tune the actor; zero values come from the node's config.
type Options struct {
	// Interval is the heartbeat interval.
	Interval time.Duration
	// Quiet is the quiet period before "cluster stable".
	Quiet time.Duration
	// FailAfter is how long heartbeats may fail before the actor exits
	// with ErrStoreUnavailable (default: the activity timeout).
	FailAfter time.Duration
}

// Spec returns the actor's child spec in the node's supervision tree.
func Spec(deps actors.Deps) supervisor.ChildSpec {
	return supervisor.ChildSpec{Name: Name, Props: Props(deps, Options{})}
}

// Props returns the actor's props. The node's incarnation (a random id
// telling a restarted node from its previous life) is fixed here, so that
// restarts of the actor keep it.
func Props(deps actors.Deps, opts Options) *actor.Props {
	c := deps.Config.Couchrep
	if opts.Interval <= 0 {
		opts.Interval = c.HeartbeatInterval
	}
	if opts.Interval <= 0 {
		opts.Interval = 5 * time.Second
	}
	if opts.Quiet <= 0 {
		opts.Quiet = c.ClusterQuietPeriod
	}
	if opts.FailAfter <= 0 {
		opts.FailAfter = c.ActivityTimeout
	}
	if opts.FailAfter <= 0 {
		opts.FailAfter = repjob.DefaultActivityTimeout
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	inc := hex.EncodeToString(b[:])
	started := time.Now()
	// The process that claimed the node's name (couchrep.Start): another
	// one claiming it later stops this node's heartbeats.
	owner := cluster.OwnerOf(c.DataDir)
	return actors.Props(func() actor.Actor {
		return &clustering{deps: deps, opts: opts, incarnation: inc, startedAt: started,
			reg: cluster.New(deps.Store, cluster.Options{Owner: &owner}),
			log: deps.Logger.With().Str("actor", Name).Logger()}
	}, actors.Handles(&messages.NodesRequest{}))
}

type clustering struct {
	deps        actors.Deps
	opts        Options
	incarnation string
	startedAt   time.Time
	reg         *cluster.Registry
	log         zerolog.Logger

	task actors.Task

	mu       sync.Mutex
	unstable bool

	// running is the last count of running jobs per node, kept while the
	// store's job generation stays the same (runningJobs).
	running runningCount
}

// runningCount is a count of the running jobs per node, kept job by job
// (runningJobs).
type runningCount struct {
	mu     sync.Mutex
	f      *repjob.Follower
	nodeOf map[string]string // job id → its node while it runs, "" otherwise
	byNode map[string]uint32 // nil: none
}

// runningMaxAge bounds how long the count is kept without reading every
// job again (a node of an older version writes records without bumping
// the generation shards this one reads).
const runningMaxAge = 5 * time.Minute

// runningJobs counts the running jobs of every node. It reads every job
// record once (its state and node: repjob.Store.JobNodes), then only the
// jobs written or added since (repjob.Follower: the store's generation
// shard by shard), so a scrape of /metrics or the status page of a node at
// rest reads a few keys, and one after a job's write that job and the few
// of its shard. The map is shared: callers must not change it.
func (a *clustering) runningJobs(ctx context.Context) (map[string]uint32, error) {
	c := &a.running
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.f == nil {
		c.f = a.deps.RepJobs.NewFollower(runningMaxAge)
	}
	full, ids, err := c.f.Next(ctx)
	if err != nil {
		return nil, err
	}
	if full {
		nodes, err := a.deps.RepJobs.JobNodes(ctx)
		if err != nil {
			return nil, err
		}
		c.f.Reset()
		running := map[string]uint32{}
		for id, node := range nodes {
			c.f.Seen(id)
			if node != "" {
				running[node]++
			}
		}
		c.f.Commit()
		c.nodeOf, c.byNode = nodes, running
		return running, nil
	}
	if len(ids) == 0 {
		c.f.Commit()
		return c.byNode, nil
	}
	nodes, err := a.deps.RepJobs.JobNodesOf(ctx, ids)
	if err != nil {
		return nil, err
	}
	running := maps.Clone(c.byNode)
	for _, id := range ids {
		if old := c.nodeOf[id]; old != "" {
			if running[old]--; running[old] == 0 {
				delete(running, old)
			}
		}
		node, ok := nodes[id]
		if !ok {
			c.f.Gone(id)
			delete(c.nodeOf, id)
			continue
		}
		c.f.Seen(id)
		c.nodeOf[id] = node
		if node != "" {
			running[node]++
		}
	}
	c.f.Commit()
	c.byNode = running
	return running, nil
}

func (a *clustering) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case *actor.Started:
		if err := a.start(ctx); err != nil {
			supervisor.Exit(ctx, err)
		}
	case *actor.Stopping:
		a.stop()
	case *messages.NodesRequest:
		if ctx.Sender() == nil {
			return
		}
		sender, system := ctx.Sender(), ctx.ActorSystem()
		go func() {
			c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := a.nodes(c)
			if err != nil {
				system.Root.Send(sender, err)
				return
			}
			system.Root.Send(sender, resp)
		}()
	}
}

func (a *clustering) record() *messages.NodeRecord {
	c := a.deps.Config.Couchrep
	rec := &messages.NodeRecord{
		Name: a.deps.NodeName(), Types: slices.Clone(c.NodeTypes), Incarnation: a.incarnation,
		StartedAt: timestamppb.New(a.startedAt), HeartbeatIntervalMs: a.opts.Interval.Milliseconds(),
		AdminAddress: readAddr(c.DataDir, "admin.addr"), HttpAddress: readAddr(c.DataDir, "http.addr"),
		Pid: int64(os.Getpid()),
	}
	// The scheduler's free slots: the other nodes' schedulers rotate only
	// for the pending jobs beyond the live nodes' free slots.
	if a.deps.Slots != nil {
		if free, ok := a.deps.Slots.Get(); ok {
			rec.FreeSlots = proto.Uint32(uint32(free))
		}
	}
	// The jobs it holds: the other nodes' accept loops take their share
	// of the pending jobs (schedpolicy.AcceptShare).
	if a.deps.Held != nil {
		rec.HeldJobs = proto.Uint32(uint32(max(0, a.deps.Held())))
	}
	return rec
}

// readAddr reads an address file the node writes into its data directory
// once it listens (empty if there is none).
func readAddr(dir, name string) string {
	if dir == "" {
		return ""
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// start writes the first heartbeat (bounded: a store that cannot take it
// fails the start) and starts the heartbeat loop.
func (a *clustering) start(ctx actor.Context) error {
	if a.deps.Store == nil {
		return nil
	}
	// The liveness lane (kv.WithPriority): job transactions queued for the
	// store never delay the heartbeat.
	c, cancel := context.WithTimeout(kv.WithPriority(context.Background()), max(5*time.Second, a.opts.Interval))
	err := a.checkStore(c)
	if err == nil {
		err = a.reg.Heartbeat(c, a.record())
	}
	if err == nil {
		_, err = a.reg.Members(c)
	}
	cancel()
	if errors.Is(err, cluster.ErrNameTaken) {
		return err
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	system, self := ctx.ActorSystem(), ctx.Self()
	a.task.Go(func(c context.Context) { a.loop(c, system, self) })
	return nil
}

func (a *clustering) stop() {
	if !a.task.Running() {
		return
	}
	a.task.Stop(0)
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// A restarted actor registers again at once; a stopping node is gone
	// for the others now rather than after three missed heartbeats.
	if err := a.reg.Leave(c, a.deps.NodeName(), a.incarnation); err != nil && !errors.Is(err, kv.ErrClosed) {
		a.log.Warn().Err(err).Msg("clustering: leave")
	}
}

// checkStore runs the store's own health check, if it has one: a store
// serving transactions from warm caches may not notice that its file is
// gone bad, and a restarted incarnation must fail its start then too, so
// that the supervisor's restart intensity gives up on the node.
func (a *clustering) checkStore(ctx context.Context) error {
	if c, ok := a.deps.Store.(kv.Checker); ok {
		return c.Check(ctx)
	}
	return nil
}

// loop heartbeats and watches membership until ctx ends.
func (a *clustering) loop(ctx context.Context, system *actor.ActorSystem, self *actor.PID) {
	// Heartbeats and the members' read go in the store's liveness lane:
	// a node whose job transactions queue for the store (thousands of
	// jobs starting) is alive, and must look it.
	ctx = kv.WithPriority(ctx)
	stab := cluster.NewStability(a.opts.Quiet)
	lastOK := time.Now()
	var lastForget time.Time
	// A round is due an interval after the previous one began.
	for due := time.Now(); pause.For(ctx, time.Until(due)) == nil; {
		now := time.Now()
		due = now.Add(a.opts.Interval)
		// The store is healthy when the heartbeat commits and the
		// members read back: a store can fail one way only.
		err := a.checkStore(ctx)
		if err == nil {
			err = a.reg.Heartbeat(ctx, a.record())
		}
		var members []cluster.Member
		if err == nil {
			members, err = a.reg.Members(ctx)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, cluster.ErrNameTaken) {
				// Another process holds the name now: running on beside it
				// would make two nodes of one name.
				a.log.Error().Err(err).Dur("since_last_ok", now.Sub(lastOK)).Msg("clustering: the node name was taken over while this node missed its heartbeats; stopping")
				system.Root.Send(self, &actors.Failed{Err: err})
				return
			}
			a.log.Warn().Err(err).Dur("since_last_ok", now.Sub(lastOK)).Msg("clustering: heartbeat failed")
			// A store server that is down or restarting (kv.ErrUnavailable)
			// is waited for: every node lost it alike, and stopping them
			// all would turn a database restart into a cluster outage.
			// Other nodes take this node's jobs after the activity timeout
			// anyway if they can reach the store and it cannot.
			if now.Sub(lastOK) >= a.opts.FailAfter && !errors.Is(err, kv.ErrUnavailable) {
				err = fmt.Errorf("%w: no heartbeat for %s: %w", ErrStoreUnavailable, now.Sub(lastOK).Round(time.Millisecond), err)
				a.log.Error().Err(err).Dur("failing_for", a.opts.FailAfter).Msg("clustering: the job store stays unavailable; stopping")
				system.Root.Send(self, &actors.Failed{Err: err})
				return
			}
			continue
		}
		lastOK = now
		var live []string
		for _, m := range members {
			if m.Alive {
				live = append(live, m.GetName())
			}
		}
		if tr := stab.Observe(live, now); tr != cluster.NoChange {
			a.publish(system, tr, stab.Members(), now)
		}
		if now.Sub(lastForget) > time.Hour {
			lastForget = now
			if n, err := a.reg.Forget(ctx, forgetAfter); err == nil && n > 0 {
				a.log.Info().Int("forgotten", n).Msg("clustering: removed records of long-gone nodes")
			}
		}
	}
}

func (a *clustering) publish(system *actor.ActorSystem, tr cluster.Transition, members []string, now time.Time) {
	kind := messages.ClusterEvent_KIND_STABLE
	if tr == cluster.BecameUnstable {
		kind = messages.ClusterEvent_KIND_UNSTABLE
	}
	a.mu.Lock()
	a.unstable = tr == cluster.BecameUnstable
	a.mu.Unlock()
	msg := "cluster stable"
	if a.unstable {
		msg = "cluster unstable"
	}
	a.log.Info().Strs("members", members).Str("event", msg).Msg(msg)
	system.EventStream.Publish(&messages.ClusterEvent{Kind: kind, Node: a.deps.NodeName(), Members: members, Time: timestamppb.New(now)})
}

// nodes builds the answer to NodesRequest: every registered node with the
// jobs it runs now.
func (a *clustering) nodes(ctx context.Context) (*messages.NodesResponse, error) {
	if a.deps.Store == nil {
		return &messages.NodesResponse{}, nil
	}
	members, err := a.reg.Members(ctx)
	if err != nil {
		return nil, err
	}
	var running map[string]uint32
	if a.deps.RepJobs != nil {
		if running, err = a.runningJobs(ctx); err != nil {
			return nil, fmt.Errorf("clustering: count running jobs: %w", err)
		}
	}
	a.mu.Lock()
	resp := &messages.NodesResponse{Unstable: a.unstable}
	a.mu.Unlock()
	for _, c := range a.deps.Competition.Snapshot() {
		m := &messages.CompetingReplicatorCheck{Server: c.Server, Status: c.Status, Reason: c.Reason, Action: c.Action,
			ServerWide: c.ServerWide, OtherStores: c.OtherStores, StoppedJobs: uint32(c.Stopped)}
		if !c.Checked.IsZero() {
			m.Checked = timestamppb.New(c.Checked)
		}
		for _, d := range c.Databases {
			m.Databases = append(m.Databases, &messages.CompetingDatabase{Db: d.DB, Jobs: uint32(d.Jobs), Since: timestamppb.New(d.Since)})
		}
		resp.CompetingReplicators = append(resp.CompetingReplicators, m)
	}
	for _, m := range members {
		resp.Nodes = append(resp.Nodes, &messages.NodeInfo{
			Name: m.GetName(), Types: m.GetTypes(), LastHeartbeat: m.GetHeartbeat(),
			RunningJobs: running[m.GetName()], Alive: m.Alive, Draining: m.GetDraining(),
			AdminAddress: m.GetAdminAddress(), HttpAddress: m.GetHttpAddress(),
		})
	}
	return resp, nil
}
