// Package cluster is node membership in the shared job store: every node
// rewrites its record (messages.NodeRecord) at each heartbeat, reads every
// other node's record, and tracks whether the membership it sees has been
// stable for a quiet period.
//
// Liveness is judged from the heartbeat's wall-clock time against three of
// the heartbeat intervals the node promised: nodes sharing an embedded store
// share one machine's clock. Membership is informational (couchrepctl
// nodes, cluster events); correctness of job ownership never depends on it:
// that is the job queue's worker locks and activity timeouts.
//
// A node's record also holds whether it is drained (SetDraining), so that
// a drained node that restarts stays drained.
//
// A name is one node's at a time: a node claims it before it starts
// (Claim), which fails while another live node holds it.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
	"github.com/couchrep/couchrep/messages"
)

// ErrCorrupt is returned (wrapped) for a membership record that does not
// decode.
var ErrCorrupt = errors.New("cluster: corrupt node record")

// MissedHeartbeats is how many heartbeat intervals a node may miss before it
// counts as gone.
const MissedHeartbeats = 3

// Registry reads and writes membership records in a store.
type Registry struct {
	db          kv.Database
	nodes       tuple.Subspace
	owners      tuple.Subspace
	clock       func() time.Time
	processGone func(pid int64) bool
	owner       *Owner
}

// Options configure a Registry.
type Options struct {
	// Prefix is prepended to the registry's keys; nodes sharing a store
	// must agree.
	Prefix []byte
	// Clock tells the time; nil is time.Now.
	Clock func() time.Time
	// ProcessGone tells whether no process with a pid runs on this host
	// (Claim); nil asks the operating system.
	ProcessGone func(pid int64) bool
	// Owner, when set, is the process this registry heartbeats for:
	// Heartbeat fails with ErrNameTaken once another process claimed the
	// name (Claim).
	Owner *Owner
}

// New returns the registry over db.
func New(db kv.Database, opts Options) *Registry {
	r := &Registry{db: db, nodes: tuple.NewSubspace(opts.Prefix, tuple.Tuple{"cluster", "nodes"}),
		owners: tuple.NewSubspace(opts.Prefix, tuple.Tuple{"cluster", "owners"}), clock: opts.Clock, processGone: opts.ProcessGone, owner: opts.Owner}
	if r.clock == nil {
		r.clock = time.Now
	}
	if r.processGone == nil {
		r.processGone = processGone
	}
	return r
}

// Member is a node as read from the registry.
type Member struct {
	*messages.NodeRecord
	// Alive: the last heartbeat is recent enough and the node did not
	// leave.
	Alive bool
}

// Heartbeat writes rec (stamped with the current time) as its node's
// record. The stored drain flag is kept: it is the job server's to change
// (SetDraining), whatever rec says. With Options.Owner set, it fails with
// ErrNameTaken, writing nothing, once another process claimed the name.
func (r *Registry) Heartbeat(ctx context.Context, rec *messages.NodeRecord) error {
	rec = proto.Clone(rec).(*messages.NodeRecord)
	rec.Heartbeat = timestamppb.New(r.clock())
	if err := r.db.Transact(ctx, func(tx kv.Tx) error {
		if err := r.checkOwner(tx, rec.GetName()); err != nil {
			return err
		}
		key := r.nodes.Pack(tuple.Tuple{rec.GetName()})
		old, err := r.get(tx, key, rec.GetName())
		if err != nil {
			return err
		}
		rec.Draining = old.GetDraining()
		return r.put(tx, key, rec)
	}); err != nil {
		return fmt.Errorf("cluster: heartbeat of %q: %w", rec.GetName(), err)
	}
	return nil
}

// SetDraining records whether node name is drained: a drained node accepts
// no jobs, also after a restart, until it is undrained. A node without a
// record yet gets one holding only its name and the flag.
func (r *Registry) SetDraining(ctx context.Context, name string, draining bool) error {
	err := r.db.Transact(ctx, func(tx kv.Tx) error {
		key := r.nodes.Pack(tuple.Tuple{name})
		rec, err := r.get(tx, key, name)
		if err != nil {
			return err
		}
		if rec == nil {
			rec = &messages.NodeRecord{Name: name}
		}
		rec.Draining = draining
		return r.put(tx, key, rec)
	})
	if err != nil {
		return fmt.Errorf("cluster: set draining of %q: %w", name, err)
	}
	return nil
}

// Draining reports whether node name's record says it is drained.
func (r *Registry) Draining(ctx context.Context, name string) (bool, error) {
	var draining bool
	err := r.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		rec, err := r.get(tx, r.nodes.Pack(tuple.Tuple{name}), name)
		draining = rec.GetDraining()
		return err
	})
	if err != nil {
		return false, fmt.Errorf("cluster: read draining of %q: %w", name, err)
	}
	return draining, nil
}

// get reads the record at key (nil if there is none).
func (r *Registry) get(tx kv.ReadTx, key []byte, name string) (*messages.NodeRecord, error) {
	v, err := tx.Get(key)
	if err != nil || v == nil {
		return nil, err
	}
	rec := &messages.NodeRecord{}
	if err := proto.Unmarshal(v, rec); err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrCorrupt, name, err)
	}
	return rec, nil
}

func (r *Registry) put(tx kv.Tx, key []byte, rec *messages.NodeRecord) error {
	b, err := proto.Marshal(rec)
	if err != nil {
		return fmt.Errorf("cluster: encode node %q: %w", rec.GetName(), err)
	}
	tx.Set(key, b)
	return nil
}

// Leave marks the node's record as left, if incarnation still owns it (a
// node restarted meanwhile under the same name keeps its record).
func (r *Registry) Leave(ctx context.Context, name, incarnation string) error {
	err := r.db.Transact(ctx, func(tx kv.Tx) error {
		key := r.nodes.Pack(tuple.Tuple{name})
		rec, err := r.get(tx, key, name)
		if err != nil || rec == nil || rec.GetIncarnation() != incarnation {
			return err
		}
		rec.Left = true
		rec.Heartbeat = timestamppb.New(r.clock())
		return r.put(tx, key, rec)
	})
	if err != nil {
		return fmt.Errorf("cluster: leave %q: %w", name, err)
	}
	return nil
}

// Members returns every registered node, sorted by name, alive or not.
func (r *Registry) Members(ctx context.Context) ([]Member, error) {
	var out []Member
	err := r.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		out = out[:0]
		begin, end := r.nodes.Range()
		it := tx.GetRange(begin, end, kv.RangeOptions{})
		for it.Next() {
			rec := &messages.NodeRecord{}
			if err := proto.Unmarshal(it.KeyValue().Value, rec); err != nil {
				return fmt.Errorf("%w: key %x: %w", ErrCorrupt, it.KeyValue().Key, err)
			}
			out = append(out, Member{NodeRecord: rec})
		}
		return it.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("cluster: read members: %w", err)
	}
	now := r.clock()
	for i := range out {
		out[i].Alive = IsAlive(out[i].NodeRecord, now)
	}
	return out, nil
}

// IsAlive reports whether rec's node counts as a member at now.
func IsAlive(rec *messages.NodeRecord, now time.Time) bool {
	if rec.GetLeft() || rec.GetHeartbeat() == nil {
		return false
	}
	iv := time.Duration(rec.GetHeartbeatIntervalMs()) * time.Millisecond
	return now.Sub(rec.GetHeartbeat().AsTime()) <= MissedHeartbeats*iv
}

// Forget removes the records of nodes gone for longer than age (dead or
// left), so the registry does not grow with every node name ever used. It
// returns how many it removed.
func (r *Registry) Forget(ctx context.Context, age time.Duration) (int, error) {
	n := 0
	err := r.db.Transact(ctx, func(tx kv.Tx) error {
		now := r.clock()
		begin, end := r.nodes.Range()
		var err error
		var names []string
		n, err = kv.ClearWhere(tx, begin, end, kv.RangeOptions{}, func(e kv.KeyValue) (bool, error) {
			rec := &messages.NodeRecord{}
			if err := proto.Unmarshal(e.Value, rec); err != nil {
				return false, nil // an operator's problem; never delete what we cannot read
			}
			gone := !IsAlive(rec, now) && now.Sub(rec.GetHeartbeat().AsTime()) > age
			if gone {
				names = append(names, rec.GetName())
			}
			return gone, nil
		})
		for _, name := range names {
			tx.Clear(r.ownerKey(name))
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("cluster: forget old nodes: %w", err)
	}
	return n, nil
}

// Stability tracks the membership one node sees: every change makes it
// unstable, and it becomes stable once membership stayed unchanged for the
// quiet period. It starts unstable. It is not safe for concurrent use.
type Stability struct {
	quiet   time.Duration
	members []string
	changed time.Time
	stable  bool
	seen    bool
}

// NewStability returns a tracker with the given quiet period.
func NewStability(quiet time.Duration) *Stability { return &Stability{quiet: quiet} }

// Transition is what Observe reports.
type Transition int

// Transitions.
const (
	// NoChange: still stable, or still unstable within the quiet period.
	NoChange Transition = iota
	// BecameUnstable: membership changed.
	BecameUnstable
	// BecameStable: the quiet period passed without a change.
	BecameStable
)

// Observe feeds the live members (names) seen at now and reports the
// transition, if any. The first observation is a change, and so is every
// change while unstable (it restarts the quiet period).
func (s *Stability) Observe(members []string, now time.Time) Transition {
	m := slices.Clone(members)
	slices.Sort(m)
	if !s.seen || !slices.Equal(m, s.members) {
		// Every change (re)starts the quiet period, stable or not.
		s.seen, s.members, s.changed, s.stable = true, m, now, false
		return BecameUnstable
	}
	if !s.stable && now.Sub(s.changed) >= s.quiet {
		s.stable = true
		return BecameStable
	}
	return NoChange
}

// Stable reports whether membership is stable.
func (s *Stability) Stable() bool { return s.stable }

// Members returns the members last observed, sorted.
func (s *Stability) Members() []string { return slices.Clone(s.members) }

// StoreHealth is the job store's health for the admin tree: "ok" or
// "unavailable: <reason>", from the store's own check (kv.Checker; a
// PostgreSQL store pings its server) and a read.
func StoreHealth(ctx context.Context, db kv.Database) string {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var err error
	if c, ok := db.(kv.Checker); ok {
		err = c.Check(ctx)
	}
	if err == nil {
		err = db.ReadTransact(ctx, func(tx kv.ReadTx) error { _, err := tx.Get(uuidKey); return err })
	}
	if err != nil {
		return "unavailable: " + err.Error()
	}
	return "ok"
}
