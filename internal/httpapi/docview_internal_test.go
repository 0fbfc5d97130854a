package httpapi

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/couchrep/couchrep/internal/repjob"
)

// TestDocViewStates: the _scheduler/docs entries CouchDB 3.4.3 shows for a
// document that cannot become a replication yet ("error": no source or
// target, id null) and for one read from a document carrying its terminal
// state; credentials never show in either.
func TestDocViewStates(t *testing.T) {
	const secret = "hunter2"
	tests := []struct {
		name    string
		job     Job
		state   string
		want    map[string]string // field -> JSON
		without []string
	}{
		{"filter not fetched yet", Job{Database: "_replicator", DocID: "d", State: repjob.StateCrashing, ErrorCount: 2, Node: "n1",
			Source: "http://bob:" + secret + "@h/src/", LastError: "Could not open source database `http://bob:" + secret + "@h/src/`: x"},
			"error", map[string]string{"id": "null", "error_count": "2", "node": `"n1"`}, []string{"source", "target", "source_proxy"}},
		{"crashing with a replication id", Job{Database: "_replicator", DocID: "d", RepID: "abc", State: repjob.StateCrashing, LastError: "boom"},
			"crashing", map[string]string{"id": `"abc"`}, nil},
		{"completed, read from the document", Job{Database: "_replicator", DocID: "d", State: repjob.StateCompleted,
			FromDoc: json.RawMessage(`{"source":"http://h/src/","target":null,"info":{"docs_written":3,"note":"http://bob:` + secret + `@h/"},"error_count":0,"start_time":"t0","last_updated":"t1"}`)},
			"completed", map[string]string{"id": "null", "target": "null", "start_time": `"t0"`, "last_updated": `"t1"`, "error_count": "0"}, []string{"node"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := docView(&tt.job)
			b, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(b), secret) {
				t.Fatalf("credentials shown: %s", b)
			}
			var got map[string]json.RawMessage
			_ = json.Unmarshal(b, &got)
			if string(got["state"]) != `"`+tt.state+`"` || docState(&tt.job) != tt.state && tt.job.FromDoc == nil {
				t.Errorf("state %s, want %s", got["state"], tt.state)
			}
			for k, w := range tt.want {
				if string(got[k]) != w {
					t.Errorf("%s = %s, want %s", k, got[k], w)
				}
			}
			for _, k := range tt.without {
				if _, has := got[k]; has {
					t.Errorf("has %s: %s", k, b)
				}
			}
		})
	}
}
