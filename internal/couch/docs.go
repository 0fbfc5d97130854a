package couch

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net"
	"net/http"
	"strconv"
	"strings"
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

// DocResult is one document's outcome in a _bulk_docs response.
type DocResult struct {
	ID  string `json:"id"`
	Rev string `json:"rev,omitempty"`
	// Error and Reason are CouchDB's per-document error ("forbidden",
	// "unauthorized", "conflict", ...); empty on success.
	Error  string `json:"error,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// BulkGet fetches revisions with POST _bulk_get?revs=true&latest=true
// &attachments=false&att_encoding_info=true, as CouchDB's replicator does:
// documents come with attachment stubs only (with their encodings), and
// the data of those the target lacks is streamed by PutDocStream. fn is
// called for every document found. Results
// may come in any order and need not be one per request (PouchDB Server
// regroups them); revisions the server reports missing or failed are
// simply not delivered: compare what fn saw with reqs and fetch the rest
// with OpenRevs. An endpoint without _bulk_get (any 400, 404, 405, 415 or
// 501 answer) gives an error matching ErrBulkGetUnsupported. The response
// is decoded as a stream, one document id at a time.
func (d *DB) BulkGet(ctx context.Context, reqs []BulkGetRequest, fn func(Doc) error) error {
	return d.bulkGet(ctx, reqs, "revs=true&latest=true&attachments=false&att_encoding_info=true", fn)
}

// BulkGetWithData is BulkGet with attachments=true: the data of the
// attachments added since each request's AttsSince comes inline (base64,
// decoded from any encoding), the others as stubs. For documents whose
// attachments are small; large ones are streamed (PutDocStream).
func (d *DB) BulkGetWithData(ctx context.Context, reqs []BulkGetRequest, fn func(Doc) error) error {
	return d.bulkGet(ctx, reqs, "revs=true&latest=true&attachments=true", fn)
}

func (d *DB) bulkGet(ctx context.Context, reqs []BulkGetRequest, query string, fn func(Doc) error) error {
	type item struct {
		ID        string   `json:"id"`
		Rev       string   `json:"rev,omitempty"`
		AttsSince []string `json:"atts_since,omitempty"`
	}
	items := make([]item, len(reqs))
	for i, r := range reqs {
		items[i] = item(r)
	}
	body, n, err := jsonBody(struct {
		Docs []item `json:"docs"`
	}{items})
	if err != nil {
		return err
	}
	r := &request{
		method: http.MethodPost, path: "_bulk_get", query: query,
		body: body, bodyLen: n, contentType: "application/json", accept: "application/json", compress: true,
	}
	resp, err := d.do(ctx, r)
	if err != nil {
		var he *HTTPError
		if errors.As(err, &he) {
			switch he.Status {
			case http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed,
				http.StatusUnsupportedMediaType, http.StatusNotImplemented:
				return fmt.Errorf("%w: %w", ErrBulkGetUnsupported, err)
			}
		}
		return err
	}
	defer drain(resp)
	if err := readBulkGet(newLimitedJSONStream(resp.Body, d.lim.MaxDocumentBytes, "_bulk_get result (one document's revisions)"), fn); err != nil {
		var ce callerError
		if errors.As(err, &ce) {
			return ce.err
		}
		return badResponse(r, d, err)
	}
	return nil
}

// callerError carries an error returned by a caller's callback through
// the response parsing, to be returned unwrapped.
type callerError struct{ err error }

func (e callerError) Error() string { return e.err.Error() }

func (e callerError) Unwrap() error { return e.err }

// deliver hands the document body to fn; fn's error comes back as
// callerError.
func deliver(body []byte, fn func(Doc) error) error {
	doc, err := newDoc(body)
	if err != nil {
		return err
	}
	if err := fn(doc); err != nil {
		return callerError{err}
	}
	return nil
}

// readBulkGet reads {"results":[{"id":…,"docs":[{"ok":doc}|{"error":…}|
// {"missing":…}|{}, …]}, …]} and calls fn for every "ok" document, whose
// Body is a slice of the stream's buffers (no copy).
func readBulkGet(js *jsonStream, fn func(Doc) error) error {
	if err := js.delim('{'); err != nil {
		return err
	}
	seen := false
	for first := true; ; first = false {
		k, ok, err := js.key(first)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if k != "results" {
			if _, err := js.value(); err != nil {
				return err
			}
			continue
		}
		seen = true
		if err := js.elements(func(res []byte) error { return bulkGetResult(res, fn) }); err != nil {
			return err
		}
	}
	if !seen {
		return errors.New(`no "results" in the answer`)
	}
	return nil
}

// bulkGetResult delivers the "ok" documents of one checked result object.
func bulkGetResult(res []byte, fn func(Doc) error) error {
	if len(res) == 0 || res[0] != '{' {
		return fmt.Errorf("result is not an object: %.100s", res)
	}
	return objectMembers(res, func(key, val []byte) error {
		if string(key) != `"docs"` || val[0] != '[' {
			return nil
		}
		return arrayElements(val, func(x []byte) error {
			if x[0] != '{' {
				return nil
			}
			return objectMembers(x, func(key, val []byte) error {
				if string(key) != `"ok"` || val[0] != '{' {
					return nil // {"error":...}, {"missing":...} (PouchDB) or {} (PouchDB, unknown doc)
				}
				return deliver(val, fn)
			})
		})
	})
}

// presence records whether a JSON value is a non-empty object or array
// without copying it.
type presence bool

func (p *presence) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	*p = presence(len(b) >= 2 && (b[0] == '{' || b[0] == '[') && len(bytes.TrimSpace(b[1:len(b)-1])) > 0)
	return nil
}

// newDoc reads the metadata of a document body (which it keeps, not
// copies). body must be valid JSON (it came through a json.Decoder); the
// top-level keys are scanned without decoding the rest of the document.
func newDoc(body json.RawMessage) (Doc, error) {
	var doc Doc
	doc.Body = body
	var revisions []byte
	b := body
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return Doc{}, fmt.Errorf("document is not an object: %.100s", body)
	}
	i++
	for {
		i = skipWS(b, i)
		if i >= len(b) {
			return Doc{}, fmt.Errorf("document truncated: %.100s", body)
		}
		if b[i] == '}' {
			break
		}
		if b[i] == ',' {
			i++
			continue
		}
		kEnd := skipValue(b, i)
		key := b[i:kEnd]
		i = skipWS(b, kEnd)
		if i >= len(b) || b[i] != ':' {
			return Doc{}, fmt.Errorf("document malformed: %.100s", body)
		}
		vStart := skipWS(b, i+1)
		i = skipValue(b, vStart)
		val := b[vStart:i]
		switch string(key) {
		case `"_id"`:
			var err error
			if doc.ID, err = unquote(val); err != nil {
				return Doc{}, fmt.Errorf("document _id: %w", err)
			}
		case `"_rev"`:
			var err error
			if doc.Rev, err = unquote(val); err != nil {
				return Doc{}, fmt.Errorf("document _rev: %w", err)
			}
		case `"_deleted"`:
			doc.Deleted = string(val) == "true"
		case `"_attachments"`:
			var p presence
			_ = p.UnmarshalJSON(val)
			doc.HasAttachments = bool(p)
		case `"_revisions"`:
			revisions = val
		}
	}
	if doc.ID == "" || doc.Rev == "" {
		return Doc{}, fmt.Errorf("document without _id or _rev: %.100s", body)
	}
	if revisions != nil {
		if err := checkRevisions(doc.ID, doc.Rev, revisions); err != nil {
			return Doc{}, err
		}
	}
	return doc, nil
}

// checkRevisions checks that a document's _revisions is its _rev's path:
// {"start": <generation of _rev>, "ids": [<hash of _rev>, ...ancestors]}
// with no more ids than the generation. A server that sends another
// history would make the target store a revision tree the source never had.
func checkRevisions(id, rev string, raw []byte) error {
	var r struct {
		Start *int64   `json:"start"`
		IDs   []string `json:"ids"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || r.Start == nil || len(r.IDs) == 0 {
		return fmt.Errorf("document %q: _revisions is not {\"start\": N, \"ids\": [...]}: %.100s", id, raw)
	}
	genStr, hash, ok := strings.Cut(rev, "-")
	gen, err := strconv.ParseInt(genStr, 10, 64)
	if !ok || err != nil || gen < 1 {
		return fmt.Errorf("document %q: invalid _rev %q", id, rev)
	}
	if *r.Start != gen || r.IDs[0] != hash || int64(len(r.IDs)) > gen {
		return fmt.Errorf("document %q: _revisions (start %d, %d ids, first %q) does not match _rev %q", id, *r.Start, len(r.IDs), r.IDs[0], rev)
	}
	return nil
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the index just past the JSON value starting at b[i]
// (valid JSON assumed).
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	default: // number, true, false, null
		for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\n' && b[i] != '\t' && b[i] != '\r' {
			i++
		}
		return i
	}
}

// skipString returns the index just past the string starting at b[i]
// (valid JSON assumed): it jumps from quote to quote (bytes.IndexByte)
// and counts the backslashes before each.
func skipString(b []byte, i int) int {
	i++
	for {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return len(b)
		}
		q := i + j
		k := q - 1
		for k >= i && b[k] == '\\' {
			k--
		}
		if (q-1-k)%2 == 0 {
			return q + 1
		}
		i = q + 1
	}
}

// maxURLLen keeps open_revs URLs under common proxy limits (CouchDB's
// replicator uses 7000 as well).
const maxURLLen = 7000

// OpenRevs fetches the given revisions of one document with
// GET /{db}/{id}?revs=true&latest=true&attachments=true&open_revs=[...]
// &atts_since=[...], accepting multipart/mixed (CouchDB; attachments as
// separate parts in Doc.Attachments) or a JSON array (PouchDB Server;
// attachments inline), chosen by the response's Content-Type. fn is called
// for each revision found; missing revisions are skipped. When the URL
// would exceed 7000 bytes the revisions are fetched in several requests
// and atts_since is shortened (costing only extra attachment bytes). An
// unknown document gives an error matching ErrNotFound.
func (d *DB) OpenRevs(ctx context.Context, id string, revs []string, attsSince []string, fn func(Doc) error) error {
	return d.openRevsQuery(ctx, id, revs, attsSince, "revs=true&latest=true&attachments=true", fn)
}

// OpenRevsStubs is OpenRevs without attachment data: the documents come
// with attachment stubs (attachments=false&att_encoding_info=true), for
// PutDocStream to send the data the target lacks.
func (d *DB) OpenRevsStubs(ctx context.Context, id string, revs []string, fn func(Doc) error) error {
	return d.openRevsQuery(ctx, id, revs, nil, "revs=true&latest=true&attachments=false&att_encoding_info=true", fn)
}

func (d *DB) openRevsQuery(ctx context.Context, id string, revs []string, attsSince []string, query string, fn func(Doc) error) error {
	path := escapeDocID(id)
	fixed := len(d.base) + len(path) + len("?"+query+"&open_revs=&atts_since=")
	// atts_since gets at most a third of the budget.
	var since string
	for n := len(attsSince); n > 0; n-- {
		b, err := json.Marshal(attsSince[:n])
		if err != nil {
			return fmt.Errorf("couch: encoding atts_since: %w", err)
		}
		if s := urlQueryEscape(b); len(s) <= (maxURLLen-fixed)/3 {
			since = s
			break
		}
	}
	budget := maxURLLen - fixed - len(since)
	for len(revs) > 0 {
		n := len(revs)
		var open string
		for ; n > 0; n = min(n-1, n*3/4) {
			b, err := json.Marshal(revs[:n])
			if err != nil {
				return fmt.Errorf("couch: encoding open_revs: %w", err)
			}
			if open = urlQueryEscape(b); len(open) <= budget || n == 1 {
				break
			}
		}
		n = max(n, 1)
		q := query + "&open_revs=" + open
		if since != "" {
			q += "&atts_since=" + since
		}
		if err := d.openRevs(ctx, &request{method: http.MethodGet, path: path, query: q, accept: "multipart/mixed"}, fn); err != nil {
			return err
		}
		revs = revs[n:]
	}
	return nil
}

func urlQueryEscape(b []byte) string {
	var sb strings.Builder
	for _, c := range b {
		if unreserved(c) || c == ',' || c == ':' {
			sb.WriteByte(c)
		} else {
			sb.WriteString("%" + strings.ToUpper(hex.EncodeToString([]byte{c})))
		}
	}
	return sb.String()
}

// openRevs sends one open_revs request. A request request_timeout ends is
// sent again only while fn has not been handed a revision yet.
func (d *DB) openRevs(ctx context.Context, r *request, fn func(Doc) error) error {
	return d.doRead(ctx, r, func(resp *http.Response) error {
		defer drain(resp)
		delivered := false
		body, err := wholeBody(resp, d.lim.MaxBodyBytes, "open_revs response")
		if err == nil {
			err = readOpenRevs(resp.Header.Get("Content-Type"), body, d.lim.MaxDocumentBytes, func(doc Doc) error {
				delivered = true
				return fn(doc)
			})
		}
		var ce callerError
		if errors.As(err, &ce) {
			return finalError{ce.err}
		}
		if err != nil {
			err = badResponse(r, d, err)
			if delivered {
				return finalError{err}
			}
			return err
		}
		return nil
	})
}

// readOpenRevs reads an open_revs answer of the given content type: a
// JSON array of {"ok": doc} / {"missing": rev}, or multipart/mixed with one
// part per revision (a JSON document, or a multipart/related document with
// its attachments). Documents are at most maxDoc bytes each. fn's errors
// come back as callerError.
func readOpenRevs(contentType string, body io.Reader, maxDoc int64, fn func(Doc) error) error {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil || !strings.HasPrefix(mt, "multipart/") {
		// JSON: CouchDB with Accept: application/json, PouchDB Server always
		// (as text/plain).
		js := newLimitedJSONStream(body, maxDoc, "open_revs document")
		err := js.elements(func(elem []byte) error {
			if elem[0] != '{' {
				return fmt.Errorf("open_revs element is not an object: %.100s", elem)
			}
			var ok []byte
			if err := objectMembers(elem, func(key, val []byte) error {
				if string(key) == `"ok"` {
					ok = val
				}
				return nil
			}); err != nil {
				return err
			}
			if ok == nil {
				return nil // {"missing": rev}
			}
			return deliver(ok, fn)
		})
		if err != nil {
			return err
		}
		if _, err := js.peek(); err != io.ErrUnexpectedEOF {
			if err == nil {
				err = errors.New("data after the open_revs array")
			}
			return err
		}
		return nil
	}
	if params["boundary"] == "" {
		return errors.New("multipart answer without boundary")
	}
	mr := multipart.NewReader(body, params["boundary"])
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		doc, ok, err := readRevPart(part, maxDoc)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if err := fn(doc); err != nil {
			return callerError{err}
		}
	}
}

// readRevPart reads one part of an open_revs multipart/mixed answer: a
// JSON document, a {"missing": rev} marker (ok false), or a
// multipart/related document with its attachments.
func readRevPart(part *multipart.Part, maxDoc int64) (Doc, bool, error) {
	defer part.Close()
	mt, params, err := mime.ParseMediaType(part.Header.Get("Content-Type"))
	if err != nil {
		return Doc{}, false, fmt.Errorf("part content type: %w", err)
	}
	if mt != "multipart/related" {
		b, err := io.ReadAll(&limitedBody{r: part, left: maxDoc, limit: maxDoc, what: "document"})
		if err != nil {
			return Doc{}, false, err
		}
		var probe struct {
			ID      string          `json:"_id"`
			Missing json.RawMessage `json:"missing"`
		}
		if err := json.Unmarshal(b, &probe); err != nil {
			return Doc{}, false, fmt.Errorf("document part: %w", err)
		}
		if probe.ID == "" && (probe.Missing != nil || params["error"] == "true") {
			return Doc{}, false, nil // {"missing": rev}
		}
		doc, err := newDoc(b)
		return doc, err == nil, err
	}
	mr := multipart.NewReader(part, params["boundary"])
	first, err := mr.NextPart()
	if err != nil {
		return Doc{}, false, fmt.Errorf("multipart/related document: %w", err)
	}
	b, err := io.ReadAll(&limitedBody{r: first, left: maxDoc, limit: maxDoc, what: "document"})
	if err != nil {
		return Doc{}, false, err
	}
	if !json.Valid(b) {
		return Doc{}, false, fmt.Errorf("multipart/related document part is not valid JSON: %.100s", b)
	}
	doc, err := newDoc(b)
	if err != nil {
		return Doc{}, false, err
	}
	follows, err := followsStubs(b)
	if err != nil {
		return Doc{}, false, err
	}
	for i := 0; ; i++ {
		ap, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return Doc{}, false, fmt.Errorf("attachment part: %w", err)
		}
		data, err := io.ReadAll(ap)
		if err != nil {
			return Doc{}, false, fmt.Errorf("attachment part: %w", err)
		}
		att := Attachment{
			Name:        ap.FileName(),
			ContentType: ap.Header.Get("Content-Type"),
			Encoding:    ap.Header.Get("Content-Encoding"),
			Data:        data,
		}
		if i < len(follows) {
			f := follows[i]
			if att.Name == "" {
				att.Name = f.name
			}
			if f.contentType != "" {
				att.ContentType = f.contentType
			}
			if att.Encoding == "" {
				att.Encoding = f.encoding
			}
		}
		if att.Name == "" {
			return Doc{}, false, fmt.Errorf("attachment part %d of %s has no name", i, doc.ID)
		}
		doc.Attachments = append(doc.Attachments, att)
	}
	if len(doc.Attachments) != len(follows) {
		return Doc{}, false, fmt.Errorf("document %s: %d attachment parts for %d \"follows\" stubs", doc.ID, len(doc.Attachments), len(follows))
	}
	return doc, true, nil
}

type followStub struct{ name, contentType, encoding string }

// followsStubs lists the attachments marked "follows": true, in the
// order they appear in the JSON (the order of the MIME parts).
func followsStubs(body []byte) ([]followStub, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := seekObject(dec, "_attachments"); err != nil {
		return nil, nil // no attachments
	}
	var out []followStub
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, _ := tok.(string)
		var a struct {
			Follows     bool   `json:"follows"`
			ContentType string `json:"content_type"`
			Encoding    string `json:"encoding"`
		}
		if err := dec.Decode(&a); err != nil {
			return nil, err
		}
		if a.Follows {
			out = append(out, followStub{name, a.ContentType, a.Encoding})
		}
	}
	return out, nil
}

func seekObject(dec *json.Decoder, key string) error {
	if err := expectDelim(dec, '{'); err != nil {
		return err
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		if tok == key {
			return expectDelim(dec, '{')
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return err
		}
	}
	return fmt.Errorf("no %q", key)
}

// BulkDocs writes docs (each a complete JSON document) with POST
// _bulk_docs. With newEdits false the revisions are stored as given
// (replication); the result then lists only the documents that failed
// (forbidden by a validate_doc_update function, unauthorized, ...). The
// request body is streamed from docs without copying them. A body over the
// server's limit gives an error matching ErrTooLarge: split the batch.
func (d *DB) BulkDocs(ctx context.Context, docs []json.RawMessage, newEdits bool) ([]DocResult, error) {
	head := []byte(`{"new_edits":false,"docs":[`)
	if newEdits {
		head = []byte(`{"new_edits":true,"docs":[`)
	}
	pieces := make([][]byte, 0, 2*len(docs)+1)
	pieces = append(pieces, head)
	var n int64 = int64(len(head))
	for i, doc := range docs {
		if i > 0 {
			pieces = append(pieces, comma)
			n++
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			return nil, fmt.Errorf("couch: _bulk_docs: document %d is empty", i)
		}
		pieces = append(pieces, doc)
		n += int64(len(doc))
	}
	pieces = append(pieces, tail)
	n += int64(len(tail))
	r := &request{
		method: http.MethodPost, path: "_bulk_docs", contentType: "application/json", bodyLen: n,
		body: buffersBody(pieces), compress: true,
		okStatus: func(code int) bool { return code == http.StatusExpectationFailed },
	}
	return getJSON[[]DocResult](ctx, d, r, d.lim.MaxBodyBytes, "response body")
}

var (
	comma = []byte(",")
	tail  = []byte("]}")
)

// buffersBody returns a body function that reads the pieces in order,
// without copying them, afresh for every attempt.
func buffersBody(pieces [][]byte) func() io.Reader {
	return func() io.Reader {
		b := make(net.Buffers, len(pieces))
		copy(b, pieces)
		return &b
	}
}

// PutDoc writes one revision with PUT /{db}/{id}?new_edits=false: as
// multipart/related when doc.Attachments is non-empty (JSON part, then one
// part per attachment, each with a filename as CouchDB's replicator sends
// it; Body's stubs for them must say "follows": true), as JSON otherwise.
// Errors match ErrForbidden, ErrUnauthorized, ErrTooLarge, ErrMissingStub
// (refetch the doc with attachment data), ...
func (d *DB) PutDoc(ctx context.Context, doc Doc) error {
	return d.putDoc(ctx, doc, false)
}

// PutDocOnce is PutDoc in one attempt: a stall, a timeout, a lost
// connection or a 5xx is returned at once instead of being retried, for a
// caller that has another way to write the document.
func (d *DB) PutDocOnce(ctx context.Context, doc Doc) error {
	return d.putDoc(ctx, doc, true)
}

func (d *DB) putDoc(ctx context.Context, doc Doc, once bool) error {
	if len(doc.Attachments) == 0 {
		return d.putJSON(ctx, doc.ID, doc.Body, once)
	}
	r := &request{method: http.MethodPut, path: escapeDocID(doc.ID), query: "new_edits=false", noRetry: once}
	boundary := newBoundary()
	pieces := make([][]byte, 0, 3+2*len(doc.Attachments))
	pieces = append(pieces, jsonPartHead(boundary), doc.Body)
	for _, a := range doc.Attachments {
		pieces = append(pieces, attachmentPartHead(boundary, a.Name, a.ContentType, a.Encoding, int64(len(a.Data))), a.Data)
	}
	pieces = append(pieces, multipartEnd(boundary))
	var n int64
	for _, p := range pieces {
		n += int64(len(p))
	}
	r.body, r.bodyLen = buffersBody(pieces), n
	r.contentType = mime.FormatMediaType("multipart/related", map[string]string{"boundary": boundary})
	resp, err := d.do(ctx, r)
	if err != nil {
		return err
	}
	drain(resp) // CouchDB: {"ok":true,"id","rev"}; PouchDB Server: [] — neither is needed
	return nil
}

// putJSON writes one revision with PUT /{db}/{id}?new_edits=false and a
// JSON body (attachments inline or stubs); once sends it in one attempt.
func (d *DB) putJSON(ctx context.Context, id string, body []byte, once bool) error {
	r := &request{method: http.MethodPut, path: escapeDocID(id), query: "new_edits=false", contentType: "application/json", noRetry: once}
	r.body, r.bodyLen = bytesBody(body)
	resp, err := d.do(ctx, r)
	if err != nil {
		return err
	}
	drain(resp)
	return nil
}
