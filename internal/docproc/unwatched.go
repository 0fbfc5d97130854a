package docproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
)

// watchRecord is the ("watching", node) value: the servers (store keys, no
// credentials) a node's [couchrep] watch listed when it last started.
type watchRecord struct {
	Servers []string `json:"servers"`
}

// Forgotten is what ForgetUnwatched did to one server.
type Forgotten struct {
	// Server is the server's URL without credentials.
	Server string
	// Jobs is how many of its documents' jobs were removed.
	Jobs int
}

// ForgetUnwatched records the servers this node watches (Options.Servers,
// possibly none) and forgets every server the doc processor knew (it has
// records, a feed checkpoint or a lease for it, or this node's previous
// watch list named it) that no node watches any more: the jobs of its
// _replicator documents are removed (a running one is
// stopped at once by its node) and the doc processor's records, feed
// checkpoints and leases for it are cleared, so that nothing of it runs
// again at the next start. Replication checkpoints stay on the endpoints:
// watching the server again later resumes from them.
//
// A server is still watched if another node's last recorded watch list
// names it, or another node holds an unexpired lease on one of its
// databases (a node of an earlier version, which records no list). Run
// calls it first; a node that processes no documents (not api_frontend, or
// an empty watch list) calls it at start-up too. Persistent jobs of a
// server the doc processor never knew (added through the store API) are
// not its own and are left alone.
func (p *Processor) ForgetUnwatched(ctx context.Context) ([]Forgotten, error) {
	mine := make([]string, len(p.servers))
	for i, s := range p.servers {
		mine[i] = serverKey(s.key)
	}
	watched := map[string]bool{}
	for _, s := range mine {
		watched[s] = true
	}
	known := map[string]string{} // serverKey -> the key as stored
	now := p.opts.Clock().UnixNano()
	err := p.opts.Store.Transact(ctx, func(tx kv.Tx) error {
		clear(known)
		sub := p.keys.root.Sub("watching")
		if err := eachRow(tx, sub, func(t tuple.Tuple, v []byte) error {
			var r watchRecord
			if err := json.Unmarshal(v, &r); err != nil {
				return nil // unreadable: it names nothing
			}
			for _, s := range r.Servers {
				if node, _ := t[0].(string); node == p.opts.Node {
					known[serverKey(s)] = s // what this node watched before
				} else {
					watched[serverKey(s)] = true
				}
			}
			return nil
		}); err != nil {
			return err
		}
		if err := setJSON(tx, p.keys.watching(p.opts.Node), watchRecord{Servers: mine}); err != nil {
			return err
		}
		if err := eachRow(tx, p.keys.root.Sub("lease"), func(t tuple.Tuple, v []byte) error {
			server, _ := t[0].(string)
			known[serverKey(server)] = server
			var l lease
			if json.Unmarshal(v, &l) == nil && l.Owner != p.opts.Node && l.Expires > now {
				watched[serverKey(server)] = true
			}
			return nil
		}); err != nil {
			return err
		}
		return eachRow(tx, p.keys.root.Sub("seq"), func(t tuple.Tuple, _ []byte) error {
			server, _ := t[0].(string)
			known[serverKey(server)] = server
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("docproc: read watched servers: %w", err)
	}
	jobs, err := p.opts.Jobs.Persistent(ctx)
	if err != nil {
		return nil, fmt.Errorf("docproc: list document jobs: %w", err)
	}
	byServer := map[string][]string{}
	for _, j := range jobs {
		k := serverKey(j.Server)
		byServer[k] = append(byServer[k], j.ID)
	}
	var out []Forgotten
	for k, stored := range known {
		if watched[k] {
			continue
		}
		f := Forgotten{Server: stored}
		for _, id := range byServer[k] {
			if err := p.opts.Jobs.Remove(ctx, id); err != nil && !errors.Is(err, ErrJobNotFound) {
				return out, fmt.Errorf("docproc: remove job %q of unwatched server %s: %w", id, stored, err)
			}
			f.Jobs++
		}
		if err := p.forgetServer(ctx, stored); err != nil {
			return out, err
		}
		p.log.Info().Str("server", stored).Int("jobs_removed", f.Jobs).
			Msg("server no longer watched: its documents' jobs removed and its records forgotten (checkpoints stay on the endpoints)")
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b Forgotten) int { return strings.Compare(a.Server, b.Server) })
	return out, nil
}

// forgetServer clears the doc processor's records, checkpoints and leases
// for server (its key as stored).
func (p *Processor) forgetServer(ctx context.Context, server string) error {
	err := p.opts.Store.Transact(ctx, func(tx kv.Tx) error {
		for _, tag := range []string{"seq", "doc", "lease"} {
			tx.ClearRange(p.keys.root.Sub(tag, server).Range())
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("docproc: forget server %s: %w", server, err)
	}
	return nil
}

// eachRow calls fn with the unpacked key (after sub) and value of every
// row under sub whose key starts with a string.
func eachRow(tx kv.ReadTx, sub tuple.Subspace, fn func(tuple.Tuple, []byte) error) error {
	begin, end := sub.Range()
	it := tx.GetRange(begin, end, kv.RangeOptions{})
	for it.Next() {
		e := it.KeyValue()
		t, err := sub.Unpack(e.Key)
		if err != nil || len(t) == 0 {
			continue
		}
		if _, ok := t[0].(string); !ok {
			continue
		}
		if err := fn(t, e.Value); err != nil {
			return err
		}
	}
	return it.Err()
}

// serverKey compares servers' store keys: without a trailing slash.
func serverKey(s string) string { return strings.TrimRight(s, "/") }
