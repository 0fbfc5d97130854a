package docproc

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/repjob"
)

// ErrJobNotFound is returned by a JobStore for a job that does not exist.
var ErrJobNotFound = errors.New("docproc: job not found")

// Job is what the doc processor needs to know of a replication job.
type Job struct {
	// ID is the job id.
	ID string
	// Persistent reports a job made from a _replicator document.
	Persistent bool
	// Server, DB and DocID name the document of a persistent job.
	Server, DB, DocID string
	// RepID is the replication id ("" until known).
	RepID string
	// State is the job's state.
	State repjob.State
	// Reason is why the job failed (or last crashed).
	Reason string
	// Stats are the job's counters under _active_tasks' names, written
	// as _replication_stats when it completes.
	Stats map[string]any
	// StartTime is when the job last started (zero when it never did).
	StartTime time.Time
}

// JobStore is the doc processor's view of the replication job store
// (internal/repjob's Store in a node; a fake in unit tests).
type JobStore interface {
	// InTx returns the job operations inside tx, a transaction of the
	// doc processor's store (Options.Store), which holds the jobs too: a
	// batch of documents' jobs, their records and the feed checkpoint
	// commit together. The operations have no effect outside tx (the
	// transaction may be retried).
	InTx(tx kv.Tx) TxJobs
	// Remove removes a job; an error matching ErrJobNotFound when absent.
	Remove(ctx context.Context, jobID string) error
	// Get returns a job; an error matching ErrJobNotFound when absent.
	Get(ctx context.Context, jobID string) (*Job, error)
	// Persistent returns every job of a _replicator document.
	Persistent(ctx context.Context) ([]*Job, error)
	// Follow calls fn with every job whose state changes after Follow
	// was called, in commit order, until ctx ends or fn fails. It calls
	// started (once) as soon as it follows, before any fn.
	Follow(ctx context.Context, started func(), fn func(*Job) error) error
}

// ErrInvalidDoc is wrapped by TxJobs.AddPersistent's error for a document
// the job store refuses (its replication id cannot be computed): the
// document fails, the rest of its batch goes on.
var ErrInvalidDoc = errors.New("docproc: invalid replication document")

// TxJobs are a JobStore's operations inside one transaction (InTx).
type TxJobs interface {
	// AddPersistent adds or updates the job of a _replicator document:
	// unchanged parameters on a pending or running job are a no-op, new
	// parameters restart it, a finished job runs again. It returns the
	// job id.
	AddPersistent(server, db, docID string, body json.RawMessage) (jobID string, err error)
	// AddInvalid records an invalid _replicator document as a failed job
	// with reason (replacing the job it had), and returns the job id.
	AddInvalid(server, db, docID string, body json.RawMessage, reason string) (jobID string, err error)
	// AddFromDoc records a document that carries terminal state st the
	// doc processor did not write as a finished job in that state that
	// never runs (replacing, and stopping, the job it had), with entry,
	// its _scheduler/docs fields read from the document (DocEntry), and
	// reason, its _replication_state_reason; it returns the job id.
	AddFromDoc(server, db, docID string, body json.RawMessage, st repjob.State, reason string, entry json.RawMessage) (jobID string, err error)
	// Remove removes a job; an error matching ErrJobNotFound when absent.
	Remove(jobID string) error
	// Get returns a job; an error matching ErrJobNotFound when absent.
	Get(jobID string) (*Job, error)
}
