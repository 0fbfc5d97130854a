package replicate

import (
	"context"
	"errors"

	"github.com/couchrep/couchrep/internal/couch"
)

// OpenEndpoints returns clients for p's source and target built exactly as
// a replication run builds its own (transport, TLS, proxies, sessions,
// retries, limits), for tools that read both sides without replicating
// (internal/verify). release closes their idle connections.
func OpenEndpoints(p Params, o Options) (src, tgt *couch.DB, release func(), err error) {
	r := New(p, o)
	if err := r.openDBs(); err != nil {
		return nil, nil, nil, err
	}
	return r.src, r.tgt, r.closeIdle, nil
}

// OpenError is the error a replication gives when the source or target
// (which) cannot be opened: ErrUnauthorized or ErrDBNotFound, naming it.
func OpenError(which string, db *couch.DB, err error) error { return openError(which, db, err) }

// ChangesOptions are the _changes options of a one-shot run of p from
// since: style=all_docs (main_only with winning_revs_only) and p's
// doc_ids, selector or named filter with its query_params.
func ChangesOptions(p Params, since couch.Seq) couch.ChangesOptions {
	q := p
	q.Continuous = false
	r := &Replication{p: q}
	var o couch.ChangesOptions
	r.changesOptions(&o, since)
	return o
}

// Copier replicates given changes with a replication's own worker: the
// target's _revs_diff, then exactly the missing revisions fetched from the
// source (attachments since the target's possible ancestors) and written
// with new_edits=false. A verify's repair uses it.
type Copier struct {
	r *Replication
}

// NewCopier opens p's endpoints for copying.
func NewCopier(p Params, o Options) (*Copier, error) {
	r := New(p, o)
	if err := r.openDBs(); err != nil {
		return nil, err
	}
	return &Copier{r: r}, nil
}

// Copy replicates what the target lacks of changes (each a document id
// and leaf revisions) and returns the counters of this call.
func (c *Copier) Copy(ctx context.Context, changes []couch.Change) (Stats, error) {
	before := c.r.ctr.snapshot()
	w := &worker{r: c.r}
	err := w.process(ctx, changes) // counts its stats when it returns
	w.stats = Stats{}
	err = errors.Join(err, w.flush(ctx))
	c.r.count(w.stats)
	after := c.r.ctr.snapshot()
	return Stats{
		RevisionsChecked:      after.RevisionsChecked - before.RevisionsChecked,
		MissingRevisionsFound: after.MissingRevisionsFound - before.MissingRevisionsFound,
		DocsRead:              after.DocsRead - before.DocsRead,
		DocsWritten:           after.DocsWritten - before.DocsWritten,
		DocWriteFailures:      after.DocWriteFailures - before.DocWriteFailures,
	}, err
}

// Close closes the copier's idle connections.
func (c *Copier) Close() { c.r.closeIdle() }
