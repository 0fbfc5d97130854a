package jobqueue

import "errors"

// Sentinel errors callers branch on. Returned errors wrap them with the job
// type and id.
var (
	// ErrNotFound means the job (or, from Accept without waiting, any
	// eligible pending job) does not exist.
	ErrNotFound = errors.New("jobqueue: not found")
	// ErrOverShare is returned by AcceptMany when jobs are pending but
	// the worker holds its share of them already (AcceptOptions.Share):
	// the other workers are to take them.
	ErrOverShare = errors.New("jobqueue: pending jobs are other workers' share")
	// ErrExists is returned by Add for an id already in use, unless
	// AddOptions.Replace is set.
	ErrExists = errors.New("jobqueue: job already exists")
	// ErrWorkerConflict means the caller no longer holds the job's worker
	// lock: the activity monitor re-enqueued it, another worker holds it, or
	// it was replaced. The caller must stop running the job and must not
	// write anything for it.
	ErrWorkerConflict = errors.New("jobqueue: worker conflict")
	// ErrCanceled means a user canceled or removed the running job; the
	// worker must stop running it.
	ErrCanceled = errors.New("jobqueue: job canceled")
	// ErrUnknownType means the job type was never registered with
	// SetTypeTimeout.
	ErrUnknownType = errors.New("jobqueue: unknown job type")
	// ErrInvalidID means a job id is empty or longer than MaxIDLength bytes
	// (or a type name is empty or too long).
	ErrInvalidID = errors.New("jobqueue: invalid job id")
	// ErrCorrupt means a stored record could not be decoded. The record is
	// left in place (never silently dropped) for an operator to inspect,
	// replace or remove.
	ErrCorrupt = errors.New("jobqueue: corrupt job record")
)

// ErrRunning is returned (wrapped) for a change only a job's worker may
// make while it runs (its payload).
var ErrRunning = errors.New("jobqueue: job running")
