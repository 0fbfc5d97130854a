package postgres

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/kvbuf"
)

// tx is one attempt of a transaction (or a ReadTransact).
type tx struct {
	kvbuf.Tx // the buffered writes, the first internal error, done
	db       *DB
	ctx      context.Context
	readOnly bool
	// prio: a transaction of the liveness lane (kv.WithPriority): its
	// reads on a connection of the lane, its commit ahead of the queue.
	prio bool

	conn  *pgxpool.Conn // held from the first read to the end
	open  bool          // the snapshot transaction is open on conn
	dirty bool          // conn may still be in an earlier snapshot: send ROLLBACK first
	snap  int64         // the snapshot's commit version

	readKeys [][]byte        // validated point reads (and read conflict keys)
	present  map[string]bool // point reads: whether the key had a value at snap
	reads    []*kvbuf.Span   // validated range reads

	// Reads served from the commit cache (cache.go) before a snapshot was
	// opened, all at version snap; conflict: one of them had changed when
	// a snapshot was opened (the attempt must run again).
	cached   [][]byte
	cacheVer int64 // their version (snap until a snapshot is opened)
	conflict bool

	// A first read run on its own, without a snapshot (autoRead): its key
	// and the version of the row it found (-1: none), checked when a
	// later read opens a snapshot.
	auto    bool
	autoKey []byte
	autoRow int64

	watches []*watch
}

var (
	_ kv.Tx       = (*tx)(nil)
	_ kvbuf.Store = (*tx)(nil)
)

func newTx(ctx context.Context, db *DB, readOnly bool) *tx {
	t := &tx{db: db, ctx: ctx, readOnly: readOnly, prio: kv.IsPriority(ctx)}
	t.Init(t)
	return t
}

// begin opens the snapshot on first use (see query).
func (t *tx) begin() error {
	if t.open {
		return nil
	}
	_, err := t.query("")
	return t.db.errorf("begin snapshot", err)
}

// query runs one read on the transaction's snapshot and returns its rows
// (k, v). The first read of a transaction also opens the snapshot, a
// REPEATABLE READ, READ ONLY transaction, and reads its commit version, in
// the same round trip. sql "" only opens the snapshot.
func (t *tx) query(sql string, args ...any) ([]kvbuf.Row, error) {
	if t.Done {
		return nil, kv.ErrTxDone
	}
	if t.open {
		t.db.rt.Add(1)
		var out []kvbuf.Row
		err := run(t.ctx, t.conn.Conn(), []call{{sql: sql, args: args, row: func(vals [][]byte) error {
			return appendRow(&out, vals[0], vals[1])
		}}})
		return out, err
	}
	if sql == getSQL && !t.readOnly && !t.auto && len(t.cached) == 0 && !t.prio {
		return t.autoRead(args...)
	}
	var err error
	for try := 0; try < 3; try++ {
		if t.conn == nil {
			c, dirty, err := t.db.acquire(t.ctx, t.prio)
			if err != nil {
				return nil, err
			}
			t.conn, t.dirty = c, dirty
		}
		t.db.rt.Add(1)
		calls := make([]call, 0, 3)
		if t.dirty {
			calls = append(calls, call{sql: "ROLLBACK"})
		}
		calls = append(calls, call{sql: beginSQL})
		var out []kvbuf.Row
		snapRead := false
		if sql == "" {
			calls = append(calls, call{sql: snapSQL, row: func(vals [][]byte) (err error) {
				t.snap, err = decodeInt8(vals[0])
				snapRead = true
				return err
			}})
		} else {
			// Each row also carries the snapshot's commit version; a lone
			// row without a key says the read found nothing.
			calls = append(calls, call{sql: firstSQL[sql], args: args, row: func(vals [][]byte) (err error) {
				snapRead = true
				if t.snap, err = decodeInt8(vals[0]); err != nil || vals[1] == nil {
					return err
				}
				return appendRow(&out, vals[1], vals[2])
			}})
		}
		same := int64(-1)
		if len(t.cached) > 0 {
			// The values served from the commit cache must be the
			// snapshot's too (cache.go).
			calls = append(calls, call{sql: cacheCheckSQL, args: []any{t.cached, t.cacheVer}, row: func(vals [][]byte) (err error) {
				same, err = decodeInt8(vals[0])
				return err
			}})
		}
		autoSame := int64(-1)
		if t.auto {
			// The first read's row must be the snapshot's too.
			calls = append(calls, call{sql: autoCheckSQL, args: []any{t.autoKey, t.autoRow}, row: func(vals [][]byte) (err error) {
				autoSame, err = decodeInt8(vals[0])
				return err
			}})
		}
		snap0 := t.snap
		err = run(t.ctx, t.conn.Conn(), calls)
		if err == nil && !snapRead {
			err = errors.New("postgres: no row in couchrep_kv_meta")
		}
		if err == nil {
			t.open, t.dirty = true, false
			if len(t.cached) > 0 && same != int64(len(t.cached)) {
				t.db.cache.drop(t.cached)
				t.conflict = true
				err := fmt.Errorf("postgres: a value read from the commit cache changed: %w", kv.ErrConflict)
				t.Fail(err) // never committed, even if the function goes on
				return nil, err
			}
			if t.auto && autoSame != 1 {
				t.conflict = true
				err := fmt.Errorf("postgres: the transaction's first read changed before its second: %w", kv.ErrConflict)
				t.Fail(err)
				return nil, err
			}
			return out, nil
		}
		t.snap = snap0 // not a snapshot's, which failed to open
		// A pooled connection the server closed (it restarted): the pool
		// drops it; a new one may work. Nothing was read yet.
		t.conn.Release()
		t.conn, t.dirty = nil, false
		if !connLost(err) || t.ctx.Err() != nil {
			break
		}
	}
	return nil, err
}

// autoRead runs a transaction's first read, a point read, as a statement
// of its own (on the read connection, reads.go: a statement has a
// snapshot of its own) instead of opening a REPEATABLE READ transaction
// for it: a transaction whose only read it is (Accept, once its queue head
// is known) needs no BEGIN and no ROLLBACK, and no connection of its own.
// The statement's snapshot version becomes the transaction's. A later
// read opens a snapshot (the current state) and
// checks, in the same round trip, that the first read's row is still the
// one read (autoCheckSQL: the same version, or still none); if not, it
// fails with kv.ErrConflict and the attempt runs again, so the function
// never sees two states.
func (t *tx) autoRead(args ...any) ([]kvbuf.Row, error) {
	key, _ := args[0].([]byte)
	var err error
	for try := 0; try < 3; try++ {
		var r *pointRead
		if r, err = t.db.readPoint(t.ctx, key); err == nil {
			t.snap = r.snap
			t.auto, t.autoKey, t.autoRow = true, slices.Clone(key), -1
			if !r.found {
				return nil, nil
			}
			t.autoRow = r.ver
			return []kvbuf.Row{{K: slices.Clone(key), V: r.v}}, nil
		}
		// The read connection broke (the server restarted): a new one
		// may work. Nothing was read.
		if !connLost(err) || t.ctx.Err() != nil {
			break
		}
	}
	return nil, err
}

// appendRow appends the row (k, v) of a read, copying both (the values
// are the connection's buffer).
func appendRow(out *[]kvbuf.Row, k, v []byte) error {
	if k == nil {
		return fmt.Errorf("postgres: a row without a key")
	}
	*out = append(*out, kvbuf.Row{K: append([]byte{}, k...), V: append([]byte{}, v...)})
	return nil
}

// end closes the snapshot and returns the connection to the pool.
func (t *tx) end() {
	if t.conn == nil {
		return
	}
	if (t.open || t.dirty) && t.prio {
		// A connection of the lane goes back to the lane, its snapshot
		// ended now: parked, a job transaction would take it.
		t.db.rollback(t.conn)
	} else if t.open || t.dirty {
		// The snapshot (read only) ends with the ROLLBACK that the next
		// user of the connection sends ahead of its own statements: no
		// round trip of its own.
		t.db.park(t.conn)
	} else {
		t.conn.Release()
	}
	t.conn, t.open, t.dirty = nil, false, false
}

// ReadStored implements kvbuf.Store: it reads key from the snapshot, adding it to the read set unless
// snapshot.
func (t *tx) ReadStored(key []byte, snapshot bool) ([]byte, error) {
	if !snapshot && !t.readOnly && !t.open && !t.auto && !t.Done {
		if v, ok := t.readCached(key); ok {
			return v, nil
		}
	}
	rows, err := t.query(getSQL, key)
	if err != nil {
		return nil, t.db.errorf(fmt.Sprintf("get %x", key), err)
	}
	var v []byte
	if len(rows) > 0 {
		v = rows[0].V
	}
	if !t.readOnly {
		t.setPresent(key, len(rows) > 0)
		if !snapshot {
			t.readKeys = append(t.readKeys, slices.Clone(key))
		}
	}
	return v, nil
}

// GetMany implements kv.BatchReader: the keys the transaction has not
// written are read in one statement on its snapshot (opened first, if it
// is not), each recorded as ReadStored records a point read.
func (t *tx) GetMany(keys [][]byte) ([][]byte, error) {
	if t.Done {
		return nil, kv.ErrTxDone
	}
	out := make([][]byte, len(keys))
	var fetch [][]byte
	var at []int
	for i, k := range keys {
		if _, ok := t.Buf.Writes[string(k)]; ok || t.Buf.Cleared(k) {
			v, err := t.Read(k, false)
			if err != nil {
				return nil, err
			}
			out[i] = v
			continue
		}
		fetch, at = append(fetch, k), append(at, i)
	}
	if len(fetch) < 2 {
		for j, k := range fetch {
			v, err := t.Read(k, false)
			if err != nil {
				return nil, err
			}
			out[at[j]] = v
		}
		return out, nil
	}
	if err := t.begin(); err != nil {
		return nil, err
	}
	rows, err := t.query(manySQL, fetch)
	if err != nil {
		return nil, t.db.errorf(fmt.Sprintf("get %d keys", len(fetch)), err)
	}
	found := make(map[string][]byte, len(rows))
	for _, r := range rows {
		found[string(r.K)] = r.V
	}
	for j, k := range fetch {
		v, ok := found[string(k)]
		out[at[j]] = v
		if !t.readOnly {
			t.setPresent(k, ok)
			t.readKeys = append(t.readKeys, slices.Clone(k))
		}
	}
	return out, nil
}

// setPresent records whether key has a value in the state at the
// transaction's snapshot version (a point read found it).
func (t *tx) setPresent(key []byte, present bool) {
	if t.present == nil {
		t.present = make(map[string]bool, 4)
	}
	t.present[string(key)] = present
}

// readCached serves a validated read from the commit cache (cache.go) if
// key is there at the version of the attempt's earlier cached reads (or
// this is the first): it becomes the attempt's snapshot version until a
// snapshot is opened.
func (t *tx) readCached(key []byte) ([]byte, bool) {
	v, ver, ok := t.db.cache.get(key)
	if !ok || (len(t.cached) > 0 && ver != t.cacheVer) {
		return nil, false
	}
	t.snap, t.cacheVer = ver, ver
	k := slices.Clone(key)
	if !slices.ContainsFunc(t.cached, func(c []byte) bool { return bytes.Equal(c, k) }) {
		t.cached = append(t.cached, k)
	}
	t.readKeys = append(t.readKeys, k)
	t.setPresent(k, true)
	return v, true
}

// validateCached checks, by opening a snapshot, that the values the
// attempt read from the commit cache are current, when nothing else will:
// before a commit without writes or an error result goes to the caller.
func (t *tx) validateCached() error {
	if len(t.cached) == 0 || t.open || t.Done {
		return nil
	}
	return t.begin()
}

// fixSnapshot fixes the version the transaction's conflicts are counted
// from: its first read's (autoRead) or, if it read nothing yet, a
// snapshot's opened now.
func (t *tx) fixSnapshot() error {
	if t.auto {
		return nil
	}
	return t.begin()
}

// AddReadConflictKey implements kv.Tx: FDB's meaning, the transaction
// conflicts with any commit after its snapshot that writes key.
func (t *tx) AddReadConflictKey(key []byte) {
	if t.Writable() {
		if err := t.fixSnapshot(); err != nil {
			t.Fail(err)
			return
		}
		t.readKeys = append(t.readKeys, slices.Clone(key))
	}
}

// AddReadConflictRange implements kv.Tx, for every key in [begin, end).
func (t *tx) AddReadConflictRange(begin, end []byte) {
	if !t.Writable() || bytes.Compare(begin, end) >= 0 {
		return
	}
	if err := t.fixSnapshot(); err != nil {
		t.Fail(err)
		return
	}
	t.reads = append(t.reads, &kvbuf.Span{Range: kvbuf.Range{Begin: slices.Clone(begin), End: slices.Clone(end)}})
}

// Watch implements kv.Tx.
func (t *tx) Watch(key []byte) kv.Watch {
	w := newWatch(t.db.watches, key)
	if t.Done {
		w.fail(kv.ErrTxDone)
		return w
	}
	t.watches = append(t.watches, w)
	return w
}

// finish ends the attempt: the snapshot is released; with err, its
// watches and stamps fail.
func (t *tx) finish(err error) {
	t.closeReads()
	t.Finish(err)
	t.end()
	if err == nil {
		return
	}
	for _, w := range t.watches {
		w.fail(err)
	}
}

// closeReads narrows the range reads still iterated to what was consumed.
func (t *tx) closeReads() {
	for _, r := range t.reads {
		r.Close()
	}
}

// commit validates and applies the transaction in one round trip (see
// couchrep_kv_commit), then arms its watches and resolves its stamps.
func (t *tx) commit() error {
	t.closeReads()
	// What each watch is armed with: its key's value as this transaction
	// sees it (read without conflict); keys with a versionstamped value
	// get theirs from the commit.
	for _, w := range t.watches {
		if o, ok := t.Buf.Writes[string(w.key)]; ok && o.Kind == kvbuf.SetVSV {
			continue
		}
		v, err := t.Read(w.key, true)
		if err != nil {
			return err
		}
		w.armed, w.present = v, v != nil
	}
	if !t.HasWrites() {
		if err := t.validateCached(); err != nil {
			return err
		}
		t.finish(nil)
		t.armWatches(nil)
		return nil
	}
	a := t.commitArgs()
	version, order, xv, err := t.db.commit(t, a)
	if err != nil {
		return err
	}
	var stamp [kv.VersionstampLength]byte
	binary.BigEndian.PutUint64(stamp[:8], uint64(version))
	binary.BigEndian.PutUint16(stamp[8:], uint16(order))
	t.finish(nil)
	t.Resolve(stamp)
	vsv := map[string][]byte{}
	for i, k := range a.xk {
		if i < len(xv) {
			vsv[string(k)] = xv[i]
		}
	}
	t.armWatches(vsv)
	return nil
}

// armWatches hands the committed transaction's watches to the hub.
func (t *tx) armWatches(vsv map[string][]byte) {
	for _, w := range t.watches {
		if v, ok := vsv[string(w.key)]; ok {
			w.armed, w.present = v, true
		}
		t.db.watches.arm(w)
	}
}

// commitArgs are the parameters of couchrep_kv_commit.
type commitArgs struct {
	rk, rb, re, cb, ce, ck, sk, sv, ak, ad, vk, vv, xk, xv [][]byte
	rkp, rka                                               [][]byte // read keys present, absent at snapVersion
	vo, xo                                                 []int32
	snapVersion                                            int64
	note                                                   *string
	cached                                                 [][]byte // read from the commit cache
}

func (t *tx) commitArgs() *commitArgs {
	e := func() [][]byte { return [][]byte{} }
	a := &commitArgs{rk: e(), rb: e(), re: e(), cb: e(), ce: e(), ck: e(), sk: e(), sv: e(), ak: e(), ad: e(),
		vk: e(), vv: e(), xk: e(), xv: e(), vo: []int32{}, xo: []int32{}, rkp: e(), rka: e(), snapVersion: t.snap, cached: t.cached}
	// A read key whose presence at snap is known is validated without the
	// clears log (fastApply): present, it must still have a row of a
	// version up to snap; absent, still no row.
	read := make(map[string]struct{}, len(t.readKeys))
	for _, k := range t.readKeys {
		if _, dup := read[string(k)]; dup {
			continue
		}
		read[string(k)] = struct{}{}
		switch p, known := t.present[string(k)]; {
		case !known:
			a.rk = append(a.rk, k)
		case p:
			a.rkp = append(a.rkp, k)
		default:
			a.rka = append(a.rka, k)
		}
	}
	for _, r := range t.reads {
		if bytes.Compare(r.Begin, r.End) < 0 {
			a.rb, a.re = append(a.rb, r.Begin), append(a.re, r.End)
		}
	}
	for _, c := range t.Buf.Clears {
		a.cb, a.ce = append(a.cb, c.Begin), append(a.ce, c.End)
	}
	keys := make([]string, 0, len(t.Buf.Writes))
	for k := range t.Buf.Writes {
		keys = append(keys, k)
	}
	slices.Sort(keys) // a stable order of row locks
	for _, k := range keys {
		o := t.Buf.Writes[k]
		switch o.Kind {
		case kvbuf.Clear:
			a.ck = append(a.ck, []byte(k))
		case kvbuf.Set:
			a.sk, a.sv = append(a.sk, []byte(k)), append(a.sv, o.Value)
		case kvbuf.Add:
			a.ak, a.ad = append(a.ak, []byte(k)), append(a.ad, kv.EncodeInt64LE(o.Delta))
		case kvbuf.SetVSV:
			a.xk, a.xv, a.xo = append(a.xk, []byte(k)), append(a.xv, o.Value), append(a.xo, int32(o.VSOffset))
		}
	}
	// Two versionstamped keys that would become the same key: the last wins.
	var seen map[string]int
	if len(t.Buf.VSKeys) > 1 {
		seen = make(map[string]int, len(t.Buf.VSKeys))
	}
	for _, w := range t.Buf.VSKeys {
		if seen != nil {
			id := strconv.Itoa(w.Offset) + ":" + string(w.Key)
			if i, ok := seen[id]; ok {
				a.vv[i] = w.Value
				continue
			}
			seen[id] = len(a.vk)
		}
		a.vk, a.vo, a.vv = append(a.vk, w.Key), append(a.vo, int32(w.Offset)), append(a.vv, w.Value)
	}
	a.note = t.note(a)
	return a
}

// maxNote bounds the NOTIFY payload (PostgreSQL's limit is 8000 bytes).
const maxNote = 7600

// note is the NOTIFY payload naming what the commit changed: the 64-bit
// hashes of the keys written, or "*" (every watch looks again) when the
// commit cleared ranges, wrote versionstamped keys or too many keys.
func (t *tx) note(a *commitArgs) *string {
	n := len(a.ck) + len(a.sk) + len(a.ak) + len(a.xk)
	if n == 0 && len(a.cb) == 0 && len(a.vk) == 0 {
		return nil
	}
	all := "*"
	if len(a.cb) > 0 || len(a.vk) > 0 || n*16 > maxNote {
		return &all
	}
	b := make([]byte, 0, n*16)
	for _, ks := range [][][]byte{a.ck, a.sk, a.ak, a.xk} {
		for _, k := range ks {
			b = appendHex16(b, keyHash(k))
		}
	}
	s := string(b)
	return &s
}

// appendHex16 appends x as 16 lower-case hex digits (fmt's %016x).
func appendHex16(b []byte, x uint64) []byte {
	const digits = "0123456789abcdef"
	for shift := 60; shift >= 0; shift -= 4 {
		b = append(b, digits[x>>uint(shift)&0xf])
	}
	return b
}

// keyHash is the 64-bit FNV-1a hash of k (hash/fnv's New64a, without its
// allocation).
func keyHash(k []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range k {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}
