package repjob

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
	"github.com/couchrep/couchrep/messages"
)

// The listing indexes keep every job in the orders it is listed in, so that
// a page of _scheduler/jobs, _scheduler/docs or couchrepctl jobs is a range
// read of the page (plus the page's records), not a read of every job:
//
//	(SCHED, shown_id, job_id)   = ""   jobs not finished (nor NotScheduled), in _scheduler/jobs order
//	(DOCS, db, doc_id, job_id)  = ""   jobs of _replicator documents, in _scheduler/docs order
//	(LISTED, job_id)            = the job's SCHED and DOCS keys (a packed tuple)
//	(COUNT, SCHED|DOCS|LISTED)  = int64 entries of each (atomic Add)
//	(LISTING_BUILT)             = "1" once the indexes cover the jobs written before them
//
// shown_id is what _scheduler/jobs shows and CouchDB sorts it by: the
// replication id once known, else the job id. LISTED exists for every job,
// in job id order: it is couchrepctl jobs' order and its count the number of
// jobs. The indexes follow every change of a job's state (noteChange), of
// its replication id (ClaimRepID) and its cancellation (Cancel); a page that
// finds an entry out of date (a job the queue finished on its own, as a
// canceled running job) repairs it and reads again.

// Listing index tags (continuing the package comment's).
const (
	tagSched        = 10
	tagDocs         = 11
	tagListed       = 12
	tagCount        = 13
	tagListingBuilt = 14
)

// Counter names under (COUNT, ...).
const (
	countSched  = "sched"
	countDocs   = "docs"
	countListed = "listed"
)

// ShownID is the id _scheduler/jobs shows for a job and sorts by: the
// replication id once known, else the job id.
func ShownID(r *Record) string {
	if id := r.GetRepId(); id != "" {
		return id
	}
	return r.GetJobId()
}

// listingKeys are the index keys job r should have (nil when it has none).
func (s *Store) listingKeys(r *Record) (sched, docs []byte) {
	if !r.State().Terminal() && !r.NotScheduled() {
		sched = s.k.sched.Pack(tuple.Tuple{ShownID(r), r.GetJobId()})
	}
	if r.GetKind() == messages.ReplicationKind_REPLICATION_KIND_PERSISTENT {
		docs = s.k.docs.Pack(tuple.Tuple{r.GetDbName(), r.GetDocId(), r.GetJobId()})
	}
	return sched, docs
}

// relist brings job id's index entries and the counters up to date with the
// job: known, as the caller just wrote it, or else as tx reads it (a job
// whose queue record this transaction wrote with a versionstamp cannot be
// read back: its writer passes it).
func (s *Store) relist(tx kv.Tx, id string, known *Record) error {
	lk := s.k.listed.Pack(tuple.Tuple{id})
	old, err := tx.Get(lk)
	if err != nil {
		return err
	}
	var oldSched, oldDocs []byte
	if old != nil {
		t, err := tuple.Unpack(old)
		if err != nil || len(t) != 2 {
			return fmt.Errorf("repjob: corrupt listing entry of %q", id)
		}
		oldSched, _ = t[0].([]byte)
		oldDocs, _ = t[1].([]byte)
	}
	r := known
	if r == nil {
		info, err := s.q.GetTx(tx, JobType, id)
		if err != nil && !errors.Is(err, jobqueue.ErrNotFound) {
			return err
		}
		if err == nil {
			if r, err = recordFromInfo(info); err != nil {
				return err
			}
		}
	}
	exists := r != nil
	var sched, docs []byte
	if exists {
		sched, docs = s.listingKeys(r)
	}
	s.swapEntry(tx, countSched, oldSched, sched)
	s.swapEntry(tx, countDocs, oldDocs, docs)
	switch {
	case exists:
		v := tuple.Tuple{orEmpty(sched), orEmpty(docs)}.Pack()
		if !bytes.Equal(v, old) {
			tx.Set(lk, v)
		}
		if old == nil {
			tx.Add(s.k.count(countListed), 1)
		}
	case old != nil:
		tx.Clear(lk)
		tx.Add(s.k.count(countListed), -1)
	}
	return nil
}

func orEmpty(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// swapEntry replaces index entry old (empty: none) by new, counting them.
func (s *Store) swapEntry(tx kv.Tx, counter string, old, new []byte) {
	if len(old) == 0 {
		old = nil
	}
	if bytes.Equal(old, new) {
		return
	}
	if old != nil {
		tx.Clear(old)
		tx.Add(s.k.count(counter), -1)
	}
	if new != nil {
		tx.Set(new, nil)
		tx.Add(s.k.count(counter), 1)
	}
}

// buildListing indexes the jobs of a store written before the listing
// indexes existed, once; relist makes it safe to run on several nodes at
// once and beside writers.
func (s *Store) buildListing(ctx context.Context) error {
	var built []byte
	if err := s.db.ReadTransact(ctx, func(tx kv.ReadTx) (err error) {
		built, err = tx.Get(s.k.listingBuilt)
		return err
	}); err != nil || built != nil {
		return err
	}
	var ids []string
	if err := s.q.Fold(ctx, JobType, func(info *jobqueue.JobInfo) error {
		ids = append(ids, info.ID)
		return nil
	}); err != nil && !errors.Is(err, jobqueue.ErrCorrupt) {
		return err
	}
	for i := 0; i <= len(ids); i += 500 {
		chunk := ids[i:min(i+500, len(ids))]
		last := i+500 >= len(ids)
		err := s.db.Transact(ctx, func(tx kv.Tx) error {
			for _, id := range chunk {
				if err := s.relist(tx, id, nil); err != nil {
					return err
				}
			}
			if last {
				tx.Set(s.k.listingBuilt, []byte("1"))
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// Page is one page of a listing and the listing's length.
type Page struct {
	Jobs  []*Record
	Total int
}

// SchedulerJobs returns the jobs _scheduler/jobs lists (every job not
// finished) from the skip-th on, at most limit (negative: no limit), in its
// order (ShownID, then job id), and how many there are.
func (s *Store) SchedulerJobs(ctx context.Context, skip, limit int) (Page, error) {
	return s.page(ctx, s.k.sched, countSched, skip, limit, func(r *Record, key []byte) bool {
		sched, _ := s.listingKeys(r)
		return bytes.Equal(sched, key)
	})
}

// SchedulerDocs returns the jobs of _replicator documents (of database db,
// or of every database when db is empty) in _scheduler/docs order (database,
// document id), from the skip-th on, at most limit (negative: no limit),
// and how many there are.
func (s *Store) SchedulerDocs(ctx context.Context, db string, skip, limit int) (Page, error) {
	sub, counter := s.k.docs, countDocs
	if db != "" {
		sub, counter = s.k.docs.Sub(db), ""
	}
	return s.page(ctx, sub, counter, skip, limit, func(r *Record, key []byte) bool {
		_, docs := s.listingKeys(r)
		return bytes.Equal(docs, key)
	})
}

// SchedulerDoc returns the job of document docID in database db (the first
// in job id order if several watched servers have one), or an error
// wrapping ErrNotFound.
func (s *Store) SchedulerDoc(ctx context.Context, db, docID string) (*Record, error) {
	p, err := s.page(ctx, s.k.docs.Sub(db, docID), "", 0, 1, func(r *Record, key []byte) bool {
		_, docs := s.listingKeys(r)
		return bytes.Equal(docs, key)
	})
	if err != nil {
		return nil, err
	}
	if len(p.Jobs) == 0 {
		return nil, fmt.Errorf("repjob: no job for document %q in %q: %w", docID, db, ErrNotFound)
	}
	return p.Jobs[0], nil
}

// Jobs returns the jobs in job id order from the skip-th on, at most limit
// (negative: no limit), and how many jobs there are.
func (s *Store) Jobs(ctx context.Context, skip, limit int) (Page, error) {
	return s.page(ctx, s.k.listed, countListed, skip, limit, func(r *Record, key []byte) bool { return true })
}

// page reads entries [skip, skip+limit) of index sub, each entry's job
// (the last element of its key) and the index's length (counter, or the
// entries counted when counter is ""). An entry whose job no longer
// matches it (current says) is repaired and the page read again.
func (s *Store) page(ctx context.Context, sub tuple.Subspace, counter string, skip, limit int,
	current func(r *Record, key []byte) bool) (Page, error) {
	if err := s.Init(ctx); err != nil {
		return Page{}, err
	}
	for attempt := 0; ; attempt++ {
		var p Page
		var stale []string
		err := s.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
			p, stale = Page{}, nil
			if counter != "" {
				v, err := tx.Get(s.k.count(counter))
				if err != nil {
					return err
				}
				p.Total = int(kv.Int64LE(v))
			}
			begin, end := sub.Range()
			n := 0
			if counter != "" && limit >= 0 {
				n = skip + limit
				if n == 0 {
					return nil
				}
			}
			it := tx.GetRange(begin, end, kv.RangeOptions{Limit: n})
			i := -1
			for it.Next() {
				i++
				if counter == "" {
					p.Total++
				}
				if i < skip || limit >= 0 && len(p.Jobs) >= limit {
					continue
				}
				key := it.KeyValue().Key
				t, err := sub.Unpack(key)
				if err != nil || len(t) == 0 {
					return fmt.Errorf("repjob: corrupt listing key %x", key)
				}
				id, _ := t[len(t)-1].(string)
				info, err := s.q.GetTx(tx, JobType, id)
				if errors.Is(err, jobqueue.ErrNotFound) {
					stale = append(stale, id)
					continue
				}
				if err != nil {
					return err
				}
				r, err := recordFromInfo(info)
				if err != nil {
					return err
				}
				if !current(r, key) {
					stale = append(stale, id)
					continue
				}
				p.Jobs = append(p.Jobs, r)
			}
			return it.Err()
		})
		if err != nil || len(stale) == 0 || attempt > 0 {
			if err != nil {
				return Page{}, fmt.Errorf("repjob: list jobs: %w", err)
			}
			return p, nil
		}
		if err := s.db.Transact(ctx, func(tx kv.Tx) error {
			for _, id := range stale {
				if err := s.relist(tx, id, nil); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return Page{}, fmt.Errorf("repjob: repair listing: %w", err)
		}
	}
}
