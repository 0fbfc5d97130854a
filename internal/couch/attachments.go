package couch

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/couchrep/couchrep/internal/pause"
)

// Attachments are streamed, never held whole: a document's metadata comes
// with stubs (BulkGet, OpenRevsStubs: attachments=false,
// att_encoding_info=true), and PutDocStream writes it as multipart/related
// with one part per attachment the target lacks, each part's bytes copied
// from GET /{db}/{doc}/{att}?rev= on the source as they arrive. An
// attachment the source stores encoded (gzip) is asked for and written
// encoded, so the target keeps its encoding and the bytes cross the
// network compressed. Memory per attachment in flight is a copy buffer;
// the limit on an attachment's body is the length its stub declares
// (encoded_length when encoded), not Limits.MaxBodyBytes, and a body that
// runs past it, ends short or does not match its digest fails the write
// before the target has the whole request (ErrAttachmentMismatch).

var (
	// ErrAttachmentMismatch: an attachment's bytes from the source do not
	// match its stub (more or fewer bytes than its length, another
	// encoding, another md5 digest). The document is not written.
	ErrAttachmentMismatch = errors.New("couch: attachment does not match its stub")
	// ErrAttachmentDecoded: the source answered the GET of an attachment
	// it stores encoded with its decoded bytes (it ignores
	// Accept-Encoding). It matches ErrAttachmentMismatch; write the
	// document again with the Decoded stubs.
	ErrAttachmentDecoded = fmt.Errorf("%w: sent decoded", ErrAttachmentMismatch)
)

// AttachmentSourceError is a PutDocStream that failed on the source's
// side: an attachment could not be opened or read, or did not match its
// stub (Err matches ErrAttachmentMismatch then). The target stored nothing.
type AttachmentSourceError struct {
	DocID string
	Err   error
}

func (e *AttachmentSourceError) Error() string {
	return fmt.Sprintf("couch: reading the attachments of %q from the source: %v", e.DocID, e.Err)
}

func (e *AttachmentSourceError) Unwrap() error { return e.Err }

// AttachmentStub is one entry of a document's _attachments, as a stub.
type AttachmentStub struct {
	// Name is the attachment's name (its key in _attachments).
	Name        string
	ContentType string
	// Digest is CouchDB's "md5-<base64>" of the stored (encoded) bytes;
	// empty when the server gave none.
	Digest string
	// Length is the identity length; EncodedLength the stored length when
	// Encoding is set (gzip). -1 when the stub does not say (a server
	// whose stubs lack them cannot have its attachments streamed: Sized).
	Length        int64
	Encoding      string
	EncodedLength int64
	// RevPos is the generation of the revision that added the attachment.
	RevPos int64
	// Inline reports that the stub carries the data ("data"), Follows that
	// the data is a separate MIME part.
	Inline, Follows bool
}

// wireLength is the number of bytes the attachment's data takes when sent
// as stored: encoded_length for an encoded attachment, length otherwise.
func (a AttachmentStub) wireLength() int64 {
	if a.encoded() {
		return a.EncodedLength
	}
	return a.Length
}

func (a AttachmentStub) encoded() bool { return a.Encoding != "" && a.Encoding != "identity" }

// Sized reports whether the stub says how many bytes its data has.
func (a AttachmentStub) Sized() bool { return a.wireLength() >= 0 }

// Decoded is the stub of the attachment's identity bytes: for a source
// that answers an encoded attachment's GET with its decoded bytes. The
// digest of those is not known (the target computes its own).
func (a AttachmentStub) Decoded() AttachmentStub {
	if !a.encoded() {
		return a
	}
	a.Encoding, a.EncodedLength, a.Digest = "", 0, ""
	return a
}

// Stubs lists the document's attachments in the order of its JSON.
func (d Doc) Stubs() ([]AttachmentStub, error) {
	if !d.HasAttachments {
		return nil, nil
	}
	var atts []byte
	if err := objectMembers(d.Body, func(key, val []byte) error {
		if string(key) == `"_attachments"` {
			atts = val
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if len(atts) == 0 || atts[0] != '{' {
		return nil, fmt.Errorf("document %q: _attachments is not an object", d.ID)
	}
	var out []AttachmentStub
	err := objectMembers(atts, func(key, val []byte) error {
		name, err := unquote(key)
		if err != nil {
			return err
		}
		var a struct {
			ContentType   string          `json:"content_type"`
			Digest        string          `json:"digest"`
			Length        *int64          `json:"length"`
			Encoding      string          `json:"encoding"`
			EncodedLength *int64          `json:"encoded_length"`
			RevPos        int64           `json:"revpos"`
			Data          json.RawMessage `json:"data"`
			Follows       bool            `json:"follows"`
		}
		if err := json.Unmarshal(val, &a); err != nil {
			return fmt.Errorf("document %q: attachment %q: %w", d.ID, name, err)
		}
		s := AttachmentStub{
			Name: name, ContentType: a.ContentType, Digest: a.Digest, Encoding: a.Encoding,
			RevPos: a.RevPos, Inline: a.Data != nil, Follows: a.Follows,
		}
		if a.Length != nil {
			s.Length = *a.Length
		}
		if a.EncodedLength != nil {
			s.EncodedLength = *a.EncodedLength
		}
		if a.Length == nil || s.Length < 0 {
			s.Length = -1
		}
		if s.encoded() && (a.EncodedLength == nil || s.EncodedLength < 0) {
			s.EncodedLength = -1
		}
		out = append(out, s)
		return nil
	})
	return out, err
}

// AncestorPos is CouchDB's atts_since rule: the generation of the most
// recent revision of the document's own history (its _revisions) that is
// one of possibleAncestors (revisions the target has), 0 when none is.
// Attachments with a revpos above it must be sent with their data; the
// others the target has.
func (d Doc) AncestorPos(possibleAncestors []string) int64 {
	if len(possibleAncestors) == 0 {
		return 0
	}
	var revs struct {
		Start int64    `json:"start"`
		IDs   []string `json:"ids"`
	}
	var raw []byte
	_ = objectMembers(d.Body, func(key, val []byte) error {
		if string(key) == `"_revisions"` {
			raw = val
		}
		return nil
	})
	if raw == nil || json.Unmarshal(raw, &revs) != nil {
		return 0
	}
	have := make(map[string]bool, len(possibleAncestors))
	for _, r := range possibleAncestors {
		have[r] = true
	}
	for i, id := range revs.IDs {
		pos := revs.Start - int64(i)
		if pos < 1 {
			break
		}
		if have[strconv.FormatInt(pos, 10)+"-"+id] {
			return pos
		}
	}
	return 0
}

// FollowsBody is the document's JSON for a multipart write, its
// _attachments made from stubs (d's, from Stubs, possibly Decoded): those
// named in send become {"follows": true} stubs (their data to come as
// parts, in the order of the returned list), the others plain stubs the
// target must already have. Every other member is kept as is.
func (d Doc) FollowsBody(stubs []AttachmentStub, send map[string]bool) ([]byte, []AttachmentStub, error) {
	var parts []AttachmentStub
	body, err := d.withAttachments(stubs, func(s AttachmentStub, m map[string]any) {
		if s.Digest != "" {
			m["digest"] = s.Digest
		}
		if s.encoded() {
			m["encoding"] = s.Encoding
			m["encoded_length"] = s.EncodedLength
		}
		if send[s.Name] {
			m["follows"] = true
			parts = append(parts, s)
		} else {
			m["stub"] = true
		}
	})
	if err != nil {
		return nil, nil, err
	}
	return body, parts, nil
}

// InlineBody is the document's JSON with the data of its attachments
// inline: data[name] are an attachment's identity (decoded) bytes, sent
// base64 as "data" (the target computes their digest, and may store them
// encoded as it likes); an attachment without data stays a stub the
// target must have. For a JSON write of a document whose multipart write
// stalled or was refused. Every other member is kept as is.
func (d Doc) InlineBody(stubs []AttachmentStub, data map[string][]byte) ([]byte, error) {
	return d.withAttachments(stubs, func(s AttachmentStub, m map[string]any) {
		b, ok := data[s.Name]
		if !ok {
			if s.Digest != "" {
				m["digest"] = s.Digest
			}
			if s.encoded() {
				m["encoding"] = s.Encoding
				m["encoded_length"] = s.EncodedLength
			}
			m["stub"] = true
			return
		}
		delete(m, "length")
		m["data"] = b // []byte: base64 in JSON
	})
}

// InlinedBody is InlineBody for a document whose attachments came as
// parts (Attachments, the "follows" stubs of Body): their data decoded
// (gzip) and inline, the other stubs kept. ok is false when the decoded
// data would exceed max bytes.
func (d Doc) InlinedBody(max int64) (body []byte, ok bool, err error) {
	stubs, err := d.Stubs()
	if err != nil {
		return nil, false, err
	}
	data := make(map[string][]byte, len(d.Attachments))
	left := max
	for _, a := range d.Attachments {
		b := a.Data
		switch a.Encoding {
		case "", "identity":
		case "gzip":
			zr, err := gzip.NewReader(bytes.NewReader(a.Data))
			if err != nil {
				return nil, false, fmt.Errorf("document %q: attachment %q: %w", d.ID, a.Name, err)
			}
			if b, err = io.ReadAll(io.LimitReader(zr, left+1)); err != nil {
				return nil, false, fmt.Errorf("document %q: attachment %q: %w", d.ID, a.Name, err)
			}
		default:
			return nil, false, nil // an encoding this cannot decode: multipart only
		}
		if left -= int64(len(b)); left < 0 {
			return nil, false, nil
		}
		data[a.Name] = b
	}
	body, err = d.InlineBody(stubs, data)
	return body, err == nil, err
}

// withAttachments is d's JSON with _attachments made from stubs, each
// entry its content_type, revpos and length plus what set adds.
func (d Doc) withAttachments(stubs []AttachmentStub, set func(AttachmentStub, map[string]any)) ([]byte, error) {
	var buf bytes.Buffer
	buf.Grow(len(d.Body))
	buf.WriteByte('{')
	first := true
	err := objectMembers(d.Body, func(key, val []byte) error {
		if !first {
			buf.WriteByte(',')
		}
		first = false
		buf.Write(key)
		buf.WriteByte(':')
		if string(key) != `"_attachments"` {
			buf.Write(val)
			return nil
		}
		buf.WriteByte('{')
		for i, s := range stubs {
			if i > 0 {
				buf.WriteByte(',')
			}
			name, _ := json.Marshal(s.Name)
			buf.Write(name)
			buf.WriteByte(':')
			m := map[string]any{"content_type": s.ContentType, "revpos": s.RevPos, "length": s.Length}
			set(s, m)
			b, err := json.Marshal(m)
			if err != nil {
				return err
			}
			buf.Write(b)
		}
		buf.WriteByte('}')
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("document %q: %w", d.ID, err)
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// GetAttachment opens GET /{db}/{doc}/{name}?rev=rev as a stream: the
// stored (encoded) bytes when encoded is set, identity bytes otherwise.
// The caller reads and closes it; its reads are under the read deadline
// (connection_timeout) like every response's. Opening is retried as any
// request is; a body cut short is the caller's to retry.
func (d *DB) GetAttachment(ctx context.Context, docID, name, rev string, encoded bool) (*http.Response, error) {
	enc := "identity"
	if encoded {
		enc = "gzip"
	}
	r := &request{
		method: http.MethodGet, path: escapeDocID(docID) + "/" + escapeStrict(name),
		query: encodeQuery("rev", rev), accept: "*/*", acceptEncoding: enc,
	}
	return d.do(ctx, r)
}

// StreamAttachment is one attachment part of PutDocStream: its stub (the
// bytes it must have) and how to open its bytes, called afresh for every
// attempt of the write.
type StreamAttachment struct {
	AttachmentStub
	Open func(ctx context.Context) (io.ReadCloser, error)
}

// smallAttachments is the most attachment data PutDocStream reads whole
// before sending the request: below it a document's attachments are
// fetched and checked first (a source that lies costs the target nothing,
// and a retried write does not read the source again); above it they are
// streamed.
const smallAttachments = 1 << 20

// PutDocStream writes one revision with PUT /{db}/{id}?new_edits=false as
// multipart/related: body (a FollowsBody) then one part per attachment, in
// the order of atts. Attachments of at most 1 MiB together are read and
// checked before the request is sent; larger ones are copied from their
// Open streams as the request is sent, and a retried attempt opens them
// again. The request's Content-Length is computed from the stubs; a
// source whose bytes are more or fewer than its stub's length, or whose
// md5 differs from its digest, fails the write with an
// *AttachmentSourceError matching ErrAttachmentMismatch (a streamed
// request is ended before its last byte: the target stores nothing).
// Other errors match ErrForbidden, ErrUnauthorized, ErrTooLarge,
// ErrMissingStub, ... as PutDoc's.
//
// With no attachment to send (every one a stub the target has) the body
// goes as JSON: CouchDB (3.4.3) never answers a multipart/related PUT
// whose only part is the JSON one, and its replicator sends such a
// document as JSON too (couch_doc:len_doc_to_multi_part_stream).
func (d *DB) PutDocStream(ctx context.Context, id string, body []byte, atts []StreamAttachment) error {
	return d.putDocStream(ctx, id, body, atts, false)
}

// PutDocStreamOnce is PutDocStream in one attempt: a stall, a timeout, a
// lost connection or a 5xx is returned at once instead of being retried,
// for a caller that has another way to write the document (Stalled tells
// those errors apart).
func (d *DB) PutDocStreamOnce(ctx context.Context, id string, body []byte, atts []StreamAttachment) error {
	return d.putDocStream(ctx, id, body, atts, true)
}

func (d *DB) putDocStream(ctx context.Context, id string, body []byte, atts []StreamAttachment, once bool) error {
	if len(atts) == 0 {
		return d.putJSON(ctx, id, body, once)
	}
	boundary := newBoundary()
	head := jsonPartHead(boundary)
	heads := make([][]byte, len(atts))
	n := int64(len(head) + len(body))
	var data int64
	for i, a := range atts {
		heads[i] = attachmentPartHead(boundary, a.Name, a.ContentType, a.Encoding, a.wireLength())
		n += int64(len(heads[i])) + a.wireLength()
		data += a.wireLength()
	}
	end := multipartEnd(boundary)
	n += int64(len(end))
	r := &request{
		method: http.MethodPut, path: escapeDocID(id), query: "new_edits=false", bodyLen: n,
		contentType: mime.FormatMediaType("multipart/related", map[string]string{"boundary": boundary}),
		noRetry:     once,
	}
	var cur *multipartStream
	if data <= smallAttachments {
		pieces := [][]byte{head, body}
		for i, a := range atts {
			b, err := d.readAttachment(ctx, a)
			if err != nil {
				return &AttachmentSourceError{DocID: id, Err: err}
			}
			pieces = append(pieces, heads[i], b)
		}
		r.body = buffersBody(append(pieces, end))
	} else {
		r.body = func() io.Reader {
			if cur != nil {
				cur.close()
			}
			cur = &multipartStream{ctx: ctx, pieces: [][]byte{head, body}, heads: heads, atts: atts, end: end}
			return cur
		}
		defer func() {
			if cur != nil {
				cur.close()
			}
		}()
	}
	resp, err := d.do(ctx, r)
	if err != nil {
		if serr := cur.sourceErr(); serr != nil {
			return &AttachmentSourceError{DocID: id, Err: serr}
		}
		return err
	}
	drain(resp) // CouchDB: {"ok":true,"id","rev"}; PouchDB Server: []
	return nil
}

// The pieces of a multipart/related document write, as CouchDB's
// replicator sends them (couch_httpd_multipart): the JSON part, then one
// part per attachment, each with a filename (PouchDB Server needs it) and
// its length.
func newBoundary() string {
	var rnd [16]byte
	_, _ = rand.Read(rnd[:])
	return hex.EncodeToString(rnd[:])
}

func jsonPartHead(boundary string) []byte {
	return []byte("--" + boundary + "\r\nContent-Type: application/json\r\n\r\n")
}

func attachmentPartHead(boundary, name, contentType, encoding string, length int64) []byte {
	var h strings.Builder
	h.WriteString("\r\n--" + boundary + "\r\n")
	h.WriteString("Content-Disposition: attachment; filename=" + strconv.Quote(name) + "\r\n")
	if contentType == "" {
		contentType = "application/octet-stream"
	}
	h.WriteString("Content-Type: " + contentType + "\r\n")
	if encoding != "" && encoding != "identity" {
		h.WriteString("Content-Encoding: " + encoding + "\r\n")
	}
	h.WriteString("Content-Length: " + strconv.FormatInt(length, 10) + "\r\n\r\n")
	return []byte(h.String())
}

func multipartEnd(boundary string) []byte { return []byte("\r\n--" + boundary + "--") }

// readAttachment reads a's bytes whole, checked against its stub. A read
// cut short by the connection is started again, as a failed request is
// (retries_per_request); a mismatch or an HTTP error is not.
func (d *DB) readAttachment(ctx context.Context, a StreamAttachment) ([]byte, error) {
	backoff := pause.Backoff{Min: d.opts.RetryBackoff, Max: d.opts.MaxRetryBackoff}
	for attempt := 0; ; attempt++ {
		b, err := readAttachmentOnce(ctx, a)
		var herr *HTTPError
		if err == nil || errors.Is(err, ErrAttachmentMismatch) || errors.As(err, &herr) || ctx.Err() != nil || attempt >= d.opts.Retries {
			return b, err
		}
		wait := backoff.Next()
		d.log.Warn().Str("attachment", a.Name).Err(err).Int("attempt", attempt+1).Dur("wait", wait).
			Msg("couch: reading an attachment failed, retrying")
		if err := pause.For(ctx, wait); err != nil {
			return nil, err
		}
	}
}

func readAttachmentOnce(ctx context.Context, a StreamAttachment) ([]byte, error) {
	src, err := a.Open(ctx)
	if err != nil {
		return nil, fmt.Errorf("attachment %q: %w", a.Name, err)
	}
	defer src.Close()
	b := make([]byte, 0, a.wireLength())
	c := newCheckedReader(src, a.AttachmentStub)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // room for the byte too many
		}
		k, err := c.Read(b[len(b):cap(b)])
		b = b[:len(b)+k]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// checkedReader reads an attachment's bytes from its source and ends with
// io.EOF only when they are exactly its stub's: its length (no byte more)
// and its md5 digest (when the stub has one).
type checkedReader struct {
	src  io.Reader
	stub AttachmentStub
	left int64
	sum  hash.Hash
}

func newCheckedReader(src io.Reader, stub AttachmentStub) *checkedReader {
	return &checkedReader{src: src, stub: stub, left: stub.wireLength(), sum: md5.New()}
}

func (c *checkedReader) Read(p []byte) (int, error) {
	name, size := c.stub.Name, c.stub.wireLength()
	if c.left == 0 {
		var one [1]byte
		k, err := io.ReadFull(c.src, one[:])
		if k > 0 {
			return 0, fmt.Errorf("%w: attachment %q: the source sent more than its %d bytes", ErrAttachmentMismatch, name, size)
		}
		if err != io.EOF {
			return 0, fmt.Errorf("attachment %q: %w", name, err)
		}
		if want, ok := strings.CutPrefix(c.stub.Digest, "md5-"); ok {
			if got := base64.StdEncoding.EncodeToString(c.sum.Sum(nil)); got != want {
				return 0, fmt.Errorf("%w: attachment %q: md5 of the %d bytes sent is %s, the stub says %s", ErrAttachmentMismatch, name, size, got, want)
			}
		}
		return 0, io.EOF
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.src.Read(p)
	c.left -= int64(n)
	c.sum.Write(p[:n])
	switch {
	case err == io.EOF && c.left > 0:
		return n, fmt.Errorf("%w: attachment %q: the source sent %d of its %d bytes", ErrAttachmentMismatch, name, size-c.left, size)
	case err == io.EOF:
		err = nil
	case err != nil:
		err = fmt.Errorf("attachment %q: %w", name, err)
	}
	return n, err
}

// multipartStream is one attempt's request body of PutDocStream: the
// fixed pieces, then each attachment's head and checked bytes, opened in
// turn.
type multipartStream struct {
	mu     sync.Mutex // Read (the transport's writer) against close (the caller)
	ctx    context.Context
	pieces [][]byte // what to send before the next attachment
	heads  [][]byte
	atts   []StreamAttachment
	end    []byte
	next   int           // the next attachment to open
	src    io.ReadCloser // the current attachment's source
	cur    *checkedReader
	err    error // the first error; every Read returns it
	srcErr error // err, when it came from an attachment's source
}

// sourceErr is the error an attachment's source ended the stream with.
func (m *multipartStream) sourceErr() error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.srcErr
}

func (m *multipartStream) Read(p []byte) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return 0, m.err
	}
	for {
		if len(m.pieces) > 0 {
			if len(m.pieces[0]) == 0 {
				m.pieces = m.pieces[1:]
				continue
			}
			n := copy(p, m.pieces[0])
			m.pieces[0] = m.pieces[0][n:]
			return n, nil
		}
		if m.cur != nil {
			n, err := m.cur.Read(p)
			if err == io.EOF {
				_ = m.src.Close()
				m.src, m.cur = nil, nil
				m.next++
				err = nil
			}
			if err != nil {
				m.err, m.srcErr = err, err
				return n, err
			}
			if n > 0 {
				return n, nil
			}
			continue
		}
		if m.next == len(m.atts) {
			if m.end == nil {
				return 0, io.EOF
			}
			m.pieces, m.end = [][]byte{m.end}, nil
			continue
		}
		a := m.atts[m.next]
		src, err := a.Open(m.ctx)
		if err != nil {
			m.err = fmt.Errorf("attachment %q: %w", a.Name, err)
			m.srcErr = m.err
			return 0, m.err
		}
		m.src, m.cur = src, newCheckedReader(src, a.AttachmentStub)
		m.pieces = [][]byte{m.heads[m.next]}
	}
}

func (m *multipartStream) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.src != nil {
		_ = m.src.Close()
		m.src, m.cur = nil, nil
	}
	if m.err == nil {
		m.err = errors.New("couch: request body closed")
	}
}

// ReadAttachmentDecoded reads the identity (decoded) bytes of the
// attachment stub s of revision rev of document docID whole, checked
// against its length; a read cut short is started again, as a failed
// request is. For InlineBody.
func (d *DB) ReadAttachmentDecoded(ctx context.Context, docID, rev string, s AttachmentStub) ([]byte, error) {
	s = s.Decoded()
	return d.readAttachment(ctx, StreamAttachment{AttachmentStub: s, Open: func(ctx context.Context) (io.ReadCloser, error) {
		return d.OpenAttachment(ctx, docID, rev, s)
	}})
}

// OpenAttachment opens the bytes of the attachment stub s of revision rev
// of document docID for PutDocStream: in their stored encoding, checked
// against the stub (encoding, and length where the server declares one).
func (d *DB) OpenAttachment(ctx context.Context, docID, rev string, s AttachmentStub) (io.ReadCloser, error) {
	resp, err := d.GetAttachment(ctx, docID, s.Name, rev, s.encoded())
	if err != nil {
		return nil, err
	}
	enc := resp.Header.Get("Content-Encoding")
	if enc == "identity" {
		enc = ""
	}
	want := s.Encoding
	if !s.encoded() {
		want = ""
	}
	switch {
	case enc == "" && want != "":
		drain(resp)
		return nil, fmt.Errorf("%w: attachment %q of %q: its stub says %s", ErrAttachmentDecoded, s.Name, docID, want)
	case enc != want:
		drain(resp)
		return nil, fmt.Errorf("%w: attachment %q of %q: the source sent it with Content-Encoding %q, its stub says %q", ErrAttachmentMismatch, s.Name, docID, enc, want)
	case resp.ContentLength >= 0 && resp.ContentLength != s.wireLength():
		drain(resp)
		return nil, fmt.Errorf("%w: attachment %q of %q: the source declares %d bytes, its stub %d", ErrAttachmentMismatch, s.Name, docID, resp.ContentLength, s.wireLength())
	}
	return resp.Body, nil
}
