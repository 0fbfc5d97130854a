package replicate

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
)

// maxHistory is how many entries a checkpoint document keeps (CouchDB: 50).
const maxHistory = 50

// HistoryEntry is one session's record in a checkpoint document, in
// CouchDB's field order (couch_replicator_scheduler_job:do_checkpoint/1).
type HistoryEntry struct {
	SessionID        string    `json:"session_id"`
	StartTime        string    `json:"start_time,omitempty"`
	EndTime          string    `json:"end_time,omitempty"`
	StartLastSeq     couch.Seq `json:"start_last_seq,omitempty"`
	EndLastSeq       couch.Seq `json:"end_last_seq,omitempty"`
	RecordedSeq      couch.Seq `json:"recorded_seq,omitempty"`
	MissingChecked   int64     `json:"missing_checked"`
	MissingFound     int64     `json:"missing_found"`
	DocsRead         int64     `json:"docs_read"`
	DocsWritten      int64     `json:"docs_written"`
	DocWriteFailures int64     `json:"doc_write_failures"`
	BulkGetDocs      int64     `json:"bulk_get_docs"`
	BulkGetAttempts  int64     `json:"bulk_get_attempts"`
	// Replicator is "couchrep" in the entries couchrep writes; CouchDB's
	// have none (CouchDB keeps the entries it finds as they are, so the
	// mark survives its own checkpoints). It tells where a run resumed
	// from: StartCheckpoint or StartForeignCheckpoint.
	Replicator string `json:"replicator,omitempty"`
}

// ReplicatorMark is HistoryEntry.Replicator in couchrep's checkpoints.
const ReplicatorMark = "couchrep"

// Where a run started (Stats.StartFrom; _scheduler/jobs info.start_from).
const (
	// StartCheckpoint: from a checkpoint couchrep recorded.
	StartCheckpoint = "checkpoint"
	// StartForeignCheckpoint: from a checkpoint another replicator
	// recorded under the same replication id: CouchDB's, when [couchdb]
	// uuid is the CouchDB server's.
	StartForeignCheckpoint = "couchdb_checkpoint"
	// StartSinceSeq: no usable checkpoint; from the since_seq parameter.
	StartSinceSeq = "since_seq"
	// StartZero: no usable checkpoint; from the beginning.
	StartZero = "zero"
	// StartReset: from the beginning (or since_seq) on an operator's
	// request (couchrepctl job reset, Options.FromZero), the checkpoints
	// ignored but kept: the run's checkpoints add to their history.
	StartReset = "reset"
)

// Checkpoint is the body of _local/<base id> on both source and target.
type Checkpoint struct {
	SessionID            string    `json:"session_id,omitempty"`
	SourceLastSeq        couch.Seq `json:"source_last_seq,omitempty"`
	ReplicationIDVersion int       `json:"replication_id_version,omitempty"`
	// The next five are only written for doc_ids replications (CouchDB
	// 0.11/1.0 compatibility).
	StartTime        string         `json:"start_time,omitempty"`
	EndTime          string         `json:"end_time,omitempty"`
	DocsRead         *int64         `json:"docs_read,omitempty"`
	DocsWritten      *int64         `json:"docs_written,omitempty"`
	DocWriteFailures *int64         `json:"doc_write_failures,omitempty"`
	History          []HistoryEntry `json:"history,omitempty"`
}

// storedCheckpoint is a checkpoint as read from an endpoint: the body plus
// its _rev, and the raw JSON (for the no_changes result).
type storedCheckpoint struct {
	Checkpoint
	Rev    string          `json:"_rev,omitempty"`
	Raw    json.RawMessage `json:"-"`
	exists bool
}

func parseStoredCheckpoint(raw json.RawMessage) (storedCheckpoint, error) {
	var c storedCheckpoint
	if err := json.Unmarshal(raw, &c); err != nil {
		return storedCheckpoint{}, err
	}
	c.Raw, c.exists = raw, true
	return c, nil
}

// compareCheckpoints finds the sequence to resume from and the history to
// keep (couch_replicator_scheduler_job:compare_replication_logs/2). Missing
// documents have no session id; two missing documents agree, at seq 0.
func compareCheckpoints(src, tgt Checkpoint) (couch.Seq, []HistoryEntry) {
	seq, h, _ := compareCheckpointsFrom(src, tgt)
	return seq, h
}

// compareCheckpointsFrom is compareCheckpoints that also says whose
// checkpoint the sequence comes from: StartCheckpoint,
// StartForeignCheckpoint, or "" when there is none to resume from.
func compareCheckpointsFrom(src, tgt Checkpoint) (couch.Seq, []HistoryEntry, string) {
	if src.SessionID == tgt.SessionID {
		if src.SourceLastSeq.IsZero() {
			return src.SourceLastSeq, src.History, ""
		}
		by := StartForeignCheckpoint
		if len(src.History) > 0 && src.History[0].SessionID == src.SessionID && src.History[0].Replicator == ReplicatorMark {
			by = StartCheckpoint
		}
		return src.SourceLastSeq, src.History, by
	}
	return compareHistory(src.History, tgt.History)
}

func compareHistory(s, t []HistoryEntry) (couch.Seq, []HistoryEntry, string) {
	by := func(e HistoryEntry) string {
		if e.RecordedSeq.IsZero() {
			return ""
		}
		if e.Replicator == ReplicatorMark {
			return StartCheckpoint
		}
		return StartForeignCheckpoint
	}
	for len(s) > 0 && len(t) > 0 {
		if hasSession(s[0].SessionID, t) {
			return s[0].RecordedSeq, s[1:], by(s[0])
		}
		if hasSession(t[0].SessionID, s[1:]) {
			return t[0].RecordedSeq, t[1:], by(t[0])
		}
		s, t = s[1:], t[1:]
	}
	return nil, nil, "" // no common ancestry: full replication
}

func hasSession(id string, h []HistoryEntry) bool {
	for _, e := range h {
		if e.SessionID == id {
			return true
		}
	}
	return false
}

// rfc1123 formats t as httpd_util:rfc1123_date does ("Sun, 11 Aug 2013 20:38:50 GMT").
func rfc1123(t time.Time) string { return t.UTC().Format("Mon, 02 Jan 2006 15:04:05 GMT") }

// newCheckpoint builds the document written at a checkpoint.
func newCheckpoint(session string, startSeq, seq couch.Seq, start, now time.Time, s Stats, old []HistoryEntry, docIDs bool) Checkpoint {
	e := HistoryEntry{
		SessionID: session, StartTime: rfc1123(start), EndTime: rfc1123(now),
		StartLastSeq: seqOrZero(startSeq), EndLastSeq: seq, RecordedSeq: seq,
		MissingChecked: s.RevisionsChecked, MissingFound: s.MissingRevisionsFound,
		DocsRead: s.DocsRead, DocsWritten: s.DocsWritten, DocWriteFailures: s.DocWriteFailures,
		BulkGetDocs: s.BulkGetDocs, BulkGetAttempts: s.BulkGetAttempts, Replicator: ReplicatorMark,
	}
	h := append([]HistoryEntry{e}, old...)
	if len(h) > maxHistory {
		h = h[:maxHistory]
	}
	c := Checkpoint{SessionID: session, SourceLastSeq: seq, ReplicationIDVersion: RepIDVersion, History: h}
	if docIDs {
		r, w, f := s.DocsRead, s.DocsWritten, s.DocWriteFailures
		c.StartTime, c.EndTime = e.StartTime, e.EndTime
		c.DocsRead, c.DocsWritten, c.DocWriteFailures = &r, &w, &f
	}
	return c
}

func seqOrZero(s couch.Seq) couch.Seq {
	if len(s) == 0 {
		return couch.Seq("0")
	}
	return s
}

// withRev returns the checkpoint JSON with "_id" and (if known) "_rev"
// first, as a _local document body.
func withRev(id, rev string, body []byte) []byte {
	var b bytes.Buffer
	b.WriteString(`{"_id":`)
	idj, _ := json.Marshal(id)
	b.Write(idj)
	if rev != "" {
		revj, _ := json.Marshal(rev)
		b.WriteString(`,"_rev":`)
		b.Write(revj)
	}
	if len(body) > 2 {
		b.WriteByte(',')
		b.Write(body[1:])
	} else {
		b.WriteByte('}')
	}
	return b.Bytes()
}

// seqTracker is CouchDB's through_seq bookkeeping (report_seq_done): batches
// are numbered in feed order; the checkpointable seq is that of the highest
// batch such that it and every batch before it have completed. Batches
// not yet through are a queue in feed order (no maps: an idle job's
// tracker is a few words).
type seqTracker struct {
	next    uint64         // number of the next batch to be handed out
	low     uint64         // number of queue[head], the lowest batch not yet through
	queue   []trackedBatch // queue[head:] are batches low..next-1
	head    int
	through couch.Seq
}

type trackedBatch struct {
	seq  couch.Seq
	done bool
}

func newSeqTracker(start couch.Seq) *seqTracker {
	return &seqTracker{through: start}
}

// start registers a batch ending at seq and returns its number.
func (t *seqTracker) start(seq couch.Seq) uint64 {
	if t.head > 0 && t.head >= len(t.queue)/2 {
		// Drop the batches already through (amortised: the queue never
		// holds more dead entries than live ones when it grows).
		k := copy(t.queue, t.queue[t.head:])
		clear(t.queue[k:])
		t.queue, t.head = t.queue[:k], 0
	}
	n := t.next
	t.next++
	t.queue = append(t.queue, trackedBatch{seq: seq})
	return n
}

// finish marks batch n done and reports whether through advanced.
func (t *seqTracker) finish(n uint64) bool {
	if n < t.low || n >= t.next {
		return false
	}
	b := &t.queue[t.head+int(n-t.low)]
	if b.done {
		return false
	}
	b.done = true
	advanced := false
	for t.head < len(t.queue) && t.queue[t.head].done {
		t.through = t.queue[t.head].seq
		t.queue[t.head] = trackedBatch{}
		t.head++
		t.low++
		advanced = true
	}
	if t.head == len(t.queue) {
		t.queue, t.head = t.queue[:0], 0
	}
	return advanced
}

// advance sets through to seq when nothing is in flight (a feed that ended
// with last_seq beyond its last row).
func (t *seqTracker) advance(seq couch.Seq) {
	if t.low == t.next && seq != nil {
		t.through = seq
	}
}
