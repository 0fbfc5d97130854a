package httpapi

import (
	"encoding/json"
	"testing"

	"github.com/couchrep/couchrep/messages"
)

// statsCases are stored stats and the "info" _scheduler/jobs and
// _active_tasks show for them (CouchDB's seq_encode for the sequences).
var statsCases = []struct {
	name string
	st   *messages.ReplicationStats
	want string
}{
	{"none", nil, `null`},
	{"empty", &messages.ReplicationStats{},
		`{"bulk_get_attempts":0,"bulk_get_docs":0,"changes_pending":null,"checkpointed_source_seq":"0","doc_write_failures":0,"docs_read":0,"docs_written":0,"missing_revisions_found":0,"revisions_checked":0,"source_seq":"0","through_seq":"0"}`},
	{"numbers", &messages.ReplicationStats{RevisionsChecked: 1, MissingRevisionsFound: 2, DocsRead: 3, DocsWritten: 4, DocWriteFailures: 5,
		BulkGetDocs: 6, BulkGetAttempts: 7, ChangesPending: ptr(int64(8)), CheckpointedSourceSeq: "9", SourceSeq: " 10 ", ThroughSeq: "9",
		StartFrom: "checkpoint", StartSeq: "3"},
		`{"bulk_get_attempts":7,"bulk_get_docs":6,"changes_pending":8,"checkpointed_source_seq":"9","doc_write_failures":5,"docs_read":3,"docs_written":4,"missing_revisions_found":2,"revisions_checked":1,"source_seq":"10","start_from":"checkpoint","start_seq":"3","through_seq":"9"}`},
	{"strings", &messages.ReplicationStats{ChangesPending: ptr(int64(0)), CheckpointedSourceSeq: `"12-g1AAAA"`, SourceSeq: `"13-g1AAAB"`,
		ThroughSeq: `[1,"x"]`, StartFrom: "zero", StartSeq: `0`},
		`{"bulk_get_attempts":0,"bulk_get_docs":0,"changes_pending":0,"checkpointed_source_seq":"12-g1AAAA","doc_write_failures":0,"docs_read":0,"docs_written":0,"missing_revisions_found":0,"revisions_checked":0,"source_seq":"13-g1AAAB","start_from":"zero","start_seq":"0","through_seq":"[1,\"x\"]"}`},
}

func ptr[T any](v T) *T { return &v }

// TestStatsJSON: a job's stats as the API shows them, byte for byte.
func TestStatsJSON(t *testing.T) {
	for _, tc := range statsCases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(statsJSON(tc.st))
			if err != nil || string(b) != tc.want {
				t.Errorf("info = %s, %v\nwant   %s", b, err, tc.want)
			}
		})
	}
}
