package docproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/pause"
)

// errNoDBUpdates: the server has no usable _db_updates (PouchDB Server
// answers 400; CouchDB 1.x and others 404/405/501).
var errNoDBUpdates = errors.New("docproc: _db_updates not available")

// dbUpdates is the answer to GET /_db_updates.
type dbUpdates struct {
	Results []struct {
		DBName string `json:"db_name"`
		Type   string `json:"type"`
	} `json:"results"`
	LastSeq json.RawMessage `json:"last_seq"`
}

// discover reports the server's _replicator databases on snaps whenever
// they change, until ctx ends: from _db_updates where it exists, by
// polling _all_dbs otherwise.
func (p *Processor) discover(ctx context.Context, i int, snaps chan<- snapshot) {
	srv := p.servers[i]
	log := p.log.With().Str("server", srv.key).Logger()
	root := couch.NewDB(srv.ep, p.couchOpts())
	var last map[string]bool
	send := func(dbs map[string]bool) bool {
		if last != nil && maps.Equal(last, dbs) {
			return true
		}
		select {
		case snaps <- snapshot{server: i, dbs: dbs}:
			last = dbs
			return true
		case <-ctx.Done():
			return false
		}
	}
	useUpdates := true
	backoff := pause.Backoff{Min: time.Second, Max: time.Minute}
	for ctx.Err() == nil {
		var since couch.Seq
		if useUpdates {
			var err error
			since, err = p.dbUpdatesNow(ctx, root)
			if errors.Is(err, errNoDBUpdates) {
				log.Info().Msg("server has no _db_updates: polling _all_dbs")
				useUpdates = false
			} else if err != nil {
				log.Warn().Err(err).Msg("_db_updates failed")
			}
		}
		dbs, err := p.replicatorDBs(ctx, root)
		if err != nil {
			wait := backoff.Next()
			if ctx.Err() == nil {
				log.Warn().Err(err).Dur("retry_in", wait).Msg("listing databases failed")
			}
			if pause.For(ctx, wait) != nil {
				return
			}
			continue
		}
		backoff.Reset()
		if !send(dbs) {
			return
		}
		if !useUpdates || since == nil {
			if pause.For(ctx, p.opts.PollInterval) != nil {
				return
			}
			continue
		}
		// Follow _db_updates from since; any failure lists again.
		for ctx.Err() == nil {
			u, err := p.dbUpdatesLongpoll(ctx, root, since)
			if err != nil {
				if ctx.Err() == nil {
					log.Warn().Err(err).Msg("_db_updates failed")
					_ = pause.For(ctx, backoff.Next())
				}
				break
			}
			next := maps.Clone(last)
			for _, r := range u.Results {
				if !IsReplicatorDB(r.DBName) {
					continue
				}
				switch r.Type {
				case "deleted":
					delete(next, r.DBName)
				default: // created, updated
					next[r.DBName] = true
				}
			}
			if !send(next) {
				return
			}
			if len(u.LastSeq) > 0 {
				since = couch.SeqOf(u.LastSeq)
			}
		}
	}
}

// replicatorDBs lists the server's _replicator databases, creating
// _replicator first when configured to.
func (p *Processor) replicatorDBs(ctx context.Context, root *couch.DB) (map[string]bool, error) {
	raw, err := root.GetDoc(ctx, "_all_dbs", nil)
	if err != nil {
		return nil, err
	}
	var names []string
	if err := json.Unmarshal(raw, &names); err != nil {
		return nil, fmt.Errorf("docproc: _all_dbs: %w: %w", couch.ErrBadResponse, err)
	}
	dbs := map[string]bool{}
	for _, n := range names {
		if IsReplicatorDB(n) {
			dbs[n] = true
		}
	}
	if p.opts.CreateReplicatorDB && !dbs["_replicator"] {
		srv := server{ep: root.Endpoint()}
		err := couch.NewDB(srv.dbEndpoint("_replicator"), p.couchOpts()).Create(ctx, nil)
		if err != nil && !errors.Is(err, couch.ErrExists) {
			return nil, fmt.Errorf("docproc: create _replicator: %w", err)
		}
		dbs["_replicator"] = true
	}
	return dbs, nil
}

// dbUpdatesNow returns the current _db_updates sequence.
func (p *Processor) dbUpdatesNow(ctx context.Context, root *couch.DB) (couch.Seq, error) {
	var u dbUpdates
	raw, err := root.GetDoc(ctx, "_db_updates", url.Values{"feed": {"normal"}, "since": {"now"}})
	if err != nil {
		return nil, classifyDBUpdatesErr(err)
	}
	if err := json.Unmarshal(raw, &u); err != nil {
		return nil, fmt.Errorf("docproc: _db_updates: %w: %w", couch.ErrBadResponse, err)
	}
	if len(u.LastSeq) == 0 {
		return nil, errNoDBUpdates
	}
	return couch.SeqOf(u.LastSeq), nil
}

// dbUpdatesLongpoll waits for database events after since.
func (p *Processor) dbUpdatesLongpoll(ctx context.Context, root *couch.DB, since couch.Seq) (*dbUpdates, error) {
	timeout := p.opts.FeedTimeout
	ctx, cancel := context.WithTimeout(ctx, timeout+timeout/4+5*time.Second)
	defer cancel()
	q := url.Values{"feed": {"longpoll"}, "since": {since.Param()}, "timeout": {strconv.FormatInt(timeout.Milliseconds(), 10)}}
	raw, err := root.GetDoc(ctx, "_db_updates", q)
	if err != nil {
		return nil, classifyDBUpdatesErr(err)
	}
	var u dbUpdates
	if err := json.Unmarshal(raw, &u); err != nil {
		return nil, fmt.Errorf("docproc: _db_updates: %w: %w", couch.ErrBadResponse, err)
	}
	return &u, nil
}

func classifyDBUpdatesErr(err error) error {
	var he *couch.HTTPError
	if errors.As(err, &he) {
		switch he.Status {
		case http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusNotImplemented:
			return fmt.Errorf("%w: %w", errNoDBUpdates, err)
		}
	}
	return err
}
