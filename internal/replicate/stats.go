package replicate

import (
	"encoding/json"
	"sync/atomic"

	"github.com/couchrep/couchrep/internal/couch"
)

// Stats are a replication's counters under the names CouchDB's
// _active_tasks and _scheduler/jobs use.
type Stats struct {
	RevisionsChecked      int64     `json:"revisions_checked"`
	MissingRevisionsFound int64     `json:"missing_revisions_found"`
	DocsRead              int64     `json:"docs_read"`
	DocsWritten           int64     `json:"docs_written"`
	ChangesPending        *int64    `json:"changes_pending"`
	DocWriteFailures      int64     `json:"doc_write_failures"`
	BulkGetDocs           int64     `json:"bulk_get_docs"`
	BulkGetAttempts       int64     `json:"bulk_get_attempts"`
	CheckpointedSourceSeq couch.Seq `json:"-"`
	SourceSeq             couch.Seq `json:"-"`
	ThroughSeq            couch.Seq `json:"-"`
	// StartFrom says where the run started: StartCheckpoint,
	// StartForeignCheckpoint, StartSinceSeq or StartZero; StartSeq is
	// that sequence. Empty before the checkpoints were read.
	StartFrom string    `json:"-"`
	StartSeq  couch.Seq `json:"-"`
}

// MarshalJSON encodes the seqs as CouchDB's seq_encode does: a JSON string
// stays as is, anything else (numbers, including 0) is JSON-encoded into a
// string.
func (s Stats) MarshalJSON() ([]byte, error) {
	type plain Stats
	b, err := json.Marshal(plain(s))
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	m["checkpointed_source_seq"] = seqEncode(s.CheckpointedSourceSeq)
	m["source_seq"] = seqEncode(s.SourceSeq)
	m["through_seq"] = seqEncode(s.ThroughSeq)
	if s.StartFrom != "" {
		m["start_from"], _ = json.Marshal(s.StartFrom)
		m["start_seq"] = seqEncode(s.StartSeq)
	}
	return json.Marshal(m)
}

func seqEncode(s couch.Seq) json.RawMessage {
	if len(s) == 0 {
		return json.RawMessage(`"0"`)
	}
	if s[0] == '"' {
		return json.RawMessage(s)
	}
	b, _ := json.Marshal(string(s))
	return b
}

// counters are the live, concurrently updated counters.
type counters struct {
	revisionsChecked, missingFound, docsRead, docsWritten, writeFailures atomic.Int64
	bulkGetDocs, bulkGetAttempts                                         atomic.Int64
}

func (c *counters) add(s Stats) {
	c.revisionsChecked.Add(s.RevisionsChecked)
	c.missingFound.Add(s.MissingRevisionsFound)
	c.docsRead.Add(s.DocsRead)
	c.docsWritten.Add(s.DocsWritten)
	c.writeFailures.Add(s.DocWriteFailures)
	c.bulkGetDocs.Add(s.BulkGetDocs)
	c.bulkGetAttempts.Add(s.BulkGetAttempts)
}

// sum is the sum of the counters: they only grow, so it changes whenever
// one of them does.
func (c *counters) sum() int64 {
	return c.revisionsChecked.Load() + c.missingFound.Load() + c.docsRead.Load() + c.docsWritten.Load() +
		c.writeFailures.Load() + c.bulkGetDocs.Load() + c.bulkGetAttempts.Load()
}

func (c *counters) snapshot() Stats {
	return Stats{
		RevisionsChecked: c.revisionsChecked.Load(), MissingRevisionsFound: c.missingFound.Load(),
		DocsRead: c.docsRead.Load(), DocsWritten: c.docsWritten.Load(),
		DocWriteFailures: c.writeFailures.Load(),
		BulkGetDocs:      c.bulkGetDocs.Load(), BulkGetAttempts: c.bulkGetAttempts.Load(),
	}
}
