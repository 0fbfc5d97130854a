// Package sharedfeed shares one continuous _changes feed per source
// database among the continuous replications of a node: a Hub keeps one
// feed open per Source (same database, same credentials and connection
// settings: the Source's Key) and fans its rows out to the subscribed jobs,
// each of which sees only the rows of its own Filter: its doc_ids, its
// Mango selector evaluated here on the row's document (a feed read with
// include_docs=true), or all rows.
//
// A Watch is a subscription that holds no rows: it wakes its owner (a
// parked job) when the feed reads a row its filter wants, so a parked job's
// whole footprint on the feed is one entry.
//
// What a subscriber must do to see exactly what a feed of its own would
// show (package replicate does it): Subscribe first, then read the changes
// since its own checkpoint with a one-shot request of its own (the
// catch-up), then follow the subscription, skipping rows the catch-up
// already delivered. The Hub starts a feed at the source's update_seq read
// before the first Subscribe returns, and a later subscriber receives every
// row the feed reads after it subscribed, so catch-up plus subscription
// miss nothing. A subscription knows where it joined (Subscription.From):
// a subscriber whose checkpoint is at or after that seq has nothing to
// catch up. A subscriber that has just read the source's update_seq passes
// it (Source.Start): a feed its Subscribe opens starts there, without
// reading the source's info again.
//
// The Hub never waits for a subscriber: each has a bounded buffer, and one
// that falls further behind gets ErrOverflow (it then catches up on its own
// and subscribes again). When the feed fails, every subscriber gets the
// error, in order after the rows it already has; the feed is gone, and the
// next Subscribe opens a new one. A feed without subscribers is closed.
package sharedfeed

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/mango"
)

// ErrOverflow is a subscription's error when more rows than the buffer
// holds were waiting for it: they were dropped, and the subscriber must
// read them on its own.
var ErrOverflow = errors.New("sharedfeed: subscriber fell behind the shared feed")

// DefaultBuffer is the rows a subscriber may have waiting (Options.Buffer).
const DefaultBuffer = 1000

// Options tune a Hub.
type Options struct {
	// Logger receives the feeds' logs (never a Source's Key).
	Logger zerolog.Logger
	// Buffer is the most rows waiting for one subscriber; zero is
	// DefaultBuffer.
	Buffer int
}

// Source is the feed subscribers share.
type Source struct {
	// Key identifies the feed: subscriptions with equal keys share one. It
	// must cover everything that shapes the request or its connection
	// (database URL, credentials, headers, proxy, TLS and socket settings,
	// style, heartbeat), so that jobs with different credentials never
	// share; a digest keeps credentials out of it. It is never logged.
	Key string
	// Name is the database for logs (credentials redacted).
	Name string
	// Open returns the database to read the feed from and a function that
	// releases its connections when the feed ends; called once per feed.
	Open func(log zerolog.Logger) (db *couch.DB, release func(), err error)
	// Style is the feed's style= (couch.StyleAllDocs or StyleMainOnly).
	Style string
	// Heartbeat is the feed's heartbeat=. Stall detection is Open's DB's
	// read deadline (connection_timeout): a feed that sends nothing for
	// that long fails (couch.ErrFeedStalled) and its subscribers resume.
	Heartbeat time.Duration
	// IncludeDocs reads the feed with include_docs=true: needed by
	// selector filters (the Key must differ from the same source's feed
	// without documents). Subscribers receive the rows without them.
	IncludeDocs bool
	// Start, when set, is the source's update_seq as the subscriber read
	// it just before Subscribe (its own GET /db): a feed this Subscribe
	// opens starts at it instead of reading the source's info again. A
	// seq read earlier is safe (the feed reads from there: rows twice, none
	// missed) but makes every subscriber of the feed see rows it may have
	// replicated already: pass only a fresh one. Ignored when the feed is
	// open, and by Watch.
	Start couch.Seq
}

// Filter chooses the rows a subscription or watch receives; its zero value
// takes every row.
type Filter struct {
	// DocIDs, when not nil, takes only the rows of these documents.
	DocIDs []string
	// Selector, when set, takes only the rows whose document matches, as
	// CouchDB's _selector filter would: the feed (Source.IncludeDocs)
	// carries each row's winning revision, which is what is matched (a
	// deleted document is {_id, _rev, _deleted: true}, as CouchDB's filter
	// sees it). A row taken lists only that winning revision: CouchDB
	// (style=all_docs) matches each leaf and lists the leaves that match,
	// here a conflicting leaf is never listed (it would be, by CouchDB,
	// when it matches; it would not be, here too, when it does not: a
	// selector that slices data never leaks a conflict's body).
	Selector *mango.Selector
}

// Hub is a node's set of shared feeds. Its zero value is not usable; New
// returns one. It is safe for concurrent use.
type Hub struct {
	log    zerolog.Logger
	buffer int

	mu        sync.Mutex
	feeds     map[string]*feed
	overflows atomic.Uint64
}

// New returns an empty Hub.
func New(o Options) *Hub {
	if o.Buffer <= 0 {
		o.Buffer = DefaultBuffer
	}
	return &Hub{log: o.Logger, buffer: o.Buffer, feeds: map[string]*feed{}}
}

// Stats are a Hub's counts.
type Stats struct {
	// Feeds open or opening, their subscriptions and their watches.
	Feeds, Subscriptions, Watches int
	// Overflows counts the subscriptions that fell behind (ErrOverflow)
	// since the Hub was made.
	Overflows uint64
}

// Stats counts the Hub's feeds and subscriptions.
func (h *Hub) Stats() Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := Stats{Feeds: len(h.feeds), Overflows: h.overflows.Load()}
	for _, f := range h.feeds {
		f.mu.Lock()
		st.Subscriptions += len(f.subs) - f.watches
		st.Watches += f.watches
		f.mu.Unlock()
	}
	return st
}

// ErrNeedsDocs is Subscribe's or Watch's error for a selector filter on a
// Source read without include_docs.
var ErrNeedsDocs = errors.New("sharedfeed: a selector filter needs a feed with include_docs")

// Subscribe subscribes to src's shared feed, opening it if none is open,
// for the rows filter takes. It returns once the feed's start is fixed:
// every row of a change made after Subscribe returns reaches the
// subscription (unless it overflows or the feed fails). An error is the
// feed's failure to start (the source's info could not be read); the
// caller retries as after a failed request of its own.
func (h *Hub) Subscribe(ctx context.Context, src Source, filter Filter) (*Subscription, error) {
	return h.join(ctx, src, filter, false)
}

// Watch watches src's shared feed, opening it if none is open: its C
// fires when the feed reads a row filter takes, from once Watch returns
// (the same start as Subscribe's). It holds no rows. A watch outlives its
// feed: when the feed fails, the watch moves to the source's next feed
// (opened after a back-off while failures repeat) and Marks says which
// seqs it may have missed. An error is the first feed's failure to start.
func (h *Hub) Watch(ctx context.Context, src Source, filter Filter) (*Watch, error) {
	s, err := h.join(ctx, src, filter, true)
	if err != nil {
		return nil, err
	}
	return &Watch{s: s}, nil
}

func (h *Hub) join(ctx context.Context, src Source, filter Filter, watch bool) (*Subscription, error) {
	if filter.Selector != nil && !src.IncludeDocs {
		return nil, ErrNeedsDocs
	}
	s := h.member(filter, watch)
	h.mu.Lock()
	f := h.feeds[src.Key]
	if f == nil {
		f = h.newFeed(src)
		if !watch {
			f.start = src.Start
		}
		h.feeds[src.Key] = f
		go f.run()
	}
	f.add(s)
	h.mu.Unlock()
	if !watch {
		f.kickOnce.Do(func() { close(f.kick) }) // a job waits: no back-off
	}
	select {
	case <-f.ready:
	case <-ctx.Done():
		s.Close()
		return nil, ctx.Err()
	}
	if f.openErr != nil {
		s.Close()
		return nil, f.openErr
	}
	return s, nil
}

// member is a new subscription or watch of filter.
func (h *Hub) member(filter Filter, watch bool) *Subscription {
	s := &Subscription{h: h, wake: make(chan struct{}, 1), max: h.buffer, sel: filter.Selector, watch: watch}
	if filter.DocIDs != nil {
		s.ids = make(map[string]struct{}, len(filter.DocIDs))
		for _, id := range filter.DocIDs {
			s.ids[id] = struct{}{}
		}
	}
	return s
}

// feed is one shared continuous feed.
type feed struct {
	h      *Hub
	src    Source
	log    zerolog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	// ready is closed once the feed's start is fixed, or it failed to
	// start (openErr, written before).
	ready   chan struct{}
	openErr error
	// delay is how long the feed waits before it opens: the next feed of
	// the watches of a feed that failed (backing off while failures
	// repeat); kick ends the wait (a subscriber joined).
	delay    time.Duration
	kick     chan struct{}
	kickOnce sync.Once
	// start is where the feed starts when its opener knew (Source.Start);
	// nil: it reads the source's info.
	start couch.Seq

	mu      sync.Mutex
	subs    map[*Subscription]struct{}
	byID    map[string][]*Subscription
	all     []*Subscription // subscriptions without doc_ids or selector
	sels    []*Subscription // subscriptions with a selector and no doc_ids, not in eq
	eq      map[string]*eqIndex
	watches int // of subs
	ended   bool
	// pos is the seq after which the feed hands every row it reads to the
	// members it has now: its start once fixed (nil before), then each
	// row's seq as it is dispatched. A subscription joins at pos
	// (Subscription.From).
	pos     couch.Seq
	started bool // pos is fixed
}

func (h *Hub) newFeed(src Source) *feed {
	f := &feed{h: h, src: src, log: h.log.With().Str("source", src.Name).Logger(), ready: make(chan struct{}), kick: make(chan struct{}),
		subs: map[*Subscription]struct{}{}, byID: map[string][]*Subscription{}}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	return f
}

// add registers s; h.mu is held and f is in h.feeds (so not ended).
func (f *feed) add(s *Subscription) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s.f = f
	f.subs[s] = struct{}{}
	if f.started && !s.watch {
		s.from, s.fromOK = f.pos, true
	}
	if s.watch {
		f.watches++
	}
	switch {
	case s.ids == nil && s.sel == nil:
		f.all = append(f.all, s)
		return
	case s.ids == nil:
		f.addSel(s)
		return
	}
	for id := range s.ids {
		f.byID[id] = append(f.byID[id], s)
	}
}

// remove unregisters s from its feed (a watch's may have changed: s.f
// changes under h.mu) and closes the feed when it was the last member.
func (h *Hub) remove(s *Subscription) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f := s.f
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.subs[s]; !ok {
		return
	}
	delete(f.subs, s)
	if s.watch {
		f.watches--
	}
	switch {
	case s.ids == nil && s.sel == nil:
		f.all = without(f.all, s)
	case s.ids == nil:
		f.removeSel(s)
	default:
		for id := range s.ids {
			if l := without(f.byID[id], s); len(l) > 0 {
				f.byID[id] = l
			} else {
				delete(f.byID, id)
			}
		}
	}
	if len(f.subs) == 0 && !f.ended {
		f.ended = true
		if h.feeds[f.src.Key] == f {
			delete(h.feeds, f.src.Key)
		}
		f.cancel()
	}
}

func without(l []*Subscription, s *Subscription) []*Subscription {
	for i, x := range l {
		if x == s {
			l[i] = l[len(l)-1]
			l[len(l)-1] = nil
			return l[:len(l)-1]
		}
	}
	return l
}

// maxDelay bounds the back-off between the feeds of watches whose feed
// keeps failing.
const maxDelay = 5 * time.Minute

// end takes the feed out of the hub and gives err to every subscription.
// Its watches move to the source's next feed (the one open, or a new one
// opened after a back-off): each is signalled and marked lost (rows may
// have been missed) until that feed's start is fixed (Watch.Marks).
func (f *feed) end(err error) {
	h := f.h
	h.mu.Lock()
	if h.feeds[f.src.Key] == f {
		delete(h.feeds, f.src.Key)
	}
	f.mu.Lock()
	f.ended = true
	subs := make([]*Subscription, 0, len(f.subs))
	var watches []*Subscription
	for s := range f.subs {
		if s.watch {
			watches = append(watches, s)
		} else {
			subs = append(subs, s)
		}
	}
	clear(f.subs)
	f.mu.Unlock()
	if len(watches) > 0 {
		nf, start := h.feeds[f.src.Key], false
		if nf == nil {
			nf, start = h.newFeed(f.src), true
			nf.delay = reopenPause
			if f.openErr != nil { // it never started: back off
				nf.delay = min(max(2*f.delay, reopenPause), maxDelay)
			}
			h.feeds[f.src.Key] = nf
		}
		for _, w := range watches {
			w.mu.Lock()
			w.lost, w.lostUntil = true, nil
			w.mu.Unlock()
			nf.add(w)
		}
		if start {
			go nf.run()
		}
		f.log.Debug().Int("watches", len(watches)).Dur("delay", nf.delay).Msg("shared feed: its watches move to the next feed")
	}
	h.mu.Unlock()
	for _, s := range subs {
		s.fail(err)
	}
	for _, w := range watches {
		w.signal()
	}
	f.cancel()
}

// reopenPause is the least time between two requests of a feed that the
// server ends at once without a row.
var reopenPause = time.Second

// run reads the feed until it fails or its last subscriber leaves.
func (f *feed) run() {
	if f.delay > 0 {
		t := time.NewTimer(f.delay)
		select {
		case <-t.C:
		case <-f.kick:
			t.Stop()
		case <-f.ctx.Done():
			t.Stop()
			return // every member left
		}
	}
	db, release, err := f.src.Open(f.log)
	if err != nil {
		f.openErr = fmt.Errorf("sharedfeed: %w", err)
		close(f.ready)
		f.end(f.openErr)
		return
	}
	defer release()
	since := f.start
	if since == nil {
		info, err := db.Info(f.ctx)
		if err != nil {
			f.openErr = err
			close(f.ready)
			f.end(err)
			return
		}
		since = info.UpdateSeq
	}
	f.mu.Lock()
	f.pos, f.started = since, true
	for s := range f.subs {
		if !s.watch {
			s.from, s.fromOK = since, true
		}
	}
	f.mu.Unlock()
	f.found(since)
	close(f.ready)
	f.log.Debug().Str("since", since.String()).Msg("shared feed: open")
	opts := couch.ChangesOptions{Feed: couch.FeedContinuous, Style: f.src.Style, Heartbeat: f.src.Heartbeat,
		IncludeDocs: f.src.IncludeDocs}
	for {
		opts.Since = since
		began := time.Now()
		rows := 0
		last, err := db.ReadChanges(f.ctx, &opts, func(c couch.Change) error {
			rows++
			f.dispatch(c)
			return nil
		})
		if f.ctx.Err() != nil {
			f.log.Debug().Msg("shared feed: closed, no subscriber left")
			return
		}
		if last != nil {
			since = last
		}
		if err != nil {
			f.log.Warn().Err(err).Str("since", since.String()).Msg("shared feed: failed; its subscribers resume on their own")
			f.end(err)
			return
		}
		// The server ended the feed cleanly: resume from its last seq,
		// after a pause if it ended at once without a row.
		if rows == 0 && time.Since(began) < opts.Heartbeat {
			t := time.NewTimer(reopenPause)
			select {
			case <-t.C:
			case <-f.ctx.Done():
				t.Stop()
				return
			}
		}
	}
}

// found settles the watches that moved here from a failed feed: what
// they may have missed ends at this feed's start; each is signalled.
func (f *feed) found(since couch.Seq) {
	f.mu.Lock()
	var lost []*Subscription
	for s := range f.subs {
		if !s.watch {
			continue
		}
		s.mu.Lock()
		if s.lost {
			s.lost, s.lostUntil = false, since
			lost = append(lost, s)
		}
		s.mu.Unlock()
	}
	f.mu.Unlock()
	for _, s := range lost {
		s.signal()
	}
}

// dispatch hands c to the subscriptions that want it; it never waits for
// one. The row's document is decoded once, for the selectors, and never
// handed on.
func (f *feed) dispatch(c couch.Change) {
	raw := c.Doc
	c.Doc = nil
	d := docRow{c: c, raw: raw}
	f.mu.Lock()
	defer f.mu.Unlock()
	if c.Seq != nil {
		f.pos = c.Seq
	}
	for _, s := range f.byID[c.ID] {
		if s.sel == nil {
			s.push(c)
		} else if r, ok := d.match(f, s.sel); ok {
			s.push(r)
		}
	}
	for _, s := range f.all {
		s.push(c)
	}
	for _, s := range f.sels {
		if r, ok := d.match(f, s.sel); ok {
			s.push(r)
		}
	}
	if len(f.eq) == 0 {
		return
	}
	if !d.decoded {
		d.decode(f)
	}
	if d.doc == nil {
		return
	}
	for _, x := range f.eq {
		v, ok := mango.Lookup(d.doc, x.e.Path)
		str, isStr := v.(string)
		if !ok || !isStr {
			continue // an equality to a string needs a string
		}
		if x.e.Keyed(str) {
			for _, s := range x.by[str] {
				if r, ok := d.match(f, s.sel); ok {
					s.push(r)
				}
			}
			continue
		}
		for _, l := range x.by { // a string that may collate equal to others
			for _, s := range l {
				if r, ok := d.match(f, s.sel); ok {
					s.push(r)
				}
			}
		}
	}
}

// eqIndex holds the selector members that require one field to equal a
// string (mango.Selector.Equality), by that string: a row is evaluated
// against those whose string its field has, not against every selector of
// the feed (10,000 per-user selectors: one or two evaluations a row).
type eqIndex struct {
	e  mango.Equality // Path and Bytes; Value varies
	by map[string][]*Subscription
}

func eqKey(e mango.Equality) string {
	k := strings.Join(e.Path, "\x00")
	if e.Bytes {
		k += "\x01"
	}
	return k
}

// addSel registers a selector member; f.mu is held.
func (f *feed) addSel(s *Subscription) {
	e, ok := s.sel.Equality()
	if !ok {
		f.sels = append(f.sels, s)
		return
	}
	if f.eq == nil {
		f.eq = map[string]*eqIndex{}
	}
	k := eqKey(e)
	x := f.eq[k]
	if x == nil {
		x = &eqIndex{e: e, by: map[string][]*Subscription{}}
		f.eq[k] = x
	}
	x.by[e.Value] = append(x.by[e.Value], s)
}

// removeSel unregisters a selector member; f.mu is held.
func (f *feed) removeSel(s *Subscription) {
	e, ok := s.sel.Equality()
	if !ok {
		f.sels = without(f.sels, s)
		return
	}
	k := eqKey(e)
	x := f.eq[k]
	if x == nil {
		return
	}
	if l := without(x.by[e.Value], s); len(l) > 0 {
		x.by[e.Value] = l
	} else {
		delete(x.by, e.Value)
	}
	if len(x.by) == 0 {
		delete(f.eq, k)
	}
}

// docRow is a row and its document, decoded on first use.
type docRow struct {
	c       couch.Change
	raw     []byte
	decoded bool
	doc     any    // nil: no usable document
	winner  string // the document's _rev
	winRow  couch.Change
}

// match reports whether the row's document matches sel, and the row to
// hand on (listing only the winning revision).
func (d *docRow) match(f *feed, sel *mango.Selector) (couch.Change, bool) {
	if !d.decoded {
		d.decode(f)
	}
	if d.doc == nil || !sel.Match(d.doc) {
		return couch.Change{}, false
	}
	return d.winRow, true
}

func (d *docRow) decode(f *feed) {
	d.decoded = true
	var err error
	d.doc, d.winRow, err = rowDoc(d.c, d.raw)
	if err != nil {
		f.log.Warn().Err(err).Str("seq", d.c.Seq.String()).Msg("shared feed: no selector takes this row")
	}
}

// errNoDoc: a row without its document that is not a deletion.
var errNoDoc = errors.New("the row has no document")

// rowDoc is the document a selector matches for row c (raw: its
// include_docs document), and the row to hand on when it matches: listing
// only the winning revision (the document's _rev), without the document. A
// deletion without a document is {_id, _rev, _deleted: true}.
func rowDoc(c couch.Change, raw []byte) (any, couch.Change, error) {
	c.Doc = nil
	if len(raw) == 0 || string(raw) == "null" {
		if !c.Deleted || len(c.Revs) != 1 {
			return nil, c, errNoDoc
		}
		return mango.Object{{Key: "_id", Value: c.ID}, {Key: "_rev", Value: c.Revs[0]}, {Key: "_deleted", Value: true}}, c, nil
	}
	doc, err := mango.Decode(raw)
	if err != nil {
		return nil, c, err
	}
	if obj, ok := doc.(mango.Object); ok && len(c.Revs) > 1 {
		for _, m := range obj {
			if m.Key == "_rev" {
				if rev, ok := m.Value.(string); ok {
					c.Revs = []string{rev}
				}
				break
			}
		}
	}
	return doc, c, nil
}

// MatchRow is Filter.Selector's test for one row read with include_docs
// (a job's own catch-up matches its rows as its subscription would): the
// row to hand on and whether sel takes it.
func MatchRow(c couch.Change, sel *mango.Selector) (couch.Change, bool) {
	doc, out, err := rowDoc(c, c.Doc)
	if err != nil || !sel.Match(doc) {
		return couch.Change{}, false
	}
	return out, true
}

// Subscription is one job's share of a feed: the rows it wants, in feed
// order, until its error.
type Subscription struct {
	h     *Hub
	f     *feed               // changes under h.mu (a watch moves to the next feed)
	ids   map[string]struct{} // nil: every row
	sel   *mango.Selector     // nil: every row
	max   int
	wake  chan struct{}
	watch bool // a Watch's: no rows kept
	// notify, when set, is called at every signal (Watch.OnSignal).
	notify atomic.Pointer[func()]

	// from is where the subscription joined its feed (From), written
	// under its feed's mu before Subscribe returns; fromOK: it is known.
	from   couch.Seq
	fromOK bool

	mu   sync.Mutex
	rows []couch.Change
	err  error
	// A watch's marks (Watch.Marks).
	lastMatch, lostUntil couch.Seq
	lost                 bool
}

// From is the seq after which the subscription receives every row its feed
// reads (unless it overflows or the feed fails): where it joined, the
// feed's start or the last row it had read then. A subscriber checkpointed
// at or after it has nothing to catch up. ok is false when the feed did
// not say (a seq the feed reads is then still delivered; catch up).
func (s *Subscription) From() (seq couch.Seq, ok bool) { return s.from, s.fromOK }

func (s *Subscription) push(c couch.Change) {
	if s.watch {
		s.mu.Lock()
		if c.Seq != nil {
			s.lastMatch = c.Seq
		}
		s.mu.Unlock()
		s.signal()
		return
	}
	s.mu.Lock()
	switch {
	case s.err != nil:
	case len(s.rows) >= s.max:
		s.rows, s.err = nil, ErrOverflow
		s.h.overflows.Add(1)
	default:
		s.rows = append(s.rows, c)
	}
	s.mu.Unlock()
	s.signal()
}

func (s *Subscription) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	s.signal()
}

func (s *Subscription) signal() {
	if f := s.notify.Load(); f != nil {
		(*f)()
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Next returns the rows waiting, in feed order, waiting for some if there
// are none; then the subscription's error (ErrOverflow, or the feed's
// failure) once its rows are taken; or ctx's error.
func (s *Subscription) Next(ctx context.Context) ([]couch.Change, error) {
	for {
		s.mu.Lock()
		if rows := s.rows; len(rows) > 0 {
			s.rows = nil
			s.mu.Unlock()
			return rows, nil
		}
		err := s.err
		s.mu.Unlock()
		if err != nil {
			return nil, err
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Close ends the subscription; the feed closes with its last one. Closing
// twice is harmless.
func (s *Subscription) Close() {
	s.h.remove(s)
}

// Watch wakes a parked job when its shared feed reads a row the job's
// filter takes (Hub.Watch).
type Watch struct {
	s *Subscription
}

// C receives when the feed read a row the filter takes, when the feed
// failed and when its next feed started (see Marks). Wake-ups coalesce:
// one is pending at most.
func (w *Watch) C() <-chan struct{} { return w.s.wake }

// Marks tell a parked job whether its source has a row for it after its
// checkpoint seq: last is the seq of the last row the watch's filter took
// (nil: none yet); lost is set while the watch's feed failed and the next
// one has not started (rows may be missing), lostUntil, once it started,
// the seq it started at: rows up to it may have been missed.
func (w *Watch) Marks() (last, lostUntil couch.Seq, lost bool) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	return w.s.lastMatch, w.s.lostUntil, w.s.lost
}

// Close ends the watch; the feed closes with its last subscription or
// watch. Closing twice is harmless.
func (w *Watch) Close() { w.s.Close() }

// OnSignal makes every later signal of w (what C receives) also call f, on
// the feed's goroutine (f must return at once), so that a parked job needs
// no goroutine waiting on C (park.Notifier); nil stops that.
func (w *Watch) OnSignal(f func()) {
	if f == nil {
		w.s.notify.Store(nil)
		return
	}
	w.s.notify.Store(&f)
}
