package replicate

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/couch"
)

// DefaultErrorBudget is how long one request may keep failing before the
// job gives up on it: half of CouchDB's health_threshold (120 s), as
// couch_replicator_httpc:total_error_time_exceeded.
const DefaultErrorBudget = 60 * time.Second

// EndpointConfig are the node-wide [replicator] settings that shape every
// endpoint's connections and authentication. The zero value is CouchDB's
// defaults (certificates not verified, cookie sessions then Basic auth,
// a 60 s error budget).
type EndpointConfig struct {
	// TLS are verify_ssl_certificates, ssl_trusted_certificates_file,
	// ssl_certificate_max_depth, cert_file, key_file and password.
	TLS couch.TLSOptions
	// VerifyLog is verify_ssl_certificates_log: when certificates are not
	// verified, check each https endpoint's certificate once at start
	// against ssl_trusted_certificates_file and log a **security warning**
	// when it would fail.
	VerifyLog bool
	// ProtocolsLog is valid_endpoint_protocols_log: log a **security
	// warning** for every plain-http endpoint.
	ProtocolsLog bool
	// Socket is socket_options; a job's own socket_options override it.
	Socket couch.SocketOptions
	// AuthPlugins is auth_plugins; nil is couch.DefaultAuthPlugins.
	AuthPlugins []string
	// SessionRefresh and SessionMinUpdate are session_refresh_interval_sec
	// and session_min_update_interval (zero: 550 s and 5 s).
	SessionRefresh, SessionMinUpdate time.Duration
	// ErrorBudget bounds how long one request keeps being retried
	// (health_threshold / 2); zero is DefaultErrorBudget, negative none.
	ErrorBudget time.Duration
	// IdleTimeout closes idle connections (connection_close_interval) of
	// the transports the engine builds itself.
	IdleTimeout time.Duration
	// ConnectTo are connect_to's overrides ("host:port:target:port").
	ConnectTo []string
	// RequestTimeout is request_timeout: it bounds every request except
	// _changes feeds, response body included (couch.Options.RequestTimeout);
	// zero is CouchDB's infinity.
	RequestTimeout time.Duration
	// CompressRequests is compress_requests: _bulk_docs, _revs_diff and
	// _bulk_get bodies of couch.DefaultCompressMinBytes or more are sent
	// gzip-compressed (plain to a server that refuses them).
	CompressRequests bool
	// Tokens are iam_token_url, allow_credential_commands and
	// credential_command_timeout: how endpoints with an expiring
	// credential (auth.iam, auth.bearer) get their tokens. Its Cache nil
	// shares them process-wide (couch.DefaultTokens).
	Tokens couch.TokenOptions
}

// EndpointConfigFrom reads the [replicator] keys of c.
func EndpointConfigFrom(c config.Replicator) EndpointConfig {
	return EndpointConfig{
		TLS: couch.TLSOptions{
			Verify: c.VerifySSLCertificates, CAFile: c.SSLTrustedCertificatesFile,
			MaxDepth: c.SSLCertificateMaxDepth, CertFile: c.CertFile, KeyFile: c.KeyFile,
			KeyPassword: c.Password,
		},
		VerifyLog:        c.VerifySSLCertificatesLog,
		ProtocolsLog:     c.ValidEndpointProtocolsLog,
		Socket:           couch.ParseSocketOptions(c.SocketOptions),
		AuthPlugins:      c.AuthPlugins,
		SessionRefresh:   c.SessionRefreshInterval,
		SessionMinUpdate: c.SessionMinUpdateInterval,
		ErrorBudget:      c.HealthThreshold / 2,
		IdleTimeout:      c.ConnectionCloseInterval,
		ConnectTo:        c.ConnectTo,
		RequestTimeout:   c.RequestTimeout,
		CompressRequests: c.CompressRequests,
		Tokens: couch.TokenOptions{IAMURL: c.IAMTokenURL, AllowCommands: c.AllowCredentialCommands,
			CommandTimeout: c.CredentialCommandTimeout},
	}
}

// tokenOptions are couch.Options.Tokens under c.
func (c EndpointConfig) tokenOptions() *couch.TokenOptions {
	to := c.Tokens
	return &to
}

// CouchOptions are the couch.Options of a request made for a job outside
// its run (its filter's code): retries, the request timeout and the
// node's expiring-credential settings under c.
func (c EndpointConfig) CouchOptions(log zerolog.Logger, retries int, client *http.Client) couch.Options {
	return couch.Options{Logger: log, Retries: retries, HTTPClient: client, RequestTimeout: c.RequestTimeout, Tokens: c.tokenOptions()}
}

// ClientSource gives the HTTP client of one endpoint: the node's
// connection_pool lease implements it (connpool.Lease.ClientFor).
type ClientSource interface {
	ClientFor(u *url.URL, o couch.TransportOptions) (*http.Client, error)
}

// TransportOptions are the connection settings of endpoint ep of a
// replication with parameters p under the node's settings c: c's TLS keys,
// the endpoint's proxy, connection_timeout, and socket_options (the job's
// over the node's). couch.NewTransport turns them into the transport.
func TransportOptions(p Params, ep EndpointParams, c EndpointConfig) (couch.TransportOptions, error) {
	proxy, err := couch.ParseProxy(ep.Proxy)
	if err != nil {
		return couch.TransportOptions{}, err
	}
	return couch.TransportOptions{
		TLS:            c.TLS,
		Proxy:          proxy,
		ConnectTimeout: p.ConnectionTimeout,
		Socket:         c.Socket.Merge(couch.ParseSocketOptions(p.SocketOptions)),
		IdleTimeout:    c.IdleTimeout,
		ConnectTo:      c.ConnectTo,
	}, nil
}

// sessionOptions are the cookie-session settings of c's auth_plugins: nil
// when the session plugin is not tried first (Basic auth on every request).
func (c EndpointConfig) sessionOptions() *couch.SessionOptions {
	plugins := c.AuthPlugins
	if plugins == nil {
		plugins = couch.DefaultAuthPlugins
	}
	si := slices.Index(plugins, couch.AuthPluginSession)
	ni := slices.Index(plugins, couch.AuthPluginNoop)
	if si < 0 || (ni >= 0 && ni < si) {
		return nil
	}
	return &couch.SessionOptions{Fallback: ni > si, RefreshInterval: c.SessionRefresh, MinUpdateInterval: c.SessionMinUpdate}
}

// ServerDB is a client for the server or database at ep with the
// settings a replication job's endpoint gets from c — TLS (CA file,
// verification, client certificate), socket_options, connect_to,
// auth_plugins, request_timeout — and the default connection_timeout, for
// requests made outside a job (couchrepd --adopt-uuid); retries is
// retries_per_request. release closes its connections.
func (c EndpointConfig) ServerDB(ep couch.Endpoint, retries int, log zerolog.Logger) (db *couch.DB, release func(), err error) {
	tr, err := couch.NewTransport(couch.TransportOptions{TLS: c.TLS, ConnectTimeout: DefaultConnectionTimeout,
		Socket: c.Socket, IdleTimeout: c.IdleTimeout, ConnectTo: c.ConnectTo})
	if err != nil {
		return nil, nil, err
	}
	db = couch.NewDB(ep, couch.Options{HTTPClient: &http.Client{Transport: tr}, Logger: log,
		Retries: retries, Session: c.sessionOptions(), Tokens: c.tokenOptions(), ErrorBudget: c.errorBudget(),
		RequestTimeout: c.RequestTimeout, Limits: couch.Limits{ReadTimeout: DefaultConnectionTimeout}})
	return db, tr.CloseIdleConnections, nil
}

// compressMinBytes is couch.Options.CompressMinBytes under c.
func (c EndpointConfig) compressMinBytes() int64 {
	if c.CompressRequests {
		return couch.DefaultCompressMinBytes
	}
	return 0
}

// errorBudget is c's error budget for couch.Options.
func (c EndpointConfig) errorBudget() time.Duration {
	switch {
	case c.ErrorBudget == 0:
		return DefaultErrorBudget
	case c.ErrorBudget < 0:
		return 0
	}
	return c.ErrorBudget
}

// endpointClient returns the client of one endpoint: from the lease when
// there is one, else o.HTTPClient (shared, as given), else a transport of
// the engine's own (closed when the run ends).
func (r *Replication) endpointClient(which string, ep couch.Endpoint, epp EndpointParams) (*http.Client, error) {
	if r.o.Clients == nil && r.o.HTTPClient != nil {
		return r.o.HTTPClient, nil
	}
	to, err := TransportOptions(r.p, epp, r.o.Endpoints)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrDBNotFound, which, err)
	}
	if r.o.Endpoints.VerifyLog || r.o.Endpoints.ProtocolsLog {
		// As CouchDB's spawned checker: the job does not wait for it.
		go r.securityWarnings(r.log, r.principal(), which, ep, to)
	}
	if r.o.Clients != nil {
		c, err := r.o.Clients.ClientFor(ep.URL, to)
		if err != nil {
			return nil, fmt.Errorf("%w: %s %s: %w", ErrDBNotFound, which, ep, err)
		}
		return c, nil
	}
	to.BufferSize = connBufferSize
	tr, err := couch.NewTransport(to)
	if err != nil {
		return nil, fmt.Errorf("%w: %s %s: %w", ErrDBNotFound, which, ep, err)
	}
	tr.MaxConnsPerHost = max(r.p.HTTPConnections, 2) * 2
	r.ownTrs = append(r.ownTrs, tr)
	return &http.Client{Transport: tr}, nil
}

// securityWarnings logs CouchDB's **security warning** lines: a plain-http
// endpoint when valid_endpoint_protocols_log is on, and, when certificates
// are not verified but verify_ssl_certificates_log is on, an https
// endpoint whose certificate would not verify against
// ssl_trusted_certificates_file (couch_replicator_utils:check_ssl_certificates).
func (r *Replication) securityWarnings(log zerolog.Logger, principal, which string, ep couch.Endpoint, to couch.TransportOptions) {
	c := r.o.Endpoints
	https := strings.EqualFold(ep.URL.Scheme, "https")
	if c.ProtocolsLog && !https {
		log.Warn().Str("endpoint", which).Str("url", ep.Redacted()).
			Msgf("**security warning** replication %s has insecure %s at %s", principal, which, ep.Redacted())
	}
	if !https || c.TLS.Verify || !c.VerifyLog {
		return
	}
	if c.TLS.CAFile == "" {
		log.Warn().Msg("security warnings enabled but no ssl_trusted_certificates_file configured")
		return
	}
	probe := to
	probe.TLS.Verify = true
	tr, err := couch.NewTransport(probe)
	if err != nil {
		log.Warn().Err(err).Str("url", ep.Redacted()).Msgf("failed to check certificate of %s", ep.Redacted())
		return
	}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), max(to.ConnectTimeout, time.Second))
	defer cancel()
	u := *ep.URL
	u.User = nil
	req, _ := http.NewRequestWithContext(ctx, http.MethodHead, u.String(), nil)
	resp, err := tr.RoundTrip(req)
	if err == nil {
		_ = resp.Body.Close()
		return
	}
	if ce, ok := couch.AsCertificateError(err); ok {
		log.Warn().Str("endpoint", which).Str("url", ep.Redacted()).Str("reason", ce.Reason).
			Msgf("**security warning** replication %s has bad cert in %s for reason %s at %s", principal, which, ce.Reason, ep.Redacted())
		return
	}
	log.Warn().Err(err).Str("url", ep.Redacted()).Msgf("failed to check certificate of %s", ep.Redacted())
}

// principal names who the replication belongs to in security warnings.
func (r *Replication) principal() string {
	if r.o.Principal != "" {
		return r.o.Principal
	}
	if r.p.UserCtx != nil && r.p.UserCtx.Name != "" {
		return "by user " + r.p.UserCtx.Name
	}
	return "by unknown principal"
}
