package sqlite

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
)

// watch is a kv.Watch on one key.
type watch struct {
	db    *DB
	key   []byte
	once  sync.Once
	fired chan struct{}
	err   error

	// Set when armed (under watchSet.mu).
	value   []byte
	present bool
}

func newWatch(db *DB, key []byte) *watch {
	return &watch{db: db, key: slices.Clone(key), fired: make(chan struct{})}
}

// fail ends the watch with err (nil: the key changed).
func (w *watch) fail(err error) {
	w.once.Do(func() {
		w.err = err
		close(w.fired)
	})
}

// Wait implements kv.Watch.
func (w *watch) Wait(ctx context.Context) error {
	select {
	case <-w.fired:
		return w.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Cancel implements kv.Watch.
func (w *watch) Cancel() {
	w.fail(kv.ErrWatchCancelled)
	w.db.watches.remove(w)
}

// watchSet holds the armed watches of a DB and the state of the one
// goroutine (watchLoop) that checks them.
type watchSet struct {
	db   *DB
	kick chan struct{}

	mu    sync.Mutex
	byKey map[string][]*watch
	dirty map[string]bool // keys to re-read
	all   bool            // re-read every watched key
	// own holds the commit versions this process wrote and the loop has not
	// yet seen in the counter, so it can tell them from foreign commits.
	own map[int64]bool
	// active: a local commit or a newly armed watch since the loop last
	// looked; the poll interval goes back to PollInterval.
	active bool
	// pollHook, set by tests before any watch, is called by the loop with
	// each interval it chooses before waiting for the next poll.
	pollHook func(time.Duration)
}

func newWatchSet(db *DB) *watchSet {
	return &watchSet{db: db, kick: make(chan struct{}, 1), byKey: map[string][]*watch{}, dirty: map[string]bool{}, own: map[int64]bool{}}
}

func (s *watchSet) signal() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// arm registers committed watches and has the loop check them once, in case
// a commit changed their key between arming and registration.
func (s *watchSet) arm(armed []armedWatch) {
	if len(armed) == 0 {
		return
	}
	s.mu.Lock()
	for _, a := range armed {
		select {
		case <-a.w.fired:
			continue // cancelled already
		default:
		}
		a.w.value, a.w.present = a.value, a.present
		k := string(a.w.key)
		s.byKey[k] = append(s.byKey[k], a.w)
		s.dirty[k] = true
	}
	s.active = true
	s.mu.Unlock()
	s.signal()
}

func (s *watchSet) remove(w *watch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := string(w.key)
	ws := slices.DeleteFunc(s.byKey[k], func(x *watch) bool { return x == w })
	if len(ws) == 0 {
		delete(s.byKey, k)
	} else {
		s.byKey[k] = ws
	}
}

// committed records an in-process commit and marks watched keys it wrote.
func (s *watchSet) committed(version int64, t touchedKeys) {
	if version == 0 {
		return
	}
	s.mu.Lock()
	if len(s.byKey) > 0 {
		s.own[version] = true
		s.active = true
	}
	n := 0
	for _, k := range t.keys {
		if _, ok := s.byKey[string(k)]; ok {
			s.dirty[string(k)] = true
			n++
		}
	}
	for _, r := range t.ranges {
		for k := range s.byKey {
			if r.Contains([]byte(k)) {
				s.dirty[k] = true
				n++
			}
		}
	}
	s.mu.Unlock()
	if n > 0 {
		s.signal()
	}
}

// watchLoop is the DB's one watch goroutine. It re-reads keys marked dirty
// by in-process commits at once, and while watches are pending it polls
// PRAGMA data_version every PollInterval to find commits by other
// processes, after which it re-reads every watched key. The interval backs
// off to MaxPollInterval, or to QuietMaxPollInterval once no other process
// committed for QuietAfter.
func (db *DB) watchLoop() {
	defer db.done.Done()
	s := db.watches
	var poll *readerConn
	defer func() {
		if poll != nil {
			poll.close()
		}
		s.mu.Lock()
		for _, ws := range s.byKey {
			for _, w := range ws {
				w.fail(kv.ErrClosed)
			}
		}
		s.byKey = map[string][]*watch{}
		s.mu.Unlock()
	}()
	var lastDataVersion, lastCommit int64 = -1, -1
	lastForeign := time.Now() // a foreign commit seen (or the start)
	// The poll interval starts at PollInterval, doubles with every poll
	// that finds data_version unchanged, up to MaxPollInterval, and goes
	// back to PollInterval on a change, a local commit or a new watch.
	interval := db.opts.PollInterval
	timer := time.NewTimer(time.Hour)
	timer.Stop() // runs only while watches are pending
	timing := false
	defer timer.Stop()
	for {
		s.mu.Lock()
		pending := len(s.byKey) > 0
		if s.active {
			s.active = false
			if interval != db.opts.PollInterval {
				interval = db.opts.PollInterval
				timing = false // re-arm the timer at the short interval
			}
		}
		hook := s.pollHook
		s.mu.Unlock()
		if pending && !timing {
			if hook != nil {
				hook(interval)
			}
			timer.Reset(interval)
			timing = true
		} else if !pending {
			timer.Stop()
			timing = false
		}
		if !pending {
			lastDataVersion = -1 // re-baseline when watches come back
			interval = db.opts.PollInterval
		}
		select {
		case <-db.closing:
			return
		case <-s.kick:
		case <-timer.C:
			timing = false
			if poll == nil {
				var err error
				if poll, err = db.getReader(); err != nil {
					db.log.Error().Err(err).Msg("watch poller connection")
					continue
				}
			}
			dv, err := poll.dataVersion()
			if err != nil {
				db.log.Error().Err(err).Msg("watch poll")
				continue
			}
			if dv == lastDataVersion {
				limit := db.opts.MaxPollInterval
				if time.Since(lastForeign) >= db.opts.QuietAfter {
					limit = db.opts.QuietMaxPollInterval
				}
				interval = min(2*interval, limit)
				continue
			}
			interval = db.opts.PollInterval
			commit, err := poll.commitCounter()
			if err != nil {
				db.log.Error().Err(err).Msg("watch poll")
				continue
			}
			s.mu.Lock()
			baseline := lastDataVersion < 0 || lastCommit < 0
			seen := false // a commit of another process
			for v := lastCommit + 1; !baseline && !seen && v <= commit; v++ {
				if !s.own[v] {
					seen = true
				}
			}
			foreign := baseline || seen
			if seen {
				lastForeign = time.Now()
			}
			for v := range s.own {
				if v <= commit {
					delete(s.own, v)
				}
			}
			if foreign {
				s.all = true
			}
			s.mu.Unlock()
			lastDataVersion, lastCommit = dv, commit
		}
		if poll == nil {
			var err error
			if poll, err = db.getReader(); err != nil {
				db.log.Error().Err(err).Msg("watch poller connection")
				continue
			}
		}
		s.check(poll)
	}
}

// check re-reads the dirty (or all) watched keys and fires the watches
// whose value changed.
func (s *watchSet) check(poll *readerConn) {
	s.mu.Lock()
	var keys []string
	if s.all {
		for k := range s.byKey {
			keys = append(keys, k)
		}
	} else {
		for k := range s.dirty {
			if _, ok := s.byKey[k]; ok {
				keys = append(keys, k)
			}
		}
	}
	s.all = false
	clear(s.dirty)
	s.mu.Unlock()
	for _, k := range keys {
		v, present, err := poll.getValue([]byte(k))
		if err != nil {
			s.db.log.Error().Err(err).Msg("watch read")
			s.mu.Lock()
			s.dirty[k] = true
			s.mu.Unlock()
			continue
		}
		s.mu.Lock()
		ws := s.byKey[k]
		keep := ws[:0]
		for _, w := range ws {
			if w.present != present || !bytes.Equal(w.value, v) {
				w.fail(nil)
			} else {
				keep = append(keep, w)
			}
		}
		if len(keep) == 0 {
			delete(s.byKey, k)
		} else {
			s.byKey[k] = keep
		}
		s.mu.Unlock()
	}
}
