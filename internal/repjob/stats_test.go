package repjob_test

import (
	"slices"
	"testing"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/messages"
)

// TestStats: the one list of stats names is the stored record's fields,
// each once, in _active_tasks' order, with its kind and whether it is
// known.
func TestStats(t *testing.T) {
	pending := int64(8)
	full := &messages.ReplicationStats{RevisionsChecked: 1, MissingRevisionsFound: 2, DocsRead: 3, DocsWritten: 4, DocWriteFailures: 5,
		BulkGetDocs: 6, BulkGetAttempts: 7, ChangesPending: &pending, CheckpointedSourceSeq: "9", SourceSeq: `"10-a"`, ThroughSeq: "9",
		StartFrom: "checkpoint", StartSeq: "3"}
	tests := []struct {
		name string
		st   *messages.ReplicationStats
		want []repjob.Stat
	}{
		{"full", full, []repjob.Stat{
			{Key: "revisions_checked", Kind: repjob.StatCount, Int: 1, Known: true},
			{Key: "missing_revisions_found", Kind: repjob.StatCount, Int: 2, Known: true},
			{Key: "docs_read", Kind: repjob.StatCount, Int: 3, Known: true},
			{Key: "docs_written", Kind: repjob.StatCount, Int: 4, Known: true},
			{Key: "changes_pending", Kind: repjob.StatGauge, Int: 8, Known: true},
			{Key: "doc_write_failures", Kind: repjob.StatCount, Int: 5, Known: true},
			{Key: "bulk_get_docs", Kind: repjob.StatCount, Int: 6, Known: true},
			{Key: "bulk_get_attempts", Kind: repjob.StatCount, Int: 7, Known: true},
			{Key: "checkpointed_source_seq", Kind: repjob.StatSeq, Text: "9", Known: true},
			{Key: "source_seq", Kind: repjob.StatSeq, Text: `"10-a"`, Known: true},
			{Key: "through_seq", Kind: repjob.StatSeq, Text: "9", Known: true},
			{Key: "start_from", Kind: repjob.StatText, Text: "checkpoint", Known: true, RunStart: true},
			{Key: "start_seq", Kind: repjob.StatSeq, Text: "3", Known: true, RunStart: true},
		}},
		{"none yet", nil, []repjob.Stat{
			{Key: "revisions_checked", Kind: repjob.StatCount, Known: true},
			{Key: "missing_revisions_found", Kind: repjob.StatCount, Known: true},
			{Key: "docs_read", Kind: repjob.StatCount, Known: true},
			{Key: "docs_written", Kind: repjob.StatCount, Known: true},
			{Key: "changes_pending", Kind: repjob.StatGauge},
			{Key: "doc_write_failures", Kind: repjob.StatCount, Known: true},
			{Key: "bulk_get_docs", Kind: repjob.StatCount, Known: true},
			{Key: "bulk_get_attempts", Kind: repjob.StatCount, Known: true},
			{Key: "checkpointed_source_seq", Kind: repjob.StatSeq},
			{Key: "source_seq", Kind: repjob.StatSeq},
			{Key: "through_seq", Kind: repjob.StatSeq},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := repjob.Stats(tc.st); !slices.Equal(got, tc.want) {
				t.Errorf("Stats =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
	// Every stored field is named, once (but the refused documents and
	// behind_since, shown beside the stats: repjob/trust.go).
	keys := []string{"write_failures", "behind_since"}
	for _, s := range repjob.Stats(full) {
		keys = append(keys, s.Key)
	}
	fields := full.ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		if name := string(fields.Get(i).Name()); !slices.Contains(keys, name) {
			t.Errorf("stored field %s has no stat", name)
		}
	}
	if len(keys) != fields.Len() {
		t.Errorf("%d stats for %d stored fields: %v", len(keys), fields.Len(), keys)
	}
}

// TestStatsProto: engine stats are stored as they are.
func TestStatsProto(t *testing.T) {
	pending := int64(4)
	got := repjob.StatsProto(replicate.Stats{RevisionsChecked: 1, MissingRevisionsFound: 2, DocsRead: 3, DocsWritten: 4, DocWriteFailures: 5,
		BulkGetDocs: 6, BulkGetAttempts: 7, ChangesPending: &pending, CheckpointedSourceSeq: couch.Seq(`"9-x"`), SourceSeq: couch.Seq("10"),
		ThroughSeq: couch.Seq("9"), StartFrom: replicate.StartCheckpoint, StartSeq: couch.Seq("3")})
	if got.GetDocsRead() != 3 || got.GetChangesPending() != 4 || got.GetCheckpointedSourceSeq() != `"9-x"` || got.GetSourceSeq() != "10" ||
		got.GetStartFrom() != "checkpoint" || got.GetStartSeq() != "3" || got.GetBulkGetAttempts() != 7 {
		t.Errorf("StatsProto = %v", got)
	}
	if empty := repjob.StatsProto(replicate.Stats{}); empty.ChangesPending != nil || empty.GetSourceSeq() != "" {
		t.Errorf("StatsProto(zero) = %v", empty)
	}
}
