package couchrep

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/takeover"
	"github.com/couchrep/couchrep/messages"
)

// takeoverTimeout bounds the requests of one takeover check.
const takeoverTimeout = time.Minute

// takeoverRequested answers a TakeoverRequest (couchrepctl takeover): the
// preconditions of taking over the server's _replicator documents, checked
// against the server with internal/takeover, the facts the doc processor's
// competing-replicator check reads too. It changes nothing.
func (n *Node) takeoverRequested(ctx context.Context, msg proto.Message) (proto.Message, error) {
	req := msg.(*messages.TakeoverRequest)
	ep, err := couch.ParseEndpoint(req.GetServer())
	if err != nil || req.GetServer() == "" {
		return nil, fmt.Errorf("%w: takeover needs the server's URL (http://host:5984): %v", actors.ErrInvalidRequest, err)
	}
	watched := false
	for _, w := range n.cfg.Couchrep.Watch {
		wep, err := couch.ParseEndpoint(w)
		if err != nil {
			continue
		}
		if wep.Redacted() == ep.Redacted() {
			watched = true
			if ep.Username == "" && ep.Password == "" {
				ep = wep // the watched URL's credentials
			}
		}
	}
	id, err := takeover.StoreID(ctx, n.deps.Store)
	if err != nil {
		return nil, err
	}
	rc := replicate.EndpointConfigFrom(n.cfg.Replicator)
	tr, err := couch.NewTransport(couch.TransportOptions{TLS: rc.TLS, ConnectTimeout: replicate.DefaultConnectionTimeout,
		Socket: rc.Socket, ConnectTo: rc.ConnectTo})
	if err != nil {
		return nil, fmt.Errorf("takeover: %w", err)
	}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, takeoverTimeout)
	defer cancel()
	p := takeover.Prober{Endpoint: ep, StoreID: id,
		Options: couch.Options{HTTPClient: &http.Client{Transport: tr}, Logger: n.log, Retries: 1}}
	facts := p.Probe(ctx, nil)
	now := time.Now()
	checks := takeover.Checks(facts, takeover.Want{UUID: n.cfg.CouchDB.UUID, Watched: watched, Node: n.Name()}, now)
	resp := &messages.TakeoverResponse{Server: facts.Server, Node: n.Name(), StoreId: id, Ready: takeover.Ready(checks)}
	for _, c := range checks {
		resp.Checks = append(resp.Checks, &messages.TakeoverCheck{Name: c.Name, Result: c.Result, Found: c.Found, Next: c.Next})
	}
	n.log.Info().Str("server", facts.Server).Bool("ready", resp.Ready).Msg("takeover checked")
	return resp, nil
}
