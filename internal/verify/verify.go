// Package verify checks that a replication's target holds what the
// replication would carry from its source: every leaf revision of every
// document the replication's filter passes (conflicts and deletions
// included), and each leaf's attachments by digest and length. It is the
// one implementation behind `couchrepd verify`, `couchrepctl verify`,
// `couchrepctl job verify` and a node's POST /_verify.
//
// It streams: the source's _changes?style=all_docs (winning bodies
// included, read row by row and reduced to their attachment stubs), in
// batches checked against the target with _revs_diff (the replicator's own
// missing check) by a few workers at once; bodies are fetched from the
// target (stubs only, no attachment data) only for leaves that have
// attachments. Nothing grows with the database: memory is a few batches.
package verify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/internal/replicate"
)

// Kind is what a Difference is.
type Kind string

// The kinds of difference, and ChangedSinceStart (not a difference).
const (
	// Missing: the document is not on the target at all.
	Missing Kind = "missing"
	// LeafMissing: the target has the document but lacks some of the
	// source's leaf revisions (a conflict, or the latest edit).
	LeafMissing Kind = "leaf_missing"
	// DeletedOnSource: the source's document is deleted, the target's is
	// not (it lacks the deletion).
	DeletedOnSource Kind = "deleted_on_source"
	// DeletedOnTarget: the target's document is deleted by a revision the
	// source does not have, the source's is not.
	DeletedOnTarget Kind = "deleted_on_target"
	// AttachmentMissing: a leaf revision on both sides whose attachment
	// the target lacks.
	AttachmentMissing Kind = "attachment_missing"
	// AttachmentDifferent: a leaf revision on both sides whose attachment
	// differs in digest or length (or that only the target has).
	AttachmentDifferent Kind = "attachment_different"
	// Extra: the target holds a document or leaf revisions the source
	// does not have (Options.Extra only).
	Extra Kind = "extra_on_target"
	// ChangedSinceStart: the source's document changed after the verify
	// began and is not (yet) on the target as it is now: not a difference.
	ChangedSinceStart Kind = "changed_since_start"
	// Unchecked: a document too large to read (beyond max_document_bytes):
	// its revisions were checked, its attachments could not be.
	Unchecked Kind = "unchecked"
)

// Repairable reports whether replicating from the source fixes k.
func (k Kind) Repairable() bool {
	return k == Missing || k == LeafMissing || k == DeletedOnSource
}

// Difference reports a difference (or a ChangedSinceStart or Unchecked
// document).
type Difference struct {
	Kind Kind   `json:"kind"`
	ID   string `json:"id"`
	// Revs are the revisions concerned: missing on the target, or (Extra,
	// DeletedOnTarget) missing on the source.
	Revs []string `json:"revs,omitempty"`
	// Rev and Attachment name the attachment of an Attachment* kind.
	Rev        string `json:"rev,omitempty"`
	Attachment string `json:"attachment,omitempty"`
	// Source and Target are the attachment as each side has it (nil: none).
	Source *Att `json:"source,omitempty"`
	Target *Att `json:"target,omitempty"`
	// Reason says why a document is Unchecked.
	Reason string `json:"reason,omitempty"`
}

// Att is an attachment's digest and length.
type Att struct {
	Digest string `json:"digest,omitempty"`
	Length int64  `json:"length"`
}

// Summary is a verify's outcome.
type Summary struct {
	// OK: no difference (ChangedSinceStart and Unchecked do not count).
	OK     bool   `json:"ok"`
	Source string `json:"source"`
	Target string `json:"target"`
	// StartSeq is the source's update_seq when the verify began: changes
	// after it are ChangedSinceStart.
	StartSeq couch.Seq `json:"start_seq"`
	// DocsChecked and RevsChecked count the source's documents and leaf
	// revisions checked; AttachmentsChecked the attachments compared.
	DocsChecked        int64 `json:"docs_checked"`
	RevsChecked        int64 `json:"revs_checked"`
	AttachmentsChecked int64 `json:"attachments_checked"`
	// TargetDocsChecked counts the target's documents checked (Extra).
	TargetDocsChecked int64 `json:"target_docs_checked,omitempty"`
	Differences       int64 `json:"differences"`
	// Counts are the differences by kind (ChangedSinceStart and Unchecked
	// included).
	Counts  map[Kind]int64 `json:"counts"`
	Extra   bool           `json:"extra,omitempty"`
	Seconds float64        `json:"seconds"`
	// Repair is what --repair replicated; the summary's other fields are
	// then those of the verify that followed it.
	Repair *Repair `json:"repair,omitempty"`
}

// Repair is what a repair replicated.
type Repair struct {
	// Before are the counts of the verify that found what was repaired.
	Before                map[Kind]int64 `json:"before"`
	Docs                  int64          `json:"docs"`
	MissingRevisionsFound int64          `json:"missing_revisions_found"`
	DocsWritten           int64          `json:"docs_written"`
	DocWriteFailures      int64          `json:"doc_write_failures"`
}

// Options shape a verify.
type Options struct {
	// Replicate are the engine's options the endpoints are built with
	// (the node's [replicator] settings, logger, rate limiter).
	Replicate replicate.Options
	// Extra also reads the target's changes and reports what it holds
	// that the source does not (off by default: a filtered replication's
	// target legitimately holds more).
	Extra bool
	// Repair replicates the missing revisions found (with the
	// replication engine's worker) and verifies again.
	Repair bool
	// BatchSize is how many changes rows one _revs_diff checks (default
	// 1,000); Workers how many batches are checked at once (default 4).
	BatchSize, Workers int
	// OnDifference receives each difference as it is found, one call at a
	// time.
	OnDifference func(Difference)
	// Clock is time.Now unless set (tests).
	Clock func() time.Time
}

// Sentinel errors callers branch on; every error Run returns wraps one,
// or replicate.ErrInvalidParams, replicate.ErrDBNotFound or
// replicate.ErrUnauthorized.
var (
	// ErrFailed: reading an endpoint failed for good mid-verify.
	ErrFailed = errors.New("verify: failed")
)

// MaxDocumentBytes is the largest document (or _changes row with its
// document) a verify reads unless Options.Replicate.Limits say otherwise:
// CouchDB's default max_document_size, 8 MB. A larger document's
// revisions are still checked; its attachments are reported Unchecked.
const MaxDocumentBytes = 8 << 20

const (
	defaultBatch   = 1000
	defaultWorkers = 4
	// pageRows is the limit= of one page of a source with numeric seqs
	// (PouchDB Server builds a page whole before sending it).
	pageRows = 10_000
)

// Run verifies p's target against its source.
func Run(ctx context.Context, p replicate.Params, o Options) (Summary, error) {
	if o.Extra && p.Filter != "" && p.Filter[0] != '_' {
		return Summary{}, &replicate.ParamError{Field: "extra", Code: replicate.CodeBadRequest,
			Reason: "`extra` cannot be used with a named filter (the target's changes cannot be filtered the same way)"}
	}
	if !o.Repair {
		return run(ctx, p, o)
	}
	first := o
	first.Repair = true
	s, err := run(ctx, p, first)
	if err != nil || s.Repair == nil {
		return s, err
	}
	again := o
	again.Repair = false
	rep := s.Repair
	s2, err := run(ctx, p, again)
	s2.Repair = rep
	return s2, err
}

// verifier is one pass.
type verifier struct {
	p        replicate.Params
	o        Options
	src, tgt *couch.DB
	copier   *replicate.Copier
	log      zerolog.Logger
	start    couch.Seq

	mu      sync.Mutex
	sum     Summary
	repair  *Repair
	started time.Time
}

func run(ctx context.Context, p replicate.Params, o Options) (Summary, error) {
	if o.BatchSize <= 0 {
		o.BatchSize = defaultBatch
	}
	if o.Workers <= 0 {
		o.Workers = defaultWorkers
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	p.Continuous = false
	if o.Replicate.Limits.MaxDocumentBytes <= 0 {
		o.Replicate.Limits.MaxDocumentBytes = MaxDocumentBytes
	}
	if o.Replicate.Limits.MaxLineBytes <= 0 {
		o.Replicate.Limits.MaxLineBytes = MaxDocumentBytes
	}
	src, tgt, release, err := replicate.OpenEndpoints(p, o.Replicate)
	if err != nil {
		return Summary{}, err
	}
	defer release()
	v := &verifier{p: p, o: o, src: src, tgt: tgt, log: o.Replicate.Logger, started: o.Clock()}
	v.sum = Summary{Source: src.String(), Target: tgt.String(), Counts: map[Kind]int64{}, Extra: o.Extra}
	var (
		srcInfo        couch.DBInfo
		srcErr, tgtErr error
		wg             sync.WaitGroup
	)
	wg.Go(func() { srcInfo, srcErr = src.Info(ctx) })
	wg.Go(func() { _, tgtErr = tgt.Info(ctx) })
	wg.Wait()
	if srcErr != nil {
		return v.sum, replicate.OpenError("source", src, srcErr)
	}
	if tgtErr != nil {
		return v.sum, replicate.OpenError("target", tgt, tgtErr)
	}
	v.start = srcInfo.UpdateSeq
	v.sum.StartSeq = v.start
	if o.Repair {
		if v.copier, err = replicate.NewCopier(p, o.Replicate); err != nil {
			return v.sum, err
		}
		defer v.copier.Close()
		v.repair = &Repair{}
	}
	if err := v.forward(ctx); err != nil {
		return v.summary(), err
	}
	if o.Extra {
		if err := v.backward(ctx); err != nil {
			return v.summary(), err
		}
	}
	s := v.summary()
	if v.repair != nil && v.repair.Docs > 0 {
		v.repair.Before = s.Counts
		s.Repair = v.repair
	}
	return s, nil
}

func (v *verifier) summary() Summary {
	v.mu.Lock()
	defer v.mu.Unlock()
	s := v.sum
	s.Counts = make(map[Kind]int64, len(v.sum.Counts))
	for k, n := range v.sum.Counts {
		s.Counts[k] = n
	}
	s.OK = s.Differences == 0
	s.Seconds = v.o.Clock().Sub(v.started).Seconds()
	return s
}

// report counts and hands on d.
func (v *verifier) report(d Difference) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.sum.Counts[d.Kind]++
	if d.Kind != ChangedSinceStart && d.Kind != Unchecked {
		v.sum.Differences++
	}
	if v.o.OnDifference != nil {
		v.o.OnDifference(d)
	}
}

// row is one changes row reduced to what a verify needs.
type row struct {
	id      string
	revs    []string
	deleted bool
	// winner is the winning revision whose stubs came with the row
	// (include_docs), "" when the body did not come (stub mode: fetched
	// by the batch).
	winner string
	stubs  []couch.AttachmentStub
	// fetch: the row's bodies must be fetched (stub mode).
	fetch bool
}

type batch []row

// forward reads the source's changes and checks each batch on the target.
func (v *verifier) forward(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	batches := make(chan batch, v.o.Workers)
	var wg sync.WaitGroup
	for range v.o.Workers {
		wg.Go(func() {
			for b := range batches {
				if err := v.check(ctx, b); err != nil {
					cancel(err)
					for range batches {
					}
					return
				}
			}
		})
	}
	err := v.readSource(ctx, batches)
	close(batches)
	wg.Wait()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	if err != nil {
		if ctx.Err() != nil && context.Cause(ctx) != nil && !errors.Is(context.Cause(ctx), context.Canceled) {
			return context.Cause(ctx)
		}
		return err
	}
	return ctx.Err()
}

// readSource streams the source's _changes into batches: pages of
// pageRows for a source with numeric seqs (up to the start seq), one
// streamed request otherwise. A row too large to read with its document
// (beyond the row limit) makes the rest of its page come without
// documents, their stubs then fetched by the batch.
func (v *verifier) readSource(ctx context.Context, out chan<- batch) error {
	since := couch.SeqOf(v.p.SinceSeq)
	_, numeric := v.start.Int()
	paged := numeric && v.p.DocIDs == nil
	cur := make(batch, 0, v.o.BatchSize)
	send := func() error {
		if len(cur) == 0 {
			return nil
		}
		select {
		case out <- cur:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		cur = make(batch, 0, v.o.BatchSize)
		return nil
	}
	stubMode := false
	for {
		opts := replicate.ChangesOptions(v.p, since)
		opts.IncludeDocs = !stubMode
		limit := 0
		if paged || stubMode {
			limit = pageRows
			opts.Limit = limit
		}
		got := 0
		last, err := v.src.Changes(ctx, opts, func(c couch.Change) error {
			got++
			r := row{id: c.ID, revs: append([]string(nil), c.Revs...), deleted: c.Deleted, fetch: stubMode}
			if !stubMode && c.Doc != nil {
				if d, err := couch.DocOf(c.Doc); err == nil {
					r.winner = d.Rev
					if d.HasAttachments {
						r.stubs, _ = d.Stubs()
					}
				}
			}
			if c.Doc == nil && !stubMode {
				r.fetch = true
			}
			cur = append(cur, r)
			if len(cur) >= v.o.BatchSize {
				return send()
			}
			return nil
		})
		if err != nil {
			if errors.Is(err, couch.ErrResponseTooLarge) && !stubMode && ctx.Err() == nil {
				// A row with a document beyond the limit: read on from
				// the last row delivered without documents for a page.
				v.log.Warn().Err(err).Msg("verify: a changes row is too large with its document; reading on without documents")
				since, stubMode = last, true
				continue
			}
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return fmt.Errorf("%w: reading the source's changes: %w", ErrFailed, err)
		}
		since = last
		if stubMode {
			stubMode = false
			if got >= limit {
				continue
			}
			break
		}
		if limit == 0 || got < limit || replicate.SeqPast(last, v.start) || last.Equal(v.start) {
			break
		}
	}
	return send()
}

// check verifies one batch of source rows against the target.
func (v *verifier) check(ctx context.Context, b batch) error {
	revs := make(map[string][]string, len(b))
	var nrevs int64
	for _, r := range b {
		revs[r.id] = append(revs[r.id], r.revs...)
		nrevs += int64(len(r.revs))
	}
	diff, err := v.tgt.RevsDiff(ctx, revs)
	if err != nil {
		return fmt.Errorf("%w: _revs_diff on the target: %w", ErrFailed, err)
	}
	v.mu.Lock()
	v.sum.DocsChecked += int64(len(b))
	v.sum.RevsChecked += nrevs
	v.mu.Unlock()

	// Candidates: documents with revisions the target lacks.
	var found []Difference
	if len(diff) > 0 {
		ids := make([]string, 0, len(diff))
		for id := range diff {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		states, err := v.tgt.DocStates(ctx, ids)
		if err != nil {
			return fmt.Errorf("%w: _all_docs on the target: %w", ErrFailed, err)
		}
		state := make(map[string]couch.DocState, len(states))
		for _, s := range states {
			state[s.ID] = s
		}
		byID := make(map[string]row, len(b))
		for _, r := range b {
			byID[r.id] = r
		}
		for _, id := range ids {
			r, missing := byID[id], diff[id].Missing
			st, ok := state[id]
			d := Difference{ID: id, Revs: missing}
			switch {
			case !ok || st.Missing:
				d.Kind = Missing
			case r.deleted && !st.Deleted:
				d.Kind = DeletedOnSource
			case !r.deleted && st.Deleted:
				d.Kind = DeletedOnTarget
			default:
				d.Kind = LeafMissing
			}
			found = append(found, d)
		}
	}

	// Attachments of the leaves both sides have.
	attDiffs, err := v.attachments(ctx, b, diff)
	if err != nil {
		return err
	}
	found = append(found, attDiffs...)
	if len(found) == 0 {
		return nil
	}
	changed, err := v.changedSinceStart(ctx, found)
	if err != nil {
		return err
	}
	var repair []couch.Change
	for _, d := range found {
		if changed[d.ID] {
			d = Difference{Kind: ChangedSinceStart, ID: d.ID, Revs: d.Revs}
		}
		v.report(d)
		if v.copier != nil && d.Kind.Repairable() {
			for _, r := range b {
				if r.id == d.ID {
					repair = append(repair, couch.Change{ID: r.id, Revs: r.revs})
				}
			}
		}
	}
	if len(repair) > 0 {
		st, err := v.copier.Copy(ctx, repair)
		v.mu.Lock()
		v.repair.Docs += int64(len(repair))
		v.repair.MissingRevisionsFound += st.MissingRevisionsFound
		v.repair.DocsWritten += st.DocsWritten
		v.repair.DocWriteFailures += st.DocWriteFailures
		v.mu.Unlock()
		if err != nil {
			return fmt.Errorf("%w: repair: %w", ErrFailed, err)
		}
	}
	return nil
}

type revKey struct{ id, rev string }

// attachments compares the attachments of every leaf of b that has some on
// the source and that the target has (not in diff): the source's stubs
// came with the row (its winner) or are fetched here (other leaves, stub
// mode), the target's are fetched (stubs only).
func (v *verifier) attachments(ctx context.Context, b batch, diff map[string]couch.RevsDiff) ([]Difference, error) {
	var found []Difference
	present := func(id, rev string) bool {
		for _, m := range diff[id].Missing {
			if m == rev {
				return false
			}
		}
		return true
	}
	srcStubs := map[revKey][]couch.AttachmentStub{}
	var fetch []couch.BulkGetRequest
	for _, r := range b {
		for _, rev := range r.revs {
			if !present(r.id, rev) {
				continue
			}
			if !r.fetch && rev == r.winner {
				if len(r.stubs) > 0 {
					srcStubs[revKey{r.id, rev}] = r.stubs
				}
				continue
			}
			fetch = append(fetch, couch.BulkGetRequest{ID: r.id, Rev: rev})
		}
	}
	if len(fetch) > 0 {
		unread, err := v.stubs(ctx, v.src, fetch, func(k revKey, s []couch.AttachmentStub) {
			if len(s) > 0 {
				srcStubs[k] = s
			}
		})
		if err != nil {
			return nil, fmt.Errorf("%w: _bulk_get on the source: %w", ErrFailed, err)
		}
		found = append(found, unread...)
	}
	if len(srcStubs) == 0 {
		return found, nil
	}
	reqs := make([]couch.BulkGetRequest, 0, len(srcStubs))
	for k := range srcStubs {
		reqs = append(reqs, couch.BulkGetRequest{ID: k.id, Rev: k.rev})
	}
	sort.Slice(reqs, func(i, j int) bool {
		return reqs[i].ID < reqs[j].ID || reqs[i].ID == reqs[j].ID && reqs[i].Rev < reqs[j].Rev
	})
	tgtStubs := map[revKey][]couch.AttachmentStub{}
	unread, err := v.stubs(ctx, v.tgt, reqs, func(k revKey, s []couch.AttachmentStub) { tgtStubs[k] = s })
	if err != nil {
		return nil, fmt.Errorf("%w: _bulk_get on the target: %w", ErrFailed, err)
	}
	found = append(found, unread...)
	var compared int64
	for _, q := range reqs {
		k := revKey{q.ID, q.Rev}
		ts, ok := tgtStubs[k]
		if !ok {
			continue // unreadable (reported) or gone meanwhile
		}
		tby := make(map[string]couch.AttachmentStub, len(ts))
		for _, s := range ts {
			tby[s.Name] = s
		}
		for _, s := range srcStubs[k] {
			compared++
			t, ok := tby[s.Name]
			delete(tby, s.Name)
			switch {
			case !ok:
				found = append(found, Difference{Kind: AttachmentMissing, ID: q.ID, Rev: q.Rev, Attachment: s.Name, Source: att(s)})
			case !sameAtt(s, t):
				found = append(found, Difference{Kind: AttachmentDifferent, ID: q.ID, Rev: q.Rev, Attachment: s.Name, Source: att(s), Target: att(t)})
			}
		}
		names := make([]string, 0, len(tby))
		for n := range tby {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			found = append(found, Difference{Kind: AttachmentDifferent, ID: q.ID, Rev: q.Rev, Attachment: n, Target: att(tby[n])})
		}
	}
	v.mu.Lock()
	v.sum.AttachmentsChecked += compared
	v.mu.Unlock()
	return found, nil
}

func att(s couch.AttachmentStub) *Att { return &Att{Digest: s.Digest, Length: s.Length} }

// sameAtt compares digests and lengths where both sides give them.
func sameAtt(a, b couch.AttachmentStub) bool {
	if a.Digest != "" && b.Digest != "" && a.Digest != b.Digest {
		return false
	}
	return a.Length < 0 || b.Length < 0 || a.Length == b.Length
}

// stubs fetches the attachment stubs of reqs from db with _bulk_get (no
// data), halving a request whose answer is too large; a single revision
// too large to read is reported Unchecked.
func (v *verifier) stubs(ctx context.Context, db *couch.DB, reqs []couch.BulkGetRequest, fn func(revKey, []couch.AttachmentStub)) ([]Difference, error) {
	err := db.BulkGetStubs(ctx, reqs, func(d couch.Doc) error {
		s, err := d.Stubs()
		if err != nil {
			return err
		}
		fn(revKey{d.ID, d.Rev}, s)
		return nil
	})
	switch {
	case err == nil:
		return nil, nil
	case errors.Is(err, couch.ErrResponseTooLarge) && len(reqs) > 1:
		h := len(reqs) / 2
		a, err := v.stubs(ctx, db, reqs[:h], fn)
		if err != nil {
			return nil, err
		}
		b, err := v.stubs(ctx, db, reqs[h:], fn)
		return append(a, b...), err
	case errors.Is(err, couch.ErrResponseTooLarge):
		return []Difference{{Kind: Unchecked, ID: reqs[0].ID, Revs: []string{reqs[0].Rev},
			Reason: fmt.Sprintf("%s: the document is too large to read; its attachments were not compared", redact.Text(err.Error()))}}, nil
	}
	return nil, err
}

// changedSinceStart returns which of found's documents changed on the
// source after the verify's start seq: none when the source's update_seq
// has not moved, else those its _changes since the start seq lists.
func (v *verifier) changedSinceStart(ctx context.Context, found []Difference) (map[string]bool, error) {
	info, err := v.src.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: the source's info: %w", ErrFailed, err)
	}
	if info.UpdateSeq.Equal(v.start) {
		return nil, nil
	}
	ids := make([]string, 0, len(found))
	seen := map[string]bool{}
	for _, d := range found {
		if !seen[d.ID] {
			seen[d.ID] = true
			ids = append(ids, d.ID)
		}
	}
	sort.Strings(ids)
	changed := map[string]bool{}
	opts := couch.ChangesOptions{Since: v.start, Style: couch.StyleAllDocs, DocIDs: ids}
	if _, err := v.src.Changes(ctx, opts, func(c couch.Change) error {
		changed[c.ID] = true
		return nil
	}); err != nil {
		return nil, fmt.Errorf("%w: the source's changes since %s: %w", ErrFailed, v.start, err)
	}
	return changed, nil
}

// backward reads the target's changes (with the replication's doc_ids or
// selector) and reports what the source lacks of them.
func (v *verifier) backward(ctx context.Context) error {
	p := v.p
	p.SinceSeq = nil
	cur := make(batch, 0, v.o.BatchSize)
	flush := func() error {
		if len(cur) == 0 {
			return nil
		}
		err := v.checkBack(ctx, cur)
		cur = cur[:0]
		return err
	}
	opts := replicate.ChangesOptions(p, nil)
	if _, err := v.tgt.Changes(ctx, opts, func(c couch.Change) error {
		cur = append(cur, row{id: c.ID, revs: append([]string(nil), c.Revs...), deleted: c.Deleted})
		if len(cur) >= v.o.BatchSize {
			return flush()
		}
		return nil
	}); err != nil {
		if errors.Is(err, ErrFailed) {
			return err
		}
		return fmt.Errorf("%w: reading the target's changes: %w", ErrFailed, err)
	}
	return flush()
}

func (v *verifier) checkBack(ctx context.Context, b batch) error {
	revs := make(map[string][]string, len(b))
	for _, r := range b {
		revs[r.id] = append(revs[r.id], r.revs...)
	}
	diff, err := v.src.RevsDiff(ctx, revs)
	if err != nil {
		return fmt.Errorf("%w: _revs_diff on the source: %w", ErrFailed, err)
	}
	v.mu.Lock()
	v.sum.TargetDocsChecked += int64(len(b))
	v.mu.Unlock()
	if len(diff) == 0 {
		return nil
	}
	ids := make([]string, 0, len(diff))
	for id := range diff {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	states, err := v.src.DocStates(ctx, ids)
	if err != nil {
		return fmt.Errorf("%w: _all_docs on the source: %w", ErrFailed, err)
	}
	state := make(map[string]couch.DocState, len(states))
	for _, s := range states {
		state[s.ID] = s
	}
	deleted := make(map[string]bool, len(b))
	for _, r := range b {
		deleted[r.id] = r.deleted
	}
	var found []Difference
	for _, id := range ids {
		d := Difference{Kind: Extra, ID: id, Revs: diff[id].Missing}
		if s, ok := state[id]; ok && !s.Missing && !s.Deleted && deleted[id] {
			d.Kind = DeletedOnTarget
		}
		found = append(found, d)
	}
	changed, err := v.changedSinceStart(ctx, found)
	if err != nil {
		return err
	}
	for _, d := range found {
		if changed[d.ID] {
			d = Difference{Kind: ChangedSinceStart, ID: d.ID, Revs: d.Revs}
		}
		v.report(d)
	}
	return nil
}

// MarshalLine is d as one JSON line (no newline).
func (d Difference) MarshalLine() []byte {
	b, _ := json.Marshal(d)
	return b
}

// Error is err as CouchDB-style JSON error fields with an HTTP status:
// bad_request or invalid_replication (400) for invalid parameters,
// db_not_found (404), unauthorized (401), verify_failed (500) for a
// verify that could not be finished. The reason is redacted.
func Error(err error) (status int, name, reason string) {
	reason = redact.Text(err.Error())
	var pe *replicate.ParamError
	switch {
	case errors.As(err, &pe):
		return 400, pe.Code, redact.Text(pe.Reason)
	case errors.Is(err, replicate.ErrUnauthorized):
		return 401, "unauthorized", reason
	case errors.Is(err, replicate.ErrDBNotFound):
		return 404, "db_not_found", reason
	case errors.Is(err, context.Canceled):
		return 500, "verify_failed", "cancelled"
	}
	return 500, "verify_failed", reason
}

// ErrorLine is err as a CouchDB-style JSON error object (one line).
func ErrorLine(err error) []byte {
	_, name, reason := Error(err)
	b, _ := json.Marshal(map[string]string{"error": name, "reason": reason})
	return b
}

// ParseRequest parses a POST /_verify body: a replication document (the
// one parser, replicate.ParseParamsWith, over defaults) plus "extra" and
// "repair" booleans.
func ParseRequest(body []byte, defaults replicate.Params) (replicate.Params, Options, error) {
	var o Options
	p, err := replicate.ParseParamsWith(body, defaults)
	if err != nil {
		return p, o, err
	}
	var flags struct {
		Extra  json.RawMessage `json:"extra"`
		Repair json.RawMessage `json:"repair"`
	}
	_ = json.Unmarshal(body, &flags)
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		dst  *bool
	}{{"extra", flags.Extra, &o.Extra}, {"repair", flags.Repair, &o.Repair}} {
		if f.raw == nil {
			continue
		}
		if err := json.Unmarshal(f.raw, f.dst); err != nil {
			return p, o, &replicate.ParamError{Field: f.name, Code: replicate.CodeBadRequest,
				Reason: fmt.Sprintf("parameter `%s` must be a boolean", f.name)}
		}
	}
	return p, o, nil
}

// Lines writes each difference as a JSON line to w as Run finds it, and
// returns the Options.OnDifference that does it.
func Lines(w interface{ Write([]byte) (int, error) }) func(Difference) {
	return func(d Difference) {
		_, _ = w.Write(append(d.MarshalLine(), '\n'))
	}
}

// SummaryLine is s as one JSON line, under "summary".
func SummaryLine(s Summary) []byte {
	b, _ := json.Marshal(map[string]Summary{"summary": s})
	return b
}
