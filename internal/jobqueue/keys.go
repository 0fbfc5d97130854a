package jobqueue

import (
	"fmt"
	"hash/fnv"
	"math"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
)

// Key-space tags (see the package comment).
const (
	tagData         = 1
	tagReady        = 2
	tagDelayed      = 3
	tagPendingWatch = 4
	_               = 5 // was ACTIVITY_WATCH; the newest ACTIVITY key serves instead
	tagTypes        = 6
	tagActivity     = 7
	tagCorrupt      = 8
	tagGeneration   = 15 // (GENERATION, type, shard) = int64 bumped by every write of a record (Generation)
)

type keys struct {
	root, data, ready, delayed, pendingWatch, types, activity, corrupt, generation tuple.Subspace
}

func newKeys(prefix []byte) keys {
	root := tuple.NewSubspace(prefix, tuple.Tuple{"jobs"})
	return keys{
		root:         root,
		data:         root.Sub(tagData),
		ready:        root.Sub(tagReady),
		delayed:      root.Sub(tagDelayed),
		pendingWatch: root.Sub(tagPendingWatch),
		types:        root.Sub(tagTypes),
		activity:     root.Sub(tagActivity),
		corrupt:      root.Sub(tagCorrupt),
		generation:   root.Sub(tagGeneration),
	}
}

// GenerationShards spreads the generation counter of a type over keys, so
// that no one key is written by every job write (a hot key on
// FoundationDB), and so that a reader can tell which jobs may have changed
// (GenerationShardsOf: the jobs of the shards whose counter moved). It was
// 16: a record written by a node of that version bumps a shard of its own
// numbering, which a reader holding a listing for a bounded time only
// (Generation) tolerates.
const GenerationShards = 256

// GenerationShard is the generation counter shard job id's writes bump.
func GenerationShard(id string) int64 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int64(h.Sum32() % GenerationShards)
}

// generationKey is the generation counter shard job id's writes bump.
func (k keys) generationKey(typ, id string) []byte {
	return k.generation.Pack(tuple.Tuple{typ, GenerationShard(id)})
}

func (k keys) dataKey(typ, id string) []byte { return k.data.Pack(tuple.Tuple{typ, id}) }

// dataRange holds every job record of typ.
func (k keys) dataRange(typ string) (begin, end []byte) { return k.data.Sub(typ).Range() }

func (k keys) readyKey(typ string, prio uint64, id string) []byte {
	return k.ready.Pack(tuple.Tuple{typ, prio, id})
}

// readyRange holds the READY entries of typ with priority <= maxPrio.
func (k keys) readyRange(typ string, maxPrio uint64) (begin, end []byte) {
	sub := k.ready.Sub(typ)
	begin, end = sub.Range()
	if maxPrio != math.MaxUint64 {
		end = sub.Pack(tuple.Tuple{maxPrio + 1})
	}
	return begin, end
}

func (k keys) parseReady(key []byte) (prio uint64, id string, err error) {
	t, err := k.ready.Unpack(key)
	if err != nil || len(t) != 3 {
		return 0, "", fmt.Errorf("%w: bad pending key %x", ErrCorrupt, key)
	}
	switch p := t[1].(type) {
	case int64:
		prio = uint64(p)
	case uint64:
		prio = p
	default:
		return 0, "", fmt.Errorf("%w: bad pending key %x", ErrCorrupt, key)
	}
	id, ok := t[2].(string)
	if !ok {
		return 0, "", fmt.Errorf("%w: bad pending key %x", ErrCorrupt, key)
	}
	return prio, id, nil
}

func (k keys) delayedKey(typ string, sched time.Time, id string) []byte {
	return k.delayed.Pack(tuple.Tuple{typ, sched.UnixNano(), id})
}

// delayedRange holds the DELAYED entries of typ scheduled at or before
// until (all of them if until is zero).
func (k keys) delayedRange(typ string, until time.Time) (begin, end []byte) {
	sub := k.delayed.Sub(typ)
	begin, end = sub.Range()
	if !until.IsZero() {
		end = sub.Pack(tuple.Tuple{until.UnixNano() + 1})
	}
	return begin, end
}

func (k keys) parseDelayed(key []byte) (sched time.Time, id string, err error) {
	t, err := k.delayed.Unpack(key)
	if err != nil || len(t) != 3 {
		return time.Time{}, "", fmt.Errorf("%w: bad delayed key %x", ErrCorrupt, key)
	}
	ns, ok1 := t[1].(int64)
	id, ok2 := t[2].(string)
	if !ok1 || !ok2 {
		return time.Time{}, "", fmt.Errorf("%w: bad delayed key %x", ErrCorrupt, key)
	}
	return time.Unix(0, ns), id, nil
}

func (k keys) pendingWatchKey(typ string) []byte { return k.pendingWatch.Pack(tuple.Tuple{typ}) }
func (k keys) typeKey(typ string) []byte         { return k.types.Pack(tuple.Tuple{typ}) }
func (k keys) typesRange() (begin, end []byte)   { return k.types.Range() }

func (k keys) typeFromKey(key []byte) (string, error) {
	t, err := k.types.Unpack(key)
	if err != nil || len(t) != 1 {
		return "", fmt.Errorf("%w: bad type key %x", ErrCorrupt, key)
	}
	s, ok := t[0].(string)
	if !ok {
		return "", fmt.Errorf("%w: bad type key %x", ErrCorrupt, key)
	}
	return s, nil
}

func (k keys) corruptKey(typ, id string) []byte { return k.corrupt.Pack(tuple.Tuple{typ, id}) }

func (k keys) activityKey(typ string, stamp [kv.VersionstampLength]byte, id string) []byte {
	return k.activity.Pack(tuple.Tuple{typ, tuple.Versionstamp{TransactionVersion: stamp}, id})
}

func (k keys) activityKeyIncomplete(typ, id string) ([]byte, int, error) {
	key, off, err := k.activity.PackWithVersionstamp(tuple.Tuple{typ, tuple.IncompleteVersionstamp(0), id})
	if err != nil {
		return nil, 0, fmt.Errorf("jobqueue: activity key: %w", err)
	}
	return key, off, nil
}

// activityRange holds every activity entry of typ.
func (k keys) activityRange(typ string) (begin, end []byte) { return k.activity.Sub(typ).Range() }

// activityRangeThrough holds the activity entries of typ whose stamp is at
// most stamp.
func (k keys) activityRangeThrough(typ string, stamp [kv.VersionstampLength]byte) (begin, end []byte) {
	sub := k.activity.Sub(typ)
	begin, _ = sub.Range()
	end = sub.Pack(tuple.Tuple{tuple.Versionstamp{TransactionVersion: stamp, UserVersion: math.MaxUint16}})
	return begin, end
}

func (k keys) parseActivity(key []byte) (stamp [kv.VersionstampLength]byte, id string, err error) {
	t, err := k.activity.Unpack(key)
	if err != nil || len(t) != 3 {
		return stamp, "", fmt.Errorf("%w: bad activity key %x", ErrCorrupt, key)
	}
	vs, ok1 := t[1].(tuple.Versionstamp)
	id, ok2 := t[2].(string)
	if !ok1 || !ok2 {
		return stamp, "", fmt.Errorf("%w: bad activity key %x", ErrCorrupt, key)
	}
	return vs.TransactionVersion, id, nil
}
