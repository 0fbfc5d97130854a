package docproc

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"

	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
)

// Action is what the doc processor does for one document change.
type Action int

// Actions Decide returns.
const (
	// ActionSkip leaves the job (if any) alone.
	ActionSkip Action = iota
	// ActionAdd adds the document's job, or updates it with new parameters
	// (AddPersistent: new parameters restart it, a finished job runs again).
	ActionAdd
	// ActionRemove removes the document's job (the document was deleted).
	ActionRemove
	// ActionFail marks an invalid document failed (writing the reason back)
	// and removes the job an earlier version of it had.
	ActionFail
	// ActionRecord records the terminal state a document carries that the
	// doc processor did not write (another replicator did, or the user
	// edited it keeping that state): nothing runs and nothing is written
	// to the document, as CouchDB ignores such a document; the job an
	// earlier version had is replaced by a finished one in that state, so
	// that _scheduler/docs shows it as read from the document (DocEntry).
	ActionRecord
)

// String returns the action's name, for logs.
func (a Action) String() string {
	switch a {
	case ActionSkip:
		return "skip"
	case ActionAdd:
		return "add"
	case ActionRemove:
		return "remove"
	case ActionFail:
		return "fail"
	case ActionRecord:
		return "record"
	}
	return "unknown"
}

// Doc is one document change read from a _replicator database.
type Doc struct {
	// ID is the document id.
	ID string
	// Rev is the revision read (empty for a deletion).
	Rev string
	// Deleted reports a deleted document; Body is then ignored.
	Deleted bool
	// Body is the document's JSON.
	Body json.RawMessage
}

// Known is what the store remembers about a document: its record and, when
// the record names a job, that job's state ("" when the job is absent).
type Known struct {
	// Record is the stored record, nil for a document never seen.
	Record *DocRecord
	// JobState is the state of Record.JobID, zero when there is no such
	// job.
	JobState repjob.State
}

// Decision is Decide's answer.
type Decision struct {
	Action Action
	// Why explains the action, for logs (a skip's reason, a failure's
	// reason as written to the document).
	Why string
	// Body is the replication body to add: the document without its
	// "_"-prefixed fields (ActionAdd).
	Body json.RawMessage
	// Fingerprint identifies the replication-relevant fields (every field
	// not starting with "_"); empty for a deletion or a skipped design or
	// local document.
	Fingerprint string
	// State is the terminal state the document carries (ActionRecord),
	// Entry its _scheduler/docs fields and Reason its failure's reason
	// (DocEntry).
	State  repjob.State
	Entry  json.RawMessage
	Reason string
}

// Skip reasons, as logged.
const (
	whyDesign     = "design or local document"
	whyDeleted    = "document deleted"
	whyTerminal   = "terminal state already written for these parameters"
	whyForeign    = "terminal state written by someone else: not run"
	whyKept       = "edited keeping its terminal state: not run"
	whyMarked     = "terminal state written while its job runs: job stopped"
	whyUnchanged  = "parameters unchanged"
	whyWriteBack  = "job finished, terminal state not yet written"
	whyNew        = "new document"
	whyEdited     = "parameters changed"
	whyRerun      = "terminal state removed: run again"
	whyJobMissing = "job missing"
)

// Decide decides what to do with one document change, as CouchDB's doc
// processor does:
//
//   - _design/ and _local/ documents are skipped;
//   - a deleted document removes its job;
//   - a document carrying _replication_state "completed" or "failed" never
//     runs, as in CouchDB (couch_replicator_doc_processor:process_change):
//     the doc processor's own write is skipped; a state written by
//     someone else (CouchDB's replicator before a takeover, a user), an
//     edit that keeps the state (even with new parameters) or a state
//     written while the job runs is recorded from the document
//     (ActionRecord), stopping the job an earlier version had;
//   - an invalid document fails with ParseParams' reason;
//   - a new document, or one whose parameters changed, adds its job; an
//     unchanged one is left alone, unless its terminal state had been
//     written and the user removed it (run again).
func Decide(doc Doc, known Known) Decision {
	if strings.HasPrefix(doc.ID, "_design/") || strings.HasPrefix(doc.ID, "_local/") {
		return Decision{Action: ActionSkip, Why: whyDesign}
	}
	if doc.Deleted {
		if known.Record == nil || known.Record.JobID == "" {
			return Decision{Action: ActionSkip, Why: whyDeleted}
		}
		return Decision{Action: ActionRemove, Why: whyDeleted}
	}
	body, state, err := ReplicationBody(doc.Body)
	if err != nil {
		return Decision{Action: ActionFail, Why: err.Error(), Fingerprint: Fingerprint(doc.Body)}
	}
	fp := Fingerprint(body)
	rec := known.Record
	same := rec != nil && rec.Fingerprint == fp
	if state.Terminal() {
		// The doc processor's own write (its record says written, or the
		// job's terminal state is being written) for these parameters.
		if same && (rec.Written || known.JobState.Terminal()) {
			return Decision{Action: ActionSkip, Why: whyTerminal, Fingerprint: fp}
		}
		why := whyForeign
		switch {
		case rec != nil && !same:
			why = whyKept
		case rec != nil && known.JobState != 0:
			why = whyMarked
		}
		entry, reason := DocEntry(doc.Body, state)
		return Decision{Action: ActionRecord, Why: why, Body: body, Fingerprint: fp, State: state, Entry: entry, Reason: reason}
	}
	if _, err := replicate.ParseParams(body); err != nil {
		return Decision{Action: ActionFail, Why: InvalidReason(err), Fingerprint: fp}
	}
	why := whyNew
	if rec != nil {
		why = whyEdited
	}
	if same {
		switch {
		case known.JobState == 0:
			why = whyJobMissing
		case known.JobState.Terminal():
			if !rec.Written {
				return Decision{Action: ActionSkip, Why: whyWriteBack, Fingerprint: fp}
			}
			why = whyRerun
		default:
			return Decision{Action: ActionSkip, Why: whyUnchanged, Fingerprint: fp}
		}
	}
	return Decision{Action: ActionAdd, Why: why, Body: body, Fingerprint: fp}
}

// InvalidReason is the reason written to an invalid document: the text of
// ParseParams' error, which names the field, without the Go error prefix.
func InvalidReason(err error) string {
	var pe *replicate.ParamError
	if errors.As(err, &pe) && pe.Reason != "" {
		return pe.Reason
	}
	return strings.TrimPrefix(err.Error(), replicate.ErrInvalidParams.Error()+": ")
}

// errNotObject is the reason for a document that is not a JSON object.
var errNotObject = errors.New("replication document must be a JSON object")

// ReplicationBody returns the replication-relevant part of a document (its
// fields not starting with "_", compacted, keys sorted) and the state its
// _replication_state names (zero when absent or not a replication state,
// such as CouchDB 1.x's "triggered").
func ReplicationBody(doc json.RawMessage) (body json.RawMessage, state repjob.State, err error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(doc, &fields); err != nil || fields == nil {
		return nil, 0, errNotObject
	}
	if raw, ok := fields["_replication_state"]; ok {
		_ = json.Unmarshal(raw, &state)
	}
	for k, v := range fields {
		if strings.HasPrefix(k, "_") {
			delete(fields, k)
			continue
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, v); err == nil {
			fields[k] = buf.Bytes()
		}
	}
	body, err = json.Marshal(fields) // map keys are sorted: a canonical form
	if err != nil {
		return nil, 0, errNotObject
	}
	return body, state, nil
}

// Fingerprint is a digest of a replication body (as ReplicationBody returns
// it), stored to recognise a document whose parameters did not change.
func Fingerprint(body json.RawMessage) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:16])
}

// IsReplicatorDB reports whether a database is a _replicator database:
// named "_replicator" or ending in "/_replicator".
func IsReplicatorDB(name string) bool {
	return name == "_replicator" || strings.HasSuffix(name, "/_replicator")
}
