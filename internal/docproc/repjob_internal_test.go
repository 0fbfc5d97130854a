package docproc

import (
	"encoding/json"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/messages"
)

// TestJobOf: the doc processor's view of a stored job, and the
// _replication_stats it writes (the sequences as stored, unknown values
// left out, no start_from/start_seq), byte for byte.
func TestJobOf(t *testing.T) {
	pending := int64(8)
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name  string
		st    *messages.ReplicationStats
		stats string
	}{
		{"none", nil, `null`},
		{"empty", &messages.ReplicationStats{},
			`{"bulk_get_attempts":0,"bulk_get_docs":0,"doc_write_failures":0,"docs_read":0,"docs_written":0,"missing_revisions_found":0,"revisions_checked":0}`},
		{"numbers", &messages.ReplicationStats{RevisionsChecked: 1, MissingRevisionsFound: 2, DocsRead: 3, DocsWritten: 4, DocWriteFailures: 5,
			BulkGetDocs: 6, BulkGetAttempts: 7, ChangesPending: &pending, CheckpointedSourceSeq: "9", SourceSeq: "10", ThroughSeq: "9",
			StartFrom: "checkpoint", StartSeq: "3"},
			`{"bulk_get_attempts":7,"bulk_get_docs":6,"changes_pending":8,"checkpointed_source_seq":9,"doc_write_failures":5,"docs_read":3,"docs_written":4,"missing_revisions_found":2,"revisions_checked":1,"source_seq":10,"through_seq":9}`},
		{"strings", &messages.ReplicationStats{CheckpointedSourceSeq: `"12-g1AAAA"`, SourceSeq: `"13-g1AAAB"`, ThroughSeq: `not json`},
			`{"bulk_get_attempts":0,"bulk_get_docs":0,"checkpointed_source_seq":"12-g1AAAA","doc_write_failures":0,"docs_read":0,"docs_written":0,"missing_revisions_found":0,"revisions_checked":0,"source_seq":"13-g1AAAB","through_seq":"not json"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := &repjob.Record{QueueState: jobqueue.StateFinished, ReplicationJob: &messages.ReplicationJob{
				JobId: "srv|_replicator|d", Kind: messages.ReplicationKind_REPLICATION_KIND_PERSISTENT, Server: "srv", DbName: "_replicator",
				DocId: "d", RepId: "abc+continuous", State: repjob.StateCompleted.Proto(), LastError: "why",
				LastStarted: timestamppb.New(started), Stats: tc.st}}
			j := jobOf(rec)
			if j.ID != "srv|_replicator|d" || !j.Persistent || j.Server != "srv" || j.DB != "_replicator" || j.DocID != "d" ||
				j.RepID != "abc+continuous" || j.State != repjob.StateCompleted || j.Reason != "why" || !j.StartTime.Equal(started) {
				t.Errorf("job %+v", j)
			}
			b, err := json.Marshal(j.Stats)
			if err != nil || string(b) != tc.stats {
				t.Errorf("stats = %s, %v\nwant    %s", b, err, tc.stats)
			}
		})
	}
}
