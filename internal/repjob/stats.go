package repjob

import (
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/messages"
)

// StatKind says what a Stat holds.
type StatKind int

// The kinds of stats.
const (
	// StatCount is a counter: Int, always known.
	StatCount StatKind = iota + 1
	// StatGauge is a number that may be unknown: Int (changes_pending).
	StatGauge
	// StatSeq is a sequence: Text is its JSON text as the source sent it.
	StatSeq
	// StatText is a word: Text (start_from).
	StatText
)

// Stat is one of a job's stats under its CouchDB name.
type Stat struct {
	// Key is the name _active_tasks, _scheduler/jobs "info" and
	// _replication_stats use ("docs_read").
	Key  string
	Kind StatKind
	// Int is the value of a StatCount or StatGauge.
	Int int64
	// Text is the value of a StatSeq or StatText.
	Text string
	// Known is false for a gauge, sequence or word not known yet.
	Known bool
	// RunStart marks start_from and start_seq: where the current run
	// started (couchrep's addition to _scheduler/jobs "info"; CouchDB's
	// _replication_stats has neither).
	RunStart bool
}

// Stats returns a job's stored stats (nil: none yet, all zero) in the
// order CouchDB's _active_tasks shows them. It is the one list of their
// names: the HTTP API, _replicator documents and anything else that shows
// a job's stats by name encode it, each in its own way. start_from and
// start_seq come only once the run read its checkpoints.
func Stats(st *messages.ReplicationStats) []Stat {
	count := func(k string, v int64) Stat { return Stat{Key: k, Kind: StatCount, Int: v, Known: true} }
	seq := func(k, v string) Stat { return Stat{Key: k, Kind: StatSeq, Text: v, Known: v != ""} }
	out := []Stat{
		count("revisions_checked", st.GetRevisionsChecked()),
		count("missing_revisions_found", st.GetMissingRevisionsFound()),
		count("docs_read", st.GetDocsRead()),
		count("docs_written", st.GetDocsWritten()),
		{Key: "changes_pending", Kind: StatGauge, Int: st.GetChangesPending(), Known: st != nil && st.ChangesPending != nil},
		count("doc_write_failures", st.GetDocWriteFailures()),
		count("bulk_get_docs", st.GetBulkGetDocs()),
		count("bulk_get_attempts", st.GetBulkGetAttempts()),
		seq("checkpointed_source_seq", st.GetCheckpointedSourceSeq()),
		seq("source_seq", st.GetSourceSeq()),
		seq("through_seq", st.GetThroughSeq()),
	}
	if from := st.GetStartFrom(); from != "" {
		start := seq("start_seq", st.GetStartSeq())
		start.RunStart = true
		out = append(out, Stat{Key: "start_from", Kind: StatText, Text: from, Known: true, RunStart: true}, start)
	}
	return out
}

// StatsProto converts engine stats to the stored form.
func StatsProto(st replicate.Stats) *messages.ReplicationStats {
	m := &messages.ReplicationStats{
		RevisionsChecked: st.RevisionsChecked, MissingRevisionsFound: st.MissingRevisionsFound,
		DocsRead: st.DocsRead, DocsWritten: st.DocsWritten, DocWriteFailures: st.DocWriteFailures,
		BulkGetDocs: st.BulkGetDocs, BulkGetAttempts: st.BulkGetAttempts, ChangesPending: st.ChangesPending,
	}
	if st.CheckpointedSourceSeq != nil {
		m.CheckpointedSourceSeq = string(st.CheckpointedSourceSeq)
	}
	if st.SourceSeq != nil {
		m.SourceSeq = string(st.SourceSeq)
	}
	if st.ThroughSeq != nil {
		m.ThroughSeq = string(st.ThroughSeq)
	}
	m.WriteFailures = failuresProto(st.WriteFailures)
	if !st.BehindSince.IsZero() {
		m.BehindSince = ts(st.BehindSince)
	}
	m.StartFrom = st.StartFrom
	if st.StartSeq != nil {
		m.StartSeq = string(st.StartSeq)
	}
	return m
}
