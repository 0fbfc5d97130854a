package postgres

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/kvbuf"
)

// span is a key range [begin, end).
type span struct{ begin, end []byte }

// tx is one attempt of a transaction (or a ReadTransact).
type tx struct {
	db       *DB
	ctx      context.Context
	readOnly bool
	err      error // first internal error; fails the commit
	done     bool

	conn  *pgxpool.Conn // held from the first read to the end
	open  bool          // the snapshot transaction is open on conn
	dirty bool          // conn may still be in an earlier snapshot: send ROLLBACK first
	snap  int64         // the snapshot's commit version

	buf kvbuf.Buffer // the buffered writes

	readKeys [][]byte   // validated point reads (and read conflict keys)
	reads    []*rangeRd // validated range reads

	watches []*watch
	stamps  []*kvbuf.StampFuture
}

// rangeRd is a validated range read; while its iterator runs, it is
// narrowed to what the caller consumed when the transaction ends.
type rangeRd struct {
	span
	it *iterator
}

var _ kv.Tx = (*tx)(nil)

func newTx(ctx context.Context, db *DB, readOnly bool) *tx {
	return &tx{db: db, ctx: ctx, readOnly: readOnly, buf: kvbuf.New()}
}

func (t *tx) fail(err error) {
	if t.err == nil {
		t.err = err
	}
}

// failSize fails the transaction with err if it is a write beyond kv's
// size limits (other errors leave it usable), and returns err.
func (t *tx) failSize(err error) error {
	if kv.IsTooLarge(err) {
		t.fail(err)
	}
	return err
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
func (t *tx) query(sql string, args ...any) ([]row, error) {
	if t.done {
		return nil, kv.ErrTxDone
	}
	if t.open {
		t.db.rt.Add(1)
		rows, err := t.conn.Query(t.ctx, sql, args...)
		if err != nil {
			return nil, err
		}
		return collectRows(rows)
	}
	var err error
	for try := 0; try < 3; try++ {
		if t.conn == nil {
			c, dirty, err := t.db.acquire(t.ctx)
			if err != nil {
				return nil, err
			}
			t.conn, t.dirty = c, dirty
		}
		t.db.rt.Add(1)
		b := &pgx.Batch{}
		if t.dirty {
			b.Queue("ROLLBACK")
		}
		b.Queue(beginSQL)
		if sql == "" {
			b.Queue(snapSQL)
		} else {
			b.Queue(firstSQL[sql], args...)
		}
		br := t.conn.SendBatch(t.ctx, b)
		var out []row
		if t.dirty {
			_, err = br.Exec()
		}
		if err == nil {
			_, err = br.Exec()
		}
		if err == nil && sql == "" {
			err = br.QueryRow().Scan(&t.snap)
		}
		if err == nil && sql != "" {
			var rows pgx.Rows
			if rows, err = br.Query(); err == nil {
				out, err = collectFirstRows(rows, &t.snap)
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			t.open, t.dirty = true, false
			return out, nil
		}
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

// collectFirstRows is collectRows for a firstSQL query: each row also
// carries the snapshot's commit version (snap), and a lone row without a
// key says the read found nothing.
func collectFirstRows(rows pgx.Rows, snap *int64) ([]row, error) {
	defer rows.Close()
	var out []row
	for rows.Next() {
		var r row
		if err := rows.Scan(snap, &r.k, &r.v); err != nil {
			return nil, err
		}
		if r.k == nil {
			continue
		}
		r.v = kvbuf.NonNil(r.v)
		out = append(out, r)
	}
	return out, rows.Err()
}

func collectRows(rows pgx.Rows) ([]row, error) {
	defer rows.Close()
	var out []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.k, &r.v); err != nil {
			return nil, err
		}
		r.v = kvbuf.NonNil(r.v)
		out = append(out, r)
	}
	return out, rows.Err()
}

// end closes the snapshot and returns the connection to the pool.
func (t *tx) end() {
	if t.conn == nil {
		return
	}
	if t.open || t.dirty {
		// The snapshot (read only) ends with the ROLLBACK that the next
		// user of the connection sends ahead of its own statements: no
		// round trip of its own.
		t.db.park(t.conn)
	} else {
		t.conn.Release()
	}
	t.conn, t.open, t.dirty = nil, false, false
}

// Get implements kv.ReadTx.
func (t *tx) Get(key []byte) ([]byte, error) { return t.get(key, false) }

func (t *tx) get(key []byte, snapshot bool) ([]byte, error) {
	if t.done {
		return nil, kv.ErrTxDone
	}
	if o, ok := t.buf.Writes[string(key)]; ok {
		var base []byte
		if o.Kind == kvbuf.Add {
			var err error
			if base, err = t.stored(key, snapshot); err != nil {
				return nil, err
			}
		}
		return o.Merge(key, base)
	}
	if t.buf.Cleared(key) {
		return nil, nil
	}
	return t.stored(key, snapshot)
}

// stored reads key from the snapshot, adding it to the read set unless
// snapshot.
func (t *tx) stored(key []byte, snapshot bool) ([]byte, error) {
	rows, err := t.query(getSQL, key)
	if err != nil {
		return nil, t.db.errorf(fmt.Sprintf("get %x", key), err)
	}
	var v []byte
	if len(rows) > 0 {
		v = rows[0].v
	}
	if !snapshot && !t.readOnly {
		t.readKeys = append(t.readKeys, slices.Clone(key))
	}
	return v, nil
}

// Snapshot implements kv.ReadTx.
func (t *tx) Snapshot() kv.ReadTx { return snapshotTx{t} }

type snapshotTx struct{ t *tx }

func (s snapshotTx) Get(key []byte) ([]byte, error) { return s.t.get(key, true) }
func (s snapshotTx) GetRange(begin, end []byte, opts kv.RangeOptions) kv.RangeIterator {
	return s.t.getRange(begin, end, opts, true)
}
func (s snapshotTx) Snapshot() kv.ReadTx { return s }

// writable reports whether a write may be buffered, failing the
// transaction if it is finished.
func (t *tx) writable() bool {
	if t.done {
		t.fail(kv.ErrTxDone)
		return false
	}
	return true
}

// Set implements kv.Tx.
func (t *tx) Set(key, value []byte) {
	if t.writable() {
		t.fail(t.buf.Set(key, value))
	}
}

// Clear implements kv.Tx.
func (t *tx) Clear(key []byte) {
	if t.writable() {
		t.fail(t.buf.Clear(key))
	}
}

// ClearRange implements kv.Tx.
func (t *tx) ClearRange(begin, end []byte) {
	if t.writable() {
		t.fail(t.buf.ClearRange(begin, end))
	}
}

// Add implements kv.Tx: the delta is applied at commit, inside the
// serialized commit statement, without reading the key into the read set.
func (t *tx) Add(key []byte, delta int64) {
	if t.writable() {
		if err := t.buf.Add(key, delta); err != nil {
			t.fail(err)
		}
	}
}

// SetVersionstampedKey implements kv.Tx.
func (t *tx) SetVersionstampedKey(key []byte, offset int, value []byte) error {
	if t.done {
		return kv.ErrTxDone
	}
	return t.failSize(t.buf.SetVersionstampedKey(key, offset, value))
}

// SetVersionstampedValue implements kv.Tx.
func (t *tx) SetVersionstampedValue(key, value []byte, offset int) error {
	if t.done {
		return kv.ErrTxDone
	}
	return t.failSize(t.buf.SetVersionstampedValue(key, value, offset))
}

// AddReadConflictKey implements kv.Tx: FDB's meaning, the transaction
// conflicts with any commit after its snapshot that writes key.
func (t *tx) AddReadConflictKey(key []byte) {
	if t.writable() {
		if err := t.begin(); err != nil { // fixes the snapshot version
			t.fail(err)
			return
		}
		t.readKeys = append(t.readKeys, slices.Clone(key))
	}
}

// AddReadConflictRange implements kv.Tx, for every key in [begin, end).
func (t *tx) AddReadConflictRange(begin, end []byte) {
	if !t.writable() || bytes.Compare(begin, end) >= 0 {
		return
	}
	if err := t.begin(); err != nil {
		t.fail(err)
		return
	}
	t.reads = append(t.reads, &rangeRd{span: span{slices.Clone(begin), slices.Clone(end)}})
}

// Watch implements kv.Tx.
func (t *tx) Watch(key []byte) kv.Watch {
	w := newWatch(t.db.watches, key)
	if t.done {
		w.fail(kv.ErrTxDone)
		return w
	}
	t.watches = append(t.watches, w)
	return w
}

// Versionstamp implements kv.Tx.
func (t *tx) Versionstamp() kv.VersionstampFuture {
	f := kvbuf.NewStampFuture()
	if t.done {
		f.Resolve([kv.VersionstampLength]byte{}, kv.ErrTxDone)
		return f
	}
	t.stamps = append(t.stamps, f)
	return f
}

// finish ends the attempt: the snapshot is released; with err, its
// watches and stamps fail.
func (t *tx) finish(err error) {
	t.closeReads()
	t.done = true
	t.end()
	if err == nil {
		return
	}
	for _, w := range t.watches {
		w.fail(err)
	}
	for _, f := range t.stamps {
		f.Resolve([kv.VersionstampLength]byte{}, err)
	}
}

// closeReads narrows the range reads still iterated to what was consumed.
func (t *tx) closeReads() {
	for _, r := range t.reads {
		if r.it != nil {
			r.it.closeSpan()
		}
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
		if o, ok := t.buf.Writes[string(w.key)]; ok && o.Kind == kvbuf.SetVSV {
			continue
		}
		v, err := t.get(w.key, true)
		if err != nil {
			return err
		}
		w.armed, w.present = v, v != nil
	}
	if !t.buf.HasWrites() && len(t.stamps) == 0 {
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
	for _, f := range t.stamps {
		f.Resolve(stamp, nil)
	}
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
	vo, xo                                                 []int32
	snapVersion                                            int64
	note                                                   *string
}

func (a *commitArgs) args() []any {
	return []any{a.snapVersion, a.rk, a.rb, a.re, a.cb, a.ce, a.ck, a.sk, a.sv, a.ak, a.ad,
		a.vk, a.vo, a.vv, a.xk, a.xo, a.xv, a.note}
}

func (t *tx) commitArgs() *commitArgs {
	e := func() [][]byte { return [][]byte{} }
	a := &commitArgs{rk: t.readKeys, rb: e(), re: e(), cb: e(), ce: e(), ck: e(), sk: e(), sv: e(), ak: e(), ad: e(),
		vk: e(), vv: e(), xk: e(), xv: e(), vo: []int32{}, xo: []int32{}, snapVersion: t.snap}
	if a.rk == nil {
		a.rk = e()
	}
	for _, r := range t.reads {
		if bytes.Compare(r.begin, r.end) < 0 {
			a.rb, a.re = append(a.rb, r.begin), append(a.re, r.end)
		}
	}
	for _, c := range t.buf.Clears {
		a.cb, a.ce = append(a.cb, c.Begin), append(a.ce, c.End)
	}
	keys := make([]string, 0, len(t.buf.Writes))
	for k := range t.buf.Writes {
		keys = append(keys, k)
	}
	sort.Strings(keys) // a stable order of row locks
	for _, k := range keys {
		o := t.buf.Writes[k]
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
	seen := map[string]int{}
	for _, w := range t.buf.VSKeys {
		id := fmt.Sprintf("%d:%x", w.Offset, w.Key)
		if i, ok := seen[id]; ok {
			a.vv[i] = w.Value
			continue
		}
		seen[id] = len(a.vk)
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
	var sb strings.Builder
	sb.Grow(n * 16)
	for _, ks := range [][][]byte{a.ck, a.sk, a.ak, a.xk} {
		for _, k := range ks {
			fmt.Fprintf(&sb, "%016x", keyHash(k))
		}
	}
	s := sb.String()
	return &s
}

func keyHash(k []byte) uint64 {
	h := fnv.New64a()
	h.Write(k)
	return h.Sum64()
}
