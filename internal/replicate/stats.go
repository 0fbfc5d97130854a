package replicate

import (
	"sync/atomic"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
)

// Stats are a replication's counters and sequences (internal/repjob
// stores them and names them as CouchDB does: repjob.Stats).
type Stats struct {
	RevisionsChecked      int64
	MissingRevisionsFound int64
	DocsRead              int64
	DocsWritten           int64
	ChangesPending        *int64
	DocWriteFailures      int64
	BulkGetDocs           int64
	BulkGetAttempts       int64
	CheckpointedSourceSeq couch.Seq
	SourceSeq             couch.Seq
	ThroughSeq            couch.Seq
	// StartFrom says where the run started: StartCheckpoint,
	// StartForeignCheckpoint, StartSinceSeq or StartZero; StartSeq is
	// that sequence. Empty before the checkpoints were read.
	StartFrom string
	StartSeq  couch.Seq
	// WriteFailures are this run's last documents the target refused to
	// write (at most MaxWriteFailures, newest last).
	WriteFailures []WriteFailure
	// BehindSince is set while changes are pending: when this run first
	// saw them pending after none, or its checkpoint last advanced,
	// whichever is later (the job's lag counts from it).
	BehindSince time.Time
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

// Prior are a job's counters when its last run ended (Options.Prior).
type Prior struct {
	// RepID is the replication id (base+ext) the counters belong to.
	RepID string
	Stats Stats
}

// maxCounters is a with each counter the larger of a's and b's
// (couch_replicator_stats:max_stats).
func maxCounters(a, b Stats) Stats {
	a.RevisionsChecked = max(a.RevisionsChecked, b.RevisionsChecked)
	a.MissingRevisionsFound = max(a.MissingRevisionsFound, b.MissingRevisionsFound)
	a.DocsRead = max(a.DocsRead, b.DocsRead)
	a.DocsWritten = max(a.DocsWritten, b.DocsWritten)
	a.DocWriteFailures = max(a.DocWriteFailures, b.DocWriteFailures)
	a.BulkGetDocs = max(a.BulkGetDocs, b.BulkGetDocs)
	a.BulkGetAttempts = max(a.BulkGetAttempts, b.BulkGetAttempts)
	return a
}

// count adds s, counted by this run's work, to the run's counters and
// tells Options.OnCounted.
func (r *Replication) count(s Stats) {
	r.ctr.add(s)
	if r.o.OnCounted != nil && (s.RevisionsChecked|s.MissingRevisionsFound|s.DocsRead|s.DocsWritten|s.DocWriteFailures|s.BulkGetDocs|s.BulkGetAttempts) != 0 {
		r.o.OnCounted(s)
	}
}
