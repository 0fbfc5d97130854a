package couch

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
)

// Compressed request bodies and answers.
//
// Requests: a _bulk_docs, _revs_diff or _bulk_get body of at least
// Options.CompressMinBytes is sent gzip-compressed (Content-Encoding: gzip,
// at gzip's fastest level), as CouchDB accepts on any JSON body
// (couch_httpd:body decompresses gzip) and PouchDB Server's body-parser
// inflates by default. A body that does not shrink by a quarter (base64
// of compressed data, inline attachments already compressed) is sent
// plain. A server that refuses a compressed body (400,
// 415, 500 or 501: CouchDB's bad_ctype is a 415, a server that does not
// know the encoding parses the gzip bytes as JSON and answers 400, PouchDB
// Server answers 500 for an encoding it cannot inflate) gets the same
// request again at once, plain, without using up a retry, and plain
// bodies from then on (remembered by the DB): compression never fails a
// write.
//
// Answers: a response with Content-Encoding: gzip is decoded whatever the
// request asked for (a proxy may compress on its own), except an
// attachment read in its stored encoding. The limits (max_response_bytes,
// max_document_bytes, max_changes_row_bytes) apply to the decoded bytes:
// a small gzip that inflates without end stops at the limit (a gzip bomb
// is an ErrResponseTooLarge); the read deadline counts the bytes received.

// DefaultCompressMinBytes is the smallest request body sent compressed
// when compression is on (couch.Options.CompressMinBytes): below it the
// gzip header and the CPU cost more than the bytes saved.
const DefaultCompressMinBytes = 8 << 10

// gzipWriters are reused gzip writers at the fastest level.
var gzipWriters = sync.Pool{New: func() any {
	w, _ := gzip.NewWriterLevel(io.Discard, gzip.BestSpeed)
	return w
}}

// gzipBytes compresses all of r.
func gzipBytes(r io.Reader, sizeHint int64) ([]byte, error) {
	var buf bytes.Buffer
	buf.Grow(int(min(sizeHint/3+64, 64<<20)))
	w := gzipWriters.Get().(*gzip.Writer)
	defer gzipWriters.Put(w)
	w.Reset(&buf)
	if _, err := io.Copy(w, r); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// compressedBody returns the gzip-compressed body of r for this attempt
// when r should be sent compressed (computed once per request), else nil.
func (d *DB) compressedBody(r *request) []byte {
	if !r.compress || r.body == nil || d.opts.CompressMinBytes <= 0 || r.bodyLen < d.opts.CompressMinBytes || d.gzipRefused.Load() {
		return nil
	}
	if r.gz == nil && !r.gzNoGain {
		gz, err := gzipBytes(r.body(), r.bodyLen)
		if err != nil || int64(len(gz)) > r.bodyLen*3/4 {
			r.gzNoGain = true
			return nil
		}
		r.gz = gz
	}
	return r.gz
}

// refusedEncoding reports whether status, the answer to a compressed
// request body, may mean that the server did not take the encoding.
func refusedEncoding(status int) bool {
	switch status {
	case http.StatusBadRequest, http.StatusUnsupportedMediaType, http.StatusInternalServerError, http.StatusNotImplemented:
		return true
	}
	return false
}

// decodeBody makes resp's body the decoded bytes when the server sent it
// gzip-compressed and the request did not ask for the stored encoding
// (r.acceptEncoding, attachments). The body is decoded as it is read.
func decodeBody(resp *http.Response, r *request) {
	if r.acceptEncoding != "" || resp.Uncompressed || resp.Body == nil || resp.Body == http.NoBody {
		return
	}
	ce := strings.TrimSpace(strings.ToLower(resp.Header.Get("Content-Encoding")))
	if ce != "gzip" && ce != "x-gzip" {
		return
	}
	resp.Body = &gunzipBody{rc: resp.Body}
	resp.Header.Del("Content-Encoding")
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	resp.Uncompressed = true
}

// gunzipBody decodes a gzip body as it is read; the gzip header is read
// on the first Read (not when the response arrives).
type gunzipBody struct {
	rc  io.ReadCloser
	zr  *gzip.Reader
	err error
}

// errBadGzip marks a compressed answer that does not decode.
var errBadGzip = errors.New("the gzip-compressed answer does not decode")

func (g *gunzipBody) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	if g.zr == nil {
		zr, err := gzip.NewReader(g.rc)
		if err != nil {
			g.err = gzipError(err)
			return 0, g.err
		}
		g.zr = zr
	}
	n, err := g.zr.Read(p)
	if err != nil && err != io.EOF {
		err = gzipError(err)
		g.err = err
	}
	return n, err
}

// gzipError keeps the transport's errors (a stall, a lost connection) as
// they are and marks the others as a body that does not decode.
func gzipError(err error) error {
	if errors.Is(err, ErrStalled) || errors.Is(err, ErrRequestTimeout) || errors.Is(err, errConnectionLost) || errors.Is(err, io.ErrUnexpectedEOF) {
		return err
	}
	return errors.Join(errBadGzip, err)
}

func (g *gunzipBody) Close() error { return g.rc.Close() }
