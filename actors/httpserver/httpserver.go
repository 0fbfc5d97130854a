// Package httpserver is the http_api actor: it serves CouchDB's replicator HTTP
// API (/_replicate, /_scheduler/*, /_active_tasks, /_up, /metrics, /_status; see
// internal/httpapi) on [couchrep] http_bind, on api_frontend nodes.
//
// The listener is opened when the actor starts, so a bind failure is a start
// failure its supervisor sees. The real address (port 0 picks one) is logged
// and written to <data_dir>/http.addr, newline-terminated, like admin.addr.
// The server runs in a goroutine; stopping the actor closes the listener at
// once (so a restarted incarnation can bind the same port), cancels the
// requests in flight (a POST /_replicate waiting for a one-shot answers 503;
// the replication itself continues) and lets the connections finish in the
// background. The node's metrics (actors.Deps.Metrics) are fed by the node;
// the actor gives them the cluster view and the store's health check.
package httpserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/actors"
	clusterpkg "github.com/couchrep/couchrep/internal/cluster"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/httpapi"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

// Name is the actor's name under the node's root supervisor.
const Name = "http_api"

// AddrFile is the file in the data directory that holds the address the
// API listens on.
const AddrFile = "http.addr"

// shutdownGrace bounds how long connections may take to finish after the
// actor stopped.
const shutdownGrace = 10 * time.Second

// Spec returns the actor's child spec in the node's supervision tree.
func Spec(deps actors.Deps) supervisor.ChildSpec {
	return supervisor.ChildSpec{Name: Name, Props: actors.Props(func() actor.Actor {
		return &httpAPI{deps: deps, log: deps.Logger.With().Str("actor", Name).Logger()}
	})}
}

type httpAPI struct {
	deps     actors.Deps
	log      zerolog.Logger
	srv      *http.Server
	ln       net.Listener
	cancel   context.CancelFunc
	stopping *atomic.Bool
	system   *actor.ActorSystem
	events   *eventstream.Subscription
}

func (a *httpAPI) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case *actor.Started:
		if err := a.start(ctx); err != nil {
			supervisor.Exit(ctx, err)
		}
	case *actor.Stopping:
		a.stop()
	}
}

func (a *httpAPI) start(ctx actor.Context) error {
	a.system = ctx.ActorSystem()
	cfg := a.deps.Config
	if !cfg.HasNodeType(config.NodeTypeAPIFrontend) {
		a.log.Debug().Msg("not an api_frontend node: no HTTP API")
		return nil
	}
	store := a.deps.RepJobs
	if store == nil {
		store = repjob.NewFromConfig(a.deps.Jobs, a.deps.Store, cfg, a.log)
	}
	ln, err := net.Listen("tcp", cfg.Couchrep.HTTPBind)
	if err != nil {
		return fmt.Errorf("http api: %w", err)
	}
	scheme := "http"
	if cfg.SSL.Enable {
		// [ssl] as in CouchDB: the API is served over TLS only.
		cert, err := tls.LoadX509KeyPair(cfg.SSL.CertFile, cfg.SSL.KeyFile)
		if err != nil {
			ln.Close()
			return fmt.Errorf("http api: [ssl] cert_file %s, key_file %s: %w", cfg.SSL.CertFile, cfg.SSL.KeyFile, err)
		}
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
		scheme = "https"
	}
	cl := cluster{deps: a.deps, store: store}
	var competing func() any
	if comp := a.deps.Competition; comp != nil && len(cfg.Couchrep.Watch) > 0 {
		competing = func() any { return comp.Snapshot() }
	}
	var warnings []string
	if w := config.FDWarning(cfg); w != "" {
		warnings = append(warnings, w)
	}
	users, err := a.usersOptions()
	if err != nil {
		ln.Close()
		return err
	}
	server := httpapi.New(httpapi.Options{
		Users:    users,
		Warnings: warnings,
		Store:    httpapi.NewRepjobStore(store, cfg.CouchDB.UUID),
		Admins:   cfg.Admins,
		Logger:   a.log,
		Metrics:  a.deps.Metrics,
		UUID:     cfg.CouchDB.UUID,
		NodeName: cfg.Couchrep.NodeName,
		Cluster:  cl,

		Competing: competing,
		Servers:   cfg.Couchrep.Watch,

		CredentialCommands: replicate.JobDefaults(cfg.Replicator).CredentialCommands,
		Replicator:         &cfg.Replicator,
	})
	var check func(context.Context) error
	if c, ok := a.deps.Store.(kv.Checker); ok {
		check = c.Check
	}
	server.Metrics().SetCluster(cl, check)
	// The job actors of this node report their progress about once a
	// second on the event stream; the API shows it live (the store has it
	// only every ActivityTimeout/2).
	metrics := server.Metrics()
	a.events = ctx.ActorSystem().EventStream.Subscribe(func(evt any) {
		if e, ok := evt.(*messages.ReplicationJobEvent); ok {
			metrics.ObserveLive(e)
		}
	})
	base, cancel := context.WithCancel(context.Background())
	a.ln, a.cancel, a.stopping = ln, cancel, &atomic.Bool{}
	a.srv = &http.Server{
		Handler:           server,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return base },
	}
	self, root, srv, stopping := ctx.Self(), ctx.ActorSystem().Root, a.srv, a.stopping
	go func() {
		err := srv.Serve(ln)
		if !stopping.Load() && !errors.Is(err, http.ErrServerClosed) {
			root.Send(self, &actors.Failed{Err: fmt.Errorf("http api: %w", err)})
		}
	}()
	addr := ln.Addr().String()
	if dir := cfg.Couchrep.DataDir; dir != "" {
		if err := writeAddr(filepath.Join(dir, AddrFile), addr); err != nil {
			a.log.Warn().Err(err).Msg("write " + AddrFile)
		}
	}
	ev := a.log.Info().Str("addr", addr).Str("url", scheme+"://"+addr+"/")
	adminParty := len(cfg.Admins) == 0 && users.AuthServer == ""
	if adminParty {
		ev = ev.Bool("admin_party", true)
	}
	if users.AuthServer != "" {
		// The server's own credentials, if its URL has any, are not logged
		// (nor sent with the users').
		ev = ev.Str("auth_server", redact.StripUserinfo(users.AuthServer))
	}
	ev.Msg("http api listening")
	if adminParty && !config.IsLoopback(addr) {
		a.log.Warn().Str("addr", addr).Msg("http api has no [admins] and listens beyond loopback: anyone who can reach it can start and cancel replications")
	}
	return nil
}

// usersOptions is who may use the API beyond [admins]: the users of
// [couchrep] auth_server (or the first watched server), asked with the same
// TLS settings as the watched servers; session cookies signed with the
// secret in the job store, so that every node accepts them.
func (a *httpAPI) usersOptions() (httpapi.UsersOptions, error) {
	cfg := a.deps.Config
	o := httpapi.UsersOptions{
		AuthServer:     cfg.UsersAuthServer(),
		CacheTTL:       cfg.Couchrep.AuthCacheTTL,
		SessionTimeout: cfg.Couchrep.SessionTimeout,
	}
	if db := a.deps.Store; db != nil {
		o.SessionSecret = func(ctx context.Context) ([]byte, error) { return clusterpkg.SessionSecret(ctx, db) }
	}
	if o.AuthServer != "" {
		tr, err := couch.NewTransport(couch.TransportOptions{TLS: replicate.EndpointConfigFrom(cfg.Replicator).TLS,
			IdleTimeout: cfg.Replicator.ConnectionCloseInterval})
		if err != nil {
			return o, fmt.Errorf("http api: auth server: %w", err)
		}
		o.Client = &http.Client{Transport: tr, Timeout: httpapi.DefaultAuthServerTimeout}
	}
	return o, nil
}

// writeAddr writes addr and a newline atomically (rename), so a reader never
// sees a partial address.
func writeAddr(path, addr string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(addr+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// stop closes the listener now and drains connections in the background.
func (a *httpAPI) stop() {
	if a.events != nil {
		a.system.EventStream.Unsubscribe(a.events)
		a.events = nil
	}
	if a.srv == nil {
		return
	}
	a.stopping.Store(true)
	_ = a.ln.Close()
	a.cancel()
	srv, log := a.srv, a.log
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			log.Warn().Err(err).Msg("http api: connections did not finish in time; closing them")
			_ = srv.Close()
		}
	}()
	a.srv = nil
	a.log.Info().Msg("http api stopped")
}
