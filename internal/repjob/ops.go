package repjob

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/internal/share"
	"github.com/couchrep/couchrep/messages"
)

// AddResult is what AddTransient and AddPersistent did.
type AddResult struct {
	// JobID is the job's id.
	JobID string
	// RepID is the replication id, empty when it can only be computed once
	// the job runs (a named filter's code lives on the source).
	RepID string
	// Existed is true when the same replication was already pending or
	// running (or, for a document, finished with the same body): nothing
	// was changed.
	Existed bool
	// Record is the job as stored after the call.
	Record *Record
}

// PersistentDoc is a replication document of a _replicator database.
type PersistentDoc struct {
	// Server is the CouchDB server URL (a [couchrep] watch entry).
	Server string
	// DB is the _replicator database's name; DocID the document's id.
	DB, DocID string
	// Body is the document without its _replication_* fields (JSON).
	Body []byte
	// User is the document's owner (user_ctx name), if known.
	User string
	// RunAgain makes a finished job with unchanged parameters run again
	// (the doc processor asks for it when the user removed the document's
	// terminal state); otherwise such a call is a no-op.
	RunAgain bool
}

type newJob struct {
	kind           messages.ReplicationKind
	id, server, db string
	docID, user    string
	body           []byte
	params         replicate.Params
	repID, base    string
	shareKey       string
	transient      bool
	runAgain       bool
	// checkOwner (AddTransientAs): another user's live job of the same
	// replication id refuses the job (ErrOtherUser) unless admin, and is
	// replaced when admin.
	checkOwner, admin bool
}

// AddTransient adds the job of a POST /_replicate body for user. The same
// body from the same user while its job is pending or running changes
// nothing (Existed); a finished one is started again. A body that does not
// parse gives an error wrapping ErrInvalid whose message names the field.
func (s *Store) AddTransient(ctx context.Context, body []byte, user string) (AddResult, error) {
	p, err := replicate.ParseParams(body)
	if err != nil {
		return AddResult{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	j := newJob{kind: messages.ReplicationKind_REPLICATION_KIND_TRANSIENT, id: TransientJobID(p, user, s.uuid),
		user: user, body: compact(body), params: p, shareKey: share.Key("", user), transient: true}
	return s.add(ctx, j)
}

// AddTransientAs is AddTransient for a POST /_replicate of user, who is a
// server admin or not, with CouchDB's rule for a replication another user
// already runs (couch_replicator:check_authorization): when a live job of
// another user (transient or a _replicator document's) owns the
// replication id, a user who is not an admin gets an error wrapping
// ErrOtherUser and nothing changes; an admin's POST of the same body is
// that job (Existed: it stays the other user's, as CouchDB 3.4.3 keeps
// it), and of another body (other options, same id) replaces another
// user's transient job (stopped and removed in the same transaction), as
// CouchDB's scheduler replaces a job of the same id. Either way one job
// runs the replication.
func (s *Store) AddTransientAs(ctx context.Context, body []byte, user string, admin bool) (AddResult, error) {
	p, err := replicate.ParseParams(body)
	if err != nil {
		return AddResult{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	j := newJob{kind: messages.ReplicationKind_REPLICATION_KIND_TRANSIENT, id: TransientJobID(p, user, s.uuid),
		user: user, body: compact(body), params: p, shareKey: share.Key("", user), transient: true,
		checkOwner: true, admin: admin}
	return s.add(ctx, j)
}

// AddPersistent adds or updates the job of a _replicator document. Unchanged
// parameters are a no-op (Existed) whatever the job's state; changed ones
// replace the job (a running one is stopped: its worker loses its lock).
// An invalid document gives an error wrapping ErrInvalid and no job.
func (s *Store) AddPersistent(ctx context.Context, doc PersistentDoc) (AddResult, error) {
	j, err := persistentJob(doc)
	if err != nil {
		return AddResult{}, err
	}
	return s.add(ctx, j)
}

func persistentJob(doc PersistentDoc) (newJob, error) {
	p, err := replicate.ParseParams(doc.Body)
	if err != nil {
		return newJob{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return newJob{kind: messages.ReplicationKind_REPLICATION_KIND_PERSISTENT,
		id: PersistentJobID(doc.Server, doc.DB, doc.DocID), server: doc.Server, db: doc.DB, docID: doc.DocID,
		user: doc.User, body: compact(doc.Body), params: p, shareKey: share.Key(doc.DB, doc.User), runAgain: doc.RunAgain}, nil
}

// AddPersistentTx is AddPersistent in the caller's transaction tx, which
// must be a transaction of the store's database, so that a batch of
// documents' jobs commits with whatever else tx writes (the doc processor's
// records and feed checkpoint). Call Init first. An invalid document gives
// an error wrapping ErrInvalid before tx is touched.
func (s *Store) AddPersistentTx(tx kv.Tx, doc PersistentDoc) (AddResult, error) {
	j, err := persistentJob(doc)
	if err != nil {
		return AddResult{}, err
	}
	if err := s.withRepID(&j); err != nil {
		return AddResult{}, err
	}
	res, err := s.addTx(tx, j)
	if err != nil {
		return AddResult{}, fmt.Errorf("repjob: add job %q: %w", j.id, err)
	}
	return res, nil
}

func compact(b []byte) []byte {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return append([]byte(nil), b...)
	}
	return buf.Bytes()
}

func (s *Store) add(ctx context.Context, j newJob) (AddResult, error) {
	if err := s.Init(ctx); err != nil {
		return AddResult{}, err
	}
	if err := s.withRepID(&j); err != nil {
		return AddResult{}, err
	}
	var res AddResult
	err := s.db.Transact(ctx, func(tx kv.Tx) error {
		var err error
		res, err = s.addTx(tx, j)
		return err
	})
	if err != nil {
		return AddResult{}, fmt.Errorf("repjob: add job %q: %w", j.id, err)
	}
	return res, nil
}

// withRepID sets j's replication id when it can be computed without the
// source (no named filter).
func (s *Store) withRepID(j *newJob) error {
	if base, ext, err := replicate.ID(j.params, s.uuid); err == nil {
		j.repID, j.base = base+ext, base
	} else if !errors.Is(err, replicate.ErrFilterCodeNeeded) {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// addTx is add in the caller's transaction.
func (s *Store) addTx(tx kv.Tx, j newJob) (AddResult, error) {
	res := AddResult{JobID: j.id, RepID: j.repID}
	now := s.now()
	info, err := s.q.GetTx(tx, JobType, j.id)
	switch {
	case errors.Is(err, jobqueue.ErrNotFound):
	case err != nil:
		return res, err
	default:
		old, err := recordFromInfo(info)
		if err != nil {
			return res, err
		}
		same := bytes.Equal(old.Body, j.body)
		live := info.State != jobqueue.StateFinished
		if (same || j.transient) && (live || !j.transient && !j.runAgain) {
			res.Existed, res.Record, res.RepID = true, old, old.RepId
			return res, nil
		}
		if err := s.retire(tx, old, info.State, now); err != nil {
			return res, err
		}
		if _, err := s.stopRunTx(tx, info, "replaced"); err != nil {
			return res, err
		}
	}
	if j.checkOwner && j.repID != "" {
		same, err := s.checkOwnerTx(tx, j)
		if err != nil {
			return res, err
		}
		if same != nil {
			res.JobID, res.Existed, res.Record, res.RepID = same.JobId, true, same, same.RepId
			return res, nil
		}
	}
	m := &messages.ReplicationJob{
		Kind: j.kind, JobId: j.id, Server: j.server, DbName: j.db, DocId: j.docID, User: j.user,
		Body: j.body, RepId: j.repID, BaseId: j.base, State: StatePending.Proto(),
		History: schedpolicy.NewHistory(now).Proto(), CreatedAt: ts(now), LastUpdated: ts(now),
		Continuous: j.params.Continuous, ShareKey: j.shareKey,
		Source: redact.StripUserinfo(j.params.Source.URL), Target: redact.StripUserinfo(j.params.Target.URL),
	}
	if j.repID != "" {
		if _, err := s.claimIfFree(tx, j.repID, j.id); err != nil {
			return res, err
		}
	}
	prio, err := s.ledger(tx).enqueue(j.shareKey, now)
	if err != nil {
		return res, err
	}
	data, err := marshal(m)
	if err != nil {
		return res, err
	}
	if err := s.q.AddTx(tx, JobType, j.id, jobqueue.AddOptions{Priority: prio, Data: data, Replace: true}); err != nil {
		return res, err
	}
	res.Record = &Record{ReplicationJob: m, QueueState: jobqueue.StatePending, Priority: prio}
	if err := s.noteChange(tx, j.id, res.Record); err != nil {
		return res, err
	}
	return res, nil
}

// checkOwnerTx applies AddTransientAs' rule to the live job owning j's
// replication id, if another user's. It returns that job when it is the
// same replication (the same body): CouchDB's scheduler then keeps it
// (couch_replicator_scheduler:existing_replication compares the
// replications without their user), and so does the admin's POST.
func (s *Store) checkOwnerTx(tx kv.Tx, j newJob) (*Record, error) {
	owner, err := tx.Get(s.k.repIDKey(j.repID))
	if err != nil || owner == nil || string(owner) == j.id {
		return nil, err
	}
	info, err := s.q.GetTx(tx, JobType, string(owner))
	switch {
	case errors.Is(err, jobqueue.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	case info.State == jobqueue.StateFinished:
		return nil, nil
	}
	rec, err := recordFromInfo(info)
	if err != nil {
		return nil, err
	}
	switch {
	case rec.GetUser() == j.user:
		return nil, nil
	case !j.admin:
		return nil, fmt.Errorf("%w: replication %s", ErrOtherUser, j.repID)
	case rec.GetKind() != messages.ReplicationKind_REPLICATION_KIND_TRANSIENT:
		return nil, nil // a document's job follows its document
	case bytes.Equal(rec.GetBody(), j.body):
		return rec, nil
	}
	_, err = s.removeTx(tx, info, "replaced by an admin's POST /_replicate")
	return nil, err
}

// retire undoes what a job being replaced holds: the quantum a pending job
// reserved goes back to its share key, its replication id is released, and
// a finished transient job's expiry is dropped.
func (s *Store) retire(tx kv.Tx, old *Record, st jobqueue.State, now time.Time) error {
	if st == jobqueue.StatePending {
		if err := s.ledger(tx).charge(old.ShareKey, -s.shareParams().Quantum, now); err != nil {
			return err
		}
	}
	if err := s.releaseRepID(tx, old.RepId, old.JobId); err != nil {
		return err
	}
	tx.Clear(s.k.expireKey(old.GetFinishedAt().AsTime(), old.JobId))
	return nil
}

// AddInvalid records a _replicator document that failed validation as a
// failed job, so that _scheduler/docs shows it with its reason (as
// CouchDB's does); it replaces (and stops) any job the document had. The job
// is never accepted; a valid edit of the document replaces it through
// AddPersistent.
func (s *Store) AddInvalid(ctx context.Context, doc PersistentDoc, reason string) (AddResult, error) {
	if err := s.Init(ctx); err != nil {
		return AddResult{}, err
	}
	var res AddResult
	err := s.db.Transact(ctx, func(tx kv.Tx) error {
		var err error
		res, err = s.AddInvalidTx(tx, doc, reason)
		return err
	})
	return res, err
}

// AddInvalidTx is AddInvalid in the caller's transaction (see
// AddPersistentTx).
func (s *Store) AddInvalidTx(tx kv.Tx, doc PersistentDoc, reason string) (AddResult, error) {
	id := PersistentJobID(doc.Server, doc.DB, doc.DocID)
	res, err := s.addFinishedTx(tx, id, doc, StateFailed, reason, nil)
	if err != nil {
		return AddResult{}, fmt.Errorf("repjob: record invalid document %q: %w", id, err)
	}
	return res, nil
}

// AddFromDocTx records, in the caller's transaction tx (see
// AddPersistentTx), a _replicator document that already carries a terminal
// state (completed or failed) the doc processor did not write: a finished
// job in that state whose FromDoc is entry, the document's _scheduler/docs
// fields as CouchDB reads them from it, so that _scheduler/docs shows it
// as CouchDB does. It replaces (and stops) any job the document had; the
// job never runs. reason is the document's _replication_state_reason.
func (s *Store) AddFromDocTx(tx kv.Tx, doc PersistentDoc, st State, reason string, entry []byte) (AddResult, error) {
	id := PersistentJobID(doc.Server, doc.DB, doc.DocID)
	if !st.Terminal() {
		return AddResult{}, fmt.Errorf("repjob: record document %q: state %s is not terminal", id, st)
	}
	res, err := s.addFinishedTx(tx, id, doc, st, reason, entry)
	if err != nil {
		return AddResult{}, fmt.Errorf("repjob: record document %q: %w", id, err)
	}
	return res, nil
}

// addFinishedTx records document doc as job id finished in state st
// (AddInvalidTx, AddFromDocTx).
func (s *Store) addFinishedTx(tx kv.Tx, id string, doc PersistentDoc, st State, reason string, fromDoc []byte) (AddResult, error) {
	now := s.now()
	info, err := s.q.GetTx(tx, JobType, id)
	switch {
	case errors.Is(err, jobqueue.ErrNotFound):
	case err != nil:
		return AddResult{}, err
	default:
		old, err := recordFromInfo(info)
		if err != nil {
			return AddResult{}, err
		}
		if err := s.retire(tx, old, info.State, now); err != nil {
			return AddResult{}, err
		}
		if _, err := s.stopRunTx(tx, info, "replaced"); err != nil {
			return AddResult{}, err
		}
	}
	m := &messages.ReplicationJob{
		Kind: messages.ReplicationKind_REPLICATION_KIND_PERSISTENT, JobId: id, Server: doc.Server,
		DbName: doc.DB, DocId: doc.DocID, User: doc.User, Body: invalidBody(doc.Body),
		State: st.Proto(), LastError: reason, FromDoc: compact(fromDoc),
		History: schedpolicy.NewHistory(now).Proto(), CreatedAt: ts(now), LastUpdated: ts(now), FinishedAt: ts(now),
		ShareKey: share.Key(doc.DB, doc.User),
	}
	data, err := marshal(m)
	if err != nil {
		return AddResult{}, err
	}
	if err := s.q.AddTx(tx, JobType, id, jobqueue.AddOptions{Data: data, Replace: true, Finished: true}); err != nil {
		return AddResult{}, err
	}
	rec := &Record{ReplicationJob: m, QueueState: jobqueue.StateFinished}
	if err := s.noteChange(tx, id, rec); err != nil {
		return AddResult{}, err
	}
	return AddResult{JobID: id, Record: rec}, nil
}

// invalidBody is the body kept with an invalid document's failed job: the
// document (compact), or nothing when it is too large to keep (that is
// then why it failed).
func invalidBody(doc []byte) []byte {
	b := compact(doc)
	if len(b) > replicate.MaxDocumentBytes {
		return nil
	}
	return b
}

// claimIfFree points repID at id unless another live job owns it; it
// returns the live owner's id, if any.
func (s *Store) claimIfFree(tx kv.Tx, repID, id string) (string, error) {
	key := s.k.repIDKey(repID)
	owner, err := tx.Get(key)
	if err != nil {
		return "", err
	}
	if owner != nil && string(owner) != id {
		info, err := s.q.GetTx(tx, JobType, string(owner))
		switch {
		case errors.Is(err, jobqueue.ErrNotFound):
		case err != nil:
			return "", err
		case info.State != jobqueue.StateFinished:
			return string(owner), nil
		}
	}
	tx.Set(key, []byte(id))
	return "", nil
}

// releaseRepID clears repID's index entry if it points at id.
func (s *Store) releaseRepID(tx kv.Tx, repID, id string) error {
	if repID == "" {
		return nil
	}
	key := s.k.repIDKey(repID)
	owner, err := tx.Get(key)
	if err != nil {
		return err
	}
	if string(owner) == id {
		tx.Clear(key)
	}
	return nil
}

// Remove deletes job jobID: a running job is stopped now by the node
// running it (a control request in the same transaction; else its worker's
// next call fails with jobs.ErrCanceled), a pending one gives back its reserved
// fair-share quantum. It returns an error wrapping ErrNotFound for an
// unknown job.
func (s *Store) Remove(ctx context.Context, jobID string) error {
	if err := s.Init(ctx); err != nil {
		return err
	}
	err := s.db.Transact(ctx, func(tx kv.Tx) error {
		info, err := s.q.GetTx(tx, JobType, jobID)
		if err != nil {
			return err
		}
		_, err = s.removeTx(tx, info, "removed")
		return err
	})
	return wrapNotFound("remove", jobID, err)
}

// RemoveTx is Remove in the caller's transaction (see AddPersistentTx).
func (s *Store) RemoveTx(tx kv.Tx, jobID string) error {
	info, err := s.q.GetTx(tx, JobType, jobID)
	if err == nil {
		_, err = s.removeTx(tx, info, "removed")
	}
	return wrapNotFound("remove", jobID, err)
}

// removeTx is Remove of the job info in the caller's transaction; by names
// who asked, in the stop request of a running job (returned, else nil).
func (s *Store) removeTx(tx kv.Tx, info *jobqueue.JobInfo, by string) (*messages.JobControl, error) {
	rec, err := recordFromInfo(info)
	if err != nil {
		return nil, err
	}
	c, err := s.stopRunTx(tx, info, by)
	if err != nil {
		return nil, err
	}
	now := s.now()
	l := s.ledger(tx)
	switch info.State {
	case jobqueue.StatePending:
		err = l.charge(rec.ShareKey, -l.p.Quantum, now)
	case jobqueue.StateRunning:
		// Accepted, but its run may not have started yet (startup_jitter):
		// then nothing ran, and the reserved quantum is refunded as for a
		// pending job, not the time since an earlier run's start (or, with
		// none, since the epoch) charged.
		started := now
		if rec.GetState() == StateRunning.Proto() && rec.LastStarted != nil {
			started = rec.LastStarted.AsTime()
		}
		err = l.chargeRun(rec.ShareKey, started, now)
	}
	if err != nil {
		return nil, err
	}
	if err := s.releaseRepID(tx, rec.RepId, info.ID); err != nil {
		return nil, err
	}
	if rec.FinishedAt != nil {
		tx.Clear(s.k.expireKey(rec.FinishedAt.AsTime(), info.ID))
	}
	if err := s.q.RemoveTx(tx, JobType, info.ID); err != nil {
		return nil, err
	}
	return c, s.noteChange(tx, info.ID, nil)
}

func wrapNotFound(op, id string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jobqueue.ErrNotFound):
		return fmt.Errorf("repjob: %s job %q: %w: %w", op, id, ErrNotFound, err)
	default:
		return fmt.Errorf("repjob: %s job %q: %w", op, id, err)
	}
}

// Get returns job jobID.
func (s *Store) Get(ctx context.Context, jobID string) (*Record, error) {
	if err := s.Init(ctx); err != nil {
		return nil, err
	}
	info, err := s.q.Get(ctx, JobType, jobID)
	if err != nil {
		return nil, wrapNotFound("get", jobID, err)
	}
	return recordFromInfo(info)
}

// GetTx is Get in the caller's transaction (see AddPersistentTx).
func (s *Store) GetTx(tx kv.ReadTx, jobID string) (*Record, error) {
	info, err := s.q.GetTx(tx, JobType, jobID)
	if err != nil {
		return nil, wrapNotFound("get", jobID, err)
	}
	return recordFromInfo(info)
}

// Filter selects jobs for List; zero fields match everything.
type Filter struct {
	Kind messages.ReplicationKind
	// DB and Server select the jobs of one _replicator database.
	DB, Server string
	// States selects jobs by Record.State.
	States []State
	// Node selects the jobs run (or last run) by a node.
	Node string
}

func (f Filter) match(r *Record) bool {
	if f.Kind != 0 && r.Kind != f.Kind {
		return false
	}
	if f.DB != "" && r.DbName != f.DB {
		return false
	}
	if f.Server != "" && strings.TrimRight(r.Server, "/") != strings.TrimRight(f.Server, "/") {
		return false
	}
	if f.Node != "" && r.Node != f.Node {
		return false
	}
	return len(f.States) == 0 || slices.Contains(f.States, r.State())
}

// Generation is a number that changes whenever a job's record is written
// or removed (jobqueue.Queue.Generation): a listing taken after reading
// generation g is current as long as Generation still answers g. Keep such
// a listing for a bounded time only: a node of an older version writes
// records without changing it.
func (s *Store) Generation(ctx context.Context) (int64, error) {
	if err := s.Init(ctx); err != nil {
		return 0, err
	}
	return s.q.Generation(ctx, JobType)
}

// GenerationShards is Generation shard by shard
// (jobqueue.Queue.GenerationShardsOf): a listing taken after reading it is
// current but for the jobs of the shards whose value moved since
// (jobqueue.GenerationShard of the job id) and the jobs added since
// (ChangedIDs).
func (s *Store) GenerationShards(ctx context.Context) (map[int64]int64, error) {
	if err := s.Init(ctx); err != nil {
		return nil, err
	}
	return s.q.GenerationShardsOf(ctx, JobType)
}

// GetSome reads the records of ids in one transaction: the ones that exist,
// by id.
func (s *Store) GetSome(ctx context.Context, ids []string) (map[string]*Record, error) {
	if err := s.Init(ctx); err != nil {
		return nil, err
	}
	out := make(map[string]*Record, len(ids))
	err := s.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		clear(out)
		for _, id := range ids {
			r, err := s.GetTx(tx, id)
			switch {
			case errors.Is(err, ErrNotFound):
			case err != nil:
				return err
			default:
				out[id] = r
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("repjob: read jobs: %w", err)
	}
	return out, nil
}

// ChangesHead is the seq of the newest change (Changes): "" when none.
func (s *Store) ChangesHead(ctx context.Context) (string, error) {
	if err := s.Init(ctx); err != nil {
		return "", err
	}
	var seq string
	err := s.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		seq = ""
		begin, end := s.k.changes.Range()
		it := tx.Snapshot().GetRange(begin, end, kv.RangeOptions{Limit: 1, Reverse: true})
		for it.Next() {
			seq = hex.EncodeToString(it.KeyValue().Key[len(s.k.changes.Bytes()):])
		}
		return it.Err()
	})
	if err != nil {
		return "", fmt.Errorf("repjob: read changes: %w", err)
	}
	return seq, nil
}

// changesRange is the range of the changes index after since (a seq
// Changes or ChangedIDs returned; "" the whole index).
func (s *Store) changesRange(since string) (begin, end []byte, err error) {
	begin, end = s.k.changes.Range()
	if since != "" {
		raw, err := hex.DecodeString(since)
		if err != nil {
			return nil, nil, fmt.Errorf("repjob: bad changes seq %q: %w", since, err)
		}
		begin = append(append(bytes.Clone(s.k.changes.Bytes()), raw...), 0x00)
	}
	return begin, end, nil
}

// ChangedIDs is Changes without the records: the ids of up to limit jobs
// (0: 1000) whose newest state change comes after since, and the seq to
// pass next time.
func (s *Store) ChangedIDs(ctx context.Context, since string, limit int) ([]string, string, error) {
	if err := s.Init(ctx); err != nil {
		return nil, since, err
	}
	if limit <= 0 {
		limit = 1000
	}
	begin, end, err := s.changesRange(since)
	if err != nil {
		return nil, since, err
	}
	var ids []string
	next := since
	err = s.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		ids, next = ids[:0], since
		it := tx.GetRange(begin, end, kv.RangeOptions{Limit: limit})
		for it.Next() {
			key := it.KeyValue().Key
			t, err := s.k.changes.Unpack(key)
			if err != nil || len(t) != 2 {
				continue
			}
			id, _ := t[1].(string)
			ids = append(ids, id)
			next = hex.EncodeToString(key[len(s.k.changes.Bytes()):])
		}
		return it.Err()
	})
	if err != nil {
		return nil, since, fmt.Errorf("repjob: read changes: %w", err)
	}
	return ids, next, nil
}

// JobNodes is every job with its worker node while it runs ("" when it
// does not), reading of each record only its state and node
// (jobqueue.Queue.JobNodes).
func (s *Store) JobNodes(ctx context.Context) (map[string]string, error) {
	if err := s.Init(ctx); err != nil {
		return nil, err
	}
	return s.q.JobNodes(ctx, JobType)
}

// JobNodesOf is JobNodes for the jobs ids (absent: no such job).
func (s *Store) JobNodesOf(ctx context.Context, ids []string) (map[string]string, error) {
	if err := s.Init(ctx); err != nil {
		return nil, err
	}
	return s.q.JobNodesOf(ctx, JobType, ids)
}

// RunningByNode counts the running jobs per worker node, reading of each
// job only its queue state and node (jobqueue.Queue.RunningByNode).
func (s *Store) RunningByNode(ctx context.Context) (map[string]int, error) {
	if err := s.Init(ctx); err != nil {
		return nil, err
	}
	return s.q.RunningByNode(ctx, JobType)
}

// Each calls fn for every job matching f, in job id order, from one
// consistent snapshot; fn returning an error stops with that error.
func (s *Store) Each(ctx context.Context, f Filter, fn func(*Record) error) error {
	if err := s.Init(ctx); err != nil {
		return err
	}
	return s.q.Fold(ctx, JobType, func(info *jobqueue.JobInfo) error {
		r, err := recordFromInfo(info)
		if err != nil {
			s.log.Warn().Err(err).Str("job_id", info.ID).Msg("repjob: skipping undecodable job")
			return nil
		}
		if !f.match(r) {
			return nil
		}
		return fn(r)
	})
}

// List returns every job matching f, in job id order.
func (s *Store) List(ctx context.Context, f Filter) ([]*Record, error) {
	var out []*Record
	err := s.Each(ctx, f, func(r *Record) error { out = append(out, r); return nil })
	return out, err
}

// FindByRepID returns the job owning replication id repID (base+extension,
// or the base alone, which matches the "+continuous" and "+create_target"
// variants).
func (s *Store) FindByRepID(ctx context.Context, repID string) (*Record, error) {
	if err := s.Init(ctx); err != nil {
		return nil, err
	}
	var id string
	err := s.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		id = ""
		v, err := tx.Get(s.k.repIDKey(repID))
		if err != nil {
			return err
		}
		if v != nil {
			id = string(v)
			return nil
		}
		if strings.Contains(repID, "+") {
			return nil
		}
		_, e := s.k.repIDs.Range()
		begin := s.k.repIDKey(repID)
		it := tx.GetRange(begin[:len(begin)-1], e, kv.RangeOptions{Limit: 4})
		for it.Next() {
			t, err := s.k.repIDs.Unpack(it.KeyValue().Key)
			if err != nil || len(t) != 1 {
				continue
			}
			if r, ok := t[0].(string); ok && strings.HasPrefix(r, repID+"+") {
				id = string(it.KeyValue().Value)
				return nil
			}
		}
		return it.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("repjob: find replication %q: %w", repID, err)
	}
	if id == "" {
		return nil, fmt.Errorf("repjob: find replication %q: %w", repID, ErrNotFound)
	}
	return s.Get(ctx, id)
}

// WaitState blocks until job jobID is in one of states (see Record.State)
// and returns it. It waits on the job's record (a kv watch), not by
// polling. A job that is or becomes absent gives an error wrapping
// ErrNotFound.
func (s *Store) WaitState(ctx context.Context, jobID string, states ...State) (*Record, error) {
	if err := s.Init(ctx); err != nil {
		return nil, err
	}
	var after uint64
	for {
		info, err := s.q.WaitChange(ctx, JobType, jobID, after)
		if err != nil {
			return nil, wrapNotFound("wait for", jobID, err)
		}
		r, err := recordFromInfo(info)
		if err != nil {
			return nil, err
		}
		if slices.Contains(states, r.State()) {
			return r, nil
		}
		after = info.Version
	}
}

// WaitChange blocks until job jobID has a version above after and returns
// it (after = 0 returns at once).
func (s *Store) WaitChange(ctx context.Context, jobID string, after uint64) (*Record, error) {
	if err := s.Init(ctx); err != nil {
		return nil, err
	}
	info, err := s.q.WaitChange(ctx, JobType, jobID, after)
	if err != nil {
		return nil, wrapNotFound("wait for", jobID, err)
	}
	return recordFromInfo(info)
}

// WaitFinished blocks until job jobID completed or failed.
func (s *Store) WaitFinished(ctx context.Context, jobID string) (*Record, error) {
	return s.WaitState(ctx, jobID, StateCompleted, StateFailed)
}

// Change is one entry of the changes feed: job JobID changed state (or was
// removed: Record is nil).
type Change struct {
	// Seq orders changes; pass the last one seen to Changes.
	Seq    string
	JobID  string
	Record *Record
}

// Changes returns up to limit jobs (0: 1000) whose newest state change (add,
// start, stop, crash, completion, failure, removal) comes after since, in
// commit order, and the seq to pass next time. since "" starts from the
// beginning: every existing job once. Progress updates are not changes.
func (s *Store) Changes(ctx context.Context, since string, limit int) ([]Change, string, error) {
	if err := s.Init(ctx); err != nil {
		return nil, since, err
	}
	if limit <= 0 {
		limit = 1000
	}
	begin, end, err := s.changesRange(since)
	if err != nil {
		return nil, since, err
	}
	var ids []Change
	err = s.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		ids = ids[:0]
		it := tx.GetRange(begin, end, kv.RangeOptions{Limit: limit})
		for it.Next() {
			key := it.KeyValue().Key
			t, err := s.k.changes.Unpack(key)
			if err != nil || len(t) != 2 {
				continue
			}
			id, _ := t[1].(string)
			seq := hex.EncodeToString(key[len(s.k.changes.Bytes()):])
			ids = append(ids, Change{Seq: seq, JobID: id})
		}
		return it.Err()
	})
	if err != nil {
		return nil, since, fmt.Errorf("repjob: read changes: %w", err)
	}
	next := since
	for i := range ids {
		r, err := s.Get(ctx, ids[i].JobID)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			return nil, since, err
		default:
			ids[i].Record = r
		}
		next = ids[i].Seq
	}
	return ids, next, nil
}

// WaitChanges blocks until Changes(since) would return something or ctx
// ends. It waits on a kv watch, not by polling.
func (s *Store) WaitChanges(ctx context.Context, since string) error {
	for {
		var w kv.Watch
		var has bool
		err := s.db.Transact(ctx, func(tx kv.Tx) error {
			has = false
			begin, end := s.k.changes.Range()
			if since != "" {
				raw, err := hex.DecodeString(since)
				if err != nil {
					return fmt.Errorf("repjob: bad changes seq %q: %w", since, err)
				}
				begin = append(append(bytes.Clone(s.k.changes.Bytes()), raw...), 0x00)
			}
			it := tx.GetRange(begin, end, kv.RangeOptions{Limit: 1})
			for it.Next() {
				has = true
			}
			if err := it.Err(); err != nil {
				return err
			}
			if !has {
				w = tx.Watch(s.k.changesWatch)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("repjob: wait for changes: %w", err)
		}
		if has {
			return nil
		}
		err = w.Wait(ctx)
		w.Cancel()
		if err != nil {
			return fmt.Errorf("repjob: wait for changes: %w", err)
		}
	}
}

// CleanupTransient removes up to limit (0: 100) finished transient jobs
// that finished more than TransientMaxAge ago and returns how many it
// removed. Its cost is proportional to the expired jobs.
func (s *Store) CleanupTransient(ctx context.Context) (int, error) {
	if err := s.Init(ctx); err != nil {
		return 0, err
	}
	cutoff := s.now().Add(-s.maxAge)
	n := 0
	err := s.db.Transact(ctx, func(tx kv.Tx) error {
		n = 0
		begin, _ := s.k.expire.Range()
		end := s.k.expire.Pack(tuple.Tuple{cutoff.UnixNano()})
		it := tx.GetRange(begin, end, kv.RangeOptions{Limit: 100})
		var expired [][]byte
		var ids []string
		for it.Next() {
			key := bytes.Clone(it.KeyValue().Key)
			t, err := s.k.expire.Unpack(key)
			if err != nil || len(t) != 2 {
				continue
			}
			id, _ := t[1].(string)
			expired, ids = append(expired, key), append(ids, id)
		}
		if err := it.Err(); err != nil {
			return err
		}
		for i, key := range expired {
			tx.Clear(key)
			info, err := s.q.GetTx(tx, JobType, ids[i])
			if errors.Is(err, jobqueue.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if info.State != jobqueue.StateFinished {
				continue
			}
			rec, err := recordFromInfo(info)
			if err != nil {
				return err
			}
			if err := s.releaseRepID(tx, rec.RepId, ids[i]); err != nil {
				return err
			}
			if err := s.q.RemoveTx(tx, JobType, ids[i]); err != nil {
				return err
			}
			if err := s.noteChange(tx, ids[i], nil); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("repjob: clean up transient jobs: %w", err)
	}
	return n, nil
}

// PendingCount returns how many replication jobs are due in the queue, up
// to limit (0: no limit), from a snapshot.
func (s *Store) PendingCount(ctx context.Context, limit int) (int, error) {
	if err := s.Init(ctx); err != nil {
		return 0, err
	}
	return s.q.PendingCount(ctx, JobType, limit)
}

// ShortRepIDLen is how many characters of a replication id's base the
// status page shows.
const ShortRepIDLen = 12

// ShortRepID is the short form of a replication id the status page shows:
// the first ShortRepIDLen characters of its base and its extension whole
// ("0123456789ab+continuous"), so that the one-shot and the continuous
// replication of one pair (one base) never look alike.
// admin.FindJob resolves it back to its job.
func ShortRepID(repID string) string {
	base, ext, _ := strings.Cut(repID, "+")
	if len(base) > ShortRepIDLen {
		base = base[:ShortRepIDLen]
	}
	if ext == "" {
		return base
	}
	return base + "+" + ext
}
