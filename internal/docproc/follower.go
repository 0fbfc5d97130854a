package docproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/pause"
	"github.com/couchrep/couchrep/internal/repjob"
)

// dbProc follows one _replicator database while this node holds its lease.
type dbProc struct {
	p   *Processor
	srv server
	st  *state
	db  *couch.DB
	log zerolog.Logger

	// writing serialises writeBack: the feed's batches and the job
	// follower both write terminal states; one write per run.
	writing sync.Mutex
}

// maxBatch caps the changes processed in one store transaction, and
// maxBatchBytes the documents' size in it (a transaction writes at most
// kv.MaxTransactionSize bytes; a job record holds its document's body).
const (
	maxBatch      = 500
	maxBatchBytes = 1 << 20
)

// follow reads the database's _changes feed from its checkpoint and
// processes every change, until ctx ends or the database is gone.
func (d *dbProc) follow(ctx context.Context) error {
	info, err := d.db.Info(ctx)
	if errors.Is(err, couch.ErrNotFound) {
		return errDBDeleted
	}
	if err != nil {
		return err
	}
	seq, err := d.st.loadSeq(ctx)
	if err != nil {
		return err
	}
	if seq, err = d.recreated(ctx, info.UpdateSeq, seq); err != nil {
		return err
	}
	if err := d.scanUnwritten(ctx); err != nil {
		return err
	}
	backoff := pause.Backoff{Min: time.Second, Max: time.Minute}
	for {
		opts := couch.ChangesOptions{Feed: couch.FeedContinuous, Since: seq, Timeout: d.p.opts.FeedTimeout,
			Heartbeat: 10 * time.Second, IncludeDocs: true}
		last, err := d.readFeed(ctx, opts, func(batchSeq couch.Seq) {
			if batchSeq != nil {
				seq = batchSeq
			}
			backoff.Reset()
		})
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if err == nil {
			if !last.IsZero() && !last.Equal(seq) {
				seq = last
				if err := d.st.commit(ctx, "", nil, seq); err != nil {
					return err
				}
			}
			// The feed ended (its timeout): the database may have been
			// deleted, or deleted and created again, without discovery
			// seeing it between two listings.
			info, err := d.db.Info(ctx)
			switch {
			case errors.Is(err, couch.ErrNotFound):
				return errDBDeleted
			case err == nil:
				if seq, err = d.recreated(ctx, info.UpdateSeq, seq); err != nil {
					return err
				}
			}
			continue
		}
		if errors.Is(err, couch.ErrNotFound) {
			return errDBDeleted
		}
		wait := backoff.Next()
		d.log.Warn().Err(err).Stringer("since", seq).Dur("retry_in", wait).Msg("_changes feed failed")
		if err := pause.For(ctx, wait); err != nil {
			return err
		}
	}
}

// recreated returns the seq to follow from: seq, unless a numeric
// checkpoint is beyond the database's update_seq, which means it belongs to
// a deleted database of the same name (deleted and created again). That
// database's documents are gone with it: their jobs are removed and its
// records and checkpoint forgotten (as for a deleted database), and the new
// one is processed from its start.
func (d *dbProc) recreated(ctx context.Context, updateSeq, seq couch.Seq) (couch.Seq, error) {
	n, ok := seq.Int()
	u, uok := updateSeq.Int()
	if !ok || !uok || u >= n {
		return seq, nil
	}
	removed, err := d.p.removeDBJobs(ctx, d.st, d.log)
	if err != nil {
		return seq, err
	}
	d.log.Info().Stringer("checkpoint", seq).Stringer("update_seq", updateSeq).Int("jobs_removed", removed).
		Msg("checkpoint ahead of database: it was deleted and created again; the old documents' jobs removed, processing it from the start")
	return nil, nil
}

// scanUnwritten writes back the terminal states reached while no node
// followed the database.
func (d *dbProc) scanUnwritten(ctx context.Context) error {
	recs, err := d.st.records(ctx)
	if err != nil {
		return err
	}
	for id, rec := range recs {
		if rec.JobID == "" || rec.Written {
			continue
		}
		j, err := d.p.opts.Jobs.Get(ctx, rec.JobID)
		if errors.Is(err, ErrJobNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("docproc: get job %s: %w", rec.JobID, err)
		}
		if j.State.Terminal() {
			if err := d.writeBack(ctx, id, j); err != nil {
				d.log.Warn().Err(err).Str("doc_id", id).Msg("writing terminal state failed")
			}
		}
	}
	return nil
}

// readFeed reads one _changes request and processes its rows in batches:
// the rows that arrived while the previous batch was processed (at most
// maxBatch and maxBatchBytes, no document twice) are decided and their jobs, records and the
// feed checkpoint committed in one store transaction. committed is called
// with each batch's checkpoint (nil when no row of it had a seq). It
// returns the feed's last seq and error once every row read is processed.
func (d *dbProc) readFeed(ctx context.Context, opts couch.ChangesOptions, committed func(couch.Seq)) (couch.Seq, error) {
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rows := make(chan couch.Change, maxBatch)
	type result struct {
		last couch.Seq
		err  error
	}
	done := make(chan result, 1)
	go func() {
		last, err := d.db.Changes(fctx, opts, func(c couch.Change) error {
			select {
			case rows <- c:
				return nil
			case <-fctx.Done():
				return fctx.Err()
			}
		})
		close(rows)
		done <- result{last, err}
	}()
	var carry *couch.Change
	for {
		batch := make([]couch.Change, 0, 16)
		if carry != nil {
			batch, carry = append(batch, *carry), nil
		} else {
			c, ok := <-rows
			if !ok {
				r := <-done
				return r.last, r.err
			}
			batch = append(batch, c)
		}
		ids := map[string]bool{batch[0].ID: true}
		size := len(batch[0].Doc)
	fill:
		for len(batch) < maxBatch && size < maxBatchBytes {
			select {
			case c, ok := <-rows:
				if !ok {
					break fill
				}
				if ids[c.ID] || size+len(c.Doc) > maxBatchBytes { // a document once per transaction
					carry = &c
					break fill
				}
				ids[c.ID] = true
				size += len(c.Doc)
				batch = append(batch, c)
			default:
				break fill
			}
		}
		seq, err := d.processBatch(ctx, batch)
		if err != nil {
			cancel()
			for range rows {
			}
			<-done
			return nil, err
		}
		committed(seq)
	}
}

// outcome is what processBatch did with one change.
type outcome struct {
	doc   Doc
	dec   Decision
	jobID string
}

// processBatch decides every change of batch and commits their jobs and
// records with the checkpoint (the last seq of the batch, returned) in one
// transaction. An invalid document fails alone: its job is recorded failed
// and, after the commit, its reason is written back to it.
func (d *dbProc) processBatch(ctx context.Context, batch []couch.Change) (couch.Seq, error) {
	docs := make([]Doc, len(batch))
	var seq couch.Seq
	for i, c := range batch {
		doc, err := d.docOf(ctx, c)
		if err != nil {
			return nil, err
		}
		docs[i] = doc
		if c.Seq != nil {
			seq = c.Seq
		}
	}
	outs := make([]outcome, 0, len(batch))
	err := d.p.opts.Store.Transact(ctx, func(tx kv.Tx) error {
		outs = outs[:0]
		jobs := d.p.opts.Jobs.InTx(tx)
		for _, doc := range docs {
			o, err := d.decideTx(tx, jobs, doc)
			if err != nil {
				return err
			}
			outs = append(outs, o)
		}
		if seq != nil {
			tx.Set(d.st.keys.seq(d.st.server, d.st.db), []byte(seq.String()))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("docproc: commit %d changes of %s: %w", len(batch), d.st.db, err)
	}
	for _, o := range outs {
		log := d.log.With().Str("doc_id", o.doc.ID).Str("rev", o.doc.Rev).Str("action", o.dec.Action.String()).Str("why", o.dec.Why).Logger()
		switch o.dec.Action {
		case ActionSkip:
			log.Debug().Msg("document change")
		case ActionRemove:
			log.Info().Str("job_id", o.jobID).Msg("document deleted: job removed")
		case ActionAdd:
			log.Info().Str("job_id", o.jobID).Msg("job added")
		case ActionRecord:
			log.Info().Str("job_id", o.jobID).Stringer("state", o.dec.State).Msg("terminal state read from the document: not run")
		case ActionFail:
			log.Info().Msg("invalid document")
			if err := d.writeBack(ctx, o.doc.ID, &Job{ID: o.jobID, State: repjob.StateFailed, Reason: o.dec.Why}); err != nil {
				log.Warn().Err(err).Msg("writing failed state to invalid document failed")
			}
		}
	}
	return seq, nil
}

// docOf is the document of change c: the feed's (include_docs), else read.
func (d *dbProc) docOf(ctx context.Context, c couch.Change) (Doc, error) {
	doc := Doc{ID: c.ID, Deleted: c.Deleted}
	if c.Deleted || isSpecial(c.ID) {
		return doc, nil
	}
	raw := c.Doc
	if raw == nil {
		var err error
		raw, err = d.db.GetDoc(ctx, c.ID, nil)
		switch {
		case errors.Is(err, couch.ErrNotFound):
			doc.Deleted = true
			return doc, nil
		case err != nil:
			return doc, err
		}
	}
	doc.Body = raw
	doc.Rev = revOf(raw)
	return doc, nil
}

// decideTx decides one document in the batch's transaction and applies
// the decision to its job and record.
func (d *dbProc) decideTx(tx kv.Tx, jobs TxJobs, doc Doc) (outcome, error) {
	key := d.st.keys.doc(d.st.server, d.st.db, doc.ID)
	rec, err := getRecord(tx, key)
	if err != nil {
		return outcome{}, fmt.Errorf("docproc: read record of %s/%s: %w", d.st.db, doc.ID, err)
	}
	known := Known{Record: rec}
	if rec != nil && rec.JobID != "" && !doc.Deleted {
		j, err := jobs.Get(rec.JobID)
		switch {
		case errors.Is(err, ErrJobNotFound):
		case err != nil:
			return outcome{}, fmt.Errorf("docproc: get job %s: %w", rec.JobID, err)
		default:
			known.JobState = j.State
		}
	}
	o := outcome{doc: doc, dec: Decide(doc, known)}
	var newRec *DocRecord
	switch o.dec.Action {
	case ActionSkip:
		return o, nil
	case ActionRemove:
		o.jobID = rec.JobID
		if err := jobs.Remove(rec.JobID); err != nil && !errors.Is(err, ErrJobNotFound) {
			return o, fmt.Errorf("docproc: remove job %s: %w", rec.JobID, err)
		}
	case ActionAdd:
		o.jobID, err = jobs.AddPersistent(d.srv.key, d.st.db, doc.ID, o.dec.Body)
		if errors.Is(err, ErrInvalidDoc) {
			o.dec = Decision{Action: ActionFail, Why: strings.TrimPrefix(err.Error(), ErrInvalidDoc.Error()+": "), Fingerprint: o.dec.Fingerprint}
			break
		}
		if err != nil {
			return o, fmt.Errorf("docproc: add job for %s: %w", doc.ID, err)
		}
		newRec = &DocRecord{JobID: o.jobID, Fingerprint: o.dec.Fingerprint, Rev: doc.Rev}
	}
	if o.dec.Action == ActionRecord {
		o.jobID, err = jobs.AddFromDoc(d.srv.key, d.st.db, doc.ID, o.dec.Body, o.dec.State, o.dec.Reason, o.dec.Entry)
		if err != nil {
			return o, fmt.Errorf("docproc: record terminal state of %s: %w", doc.ID, err)
		}
		newRec = &DocRecord{JobID: o.jobID, Fingerprint: o.dec.Fingerprint, Rev: doc.Rev, State: o.dec.State, Written: true}
	}
	if o.dec.Action == ActionFail {
		// The failed document is recorded as a failed job (replacing any
		// job it had), so that _scheduler/docs shows it with its reason;
		// the reason is written to the document after the commit.
		o.jobID, err = jobs.AddInvalid(d.srv.key, d.st.db, doc.ID, nil, o.dec.Why)
		if err != nil {
			return o, fmt.Errorf("docproc: record invalid document %s: %w", doc.ID, err)
		}
		newRec = &DocRecord{JobID: o.jobID, Fingerprint: o.dec.Fingerprint, Rev: doc.Rev, State: repjob.StateFailed}
	}
	if newRec == nil {
		tx.Clear(key)
		return o, nil
	}
	if err := setJSON(tx, key, newRec); err != nil {
		return o, fmt.Errorf("docproc: encode record: %w", err)
	}
	return o, nil
}

func isSpecial(id string) bool {
	return Decide(Doc{ID: id}, Known{}).Why == whyDesign
}

func revOf(raw json.RawMessage) string {
	var v struct {
		Rev string `json:"_rev"`
	}
	_ = json.Unmarshal(raw, &v)
	return v.Rev
}

// writeBack writes job j's terminal state to document id, once per run.
func (d *dbProc) writeBack(ctx context.Context, id string, j *Job) error {
	d.writing.Lock()
	defer d.writing.Unlock()
	rec, err := d.st.record(ctx, id)
	if err != nil || rec == nil || rec.JobID != j.ID || rec.Written {
		return err
	}
	rev, err := d.writeState(ctx, id, rec.Fingerprint, j)
	if err != nil || rev == "" {
		return err
	}
	_, err = d.st.update(ctx, id, rec.Fingerprint, func(r *DocRecord) {
		r.Written, r.State, r.Rev = true, j.State, rev
	})
	if err == nil {
		d.log.Info().Str("doc_id", id).Str("job_id", j.ID).Stringer("state", j.State).Str("rev", rev).Msg("terminal state written")
	}
	return err
}

// writeState writes j's terminal state to document id if the document
// still has fingerprint fp, retrying update conflicts. It returns the new
// revision, or "" when the document changed, vanished or the server
// refused the write (all logged, as CouchDB does).
func (d *dbProc) writeState(ctx context.Context, id, fp string, j *Job) (string, error) {
	backoff := pause.Backoff{Min: 50 * time.Millisecond, Max: 6400 * time.Millisecond} // 8 retries
	for attempt := 0; ; attempt++ {
		raw, err := d.db.GetDoc(ctx, id, nil)
		if errors.Is(err, couch.ErrNotFound) {
			return "", nil
		}
		if err != nil {
			return "", err
		}
		body, _, berr := ReplicationBody(raw)
		if berr == nil && Fingerprint(body) != fp || berr != nil && Fingerprint(raw) != fp {
			return "", nil // edited since: its change will be processed
		}
		doc, err := withTerminalState(raw, j, d.p.opts.Clock(), d.p.opts.UpdateDocs)
		if err != nil {
			return "", err
		}
		res, err := d.db.BulkDocs(ctx, []json.RawMessage{doc}, true)
		if err != nil {
			return "", err
		}
		if len(res) != 1 {
			return "", fmt.Errorf("docproc: _bulk_docs answered %d results for one document", len(res))
		}
		switch r := res[0]; {
		case r.Error == "":
			return r.Rev, nil
		case r.Error == "conflict" && attempt < 8:
			if err := pause.For(ctx, backoff.Next()); err != nil {
				return "", err
			}
		default:
			d.log.Warn().Str("doc_id", id).Str("error", r.Error).Str("reason", r.Reason).Msg("document refused the terminal state")
			return "", nil
		}
	}
}

// withTerminalState returns doc with j's terminal state fields set as
// CouchDB's couch_replicator_docs writes them.
func withTerminalState(doc json.RawMessage, j *Job, now time.Time, updateDocs bool) (json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(doc, &fields); err != nil || fields == nil {
		return nil, fmt.Errorf("docproc: document is not a JSON object")
	}
	set := func(k string, v any) error {
		b, err := json.Marshal(v)
		if err == nil {
			fields[k] = b
		}
		return err
	}
	var old repjob.State // zero for a name that is not a state
	_ = json.Unmarshal(fields["_replication_state"], &old)
	if err := set("_replication_state", j.State); err != nil {
		return nil, err
	}
	if old != j.State || fields["_replication_state_time"] == nil {
		if err := set("_replication_state_time", now.UTC().Format(time.RFC3339)); err != nil {
			return nil, err
		}
	}
	// As CouchDB: the replication id is the document's only with
	// [replicator] update_docs (its triggered state says it); otherwise
	// none, not even one the document was written with.
	switch {
	case !updateDocs:
		delete(fields, "_replication_id")
	case j.RepID != "":
		if err := set("_replication_id", j.RepID); err != nil {
			return nil, err
		}
	}
	switch j.State {
	case repjob.StateCompleted:
		delete(fields, "_replication_state_reason")
		stats := map[string]any{}
		for k, v := range j.Stats {
			stats[k] = v
		}
		if !j.StartTime.IsZero() {
			stats["start_time"] = j.StartTime.UTC().Format(time.RFC3339)
		}
		if err := set("_replication_stats", stats); err != nil {
			return nil, err
		}
	case repjob.StateFailed:
		delete(fields, "_replication_stats")
		if err := set("_replication_state_reason", j.Reason); err != nil {
			return nil, err
		}
	}
	for _, k := range []string{"_revisions", "_revs_info", "_conflicts", "_deleted_conflicts", "_local_seq"} {
		delete(fields, k)
	}
	return json.Marshal(fields)
}
