package replicate

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
)

// MaxWriteFailures is how many of its last write failures a run keeps (and
// a job's record: internal/repjob).
const MaxWriteFailures = 100

// WriteFailure is one document revision the target refused to write, as
// the target gave it.
type WriteFailure struct {
	ID, Rev string
	// Status is the HTTP status (a _bulk_docs row's error mapped to the
	// status CouchDB answers it with); 0 when the replicator skipped the
	// document itself (an id longer than max_document_id_length).
	Status        int
	Error, Reason string
	At            time.Time
}

// failureLog is a run's last MaxWriteFailures write failures, newest last.
type failureLog struct {
	mu   sync.Mutex
	last []WriteFailure
}

func (l *failureLog) add(f WriteFailure) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.last) == MaxWriteFailures {
		copy(l.last, l.last[1:])
		l.last = l.last[:MaxWriteFailures-1]
	}
	l.last = append(l.last, f)
}

// list returns a copy, nil when empty.
func (l *failureLog) list() []WriteFailure {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.last)
}

// writeFailed records that the target refused d (a failure CouchDB counts
// and moves past): it is counted in st, logged and kept; with
// stop_on_write_failure it returns an error wrapping ErrDocWriteFailed
// that ends the job with the document's reason.
func (w *worker) writeFailed(st *Stats, f WriteFailure) error {
	st.DocWriteFailures++
	f.At = w.r.now()
	w.r.failures.add(f)
	w.r.log.Warn().Str("doc_id", f.ID).Str("rev", f.Rev).Int("status", f.Status).Str("error", f.Error).
		Str("reason", f.Reason).Msg("replication: target rejected document")
	if w.r.p.StopOnWriteFailure {
		return fmt.Errorf("%w: %s: %s (document %q revision %s, HTTP %d; stop_on_write_failure)",
			ErrDocWriteFailed, f.Error, f.Reason, f.ID, f.Rev, f.Status)
	}
	return nil
}

// failureOf describes err, the target's refusal of one document.
func failureOf(id, rev string, err error) WriteFailure {
	f := WriteFailure{ID: id, Rev: rev, Error: "error", Reason: err.Error()}
	var herr *couch.HTTPError
	if errors.As(err, &herr) {
		f.Status = herr.Status
		if herr.Reason != "" {
			f.Reason = herr.Reason
		}
		if herr.ErrorName != "" {
			f.Error = herr.ErrorName
		}
	}
	if f.Status == 0 {
		switch {
		case errors.Is(err, couch.ErrTooLarge):
			f.Status, f.Error = 413, "too_large"
		case errors.Is(err, couch.ErrForbidden):
			f.Status, f.Error = 403, "forbidden"
		case errors.Is(err, couch.ErrUnauthorized):
			f.Status, f.Error = 401, "unauthorized"
		}
	}
	return f
}

// rowStatus is the HTTP status CouchDB answers a single write with for a
// _bulk_docs row's error (chttpd:error_info).
func rowStatus(e string) int {
	switch e {
	case "forbidden":
		return 403
	case "unauthorized":
		return 401
	case "conflict":
		return 409
	case "too_large", "document_too_large":
		return 413
	case "bad_request", "doc_validation":
		return 400
	case "not_found":
		return 404
	default:
		return 500
	}
}

// idRev reads a JSON document's _id and _rev (for a document the target
// refused whole, a 413 of a batch of one).
func idRev(doc json.RawMessage) (id, rev string) {
	var d struct {
		ID  string `json:"_id"`
		Rev string `json:"_rev"`
	}
	_ = json.Unmarshal(doc, &d)
	return d.ID, d.Rev
}
