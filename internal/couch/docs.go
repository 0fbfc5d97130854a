package couch

import (
	"context"
	"encoding/json"
)

// BulkGetRequest names one revision to fetch with BulkGet.
type BulkGetRequest struct {
	ID  string
	Rev string
	// AttsSince are revisions the target already has: attachments unchanged
	// since them come back as stubs instead of data.
	AttsSince []string
}

// Doc is one document revision read from the source, ready to be written to
// the target with new_edits=false.
type Doc struct {
	ID      string
	Rev     string
	Deleted bool
	// Body is the full document JSON including _id, _rev, _revisions and
	// _attachments (inline base64 "data", stubs, or "follows": true when
	// the data is in Attachments).
	Body json.RawMessage
	// HasAttachments reports that Body has a non-empty _attachments.
	HasAttachments bool
	// Attachments hold the data of attachments that arrived as separate
	// MIME parts (multipart/mixed open_revs), in the order of the
	// "follows": true stubs in Body. Empty when the data is inline.
	Attachments []Attachment
}

// Attachment is the data of one attachment sent outside the JSON body.
type Attachment struct {
	// Name is the attachment's name (its key in _attachments).
	Name string
	// ContentType is the attachment's MIME type.
	ContentType string
	// Encoding is the content encoding Data is in ("gzip"), empty for identity.
	Encoding string
	// Data is the attachment's bytes (as encoded by Encoding).
	Data []byte
}

// BulkGet fetches revisions with POST _bulk_get?revs=true&latest=true
// &attachments=true (attachment data inline as base64, stubs for those
// unchanged since AttsSince), calling fn for every document found. Results
// may come in any order and need not be one per request (PouchDB Server
// regroups them); revisions the server reports missing or failed are
// simply not delivered: compare what fn saw with reqs and fetch the rest
// with OpenRevs. An endpoint without _bulk_get gives an error matching
// ErrBulkGetUnsupported.
func (d *DB) BulkGet(ctx context.Context, reqs []BulkGetRequest, fn func(Doc) error) error {
	return errTODO
}

// OpenRevs fetches the given revisions of one document with
// GET /{db}/{id}?open_revs=[...]&revs=true&latest=true&attachments=true
// &atts_since=[...], accepting multipart/mixed (CouchDB; attachments as
// separate parts in Doc.Attachments) or a JSON array (PouchDB Server;
// attachments inline), chosen by the response's Content-Type. fn is called
// for each revision found; missing revisions are skipped. An unknown
// document gives an error matching ErrNotFound.
func (d *DB) OpenRevs(ctx context.Context, id string, revs []string, attsSince []string, fn func(Doc) error) error {
	return errTODO
}

// DocResult is one document's outcome in a _bulk_docs response.
type DocResult struct {
	ID  string `json:"id"`
	Rev string `json:"rev,omitempty"`
	// Error and Reason are CouchDB's per-document error ("forbidden",
	// "unauthorized", "conflict", ...); empty on success.
	Error  string `json:"error,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// BulkDocs writes docs (each a complete JSON document) with POST
// _bulk_docs. With newEdits false the revisions are stored as given
// (replication); the result then lists only the documents that failed
// (forbidden by a validate_doc_update function, unauthorized, ...). The
// request body is streamed from docs without copying them. A body over the
// server's limit gives an error matching ErrTooLarge: split the batch.
func (d *DB) BulkDocs(ctx context.Context, docs []json.RawMessage, newEdits bool) ([]DocResult, error) {
	return nil, errTODO
}

// PutDoc writes one revision with PUT /{db}/{id}?new_edits=false: as
// multipart/related when doc.Attachments is non-empty (JSON part, then one
// part per attachment, each with a filename as CouchDB's replicator sends
// it), as JSON otherwise. Errors match ErrForbidden, ErrUnauthorized,
// ErrTooLarge, ErrMissingStub (refetch the doc with attachment data), ...
func (d *DB) PutDoc(ctx context.Context, doc Doc) error {
	return errTODO
}
