package jobqueue

import (
	"bytes"
	"context"
	"encoding/binary"
	"slices"
	"sort"
	"sync"

	"github.com/couchrep/couchrep/internal/kv"
)

// memDB is a tiny in-memory kv.Database for fast unit tests: transactions
// run one at a time under a mutex (trivially serializable), versionstamps
// are a commit counter, watches fire after a commit changes their key.
// The Must-show tests run on the real sqlite backend.
type memDB struct {
	mu      sync.Mutex
	data    map[string][]byte
	commits uint64
	watches map[string][]*memWatch
	closed  bool
}

func newMemDB() *memDB {
	return &memDB{data: map[string][]byte{}, watches: map[string][]*memWatch{}}
}

type memWatch struct {
	db    *memDB
	key   string
	val   []byte
	fired chan struct{}
	once  sync.Once
	err   error
}

func (w *memWatch) Wait(ctx context.Context) error {
	select {
	case <-w.fired:
		return w.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *memWatch) Cancel() {
	w.db.mu.Lock()
	defer w.db.mu.Unlock()
	ws := w.db.watches[w.key]
	if i := slices.Index(ws, w); i >= 0 {
		w.db.watches[w.key] = slices.Delete(ws, i, i+1)
	}
}

type memVSFuture struct {
	stamp [kv.VersionstampLength]byte
	err   error
}

func (f *memVSFuture) Get(context.Context) ([kv.VersionstampLength]byte, error) {
	return f.stamp, f.err
}

type vsOp struct {
	key, val []byte
	keyOff   int
	valOff   int
}

type memTx struct {
	db      *memDB
	writes  map[string][]byte // nil value = cleared
	ranges  [][2][]byte       // cleared ranges, in order (applied before later writes)
	order   []func(map[string][]byte)
	vs      []vsOp
	watches []*memWatch
	future  *memVSFuture
	done    bool
}

func (t *memTx) Get(key []byte) ([]byte, error) {
	if t.done {
		return nil, kv.ErrTxDone
	}
	m := t.view()
	return bytes.Clone(m[string(key)]), nil
}

// view returns the data with this transaction's writes applied.
func (t *memTx) view() map[string][]byte {
	if len(t.order) == 0 {
		return t.db.data
	}
	m := make(map[string][]byte, len(t.db.data))
	for k, v := range t.db.data {
		m[k] = v
	}
	for _, op := range t.order {
		op(m)
	}
	return m
}

type memIter struct {
	kvs []kv.KeyValue
	i   int
	err error
}

func (it *memIter) Next() bool            { it.i++; return it.i <= len(it.kvs) }
func (it *memIter) KeyValue() kv.KeyValue { return it.kvs[it.i-1] }
func (it *memIter) Err() error            { return it.err }

func (t *memTx) GetRange(begin, end []byte, opts kv.RangeOptions) kv.RangeIterator {
	if t.done {
		return &memIter{err: kv.ErrTxDone}
	}
	m := t.view()
	var keys []string
	for k := range m {
		if k >= string(begin) && k < string(end) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	if opts.Reverse {
		slices.Reverse(keys)
	}
	if opts.Limit > 0 && len(keys) > opts.Limit {
		keys = keys[:opts.Limit]
	}
	out := make([]kv.KeyValue, len(keys))
	for i, k := range keys {
		out[i] = kv.KeyValue{Key: []byte(k), Value: bytes.Clone(m[k])}
	}
	return &memIter{kvs: out}
}

func (t *memTx) Snapshot() kv.ReadTx { return t }

func (t *memTx) Set(key, value []byte) {
	k, v := string(key), bytes.Clone(value)
	if v == nil {
		v = []byte{}
	}
	t.order = append(t.order, func(m map[string][]byte) { m[k] = v })
}

func (t *memTx) Clear(key []byte) {
	k := string(key)
	t.order = append(t.order, func(m map[string][]byte) { delete(m, k) })
}

func (t *memTx) ClearRange(begin, end []byte) {
	b, e := string(begin), string(end)
	t.order = append(t.order, func(m map[string][]byte) {
		for k := range m {
			if k >= b && k < e {
				delete(m, k)
			}
		}
	})
}

func (t *memTx) Add(key []byte, delta int64) {
	k := string(key)
	t.order = append(t.order, func(m map[string][]byte) {
		m[k] = kv.EncodeInt64LE(kv.Int64LE(m[k]) + delta)
	})
}

func (t *memTx) SetVersionstampedKey(key []byte, offset int, value []byte) error {
	if offset < 0 || offset+kv.VersionstampLength > len(key) {
		return kv.ErrInvalidVersionstamp
	}
	t.vs = append(t.vs, vsOp{key: bytes.Clone(key), val: bytes.Clone(value), keyOff: offset, valOff: -1})
	return nil
}

func (t *memTx) SetVersionstampedValue(key, value []byte, offset int) error {
	if offset < 0 || offset+kv.VersionstampLength > len(value) {
		return kv.ErrInvalidVersionstamp
	}
	t.vs = append(t.vs, vsOp{key: bytes.Clone(key), val: bytes.Clone(value), keyOff: -1, valOff: offset})
	return nil
}

func (t *memTx) AddReadConflictKey([]byte)           {}
func (t *memTx) AddReadConflictRange(_, _ []byte)    {}
func (t *memTx) Versionstamp() kv.VersionstampFuture { return t.future }

func (t *memTx) Watch(key []byte) kv.Watch {
	w := &memWatch{db: t.db, key: string(key), fired: make(chan struct{})}
	t.watches = append(t.watches, w)
	return w
}

func (d *memDB) Transact(ctx context.Context, fn func(kv.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return kv.ErrClosed
	}
	tx := &memTx{db: d, future: &memVSFuture{}}
	err := fn(tx)
	tx.done = true
	if err != nil {
		tx.future.err = err
		for _, w := range tx.watches {
			w.err = err
			close(w.fired)
		}
		return err
	}
	d.commits++
	var stamp [kv.VersionstampLength]byte
	binary.BigEndian.PutUint64(stamp[:], d.commits)
	tx.future.stamp = stamp
	before := make(map[string][]byte)
	touch := func(k string) {
		if _, ok := before[k]; !ok {
			before[k] = d.data[k]
		}
	}
	for k := range d.watches {
		touch(k)
	}
	for _, op := range tx.order {
		op(d.data)
	}
	for _, op := range tx.vs {
		k, v := bytes.Clone(op.key), bytes.Clone(op.val)
		if op.keyOff >= 0 {
			copy(k[op.keyOff:], stamp[:])
		} else {
			copy(v[op.valOff:], stamp[:])
		}
		d.data[string(k)] = v
	}
	for k, ws := range d.watches {
		if !bytes.Equal(before[k], d.data[k]) || (before[k] == nil) != (d.data[k] == nil) {
			for _, w := range ws {
				w.once.Do(func() { close(w.fired) })
			}
			delete(d.watches, k)
		}
	}
	for _, w := range tx.watches {
		w.val = d.data[w.key]
		d.watches[w.key] = append(d.watches[w.key], w)
	}
	return nil
}

func (d *memDB) ReadTransact(ctx context.Context, fn func(kv.ReadTx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return kv.ErrClosed
	}
	tx := &memTx{db: d, future: &memVSFuture{}}
	err := fn(tx)
	tx.done = true
	return err
}

func (d *memDB) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	for _, ws := range d.watches {
		for _, w := range ws {
			w.err = kv.ErrClosed
			w.once.Do(func() { close(w.fired) })
		}
	}
	d.watches = nil
	return nil
}
