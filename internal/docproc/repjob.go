package docproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/messages"
)

// RepJobs adapts internal/repjob's Store to JobStore.
type RepJobs struct {
	// Store is the node's replication job store.
	Store *repjob.Store
}

var _ JobStore = RepJobs{}

// InTx implements JobStore: tx must be a transaction of the repjob store's
// database, which must have been initialised (repjob.Store.Init).
func (r RepJobs) InTx(tx kv.Tx) TxJobs { return repTx{s: r.Store, tx: tx} }

// repTx is RepJobs' TxJobs.
type repTx struct {
	s  *repjob.Store
	tx kv.Tx
}

// AddPersistent implements TxJobs. repjob leaves a finished job with an
// unchanged body alone unless asked to run it again; the doc processor only
// adds such a job when the user removed the document's terminal state to run
// it again.
func (t repTx) AddPersistent(server, db, docID string, body json.RawMessage) (string, error) {
	doc := repjob.PersistentDoc{Server: server, DB: db, DocID: docID, Body: body, User: ownerOf(body), RunAgain: true}
	res, err := t.s.AddPersistentTx(t.tx, doc)
	if errors.Is(err, repjob.ErrInvalid) {
		return "", fmt.Errorf("%w: %s", ErrInvalidDoc, strings.TrimPrefix(err.Error(), repjob.ErrInvalid.Error()+": "))
	}
	if err != nil {
		return "", err
	}
	return res.JobID, nil
}

// AddInvalid implements TxJobs.
func (t repTx) AddInvalid(server, db, docID string, body json.RawMessage, reason string) (string, error) {
	doc := repjob.PersistentDoc{Server: server, DB: db, DocID: docID, Body: body, User: ownerOf(body)}
	res, err := t.s.AddInvalidTx(t.tx, doc, reason)
	if err != nil {
		return "", err
	}
	return res.JobID, nil
}

// AddFromDoc implements TxJobs.
func (t repTx) AddFromDoc(server, db, docID string, body json.RawMessage, st repjob.State, reason string, entry json.RawMessage) (string, error) {
	doc := repjob.PersistentDoc{Server: server, DB: db, DocID: docID, Body: body, User: ownerOf(body)}
	res, err := t.s.AddFromDocTx(t.tx, doc, st, reason, entry)
	if err != nil {
		return "", err
	}
	return res.JobID, nil
}

// Remove implements TxJobs.
func (t repTx) Remove(jobID string) error { return notFound(t.s.RemoveTx(t.tx, jobID)) }

// Get implements TxJobs.
func (t repTx) Get(jobID string) (*Job, error) {
	rec, err := t.s.GetTx(t.tx, jobID)
	if err != nil {
		return nil, notFound(err)
	}
	return jobOf(rec), nil
}

// notFound makes repjob's not-found errors match ErrJobNotFound.
func notFound(err error) error {
	if errors.Is(err, repjob.ErrNotFound) {
		return fmt.Errorf("%w: %w", ErrJobNotFound, err)
	}
	return err
}

// ownerOf is the document's owner: "owner", else user_ctx.name.
func ownerOf(body json.RawMessage) string {
	var v struct {
		Owner   string `json:"owner"`
		UserCtx struct {
			Name string `json:"name"`
		} `json:"user_ctx"`
	}
	_ = json.Unmarshal(body, &v)
	if v.Owner != "" {
		return v.Owner
	}
	return v.UserCtx.Name
}

// Remove implements JobStore.
func (r RepJobs) Remove(ctx context.Context, jobID string) error {
	return notFound(r.Store.Remove(ctx, jobID))
}

// Get implements JobStore.
func (r RepJobs) Get(ctx context.Context, jobID string) (*Job, error) {
	rec, err := r.Store.Get(ctx, jobID)
	if err != nil {
		return nil, notFound(err)
	}
	return jobOf(rec), nil
}

// Persistent implements JobStore.
func (r RepJobs) Persistent(ctx context.Context) ([]*Job, error) {
	var out []*Job
	err := r.Store.Each(ctx, repjob.Filter{Kind: messages.ReplicationKind_REPLICATION_KIND_PERSISTENT}, func(rec *repjob.Record) error {
		out = append(out, jobOf(rec))
		return nil
	})
	return out, err
}

// Follow implements JobStore with repjob's changes feed: it first reads the
// feed to its end (those changes happened before Follow), then follows it.
func (r RepJobs) Follow(ctx context.Context, started func(), fn func(*Job) error) error {
	since := ""
	for {
		chs, next, err := r.Store.Changes(ctx, since, 0)
		if err != nil {
			return err
		}
		since = next
		if len(chs) == 0 {
			break
		}
	}
	started()
	for {
		if err := r.Store.WaitChanges(ctx, since); err != nil {
			return err
		}
		chs, next, err := r.Store.Changes(ctx, since, 0)
		if err != nil {
			return err
		}
		since = next
		for _, c := range chs {
			if c.Record == nil {
				continue
			}
			if err := fn(jobOf(c.Record)); err != nil {
				return err
			}
		}
	}
}

func jobOf(rec *repjob.Record) *Job {
	j := &Job{
		ID:         rec.GetJobId(),
		Persistent: rec.GetKind().String() == "REPLICATION_KIND_PERSISTENT",
		Server:     rec.GetServer(),
		DB:         rec.GetDbName(),
		DocID:      rec.GetDocId(),
		RepID:      rec.GetRepId(),
		State:      rec.State(),
		Reason:     rec.GetLastError(),
	}
	if ts := rec.GetLastStarted(); ts != nil {
		j.StartTime = ts.AsTime()
	}
	if st := rec.GetStats(); st != nil {
		j.Stats = replicationStats(st)
	}
	return j
}

// replicationStats are a job's stats as _replication_stats holds them:
// sequences as stored (CouchDB writes its checkpointed_source_seq as is),
// unknown values left out, and no start_from/start_seq.
func replicationStats(st *messages.ReplicationStats) map[string]any {
	m := map[string]any{}
	for _, s := range repjob.Stats(st) {
		switch {
		case s.RunStart || !s.Known:
		case s.Kind == repjob.StatSeq:
			m[s.Key] = seqValue(s.Text)
		case s.Kind == repjob.StatText:
			m[s.Key] = s.Text
		default:
			m[s.Key] = s.Int
		}
	}
	return m
}

// seqValue is a stored seq (JSON text) as it goes into _replication_stats.
func seqValue(s string) any {
	if json.Valid([]byte(s)) {
		return json.RawMessage(s)
	}
	return s
}
