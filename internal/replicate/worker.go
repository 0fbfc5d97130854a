package replicate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/pause"
)

// worker runs CouchDB's per-batch protocol: _revs_diff, fetch the missing
// revisions (with attachment data only since the target's possible
// ancestors), write them with new_edits=false. Bodies stay raw JSON bytes
// from the source response to the _bulk_docs request.
type worker struct {
	r       *Replication
	buf     []json.RawMessage
	bufSize int
	stats   Stats
	// writer is the outcome of the batch write in flight, nil when none:
	// as CouchDB's worker spawns a writer, a batch's last _bulk_docs goes
	// out while the worker reads the next batch (_revs_diff, _bulk_get),
	// at most one per worker; any other write waits for it first.
	writer chan error
}

// fetchGate holds couch_replicator_worker's fetch_stats for _revs_diff and
// _bulk_get: exponential moving averages deciding whether the call is
// worth making. CouchDB keeps them per worker; here a job's workers share
// them, so a fresh target stops being asked after a few batches of the
// whole job, not a few batches of every worker.
type fetchGate struct {
	mu                sync.Mutex
	revsDiff, bulkGet fetchStats
}

// emptyTarget starts the job as if _revs_diff had just found every
// revision missing: the target had no documents at all when the job
// started, so asking it is (almost) pure cost. Writing a revision the
// target got meanwhile with new_edits=false is harmless, and the call is
// tried again after fetchRetry as usual.
func (g *fetchGate) emptyTarget(now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.revsDiff = fetchStats{ratio: 1, t: now}
}

func (g *fetchGate) attempt(f *fetchStats, now time.Time, threshold float64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return f.attempt(now, threshold)
}

func (g *fetchGate) update(f *fetchStats, now time.Time, successes, attempts int, decay float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f.update(now, successes, attempts, decay)
}

// CouchDB's couch_replicator_worker coefficients.
const (
	revsDiffThreshold = 0.95
	revsDiffDecay     = 0.4
	bulkGetThreshold  = 0.5
	bulkGetDecay      = 0.25
	fetchRetry        = 37 * time.Second
)

// fetchStats is an EWMA of a failure ratio plus the time it was updated.
type fetchStats struct {
	ratio float64
	t     time.Time
}

// attempt reports whether to make the call: the ratio is at most the
// threshold, or it was last tried more than 37 s ago.
func (f *fetchStats) attempt(now time.Time, threshold float64) bool {
	return f.ratio <= threshold || now.Sub(f.t) > fetchRetry
}

func (f *fetchStats) update(now time.Time, successes, attempts int, decay float64) {
	r := 0.0
	if attempts > 0 {
		r = float64(attempts-successes) / float64(attempts)
	}
	f.ratio += decay * (r - f.ratio)
	f.t = now
}

type revKey struct{ id, rev string }

func (w *worker) process(ctx context.Context, changes []couch.Change) error {
	w.stats = Stats{}
	defer func() { w.r.count(w.stats) }()

	revs := make(map[string][]string, len(changes))
	if max := w.r.o.MaxDocumentIDLength; max > 0 {
		kept := changes[:0:0]
		for _, c := range changes {
			if len(c.ID) > max {
				// As CouchDB's changes reader: dropped, counted as a failure.
				rev := ""
				if len(c.Revs) > 0 {
					rev = c.Revs[0]
				}
				if err := w.writeFailed(&w.stats, WriteFailure{ID: c.ID, Rev: rev, Error: "doc_id_too_long",
					Reason: fmt.Sprintf("document id longer than max_document_id_length (%d bytes), not replicated", max)}); err != nil {
					return err
				}
				continue
			}
			kept = append(kept, c)
		}
		changes = kept
	}
	for _, c := range changes {
		if _, seen := revs[c.ID]; !seen {
			revs[c.ID] = make([]string, 0, len(c.Revs))
		}
		revs[c.ID] = append(revs[c.ID], c.Revs...)
		w.stats.RevisionsChecked += int64(len(c.Revs))
	}
	var diff map[string]couch.RevsDiff
	gate := &w.r.fetch
	if now := w.r.now(); gate.attempt(&gate.revsDiff, now, revsDiffThreshold) {
		var err error
		if diff, err = w.r.tgt.RevsDiff(ctx, revs); err != nil {
			return fmt.Errorf("%w: revs_diff_failed: %w", ErrWorkerFailed, err)
		}
		// Success is "already on the target": when the target lacks almost
		// everything (a fresh target) _revs_diff is skipped, as CouchDB does.
		missingNoPA := 0
		for _, d := range diff {
			if len(d.PossibleAncestors) == 0 {
				missingNoPA += len(d.Missing)
			}
		}
		all := int(w.stats.RevisionsChecked)
		gate.update(&gate.revsDiff, now, all-missingNoPA, all, revsDiffDecay)
	} else {
		diff = make(map[string]couch.RevsDiff, len(revs))
		for id, rs := range revs {
			diff[id] = couch.RevsDiff{Missing: rs}
		}
	}
	if len(diff) == 0 {
		return nil
	}
	var reqs []couch.BulkGetRequest
	for _, c := range changes { // feed order
		d, ok := diff[c.ID]
		if !ok {
			continue
		}
		delete(diff, c.ID)
		for _, rev := range d.Missing {
			reqs = append(reqs, couch.BulkGetRequest{ID: c.ID, Rev: rev, AttsSince: d.PossibleAncestors})
		}
	}
	w.stats.MissingRevisionsFound += int64(len(reqs))
	// What is left in the buffer is written by the caller (flushAsync).
	return w.fetchAndWrite(ctx, reqs)
}

func (w *worker) fetchAndWrite(ctx context.Context, reqs []couch.BulkGetRequest) error {
	got := make(map[revKey]bool, len(reqs))
	since := make(map[string][]string, len(reqs))
	for _, q := range reqs {
		since[q.ID] = q.AttsSince
	}
	// Documents with attachments are written once the response that
	// brought their stubs has been read: streaming their data can take
	// longer than the source would wait for us to read on.
	var withAtts []couch.Doc
	var writeErr error
	handle := func(d couch.Doc) error {
		got[revKey{d.ID, d.Rev}] = true
		w.stats.DocsRead++
		if d.HasAttachments && len(d.Attachments) == 0 {
			withAtts = append(withAtts, d)
			return nil
		}
		if err := w.write(ctx, d); err != nil {
			writeErr = err
			return err
		}
		return nil
	}
	writeAtts := func() error {
		stream, err := w.writeInline(ctx, withAtts, since)
		if err != nil {
			return err
		}
		for _, d := range stream {
			if err := w.writeStreamed(ctx, d, since[d.ID]); err != nil {
				return err
			}
		}
		withAtts = withAtts[:0]
		return nil
	}
	now := w.r.now()
	gate := &w.r.fetch
	if w.r.p.UseBulkGet && len(reqs) > 0 && gate.attempt(&gate.bulkGet, now, bulkGetThreshold) {
		w.stats.BulkGetAttempts += int64(len(reqs))
		before := w.stats.DocsRead
		defer func() { gate.update(&gate.bulkGet, now, int(w.stats.BulkGetDocs), len(reqs), bulkGetDecay) }()
		err := w.r.src.BulkGet(ctx, reqs, handle)
		if writeErr != nil {
			return writeErr
		}
		if err != nil && ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if errors.Is(err, couch.ErrStalled) {
			// The same documents one by one would stall as well.
			return fmt.Errorf("%w: %w", ErrWorkerFailed, err)
		}
		if err != nil {
			w.r.log.Debug().Err(err).Msg("replication: _bulk_get failed, fetching documents one by one")
		}
		w.stats.BulkGetDocs += w.stats.DocsRead - before
		if err := writeAtts(); err != nil {
			return err
		}
	}
	// Whatever _bulk_get did not deliver, one GET ?open_revs per document.
	var pendingIDs []string
	pending := map[string][]string{}
	for _, q := range reqs {
		if got[revKey{q.ID, q.Rev}] {
			continue
		}
		if _, ok := pending[q.ID]; !ok {
			pendingIDs = append(pendingIDs, q.ID)
		}
		pending[q.ID] = append(pending[q.ID], q.Rev)
	}
	for _, id := range pendingIDs {
		err := w.r.src.OpenRevsStubs(ctx, id, pending[id], handle)
		if errors.Is(err, couch.ErrNotFound) && writeErr == nil {
			// The feed listed it: as CouchDB's replicator does, ask once
			// more after missing_doc_retry_msec, then fail (the job
			// restarts from its checkpoint: a 404 that passes costs a
			// restart, not the document).
			w.r.log.Warn().Str("doc_id", id).Dur("retry_in", w.r.o.MissingDocRetry).
				Msg("replication: document unexpectedly missing from the source; asking again")
			if perr := pause.For(ctx, w.r.o.MissingDocRetry); perr != nil {
				return perr
			}
			err = w.r.src.OpenRevsStubs(ctx, id, pending[id], handle)
		}
		if writeErr != nil {
			return writeErr
		}
		if err != nil {
			return fmt.Errorf("%w: open_doc_revs_failed for %q: %w", ErrWorkerFailed, id, err)
		}
		if err := writeAtts(); err != nil {
			return err
		}
	}
	return nil
}

// write buffers a document for _bulk_docs (one without attachments, or
// with their data inline), or PUTs it alone when its attachments came as
// separate parts.
func (w *worker) write(ctx context.Context, d couch.Doc) error {
	if len(d.Attachments) == 0 {
		w.buf = append(w.buf, d.Body)
		w.bufSize += len(d.Body)
		if w.bufSize >= docBufferBytes {
			return w.flush(ctx)
		}
		return nil
	}
	if err := w.settle(); err != nil {
		return err
	}
	return w.counted(d, w.putParts(ctx, d))
}

// putParts PUTs d, whose attachments came as parts, as multipart; as
// JSON with their data inline when that multipart PUT stalls or is
// refused, or first while the run's multipart PUTs do (writeStreamed).
func (w *worker) putParts(ctx context.Context, d couch.Doc) error {
	body, ok, err := d.InlinedBody(inlineFallbackBytes)
	if err != nil || !ok {
		return w.r.tgt.PutDoc(ctx, d)
	}
	inline := couch.Doc{ID: d.ID, Rev: d.Rev, Body: body}
	if w.r.now().UnixNano() < w.r.inlineUntil.Load() {
		if err := w.r.tgt.PutDoc(ctx, inline); !errors.Is(err, couch.ErrTooLarge) {
			return err
		}
		return w.r.tgt.PutDoc(ctx, d)
	}
	err = w.r.tgt.PutDocOnce(ctx, d)
	if ctx.Err() != nil || !divertable(err) {
		return err
	}
	w.multipartDiverted(d, err)
	if err := w.r.tgt.PutDoc(ctx, inline); !errors.Is(err, couch.ErrTooLarge) {
		return err
	}
	return w.r.tgt.PutDoc(ctx, d)
}

// multipartDiverted records that d's multipart PUT stalled or was
// refused: for inlineAfterStall the run writes documents with
// attachments as JSON first.
func (w *worker) multipartDiverted(d couch.Doc, err error) {
	until := w.r.now().Add(inlineAfterStall)
	if w.r.inlineUntil.Swap(until.UnixNano()) < w.r.now().UnixNano() {
		w.r.log.Warn().Str("doc_id", d.ID).Err(err).Dur("for", inlineAfterStall).
			Msg("replication: a multipart attachment write stalled or was refused; writing documents with attachments as JSON, their data inline")
	}
}

// inlineAttachmentBytes is the most attachment data one document may
// need for it to be fetched with its data inline (_bulk_get with
// attachments=true, a batch for all such documents) and written in the
// _bulk_docs batch; a document needing more, or an encoded attachment
// (inline data would arrive decoded), is streamed.
const inlineAttachmentBytes = 64 << 10

// writeInline fetches the documents among docs whose new attachments are
// small and unencoded again, with their data, in one _bulk_get, and
// buffers them for _bulk_docs. It returns the documents left to stream:
// the others, and those that _bulk_get did not deliver.
func (w *worker) writeInline(ctx context.Context, docs []couch.Doc, since map[string][]string) ([]couch.Doc, error) {
	var reqs []couch.BulkGetRequest
	var stream []couch.Doc
	for _, d := range docs {
		if w.inlineable(d, since[d.ID]) {
			reqs = append(reqs, couch.BulkGetRequest{ID: d.ID, Rev: d.Rev})
		} else {
			stream = append(stream, d)
		}
	}
	if len(reqs) == 0 || !w.r.p.UseBulkGet {
		return docs, nil
	}
	got := make(map[revKey]bool, len(reqs))
	var writeErr error
	err := w.r.src.BulkGetWithData(ctx, reqs, func(d couch.Doc) error {
		if !allInline(d) {
			return nil // a stub came back after all: stream it
		}
		got[revKey{d.ID, d.Rev}] = true
		if writeErr = w.write(ctx, d); writeErr != nil {
			return writeErr
		}
		return nil
	})
	if writeErr != nil {
		return nil, writeErr
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		w.r.log.Debug().Err(err).Msg("replication: _bulk_get with attachment data failed, streaming them")
	}
	for _, d := range docs {
		if !got[revKey{d.ID, d.Rev}] && w.inlineable(d, since[d.ID]) {
			stream = append(stream, d)
		}
	}
	return stream, nil
}

// allInline reports whether every attachment of d came with its data
// inline (what a _bulk_docs batch can carry).
func allInline(d couch.Doc) bool {
	stubs, err := d.Stubs()
	if err != nil {
		return false
	}
	for _, s := range stubs {
		if !s.Inline {
			return false
		}
	}
	return true
}

// inlineable reports whether d's attachments are all new to the target
// (a stub in a _bulk_docs batch the target cannot resolve would fail the
// batch; a lone PUT is sent again with the data), unencoded, and small.
func (w *worker) inlineable(d couch.Doc, attsSince []string) bool {
	stubs, err := d.Stubs()
	if err != nil {
		return false
	}
	pos := d.AncestorPos(attsSince)
	var need int64
	for _, s := range stubs {
		switch {
		case s.Inline || s.Follows:
			return false
		case !sendAttachment(s, pos):
			return false
		case s.Encoding != "" && s.Encoding != "identity", !s.Sized():
			return false
		}
		need += s.Length
	}
	return need <= inlineAttachmentBytes
}

// sendAttachment is CouchDB's atts_since rule: an attachment added after
// pos, the generation of the target's most recent possible ancestor,
// must be sent; one added at or before it the target has.
func sendAttachment(s couch.AttachmentStub, pos int64) bool {
	return pos == 0 || s.RevPos == 0 || s.RevPos > pos
}

// writeStreamed writes a document that came with attachment stubs: a
// multipart PUT whose parts are the attachments the target lacks (those
// added after the most recent of the target's possible ancestors in the
// document's history), streamed from the source in their stored
// encoding. When the target misses one it was sent as a stub for, every
// attachment is sent.
func (w *worker) writeStreamed(ctx context.Context, d couch.Doc, attsSince []string) error {
	stubs, err := d.Stubs()
	if err != nil {
		return fmt.Errorf("%w: open_doc_revs_failed for %q: %w", ErrWorkerFailed, d.ID, err)
	}
	pos := d.AncestorPos(attsSince)
	for _, s := range stubs {
		if s.Inline || s.Follows {
			// The source sent data though asked for stubs: write it as is.
			return w.write(ctx, d)
		}
		if !s.Sized() && sendAttachment(s, pos) {
			// Its stubs do not say how long the data is: fetch it with
			// the document (bounded by max_document_bytes).
			return w.writeFetched(ctx, d, attsSince)
		}
	}
	all, decoded := false, false
	put := func(once bool) error {
		send := make(map[string]bool, len(stubs))
		write := make([]couch.AttachmentStub, len(stubs))
		for i, s := range stubs {
			send[s.Name] = all || sendAttachment(s, pos)
			if write[i] = s; decoded && send[s.Name] {
				write[i] = s.Decoded()
			}
		}
		body, parts, err := d.FollowsBody(write, send)
		if err != nil {
			return err
		}
		atts := make([]couch.StreamAttachment, len(parts))
		for i, s := range parts {
			atts[i] = couch.StreamAttachment{AttachmentStub: s, Open: func(ctx context.Context) (io.ReadCloser, error) {
				return w.r.src.OpenAttachment(ctx, d.ID, d.Rev, s)
			}}
		}
		if once {
			return w.r.tgt.PutDocStreamOnce(ctx, d.ID, body, atts)
		}
		return w.r.tgt.PutDocStream(ctx, d.ID, body, atts)
	}
	if err := w.settle(); err != nil {
		return err
	}
	// A document whose attachments fit in inlineFallbackBytes has another
	// way to the target: JSON with their data inline. Its multipart PUT is
	// then tried once (a stall is not waited out again and again), and
	// while multipart PUTs stall on this target it is not tried at all.
	inline := inlineFits(stubs)
	if inline && w.r.now().UnixNano() < w.r.inlineUntil.Load() {
		err := w.putInline(ctx, d, stubs)
		if !errors.Is(err, couch.ErrTooLarge) {
			return w.inlineOutcome(ctx, d, err)
		}
		inline = false // too large as JSON: multipart it is
	}
	err = put(inline)
	if errors.Is(err, couch.ErrAttachmentDecoded) {
		// The source ignores Accept-Encoding: send what it sends, decoded.
		decoded = true
		err = put(inline)
	}
	if errors.Is(err, couch.ErrMissingStub) && pos > 0 {
		all = true
		err = put(inline)
	}
	if inline && ctx.Err() == nil && divertable(err) {
		w.multipartDiverted(d, err)
		ierr := w.putInline(ctx, d, stubs)
		if !errors.Is(ierr, couch.ErrTooLarge) {
			return w.inlineOutcome(ctx, d, ierr)
		}
		err = put(false) // too large as JSON: the multipart PUT after all, with its retries
	}
	var serr *couch.AttachmentSourceError
	if errors.As(err, &serr) {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return fmt.Errorf("%w: open_doc_revs_failed for %q from %s: %w", ErrWorkerFailed, d.ID, w.r.src, err)
	}
	return w.counted(d, err)
}

// inlineFallbackBytes is the most attachment data (identity bytes) a
// document may have for it to be written as JSON with its attachments
// inline when its multipart PUT stalls or is refused: the data is held
// in memory, with its base64, while the document is written.
const inlineFallbackBytes = 4 << 20

// inlineAfterStall is how long a run writes documents with attachments
// as JSON after a multipart PUT stalled or was refused (CouchDB 3.4.3
// holds a multipart attachment PUT 300 s on a cluster missing a node,
// while it answers the same document as JSON at once); then a multipart
// PUT is tried again.
const inlineAfterStall = 5 * time.Minute

// inlineFits reports whether every attachment says its length and all
// of them fit in inlineFallbackBytes.
func inlineFits(stubs []couch.AttachmentStub) bool {
	var n int64
	for _, s := range stubs {
		if !s.Sized() {
			return false
		}
		n += s.Length
	}
	return n <= inlineFallbackBytes
}

// divertable reports whether a multipart PUT's error calls for sending
// the document another way: it stalled, timed out or lost its connection
// (no HTTP answer), or the target refused it with a 5xx, 408 or 415 (not
// an answer about the document itself).
func divertable(err error) bool {
	if err == nil {
		return false
	}
	var serr *couch.AttachmentSourceError
	if errors.As(err, &serr) {
		return false
	}
	var herr *couch.HTTPError
	if errors.As(err, &herr) {
		return herr.Status >= 500 || herr.Status == 408 || herr.Status == 415
	}
	return true
}

// putInline writes d alone as JSON, every attachment's data inline (read
// from the source decoded).
func (w *worker) putInline(ctx context.Context, d couch.Doc, stubs []couch.AttachmentStub) error {
	data := make(map[string][]byte, len(stubs))
	for _, s := range stubs {
		b, err := w.r.src.ReadAttachmentDecoded(ctx, d.ID, d.Rev, s)
		if err != nil {
			return &couch.AttachmentSourceError{DocID: d.ID, Err: err}
		}
		data[s.Name] = b
	}
	body, err := d.InlineBody(stubs, data)
	if err != nil {
		return err
	}
	return w.r.tgt.PutDoc(ctx, couch.Doc{ID: d.ID, Rev: d.Rev, Body: body})
}

// inlineOutcome is writeStreamed's outcome for a document written with
// putInline.
func (w *worker) inlineOutcome(ctx context.Context, d couch.Doc, err error) error {
	var serr *couch.AttachmentSourceError
	if errors.As(err, &serr) {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return fmt.Errorf("%w: open_doc_revs_failed for %q from %s: %w", ErrWorkerFailed, d.ID, w.r.src, err)
	}
	return w.counted(d, err)
}

// writeFetched writes d's revision fetched again with its attachment data
// (open_revs, attachments=true): inline data into the _bulk_docs batch,
// MIME parts in a PUT of their own.
func (w *worker) writeFetched(ctx context.Context, d couch.Doc, attsSince []string) error {
	err := w.r.src.OpenRevs(ctx, d.ID, []string{d.Rev}, attsSince, func(x couch.Doc) error { return w.write(ctx, x) })
	if err != nil && !errors.Is(err, ErrWorkerFailed) {
		return fmt.Errorf("%w: open_doc_revs_failed for %q: %w", ErrWorkerFailed, d.ID, err)
	}
	return err
}

// counted records the outcome of writing one document alone: written, a
// write failure CouchDB counts and moves past, or the worker's failure.
func (w *worker) counted(d couch.Doc, err error) error {
	switch {
	case err == nil:
		w.stats.DocsWritten++
	case skippable(err):
		return w.writeFailed(&w.stats, failureOf(d.ID, d.Rev, err))
	default:
		return fmt.Errorf("%w: doc_write_failed for %q: %w", ErrWorkerFailed, d.ID, err)
	}
	return nil
}

// skippable reports CouchDB's "count it and move on" write errors:
// 401, 403, 413, 415, and a 400 for an invalid attachment name
// (couch_replicator_worker:handle_doc_write_error).
func skippable(err error) bool {
	var herr *couch.HTTPError
	if errors.As(err, &herr) {
		switch herr.Status {
		case 401, 403, 413, 415:
			return true
		case 400:
			return strings.HasPrefix(herr.Reason, "Attachment name ")
		}
	}
	return errors.Is(err, couch.ErrUnauthorized) || errors.Is(err, couch.ErrForbidden) || errors.Is(err, couch.ErrTooLarge)
}

// flush writes the buffered documents now, after the write in flight.
func (w *worker) flush(ctx context.Context) error {
	if err := w.settle(); err != nil {
		return err
	}
	if len(w.buf) == 0 {
		return nil
	}
	docs := w.buf
	w.buf, w.bufSize = w.buf[:0:0], 0
	return w.bulkDocs(ctx, docs, &w.stats)
}

// flushAsync writes the buffered documents on a goroutine of their own
// once the write in flight is done, and returns; done gets the write's
// outcome (nil also when there was nothing to write). The next settle
// waits for it.
func (w *worker) flushAsync(ctx context.Context, done func(error)) error {
	if err := w.settle(); err != nil {
		return err
	}
	if len(w.buf) == 0 {
		done(nil)
		return nil
	}
	docs := w.buf
	w.buf, w.bufSize = w.buf[:0:0], 0
	ch := make(chan error, 1)
	w.writer = ch
	go func() {
		var st Stats
		err := w.bulkDocs(ctx, docs, &st)
		w.r.count(st)
		done(err)
		ch <- err
	}()
	return nil
}

// settle waits for the write in flight, if any, and returns its error.
func (w *worker) settle() error {
	if w.writer == nil {
		return nil
	}
	err := <-w.writer
	w.writer = nil
	return err
}

// bulkDocs writes docs, halving the batch on 413 (a single oversized
// document is counted as a failure), and counts the outcome in st.
func (w *worker) bulkDocs(ctx context.Context, docs []json.RawMessage, st *Stats) error {
	res, err := w.r.tgt.BulkDocs(ctx, docs, false)
	if errors.Is(err, couch.ErrTooLarge) {
		if len(docs) == 1 {
			id, rev := idRev(docs[0])
			return w.writeFailed(st, failureOf(id, rev, err))
		}
		h := len(docs) / 2
		if err := w.bulkDocs(ctx, docs[:h], st); err != nil {
			return err
		}
		return w.bulkDocs(ctx, docs[h:], st)
	}
	if err != nil {
		return fmt.Errorf("%w: bulk_docs_failed: %w", ErrWorkerFailed, err)
	}
	failed := 0
	var revs map[string][]string // the revisions sent, for rows that name none
	var stop error
	for _, r := range res {
		if r.Error == "" {
			continue
		}
		failed++
		rev := r.Rev
		if rev == "" {
			if revs == nil {
				revs = make(map[string][]string, len(docs))
				for _, d := range docs {
					id, rv := idRev(d)
					revs[id] = append(revs[id], rv)
				}
			}
			if l := revs[r.ID]; len(l) > 0 {
				rev, revs[r.ID] = l[0], l[1:]
			}
		}
		if err := w.writeFailed(st, WriteFailure{ID: r.ID, Rev: rev, Status: rowStatus(r.Error), Error: r.Error, Reason: r.Reason}); err != nil && stop == nil {
			stop = err
		}
	}
	st.DocsWritten += int64(len(docs) - failed)
	return stop
}
