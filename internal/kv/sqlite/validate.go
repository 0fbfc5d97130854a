package sqlite

import (
	"bytes"
)

// Validation without re-reading.
//
// A transaction's read set must still hold at commit. The general check
// (validate) re-reads every recorded key and range inside the write
// transaction. Most of the time, though, every commit since the
// transaction's snapshot was made by this process, and this process knows
// what each of its commits wrote: then the read set holds unless one of
// those commits (or an earlier transaction of the same batch) wrote a key
// in it, which is decided in memory.
//
// The snapshot's version is bounded from below: before its read
// transaction starts, the transaction notes db.committed, the newest
// version this process has committed (stored only after the COMMIT
// returned). Every commit not visible to the snapshot therefore has a
// greater version. Inside the write transaction, with the commit counter
// read (cur), the versions in (snapshot, cur] are looked up in ownLog; if
// any is missing (another process committed it, or it fell out of the
// log) the general check runs. Commits that the snapshot did see but that
// lie above the lower bound can only cause a spurious conflict, and only
// when they wrote a key the transaction read.

// ownLogCap bounds how many of this process's commits ownLog remembers.
const ownLogCap = 512

// ownLogMaxKeys: a commit that wrote more keys than this is not
// remembered (transactions reading across it use the general check).
const ownLogMaxKeys = 4096

// ownLogMaxBytes bounds the keys ownLog holds, all commits together (a
// key's bytes and its slice header; a range's two bounds): the oldest
// commits are forgotten first. Without it the log of a node that just
// started thousands of jobs held its last 512 commits' keys for as long
// as it stayed idle (a few hundred bytes a job at 4,000 parked jobs).
const ownLogMaxBytes = 256 << 10

// ownCommits is the leader's memory of this process's recent commits.
// Only the goroutine leading (db.leading) touches it.
type ownCommits struct {
	byVersion map[int64]*touchedKeys
	order     []int64 // versions in commit order, oldest first
	bytes     int     // the keys' size in byVersion (touchedKeys.size)
}

// size is what t's keys and ranges hold, for ownLogMaxBytes.
func (t *touchedKeys) size() int {
	const header = 24 // a []byte's
	n := 0
	for _, k := range t.keys {
		n += header + len(k)
	}
	for _, r := range t.ranges {
		n += 2*header + len(r.Begin) + len(r.End)
	}
	return n
}

func (o *ownCommits) add(version int64, t *touchedKeys) {
	if o.byVersion == nil {
		o.byVersion = make(map[int64]*touchedKeys)
	}
	if len(t.keys) > ownLogMaxKeys || len(t.ranges) > ownLogMaxKeys {
		return
	}
	size := t.size()
	if size > ownLogMaxBytes {
		return
	}
	o.byVersion[version] = t
	o.order = append(o.order, version)
	o.bytes += size
	for len(o.order) > ownLogCap || o.bytes > ownLogMaxBytes {
		o.bytes -= o.byVersion[o.order[0]].size()
		delete(o.byVersion, o.order[0])
		o.order = append(o.order[:0], o.order[1:]...)
	}
}

// validateKnown decides whether t's read set still holds when every commit
// after t's snapshot (up to cur) was made by this process; known is false
// when that is not the case (or not certain), and the caller must re-read.
// batch holds what earlier transactions of the running batch wrote.
func (db *DB) validateKnown(t *tx, cur int64, batch *touchedKeys) (ok, known bool) {
	if len(t.points) == 0 && len(t.ranges) == 0 {
		return true, true
	}
	if t.snapVersion > cur || cur-t.snapVersion > ownLogCap {
		return false, false
	}
	for v := t.snapVersion + 1; v <= cur; v++ {
		if _, mine := db.own.byVersion[v]; !mine {
			return false, false
		}
	}
	if t.readsTouched(batch) {
		return false, true
	}
	for v := t.snapVersion + 1; v <= cur; v++ {
		if t.readsTouched(db.own.byVersion[v]) {
			return false, true
		}
	}
	return true, true
}

// readsTouched reports whether w wrote a key t read (or may have read).
func (t *tx) readsTouched(w *touchedKeys) bool { return readSetTouched(t.points, t.ranges, w) }

// readSetTouched reports whether w wrote one of points or a key in ranges.
func readSetTouched(tpoints []pointRead, tranges []*rangeRead, w *touchedKeys) bool {
	if len(w.keys) == 0 && len(w.ranges) == 0 {
		return false
	}
	var points map[string]struct{}
	if len(tpoints) > 8 && len(w.keys) > 8 {
		points = make(map[string]struct{}, len(tpoints))
		for _, p := range tpoints {
			points[string(p.key)] = struct{}{}
		}
	}
	for _, k := range w.keys {
		if points != nil {
			if _, ok := points[string(k)]; ok {
				return true
			}
		} else {
			for _, p := range tpoints {
				if bytes.Equal(p.key, k) {
					return true
				}
			}
		}
		for _, rr := range tranges {
			if bytes.Compare(rr.Begin, rr.End) < 0 && bytes.Compare(k, rr.Begin) >= 0 && bytes.Compare(k, rr.End) < 0 {
				return true
			}
		}
	}
	for _, c := range w.ranges {
		for _, p := range tpoints {
			if c.Contains(p.key) {
				return true
			}
		}
		for _, rr := range tranges {
			if bytes.Compare(rr.Begin, rr.End) < 0 && bytes.Compare(c.Begin, rr.End) < 0 && bytes.Compare(rr.Begin, c.End) < 0 {
				return true
			}
		}
	}
	return false
}
