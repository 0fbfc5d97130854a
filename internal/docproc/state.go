package docproc

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
	"github.com/couchrep/couchrep/internal/repjob"
)

// DocRecord is what the doc processor remembers about one document.
type DocRecord struct {
	// JobID is the document's job; empty when it has none (invalid).
	JobID string `json:"job_id,omitempty"`
	// Fingerprint identifies the parameters the job was added with.
	Fingerprint string `json:"fp"`
	// Rev is the last revision processed or written.
	Rev string `json:"rev,omitempty"`
	// State is the terminal state written back (zero while the job
	// runs); stored as its name.
	State repjob.State `json:"state,omitempty"`
	// Written reports that the terminal state of the job's current run
	// has been written to the document.
	Written bool `json:"written,omitempty"`
}

// lease is the ("lease", server, db) value.
type lease struct {
	Owner   string `json:"owner"`
	Expires int64  `json:"expires"` // unix nanoseconds
}

// keyspace builds the doc processor's keys.
type keyspace struct{ root tuple.Subspace }

func newKeyspace(prefix []byte) keyspace {
	return keyspace{root: tuple.NewSubspace(prefix, tuple.Tuple{"docproc"})}
}

func (k keyspace) seq(server, db string) []byte {
	return k.root.Pack(tuple.Tuple{"seq", server, db})
}

func (k keyspace) doc(server, db, id string) []byte {
	return k.root.Pack(tuple.Tuple{"doc", server, db, id})
}

func (k keyspace) docs(server, db string) (begin, end []byte) {
	return k.root.Sub("doc", server, db).Range()
}

func (k keyspace) watching(node string) []byte {
	return k.root.Pack(tuple.Tuple{"watching", node})
}

func (k keyspace) lease(server, db string) []byte {
	return k.root.Pack(tuple.Tuple{"lease", server, db})
}

// state is the doc processor's part of the store for one database.
type state struct {
	store  kv.Database
	keys   keyspace
	server string
	db     string
}

func (s *state) loadSeq(ctx context.Context) (couch.Seq, error) {
	var seq couch.Seq
	err := s.store.ReadTransact(ctx, func(tx kv.ReadTx) error {
		v, err := tx.Get(s.keys.seq(s.server, s.db))
		if err != nil {
			return err
		}
		seq = couch.SeqOf(v)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("docproc: load checkpoint of %s: %w", s.db, err)
	}
	return seq, nil
}

func (s *state) record(ctx context.Context, id string) (*DocRecord, error) {
	var rec *DocRecord
	err := s.store.ReadTransact(ctx, func(tx kv.ReadTx) error {
		var err error
		rec, err = getRecord(tx, s.keys.doc(s.server, s.db, id))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("docproc: read record of %s/%s: %w", s.db, id, err)
	}
	return rec, nil
}

func getRecord(tx kv.ReadTx, key []byte) (*DocRecord, error) {
	v, err := tx.Get(key)
	if err != nil || v == nil {
		return nil, err
	}
	var rec DocRecord
	if err := json.Unmarshal(v, &rec); err != nil {
		return nil, fmt.Errorf("docproc: corrupt record: %w", err)
	}
	return &rec, nil
}

// setJSON sets key to v encoded as JSON.
func setJSON(tx kv.Tx, key []byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tx.Set(key, b)
	return nil
}

// commit stores a document's new record (nil clears it) and, when seq is
// not nil, the feed checkpoint, in one transaction.
func (s *state) commit(ctx context.Context, id string, rec *DocRecord, seq couch.Seq) error {
	var val []byte
	if rec != nil {
		var err error
		if val, err = json.Marshal(rec); err != nil {
			return fmt.Errorf("docproc: encode record: %w", err)
		}
	}
	err := s.store.Transact(ctx, func(tx kv.Tx) error {
		if id != "" {
			k := s.keys.doc(s.server, s.db, id)
			if val == nil {
				tx.Clear(k)
			} else {
				tx.Set(k, val)
			}
		}
		if seq != nil {
			tx.Set(s.keys.seq(s.server, s.db), []byte(seq.String()))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("docproc: commit %s/%s: %w", s.db, id, err)
	}
	return nil
}

// update changes a document's record in a transaction if it still has the
// fingerprint fp; it reports whether it did.
func (s *state) update(ctx context.Context, id, fp string, fn func(*DocRecord)) (bool, error) {
	done := false
	err := s.store.Transact(ctx, func(tx kv.Tx) error {
		done = false
		k := s.keys.doc(s.server, s.db, id)
		rec, err := getRecord(tx, k)
		if err != nil || rec == nil || rec.Fingerprint != fp {
			return err
		}
		fn(rec)
		if err := setJSON(tx, k, rec); err != nil {
			return err
		}
		done = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("docproc: update record of %s/%s: %w", s.db, id, err)
	}
	return done, nil
}

// records returns every document record of the database.
func (s *state) records(ctx context.Context) (map[string]*DocRecord, error) {
	out := map[string]*DocRecord{}
	sub := s.keys.root.Sub("doc", s.server, s.db)
	err := s.store.ReadTransact(ctx, func(tx kv.ReadTx) error {
		clear(out)
		begin, end := sub.Range()
		it := tx.GetRange(begin, end, kv.RangeOptions{})
		for it.Next() {
			e := it.KeyValue()
			t, err := sub.Unpack(e.Key)
			if err != nil || len(t) != 1 {
				return fmt.Errorf("docproc: bad record key: %w", err)
			}
			id, _ := t[0].(string)
			var rec DocRecord
			if err := json.Unmarshal(e.Value, &rec); err != nil {
				return fmt.Errorf("docproc: corrupt record %s: %w", id, err)
			}
			out[id] = &rec
		}
		return it.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("docproc: list records of %s: %w", s.db, err)
	}
	return out, nil
}

// forget clears the database's records and checkpoint (it was deleted).
func (s *state) forget(ctx context.Context) error {
	err := s.store.Transact(ctx, func(tx kv.Tx) error {
		tx.ClearRange(s.keys.docs(s.server, s.db))
		tx.Clear(s.keys.seq(s.server, s.db))
		return nil
	})
	if err != nil {
		return fmt.Errorf("docproc: forget %s: %w", s.db, err)
	}
	return nil
}

// forgetSeq clears the database's feed checkpoint, keeping its records:
// the next follower reads the database from its start.
func (s *state) forgetSeq(ctx context.Context) error {
	err := s.store.Transact(ctx, func(tx kv.Tx) error {
		tx.Clear(s.keys.seq(s.server, s.db))
		return nil
	})
	if err != nil {
		return fmt.Errorf("docproc: forget the checkpoint of %s: %w", s.db, err)
	}
	return nil
}

// acquire takes or renews the database's lease for owner until now+ttl. It
// reports false when another owner holds an unexpired lease.
func (s *state) acquire(ctx context.Context, owner string, now time.Time, ttl time.Duration) (bool, error) {
	ok := false
	err := s.store.Transact(ctx, func(tx kv.Tx) error {
		ok = false
		k := s.keys.lease(s.server, s.db)
		v, err := tx.Get(k)
		if err != nil {
			return err
		}
		if v != nil {
			var l lease
			if json.Unmarshal(v, &l) == nil && l.Owner != owner && l.Expires > now.UnixNano() {
				return nil
			}
		}
		if err := setJSON(tx, k, lease{Owner: owner, Expires: now.Add(ttl).UnixNano()}); err != nil {
			return err
		}
		ok = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("docproc: lease %s: %w", s.db, err)
	}
	return ok, nil
}

// release gives the lease up if owner holds it.
func (s *state) release(ctx context.Context, owner string) error {
	err := s.store.Transact(ctx, func(tx kv.Tx) error {
		k := s.keys.lease(s.server, s.db)
		v, err := tx.Get(k)
		if err != nil || v == nil {
			return err
		}
		var l lease
		if json.Unmarshal(v, &l) == nil && l.Owner == owner {
			tx.Clear(k)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("docproc: release lease %s: %w", s.db, err)
	}
	return nil
}
