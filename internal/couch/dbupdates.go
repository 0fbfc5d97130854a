package couch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// SinceNow is the since= of a _db_updates (or _changes) request that starts
// at the server's current seq.
var SinceNow = Seq(`"now"`)

// MaxDBUpdatesRowBytes bounds one row of a _db_updates feed (a database
// name of at most 238 bytes, a type and a seq: CouchDB's packed shard seqs
// are a few KiB on a large cluster); Limits.MaxLineBytes lowers it. A
// longer row is an error (ErrResponseTooLarge), never buffered whole.
const MaxDBUpdatesRowBytes = 256 << 10

// DBUpdate is one row of the server's _db_updates feed.
type DBUpdate struct {
	// DBName is the database's name, unescaped ("userdb-6a6f65", "a/b").
	DBName string
	// Type is "created", "updated" or "deleted" (CouchDB may add others).
	Type string
	// Seq is the row's seq (opaque).
	Seq Seq
}

// DBUpdatesOptions shape a continuous GET /_db_updates request.
type DBUpdatesOptions struct {
	// Since is where the feed starts: SinceNow, a seq of an earlier row of
	// this server's feed, or the zero Seq (the beginning).
	Since Seq
	// Heartbeat asks the server for a newline every Heartbeat while idle
	// (CouchDB sends no headers before its first row or heartbeat, so a
	// feed without one may wait for ever); it also arms the stall detector
	// of _changes feeds (nothing received for 2×Heartbeat+5 s ends the
	// request with ErrFeedStalled). Zero means 10 s. It is lowered to a
	// third of the DB's Limits.ReadTimeout (connection_timeout) when that
	// is shorter: CouchDB sends a heartbeat once more than Heartbeat passed
	// at a check every Heartbeat, so up to 2×Heartbeat apart, and the
	// first one carries the headers.
	Heartbeat time.Duration
	// StallAfter, when set, replaces the stall detector's 2×Heartbeat+5 s.
	StallAfter time.Duration
	// Opened, when set, is called once the answer's status and headers
	// arrived (a 2xx): the feed is readable, and every database event
	// after this call is in it.
	Opened func()
}

// DBUpdates reads the server's continuous _db_updates feed
// (GET /_db_updates?feed=continuous&heartbeat=...&since=..., at the
// server root of d's endpoint, with d's credentials and connection
// settings), calling fn for every row in order. It returns when the server
// ends the feed (its last_seq), when ctx is done, when fn returns an error
// (returned as is), or on the feed's failure: a status that is not 2xx (an
// *HTTPError: 400 on PouchDB Server's stub or a since= the server rejects,
// 401/403 for a user who is not a server admin, 404 on a CouchDB without
// _global_changes), a stall (ErrFeedStalled), a row beyond
// MaxDBUpdatesRowBytes (ErrResponseTooLarge) or a malformed one
// (ErrBadResponse); the DB's read deadline (Limits.ReadTimeout) ending it
// matches ErrFeedStalled too. The request itself is not retried: the caller
// reconnects from lastSeq, which is the seq of the last row delivered (or
// opts.Since). Errors never hold credentials.
func (d *DB) DBUpdates(ctx context.Context, opts *DBUpdatesOptions, fn func(DBUpdate) error) (lastSeq Seq, err error) {
	hb := opts.Heartbeat
	if hb <= 0 {
		hb = 10 * time.Second
	}
	if rt := d.lim.ReadTimeout; rt > 0 && hb > rt/3 {
		hb = max(rt/3, 100*time.Millisecond)
	}
	lastSeq = opts.Since
	q := []string{"feed", FeedContinuous, "heartbeat", strconv.FormatInt(max(hb.Milliseconds(), 1), 10)}
	if !opts.Since.IsZero() {
		q = append(q, "since", opts.Since.Param())
	}
	r := &request{method: http.MethodGet, path: "_db_updates", root: true, query: encodeQuery(q...), noRetry: true, feed: true}
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// The stall detector runs from the request on: CouchDB sends its
	// headers with the first heartbeat, so none within it is a stall too.
	w := newFeedWatch(cancel, ChangesOptions{Feed: FeedContinuous, Heartbeat: hb}, 0) // its own stall window (StallAfter)
	defer w.stop()
	if opts.StallAfter > 0 {
		w.stallAfter = opts.StallAfter
		w.stall.Reset(w.stallAfter)
	}
	stalled := func() error {
		if ctx.Err() == nil && errors.Is(context.Cause(fctx), ErrFeedStalled) {
			return fmt.Errorf("%w: %s %s: nothing received for %s", ErrFeedStalled, r.method, r.redactedURL(d), w.stallAfter)
		}
		return nil
	}
	resp, err := d.do(fctx, r)
	if err != nil {
		if s := stalled(); s != nil {
			return lastSeq, s
		}
		if errors.Is(err, ErrStalled) {
			// Not even the headers within connection_timeout.
			err = fmt.Errorf("%w: %w", ErrFeedStalled, err)
		}
		return lastSeq, err
	}
	if opts.Opened != nil {
		opts.Opened()
	}
	limit := min(d.lim.MaxLineBytes, int64(MaxDBUpdatesRowBytes))
	js := newLimitedJSONStream(&activityReader{r: resp.Body, w: w}, limit, "_db_updates row")
	err = readDBUpdates(js, limit, &lastSeq, fn)
	if err == nil {
		drain(resp)
		return lastSeq, nil
	}
	if _, ok := err.(callerError); ok {
		_ = resp.Body.Close()
		return lastSeq, err.(callerError).err
	}
	if s := stalled(); s != nil {
		_ = resp.Body.Close()
		return lastSeq, s
	}
	cancel(err)
	_ = resp.Body.Close()
	if ctx.Err() != nil {
		return lastSeq, ctx.Err()
	}
	if errors.Is(err, ErrStalled) {
		// The read deadline (connection_timeout) ended a feed that sent
		// nothing, not even a heartbeat.
		return lastSeq, fmt.Errorf("%w: %w", ErrFeedStalled, err)
	}
	return lastSeq, badResponse(r, d, err)
}

// readDBUpdates reads a continuous _db_updates feed: one object a line,
// blank lines (heartbeats) between them, {"last_seq"} when it ends.
func readDBUpdates(js *jsonStream, limit int64, lastSeq *Seq, fn func(DBUpdate) error) error {
	for {
		raw, err := js.value()
		if err != nil {
			return err
		}
		if int64(len(raw)) > limit {
			return &TooLargeError{What: "_db_updates row", Limit: limit}
		}
		var u DBUpdate
		var end Seq
		var rowErr, reason string
		if len(raw) == 0 || raw[0] != '{' {
			return fmt.Errorf("_db_updates row is not an object: %.100s", raw)
		}
		err = objectMembers(raw, func(key, val []byte) error {
			var err error
			switch string(key) {
			case `"db_name"`:
				if val[0] != '"' {
					return fmt.Errorf("_db_updates row: db_name is not a string: %.100s", val)
				}
				u.DBName, err = unquote(val)
			case `"type"`:
				if val[0] == '"' {
					u.Type, err = unquote(val)
				}
			case `"seq"`:
				u.Seq = SeqOf(val)
			case `"last_seq"`:
				end = SeqOf(val)
				if end == nil {
					end = Seq("null")
				}
			case `"error"`:
				if string(val) != "null" {
					rowErr = string(val)
				}
			case `"reason"`:
				if val[0] == '"' {
					reason, err = unquote(val)
				}
			}
			return err
		})
		if err != nil {
			return err
		}
		switch {
		case rowErr != "":
			return fmt.Errorf("feed reported error %s: %s", rowErr, reason)
		case end != nil:
			if string(end) != "null" {
				*lastSeq = end
			}
			return nil
		case u.DBName == "":
			return fmt.Errorf("_db_updates row without db_name: %.100s", raw)
		}
		if u.Seq != nil {
			*lastSeq = u.Seq
		}
		if err := fn(u); err != nil {
			return callerError{err}
		}
	}
}

// DBUpdatesSeq asks the server where its _db_updates feed is now
// (GET /_db_updates?since=now, a normal feed, which answers at once): a
// feed read from the seq it returns misses no event that happened after
// this call returned. It is also the probe of whether the feed can be read
// at all: its errors are DBUpdates' (*HTTPError for a status that is not
// 2xx). The request is not retried. A zero Seq means the server named no
// seq (a caller then starts its feed at SinceNow).
func (d *DB) DBUpdatesSeq(ctx context.Context) (Seq, error) {
	r := &request{method: http.MethodGet, path: "_db_updates", root: true, query: "since=now", noRetry: true}
	out, err := getJSON[struct {
		LastSeq json.RawMessage `json:"last_seq"`
	}](ctx, d, r, min(d.lim.MaxBodyBytes, int64(MaxDBUpdatesRowBytes)), "_db_updates answer")
	if err != nil {
		return nil, err
	}
	return SeqOf(out.LastSeq), nil
}
