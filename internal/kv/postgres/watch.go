package postgres

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/kvbuf"
)

// channel is the NOTIFY channel commits announce their writes on.
const channel = "couchrep_kv"

// watchHub holds a Database's armed watches. The commit connection
// (pipe.go) LISTENs for the commits' notifications (from every process); a notification names
// the keys written (or "*"), and the dispatcher then reads those watched
// keys again and fires every watch whose key's value differs from the
// value it was armed with. After arming, and after every (re)connect of
// the listener, the keys are read again too, so a change is never missed:
// it either happened before that read (and the read sees it) or its
// notification arrives after the LISTEN.
type watchHub struct {
	db *DB

	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	byKey   map[string]map[*watch]struct{}
	hashes  map[uint64]int      // the hashes of byKey's keys: how many keys have each
	pending map[uint64]struct{} // key hashes to look at again
	all     bool                // look at every watched key again
	wake    chan struct{}
}

func newWatchHub(db *DB) *watchHub {
	ctx, cancel := context.WithCancel(context.Background())
	return &watchHub{db: db, ctx: ctx, cancel: cancel,
		byKey: map[string]map[*watch]struct{}{}, hashes: map[uint64]int{}, pending: map[uint64]struct{}{}, wake: make(chan struct{}, 1)}
}

func (h *watchHub) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// arm adds a committed transaction's watch and has its key read again.
func (h *watchHub) arm(w *watch) {
	h.mu.Lock()
	if h.ctx.Err() != nil {
		h.mu.Unlock()
		w.fail(kv.ErrClosed) // after the unlock: fail removes w
		return
	}
	defer h.mu.Unlock()
	if w.isDone() {
		return
	}
	set := h.byKey[string(w.key)]
	if set == nil {
		set = map[*watch]struct{}{}
		h.byKey[string(w.key)] = set
		h.hashes[keyHash(w.key)]++
	}
	set[w] = struct{}{}
	h.pending[keyHash(w.key)] = struct{}{}
	h.poke()
}

func (h *watchHub) remove(w *watch) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if set := h.byKey[string(w.key)]; set != nil {
		delete(set, w)
		if len(set) == 0 {
			delete(h.byKey, string(w.key))
			x := keyHash(w.key)
			if h.hashes[x]--; h.hashes[x] <= 0 {
				delete(h.hashes, x)
			}
		}
	}
}

// notified records a notification's payload. It wakes the dispatcher
// only when the payload may name a watched key: most commits (every job
// cycle's, on a node that watches a few keys) write none, and the
// dispatcher's wake-up is a goroutine hand-off per commit batch. A watch
// armed after the notification misses nothing: arming reads its key too.
func (h *watchHub) notified(payload string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.byKey) == 0 {
		return
	}
	if payload == "*" || len(payload)%16 != 0 {
		h.all = true
		h.poke()
		return
	}
	for i := 0; i < len(payload); i += 16 {
		x, err := strconv.ParseUint(payload[i:i+16], 16, 64)
		if err != nil {
			h.all = true
			h.poke()
			return
		}
		if h.hashes[x] > 0 {
			h.pending[x] = struct{}{}
			h.poke()
		}
	}
}

// listen keeps the DB's commit connection (pipe.go), which LISTENs for
// the notifications, open until the hub closes: a process that only
// watches needs it too. Its own commits' notifications then cost the
// server no signal to another backend (PostgreSQL's SignalBackends
// signals every other listening backend with kill(2) at each commit: 9.5%
// of the commit connection's CPU when a separate connection listened).
func (h *watchHub) listen() {
	defer h.db.bg.Done()
	delay := 100 * time.Millisecond
	for h.ctx.Err() == nil {
		p, err := h.db.commits.opened(h.db)
		if err == nil {
			delay = 100 * time.Millisecond
			// Changes made while no connection listened are found by
			// reading every watched key again.
			h.mu.Lock()
			h.all = true
			h.poke()
			h.mu.Unlock()
			select {
			case <-h.ctx.Done():
				return
			case <-p.exited:
			}
			err = p.cause()
		}
		if h.ctx.Err() != nil {
			return
		}
		h.db.log.Warn().Err(h.db.errorf("listen", err)).Dur("retry_in", delay).Msg("postgres: watch listener disconnected")
		select {
		case <-h.ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// dispatch reads the keys named by notifications and fires the watches
// whose value changed.
func (h *watchHub) dispatch() {
	defer h.db.bg.Done()
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-h.wake:
		}
		h.mu.Lock()
		var keys [][]byte
		for k := range h.byKey {
			if _, ok := h.pending[keyHash([]byte(k))]; ok || h.all {
				keys = append(keys, []byte(k))
			}
		}
		all := h.all
		h.all, h.pending = false, map[uint64]struct{}{}
		h.mu.Unlock()
		if len(keys) == 0 {
			continue
		}
		if err := h.check(keys); err != nil {
			if h.ctx.Err() != nil {
				return
			}
			h.mu.Lock()
			if all {
				h.all = true
			}
			for _, k := range keys {
				h.pending[keyHash(k)] = struct{}{}
			}
			h.mu.Unlock()
			select {
			case <-h.ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			h.poke()
		}
	}
}

// check reads keys and fires the watches on them whose value changed.
func (h *watchHub) check(keys [][]byte) error {
	ctx, cancel := context.WithTimeout(h.ctx, 10*time.Second)
	defer cancel()
	rows, err := h.db.pool.Query(ctx, "SELECT k, v FROM couchrep_kv WHERE k = ANY ($1)", keys)
	if err != nil {
		return err
	}
	now := map[string][]byte{}
	for rows.Next() {
		var k, v []byte
		if err := rows.Scan(&k, &v); err != nil {
			rows.Close()
			return err
		}
		now[string(k)] = kvbuf.NonNil(v)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	h.mu.Lock()
	var fire []*watch
	for _, k := range keys {
		v, present := now[string(k)]
		for w := range h.byKey[string(k)] {
			if present != w.present || !bytes.Equal(v, w.armed) {
				fire = append(fire, w)
			}
		}
	}
	h.mu.Unlock()
	for _, w := range fire {
		w.fail(nil)
	}
	return nil
}

// close fails every watch with kv.ErrClosed and stops the goroutines.
func (h *watchHub) close() {
	h.cancel()
	h.mu.Lock()
	var all []*watch
	for _, set := range h.byKey {
		for w := range set {
			all = append(all, w)
		}
	}
	h.mu.Unlock()
	for _, w := range all {
		w.fail(kv.ErrClosed)
	}
}

// watch is one kv.Watch.
type watch struct {
	hub     *watchHub
	key     []byte
	armed   []byte // the value it was armed with
	present bool

	once sync.Once
	done chan struct{}
	err  error
}

func newWatch(h *watchHub, key []byte) *watch {
	return &watch{hub: h, key: slices.Clone(key), done: make(chan struct{})}
}

func (w *watch) isDone() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// fail ends the watch: fired (nil) or failed.
func (w *watch) fail(err error) {
	w.once.Do(func() {
		w.err = err
		close(w.done)
		w.hub.remove(w)
	})
}

// Wait implements kv.Watch.
func (w *watch) Wait(ctx context.Context) error {
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Cancel implements kv.Watch.
func (w *watch) Cancel() { w.fail(kv.ErrWatchCancelled) }
