package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
	"github.com/couchrep/couchrep/messages"
)

// ErrNameInUse is returned (as a *NameInUseError) by Claim when a live
// node already goes by the name.
var ErrNameInUse = errors.New("cluster: node name in use")

// ErrNameTaken is returned (wrapped) by Heartbeat of a registry whose
// Options.Owner is set when another process claimed the node's name
// meanwhile (this node missed its heartbeats for longer than its lease:
// paused, or cut off from the store): the node must stop rather than run
// beside the new holder under one name.
var ErrNameTaken = errors.New("cluster: node name taken over by another process")

// Owner says which process runs a node: the one that claimed its name
// (Claim). It is kept next to the node's membership record.
type Owner struct {
	Host    string `json:"host"`
	DataDir string `json:"data_dir,omitempty"`
	PID     int64  `json:"pid"`
}

func (o Owner) String() string {
	s := fmt.Sprintf("pid %d on host %s", o.PID, o.Host)
	if o.DataDir != "" {
		s += ", data directory " + o.DataDir
	}
	return s
}

// NameInUseError is Claim's refusal: the name's record is alive and was
// not left behind by a dead process of the same data directory.
type NameInUseError struct {
	Name string
	// Holder is the process that claimed the name (zero if the record
	// was written without a claim).
	Holder Owner
	// Heartbeat is the holder's last heartbeat; its lease expires at
	// Expires unless it heartbeats again.
	Heartbeat, Expires time.Time
	// Now is when the claim was refused.
	Now time.Time
}

func (e *NameInUseError) Error() string {
	holder := "another node"
	if e.Holder.PID != 0 {
		holder = "a live node (" + e.Holder.String() + ")"
	}
	return fmt.Sprintf("node name %q is in use by %s: its last heartbeat was %s ago, its membership lease expires at %s (in %s) unless it heartbeats again; stop that node, or give this one another name (--node-name, [couchrep] node_name)",
		e.Name, holder, e.Now.Sub(e.Heartbeat).Round(time.Millisecond), e.Expires.UTC().Format(time.RFC3339Nano), e.Expires.Sub(e.Now).Round(time.Millisecond))
}

func (e *NameInUseError) Unwrap() error { return ErrNameInUse }

// OwnerOf is this process as the owner of a node with data directory dir.
func OwnerOf(dir string) Owner {
	host, _ := os.Hostname()
	if abs, err := filepath.Abs(dir); err == nil && dir != "" {
		dir = abs
	}
	return Owner{Host: host, DataDir: dir, PID: int64(os.Getpid())}
}

// checkOwner fails with ErrNameTaken when name's recorded owner is not
// r's own (no recorded owner is fine: a node that never claimed).
func (r *Registry) checkOwner(tx kv.ReadTx, name string) error {
	if r.owner == nil {
		return nil
	}
	v, err := tx.Get(r.ownerKey(name))
	if err != nil || v == nil {
		return err
	}
	var o Owner
	if err := json.Unmarshal(v, &o); err != nil || o != *r.owner {
		return fmt.Errorf("%w: %s", ErrNameTaken, o)
	}
	return nil
}

// ownerKey is where the owner of node name is kept.
func (r *Registry) ownerKey(name string) []byte { return r.owners.Pack(tuple.Tuple{name}) }

// Claim makes name this process's (me) before its node starts, so that two
// nodes never run under one name on one store: it fails with a
// *NameInUseError while the name's membership record is alive (a heartbeat
// within MissedHeartbeats intervals, not left), unless that record is the
// remains of a process that is gone: one of this host and data directory
// whose pid no longer runs (a node restarted after a crash or SIGKILL
// need not wait for its old lease). In the same transaction it records me
// as the owner and writes a provisional heartbeat (interval is the one the
// node will keep), so that a second claim racing this one sees a live
// record. It returns the provisional incarnation: Leave(name, it) gives the
// name back if the node then fails to start; the node's first real
// heartbeat replaces it.
func (r *Registry) Claim(ctx context.Context, name string, me Owner, interval time.Duration) (string, error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	inc := "claim-" + hex.EncodeToString(b[:])
	err := r.db.Transact(ctx, func(tx kv.Tx) error {
		now := r.clock()
		key := r.nodes.Pack(tuple.Tuple{name})
		rec, err := r.get(tx, key, name)
		if err != nil {
			return err
		}
		if rec != nil && IsAlive(rec, now) {
			var holder Owner
			if v, err := tx.Get(r.ownerKey(name)); err != nil {
				return err
			} else if v != nil {
				_ = json.Unmarshal(v, &holder) // unreadable: an unknown holder, refused below
			}
			leftover := holder.PID != 0 && holder.PID != me.PID && holder.Host == me.Host &&
				holder.DataDir == me.DataDir && r.processGone(holder.PID)
			if !leftover {
				hb := rec.GetHeartbeat().AsTime()
				iv := time.Duration(rec.GetHeartbeatIntervalMs()) * time.Millisecond
				return &NameInUseError{Name: name, Holder: holder, Heartbeat: hb, Expires: hb.Add(MissedHeartbeats * iv), Now: now}
			}
		}
		v, err := json.Marshal(me)
		if err != nil {
			return err
		}
		tx.Set(r.ownerKey(name), v)
		return r.put(tx, key, &messages.NodeRecord{
			Name: name, Incarnation: inc, StartedAt: timestamppb.New(now), Heartbeat: timestamppb.New(now),
			HeartbeatIntervalMs: interval.Milliseconds(), Pid: me.PID, Draining: rec.GetDraining(),
		})
	})
	if err != nil {
		return "", fmt.Errorf("cluster: claim node name %q: %w", name, err)
	}
	return inc, nil
}

// Owner returns the process that claimed node name, if any did.
func (r *Registry) Owner(ctx context.Context, name string) (Owner, bool, error) {
	var o Owner
	var found bool
	err := r.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		v, err := tx.Get(r.ownerKey(name))
		if err != nil || v == nil {
			return err
		}
		found = true
		return json.Unmarshal(v, &o)
	})
	if err != nil {
		return Owner{}, false, fmt.Errorf("cluster: owner of %q: %w", name, err)
	}
	return o, found, nil
}
