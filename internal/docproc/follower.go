package docproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/repjob"
)

// dbProc follows one _replicator database while this node holds its lease.
type dbProc struct {
	p   *Processor
	srv server
	st  *state
	db  *couch.DB
	log zerolog.Logger
}

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
	// A numeric checkpoint beyond the database's update_seq belongs to a
	// deleted database of the same name: start over.
	if n, ok := seq.Int(); ok {
		if u, ok := info.UpdateSeq.Int(); ok && u < n {
			d.log.Info().Stringer("checkpoint", seq).Stringer("update_seq", info.UpdateSeq).Msg("checkpoint ahead of database: reprocessing")
			seq = nil
		}
	}
	if err := d.scanUnwritten(ctx); err != nil {
		return err
	}
	backoff := time.Second
	for {
		opts := couch.ChangesOptions{Feed: couch.FeedContinuous, Since: seq, Timeout: d.p.opts.FeedTimeout, Heartbeat: 10 * time.Second}
		last, err := d.db.Changes(ctx, opts, func(c couch.Change) error {
			if err := d.process(ctx, c); err != nil {
				return err
			}
			if c.Seq != nil {
				seq = c.Seq
			}
			backoff = time.Second
			return nil
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
			continue
		}
		if errors.Is(err, couch.ErrNotFound) {
			return errDBDeleted
		}
		d.log.Warn().Err(err).Stringer("since", seq).Dur("retry_in", backoff).Msg("_changes feed failed")
		if err := sleep(ctx, backoff); err != nil {
			return err
		}
		backoff = min(2*backoff, time.Minute)
	}
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

// process handles one change row and checkpoints it.
func (d *dbProc) process(ctx context.Context, c couch.Change) error {
	doc := Doc{ID: c.ID, Deleted: c.Deleted}
	if !c.Deleted && !isSpecial(c.ID) {
		raw, err := d.db.GetDoc(ctx, c.ID, nil)
		switch {
		case errors.Is(err, couch.ErrNotFound):
			doc.Deleted = true
		case err != nil:
			return err
		default:
			doc.Body = raw
			doc.Rev = revOf(raw)
		}
	}
	rec, err := d.st.record(ctx, c.ID)
	if err != nil {
		return err
	}
	known := Known{Record: rec}
	if rec != nil && rec.JobID != "" && !doc.Deleted {
		j, err := d.p.opts.Jobs.Get(ctx, rec.JobID)
		switch {
		case errors.Is(err, ErrJobNotFound):
		case err != nil:
			return fmt.Errorf("docproc: get job %s: %w", rec.JobID, err)
		default:
			known.JobState = j.State
		}
	}
	dec := Decide(doc, known)
	log := d.log.With().Str("doc_id", c.ID).Str("rev", doc.Rev).Str("action", dec.Action.String()).Str("why", dec.Why).Logger()
	var seq couch.Seq
	if c.Seq != nil {
		seq = c.Seq
	}
	switch dec.Action {
	case ActionSkip:
		log.Debug().Msg("document change")
		return d.st.commit(ctx, "", nil, seq)
	case ActionRemove:
		if err := d.p.opts.Jobs.Remove(ctx, rec.JobID); err != nil && !errors.Is(err, ErrJobNotFound) {
			return fmt.Errorf("docproc: remove job %s: %w", rec.JobID, err)
		}
		log.Info().Str("job_id", rec.JobID).Msg("document deleted: job removed")
		return d.st.commit(ctx, c.ID, nil, seq)
	case ActionAdd:
		jobID, err := d.p.opts.Jobs.AddPersistent(ctx, d.srv.key, d.st.db, c.ID, dec.Body)
		if err != nil {
			return fmt.Errorf("docproc: add job for %s: %w", c.ID, err)
		}
		log.Info().Str("job_id", jobID).Msg("job added")
		return d.st.commit(ctx, c.ID, &DocRecord{JobID: jobID, Fingerprint: dec.Fingerprint, Rev: doc.Rev}, seq)
	case ActionFail:
		// The failed document is recorded as a failed job (replacing any
		// job it had), so that _scheduler/docs shows it with its reason.
		jobID, err := d.p.opts.Jobs.AddInvalid(ctx, d.srv.key, d.st.db, c.ID, dec.Body, dec.Why)
		if err != nil {
			return fmt.Errorf("docproc: record invalid document %s: %w", c.ID, err)
		}
		newRec := &DocRecord{JobID: jobID, Fingerprint: dec.Fingerprint, Rev: doc.Rev, State: repjob.StateFailed}
		rev, err := d.writeState(ctx, c.ID, dec.Fingerprint, &Job{State: repjob.StateFailed, Reason: dec.Why})
		if err != nil {
			log.Warn().Err(err).Msg("writing failed state to invalid document failed")
		} else if rev != "" {
			newRec.Rev, newRec.Written = rev, true
		}
		log.Info().Msg("invalid document")
		return d.st.commit(ctx, c.ID, newRec, seq)
	}
	return nil
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
	wait := 50 * time.Millisecond
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
		doc, err := withTerminalState(raw, j, d.p.opts.Clock())
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
			if err := sleep(ctx, wait); err != nil {
				return "", err
			}
			wait *= 2
		default:
			d.log.Warn().Str("doc_id", id).Str("error", r.Error).Str("reason", r.Reason).Msg("document refused the terminal state")
			return "", nil
		}
	}
}

// withTerminalState returns doc with j's terminal state fields set as
// CouchDB's couch_replicator_docs writes them.
func withTerminalState(doc json.RawMessage, j *Job, now time.Time) (json.RawMessage, error) {
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
	if j.RepID != "" {
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
