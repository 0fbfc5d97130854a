package postgres

import (
	"bytes"
	"slices"
	"sync"
)

// The commit cache: the values this DB's own commits wrote, each with the
// commit version that wrote it, so that a transaction can read them
// without a round trip.
//
// A job cycle's Update and Finish each read the job record that the
// previous step of the same worker wrote, then write it again. Read from
// the server, that read costs a round trip and a snapshot of its own; from
// the cache it costs nothing, and the commit validates it exactly as a read
// from a snapshot at the entry's version: the apply statement fails the
// transaction if a commit after that version wrote or cleared the key. So
// a stale entry (another node wrote the key since) costs one conflict, then
// the entry is dropped and the retry reads the server.
//
// What keeps FDB's semantics:
//   - An entry (key, value, version) is true: the key held value in the
//     state committed at version. Entries are written by the commit
//     connection's reader in commit order, batch by batch (the server runs
//     and answers a connection's batches in the order written), a
//     batch's transactions in their order, so a later write of a key in
//     the same batch replaces an earlier one and a clear, an atomic add or
//     an unknown outcome drops the entry.
//   - Only reads that are validated at commit are served from it (not
//     snapshot reads, not ReadTransact), and only before the attempt
//     opened a snapshot, and all at one version (the first one served):
//     the attempt then sees exactly the state at that version, its
//     snapshot version for validation. A later read that opens a snapshot
//     (version S) also checks, in the same round trip, that every key served
//     from the cache still has the version it was served at; if one does
//     not, the read fails with kv.ErrConflict and the attempt is run again,
//     so the function never sees values from two states that differ.
//   - A transaction that served reads from the cache and writes nothing
//     opens a snapshot at commit for that check (there is no apply to
//     validate it).

// cacheMaxEntries and cacheMaxValue bound the cache (entries are dropped
// at random beyond that); values larger than cacheMaxValue are not kept.
// A transaction writing more than cacheMaxWrites keys (a bulk load) only
// drops the entries of its keys: it would evict what is read again soon.
const (
	cacheMaxEntries = 8192
	cacheMaxValue   = 16 << 10
	cacheMaxWrites  = 64
)

// cacheHorizon: entries older than this many commit versions behind the
// newest one this DB committed are not served (the clears log that
// validates them is pruned 100,000 versions behind).
const cacheHorizon = 50_000

type cacheEntry struct {
	v   []byte
	ver int64
}

type commitCache struct {
	mu     sync.Mutex
	m      map[string]cacheEntry
	newest int64 // the newest commit version of this DB
}

func newCommitCache() *commitCache { return &commitCache{m: map[string]cacheEntry{}} }

// get returns a copy of key's cached value and its version, if there is
// one recent enough.
func (c *commitCache) get(key []byte) ([]byte, int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[string(key)]
	if !ok || e.ver < c.newest-cacheHorizon {
		return nil, 0, false
	}
	return slices.Clone(e.v), e.ver, true
}

// drop forgets keys.
func (c *commitCache) drop(keys [][]byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		delete(c.m, string(k))
	}
}

// purge forgets everything (a batch's outcome is unknown).
func (c *commitCache) purge() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.m)
}

// committed records what the batch committed at version: each request's
// writes, in batch order, those of requests that committed (ok). A
// request that failed validation drops the keys it had read from the
// cache.
func (c *commitCache) committed(version int64, batch []*commitReq) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.newest = max(c.newest, version)
	for _, r := range batch {
		a := r.args
		if !r.ok {
			for _, k := range a.cached {
				delete(c.m, string(k))
			}
			continue
		}
		for i := range a.cb {
			for k := range c.m {
				if bytes.Compare([]byte(k), a.cb[i]) >= 0 && bytes.Compare([]byte(k), a.ce[i]) < 0 {
					delete(c.m, k)
				}
			}
		}
		for _, k := range a.ck {
			delete(c.m, string(k))
		}
		for _, k := range a.ak {
			delete(c.m, string(k))
		}
		if len(a.sk)+len(a.xk) > cacheMaxWrites {
			for _, k := range a.sk {
				delete(c.m, string(k))
			}
			for _, k := range a.xk {
				delete(c.m, string(k))
			}
			continue
		}
		for i, k := range a.sk {
			c.put(k, a.sv[i], version)
		}
		for i, k := range a.xk {
			if i < len(r.xv) {
				c.put(k, r.xv[i], version)
			} else {
				delete(c.m, string(k))
			}
		}
		// Versionstamped keys are new keys (the stamp is this batch's);
		// nothing cached can be one of them.
	}
}

func (c *commitCache) put(k, v []byte, version int64) {
	if len(v) > cacheMaxValue {
		delete(c.m, string(k))
		return
	}
	if _, ok := c.m[string(k)]; !ok && len(c.m) >= cacheMaxEntries {
		for old := range c.m { // any one: map order is random
			delete(c.m, old)
			break
		}
	}
	c.m[string(k)] = cacheEntry{v: slices.Clone(v), ver: version}
}
