package sqlite

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"runtime"
	"slices"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/kvbuf"
)

// errRetry marks a commit failure worth running the transaction again for
// (the file was busy beyond the busy timeout).
var errRetry = errors.New("sqlite: store busy")

// Transact implements kv.Database.
func (db *DB) Transact(ctx context.Context, fn func(kv.Tx) error) error {
	var t *tx
	defer func() {
		if t != nil {
			t.leaveInflight() // fn panicked
		}
	}()
	classic := false // see read.go
	return kvbuf.Retry(ctx, "sqlite", db.opts.MaxAttempts, db.isClosed, func(int) (kvbuf.Outcome, error) {
		t = newTx(ctx, db, classic)
		db.inflight.Add(1)
		t.inflight = true
		err := t.Result(fn(t))
		if err != nil && isMoved(t, err) {
			// The attempt's reads were not consistent: whatever fn
			// concluded is void. Run it again on a reader snapshot.
			t.leaveInflight()
			t.finish(errMoved)
			db.moves.Add(1)
			classic = true
			return kvbuf.AgainNow, errMoved
		}
		if err != nil {
			t.leaveInflight()
			t.finish(err)
			return kvbuf.Stop, err
		}
		t.finishReads()
		if err := ctx.Err(); err != nil {
			t.leaveInflight()
			t.finish(err)
			return kvbuf.Stop, err // never committed
		}
		err = db.commit(ctx, t)
		t.leaveInflight()
		if err == nil {
			return kvbuf.Stop, nil
		}
		t.finish(err)
		if isMoved(t, err) {
			db.moves.Add(1)
			classic = true
		}
		if !errors.Is(err, kv.ErrConflict) && !errors.Is(err, errRetry) {
			return kvbuf.Stop, err
		}
		return kvbuf.Again, err
	})
}

// ReadTransact implements kv.Database.
func (db *DB) ReadTransact(ctx context.Context, fn func(kv.ReadTx) error) error {
	if err := kvbuf.Usable(ctx, db.isClosed()); err != nil {
		return err
	}
	// A read-only transaction runs fn exactly once, on a reader snapshot:
	// reads through the writer connection may have to be run again when a
	// commit moves them (see read.go), and callers of ReadTransact collect
	// what fn reads (List, Fold) without expecting a second run.
	t := newTx(ctx, db, true)
	err := t.Result(fn(t))
	t.finish(err)
	return err
}

// commitReq is a transaction waiting for the writer.
type commitReq struct {
	t    *tx
	err  error
	done chan struct{}
	// lead hands the writer over: the leader, done with its own request,
	// passes the leading on to a waiting one (buffered, sent under db.mu).
	lead chan struct{}
	// Set by the batch that committed it.
	stamp [kv.VersionstampLength]byte
	armed []armedWatch
}

type armedWatch struct {
	w       *watch
	value   []byte
	present bool
}

func isDone(r *commitReq) bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (r *commitReq) finish(err error) {
	r.err = err
	close(r.done)
}

// commit validates and writes t. A transaction without writes commits at
// its snapshot: it only arms its watches.
func (db *DB) commit(ctx context.Context, t *tx) error {
	if !t.HasWrites() {
		var armed []armedWatch
		for _, w := range t.watches {
			v, err := t.Read(w.key, true)
			if err != nil {
				return err
			}
			armed = append(armed, armedWatch{w: w, value: v, present: v != nil})
		}
		t.finish(nil)
		db.watches.arm(armed)
		return nil
	}
	t.endSnapshot() // the writer validates against the current state
	req := &commitReq{t: t, done: make(chan struct{}), lead: make(chan struct{}, 1)}
	db.mu.Lock()
	if db.closed {
		db.mu.Unlock()
		return kv.ErrClosed
	}
	if kv.IsPriority(ctx) {
		// The liveness lane (a heartbeat, a lease renewal): in the next
		// batch, whatever is queued.
		db.pending = slices.Insert(db.pending, 0, req)
	} else {
		db.pending = append(db.pending, req)
	}
	t.leaveInflight()
	lead := !db.leading
	if lead {
		db.leading = true
	}
	db.mu.Unlock()
	if lead {
		db.lead(req)
	}
wait:
	for {
		select {
		case <-req.done:
			break wait
		case <-req.lead:
			db.lead(req)
		case <-ctx.Done():
			db.mu.Lock()
			for i, r := range db.pending {
				if r == req {
					db.pending = append(db.pending[:i], db.pending[i+1:]...)
					handed := false
					select {
					case <-req.lead:
						handed = true
					default:
					}
					db.mu.Unlock()
					if handed {
						db.lead(nil) // pass it on
					}
					return ctx.Err() // never handed to the writer: nothing committed
				}
			}
			db.mu.Unlock()
			for { // already in a batch: its outcome is the answer
				select {
				case <-req.done:
					break wait
				case <-req.lead:
					db.lead(req)
				}
			}
		}
	}
	if req.err != nil {
		return req.err
	}
	t.finish(nil)
	t.Resolve(req.stamp)
	db.watches.arm(req.armed)
	return nil
}

// lead runs batches while commits are pending, until own (nil: none) is
// done: then, if commits are still pending, it hands the leading to the
// oldest of them, so that no caller waits for others' commits after its
// own. Only one goroutine leads at a time; the others wait for their
// request to be done or for the leading.
func (db *DB) lead(own *commitReq) {
	for {
		db.gather()
		db.mu.Lock()
		n := min(len(db.pending), db.opts.MaxBatch)
		if n == 0 {
			db.leading = false
			db.idle.Broadcast()
			db.mu.Unlock()
			return
		}
		if own == nil || isDone(own) {
			db.pending[0].lead <- struct{}{} // db.leading stays true
			db.mu.Unlock()
			return
		}
		batch := make([]*commitReq, n)
		copy(batch, db.pending)
		db.pending = append(db.pending[:0], db.pending[n:]...)
		db.mu.Unlock()
		db.runBatch(batch)
	}
}

// gather gives transactions of this process that are still running their
// function a chance to reach the commit queue before the leader takes a
// batch: one yield of the processor, only while some are in flight. On a
// busy 2-core machine the leader otherwise mostly finds its own request
// alone and pays a whole SQLite write transaction (BEGIN, lock file, commit
// counter, COMMIT and its WAL frames) for it; with the yield, 8 workers'
// queue cycles ran 10–20% faster (see BENCHMARKS.md, "KV store").
func (db *DB) gather() {
	if db.inflight.Load() == 0 {
		return
	}
	db.mu.Lock()
	full := len(db.pending) >= db.opts.MaxBatch
	db.mu.Unlock()
	if !full {
		runtime.Gosched()
	}
}

// runBatch commits batch in one write transaction; if that fails as a
// whole, each request is committed alone so one bad request fails alone.
func (db *DB) runBatch(batch []*commitReq) {
	db.batches.Add(1)
	db.batched.Add(int64(len(batch)))
	touched, version, err := db.writeBatch(batch)
	if err != nil && len(batch) > 1 {
		db.log.Warn().Err(err).Int("batch", len(batch)).Msg("group commit failed; committing one by one")
		for _, r := range batch {
			db.runBatch([]*commitReq{r})
		}
		return
	}
	if err != nil {
		batch[0].finish(err)
		return
	}
	if version != 0 {
		db.kickCheckpoint()
	}
	db.watches.committed(version, touched)
	for _, r := range batch {
		r.finish(r.err)
	}
}

// writeBatch runs one SQLite write transaction holding every request of
// batch that validates. It returns the keys written (for watches) and the
// commit version.
func (db *DB) writeBatch(batch []*commitReq) (touched touchedKeys, version int64, err error) {
	db.fileMu.Lock()
	defer db.fileMu.Unlock()
	if err := db.lockFile(db.queuedHook); err != nil {
		return touched, 0, err
	}
	defer db.unlockFile()
	return db.writeLocked(batch)
}

func (db *DB) writeLocked(batch []*commitReq) (touched touchedKeys, version int64, err error) {
	w := db.writer
	db.wmu.Lock()
	defer db.wmu.Unlock()
	if db.wclosed {
		return touched, 0, kv.ErrClosed
	}
	cur := int64(-1) // the newest committed version, once known
	defer func() {
		// Whatever happened, the writer connection's view may have
		// moved: record it for transactions reading through it.
		db.wgen++
		db.wver, db.wdv = cur, w.conn.dataVersion()
	}()
	if err := w.beginImmediate.exec(); err != nil {
		return touched, 0, fmt.Errorf("%w: begin: %v", errRetry, err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = w.rollback.exec()
		}
	}()
	if version, err = w.getCommit.int64Row(); err != nil {
		return touched, 0, fmt.Errorf("sqlite: read commit counter: %w", err)
	}
	cur = version
	version++
	var order uint16
	for _, r := range batch {
		r.err = nil
		ok, known := db.validateKnown(r.t, cur, &touched)
		if !known {
			db.rereads.Add(1)
			var err error
			if ok, err = db.validate(r.t); err != nil {
				return touched, 0, err
			}
		}
		if !ok {
			r.err = kv.ErrConflict
			continue
		}
		binary.BigEndian.PutUint64(r.stamp[:8], uint64(version))
		binary.BigEndian.PutUint16(r.stamp[8:], order)
		order++
		if err := db.apply(r.t, r.stamp, &touched); err != nil {
			return touched, 0, err
		}
		r.armed = r.armed[:0]
		for _, wt := range r.t.watches {
			v, present, err := w.getValue(wt.key)
			if err != nil {
				return touched, 0, err
			}
			r.armed = append(r.armed, armedWatch{w: wt, value: v, present: present})
		}
	}
	if order == 0 {
		return touched, 0, nil // every request conflicted; the rollback is free
	}
	if err := run(w.setCommit, nil, version); err != nil {
		return touched, 0, fmt.Errorf("sqlite: write commit counter: %w", err)
	}
	if err := w.commit.exec(); err != nil {
		return touched, 0, fmt.Errorf("sqlite: commit: %w", err)
	}
	committed = true
	cur = version
	db.own.add(version, &touched)
	db.committed.Store(version)
	return touched, version, nil
}

// validate re-reads t's read set inside the write transaction.
func (db *DB) validate(t *tx) (bool, error) {
	w := db.writer
	for _, p := range t.points {
		v, present, err := w.getValue(p.key)
		if err != nil {
			return false, fmt.Errorf("sqlite: validate %x: %w", p.key, err)
		}
		if present != p.present || !bytes.Equal(v, p.value) {
			return false, nil
		}
	}
	for _, rr := range t.ranges {
		if bytes.Compare(rr.Begin, rr.End) >= 0 {
			continue
		}
		var h maphash.Hash
		h.SetSeed(db.seed)
		if err := digestRange(w.stmts, rr.Begin, rr.End, rr.reverse, &h); err != nil {
			return false, fmt.Errorf("sqlite: validate range: %w", err)
		}
		if h.Sum64() != rr.h.Sum64() {
			return false, nil
		}
	}
	return true, nil
}

// apply writes t's buffered mutations; clears first, since any buffered
// write to a cleared key came after the clear.
func (db *DB) apply(t *tx, stamp [kv.VersionstampLength]byte, touched *touchedKeys) error {
	w := db.writer
	for _, r := range t.Buf.Clears {
		if err := run(w.delRange, [][]byte{r.Begin, r.End}); err != nil {
			return fmt.Errorf("sqlite: clear range: %w", err)
		}
		touched.ranges = append(touched.ranges, r)
	}
	for k, o := range t.Buf.Writes {
		key := []byte(k)
		var err error
		switch o.Kind {
		case kvbuf.Set:
			err = run(w.set, [][]byte{key, o.Value})
		case kvbuf.Clear:
			err = run(w.del, [][]byte{key})
		case kvbuf.Add:
			var cur []byte
			cur, _, err = w.getValue(key)
			if err == nil {
				err = run(w.set, [][]byte{key, kv.EncodeInt64LE(kv.Int64LE(cur) + o.Delta)})
			}
		case kvbuf.SetVSV:
			v := bytes.Clone(o.Value)
			copy(v[o.VSOffset:], stamp[:])
			err = run(w.set, [][]byte{key, v})
		}
		if err != nil {
			return fmt.Errorf("sqlite: write %x: %w", key, err)
		}
		touched.keys = append(touched.keys, key)
	}
	for _, vk := range t.Buf.VSKeys {
		key := bytes.Clone(vk.Key)
		copy(key[vk.Offset:], stamp[:])
		if err := run(w.set, [][]byte{key, vk.Value}); err != nil {
			return fmt.Errorf("sqlite: write %x: %w", key, err)
		}
		touched.keys = append(touched.keys, key)
	}
	return nil
}

// touchedKeys are the keys and ranges a batch wrote.
type touchedKeys struct {
	keys   [][]byte
	ranges []kvbuf.Range
}
