package couch

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrTransportConfig: an endpoint's TLS or proxy settings could not be turned
// into a transport (an unreadable CA bundle, a client key that does not
// decrypt, a proxy URL with a bad scheme). The message names the setting.
var ErrTransportConfig = errors.New("couch: invalid transport settings")

// TLSOptions are CouchDB's [replicator] TLS keys as one endpoint uses them
// (couch_replicator_utils:ssl_params/1).
type TLSOptions struct {
	// Verify checks the server's certificate chain and host name
	// (verify_ssl_certificates; CouchDB's default is false).
	Verify bool
	// CAFile is a PEM bundle of trusted CAs used instead of the system's
	// roots when verifying (ssl_trusted_certificates_file).
	CAFile string
	// MaxDepth is the most intermediate CAs allowed between the server's
	// certificate and a trusted root when verifying
	// (ssl_certificate_max_depth, 3; Erlang's ssl "depth").
	MaxDepth int
	// CertFile and KeyFile are a client certificate and its private key in
	// PEM, presented to servers that ask for one (cert_file, key_file).
	CertFile, KeyFile string
	// KeyPassword decrypts an encrypted KeyFile (password).
	KeyPassword string
}

// SocketOptions are the Go-meaningful part of CouchDB's socket_options.
// Nil pointers keep Go's defaults (keep-alive on, TCP_NODELAY on).
type SocketOptions struct {
	KeepAlive *bool
	NoDelay   *bool
	// SndBuf and RecBuf set SO_SNDBUF and SO_RCVBUF when positive.
	SndBuf, RecBuf int
}

// TransportOptions are everything that shapes one endpoint's connections.
// Two endpoints with equal options (and the same proxy) share a transport.
type TransportOptions struct {
	// TLS applies to https endpoints (and https proxies' own certificates
	// are verified the same way).
	TLS TLSOptions
	// Proxy is the proxy every request goes through: http://, https:// or
	// socks5:// with optional userinfo (the proxy's credentials). Nil for
	// none. HTTPS endpoints behind an http(s) proxy are reached with CONNECT.
	Proxy *url.URL
	// ConnectTimeout bounds dialling, the TLS handshake and the wait for
	// response headers (connection_timeout). Zero means 30 s.
	ConnectTimeout time.Duration
	// Socket are the socket options.
	Socket SocketOptions
	// IdleTimeout closes connections idle this long
	// (connection_close_interval). Zero means 90 s.
	IdleTimeout time.Duration
	// BufferSize is each connection's read and write buffer; zero is
	// net/http's default.
	BufferSize int
	// ConnectTo are [replicator] connect_to overrides,
	// "host:port:target_host:target_port" (host may be "*.suffix"): a
	// connection to host:port is made to target_host:target_port instead,
	// the request (Host header, TLS server name, certificate check) still
	// naming host. Behind a proxy they apply to the proxy's address.
	ConnectTo []string
}

// Transport defaults, as CouchDB's.
const (
	// DefaultConnectTimeout is connection_timeout's default.
	DefaultConnectTimeout = 30 * time.Second
	// DefaultIdleTimeout is connection_close_interval's default.
	DefaultIdleTimeout = 90 * time.Second
	// DefaultMaxDepth is ssl_certificate_max_depth's default.
	DefaultMaxDepth = 3
)

// ProxySchemes are the proxy URL schemes NewTransport accepts (CouchDB's
// valid_proxy_protocols).
var ProxySchemes = []string{"http", "https", "socks5"}

// ParseProxy parses a proxy URL: http://, https:// or socks5:// with an
// optional user:password@. Errors never quote the URL (it may hold
// credentials).
func ParseProxy(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, nil
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("%w: proxy has an invalid url", ErrTransportConfig)
	}
	u.Scheme = strings.ToLower(u.Scheme)
	for _, s := range ProxySchemes {
		if u.Scheme == s {
			return u, nil
		}
	}
	return nil, fmt.Errorf("%w: proxy has an invalid url (scheme %q is not one of %s)", ErrTransportConfig, u.Scheme, strings.Join(ProxySchemes, ", "))
}

// NewTransport turns an endpoint's options into the http.Transport its
// requests go through: the TLS configuration (verification on or off, the
// CA bundle or the system roots, host name, chain depth, client
// certificate), the proxy (CONNECT for https endpoints behind an HTTP
// proxy, SOCKS5 with optional credentials), connection_timeout for dial,
// handshake and response headers, and the socket options. It is the only
// place couchrep builds a transport for replication traffic.
func NewTransport(o TransportOptions) (*http.Transport, error) {
	tc, err := NewTLSConfig(o.TLS)
	if err != nil {
		return nil, err
	}
	timeout := o.ConnectTimeout
	if timeout <= 0 {
		timeout = DefaultConnectTimeout
	}
	idle := o.IdleTimeout
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	d := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	if o.Socket.KeepAlive != nil && !*o.Socket.KeepAlive {
		d.KeepAlive = -1
	}
	if s := o.Socket; s.NoDelay != nil || s.SndBuf > 0 || s.RecBuf > 0 {
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				if s.NoDelay != nil {
					v := 0
					if *s.NoDelay {
						v = 1
					}
					serr = errors.Join(serr, syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_NODELAY, v))
				}
				if s.SndBuf > 0 {
					serr = errors.Join(serr, syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, s.SndBuf))
				}
				if s.RecBuf > 0 {
					serr = errors.Join(serr, syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, s.RecBuf))
				}
			})
			return errors.Join(err, serr)
		}
	}
	tr := &http.Transport{
		DialContext:           connectTo(noDelayKeeper(d, o.Socket.NoDelay), o.ConnectTo),
		TLSClientConfig:       tc,
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		ExpectContinueTimeout: time.Second,
		IdleConnTimeout:       idle,
		MaxIdleConns:          0,
		MaxIdleConnsPerHost:   1 << 10,
		ForceAttemptHTTP2:     false,
		ReadBufferSize:        o.BufferSize,
		WriteBufferSize:       o.BufferSize,
	}
	if o.Proxy != nil {
		p, err := ParseProxy(o.Proxy.String())
		if err != nil {
			return nil, err
		}
		// An https:// proxy's own certificate is checked with the same
		// TLS settings as the endpoint's.
		tr.Proxy = http.ProxyURL(p)
	}
	return tr, nil
}

// noDelayKeeper dials with d; Go sets TCP_NODELAY on every TCP connection
// after dialling, so an explicit nodelay=false is applied again afterwards.
func noDelayKeeper(d *net.Dialer, noDelay *bool) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if noDelay == nil || *noDelay {
		return d.DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err == nil {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetNoDelay(false)
			}
		}
		return c, err
	}
}

// connectTo wraps dial with connect_to overrides (couch_replicator_connect:
// the first matching entry wins; "*" matches any prefix; host names
// compare case-insensitively; entries that do not parse are ignored).
func connectTo(dial func(ctx context.Context, network, addr string) (net.Conn, error), entries []string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	type rule struct{ host, port, target string }
	var rules []rule
	for _, e := range entries {
		e = strings.TrimSpace(e)
		parts := strings.Split(e, ":")
		if len(parts) < 4 || parts[0] == "" || strings.HasPrefix(parts[0], "[") {
			continue
		}
		tgtHost := strings.Join(parts[2:len(parts)-1], ":")
		tgtHost = strings.TrimSuffix(strings.TrimPrefix(tgtHost, "["), "]")
		if _, err := strconv.Atoi(parts[1]); err != nil || tgtHost == "" {
			continue
		}
		if _, err := strconv.Atoi(parts[len(parts)-1]); err != nil {
			continue
		}
		rules = append(rules, rule{strings.ToLower(parts[0]), parts[1], net.JoinHostPort(tgtHost, parts[len(parts)-1])})
	}
	if len(rules) == 0 {
		return dial
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err == nil {
			host = strings.ToLower(host)
			for _, r := range rules {
				if r.port != port {
					continue
				}
				if suffix, wild := strings.CutPrefix(r.host, "*"); wild && strings.HasSuffix(host, suffix) || r.host == host {
					return dial(ctx, network, r.target)
				}
			}
		}
		return dial(ctx, network, addr)
	}
}

// NewTLSConfig builds the tls.Config of o. Without Verify the server's
// certificate is not checked (CouchDB's default; a security warning is
// logged by the caller when asked to). With it, the chain must lead to a CA
// of CAFile (else of the system's roots) through at most MaxDepth
// intermediates, and the certificate must be valid for the host name.
func NewTLSConfig(o TLSOptions) (*tls.Config, error) {
	// A session cache lets new pooled connections resume a session
	// instead of a full handshake.
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ClientSessionCache: tls.NewLRUClientSessionCache(64)}
	if o.CertFile != "" || o.KeyFile != "" {
		cert, err := loadClientCert(o.CertFile, o.KeyFile, o.KeyPassword)
		if err != nil {
			return nil, err
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	if !o.Verify {
		tc.InsecureSkipVerify = true
		return tc, nil
	}
	if o.CAFile != "" {
		pool, err := loadCAFile(o.CAFile)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = pool
	}
	depth := o.MaxDepth
	if depth < 0 {
		depth = DefaultMaxDepth
	}
	tc.VerifyConnection = func(cs tls.ConnectionState) error {
		// The chains are already verified (host name included) by the
		// time this runs; only the depth is left to check.
		if len(cs.VerifiedChains) == 0 {
			return nil
		}
		shortest := -1
		for _, ch := range cs.VerifiedChains {
			n := max(len(ch)-2, 0) // intermediates: leaf and root excluded
			if shortest < 0 || n < shortest {
				shortest = n
			}
		}
		if shortest > depth {
			return &CertificateError{Reason: "chain too long",
				Err: fmt.Errorf("certificate chain has %d intermediate CAs, ssl_certificate_max_depth is %d", shortest, depth)}
		}
		return nil
	}
	return tc, nil
}

func loadCAFile(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: ssl_trusted_certificates_file: %w", ErrTransportConfig, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%w: ssl_trusted_certificates_file %s: no PEM certificate in it", ErrTransportConfig, path)
	}
	return pool, nil
}

func loadClientCert(certFile, keyFile, password string) (tls.Certificate, error) {
	if certFile == "" || keyFile == "" {
		return tls.Certificate{}, fmt.Errorf("%w: cert_file and key_file must be set together", ErrTransportConfig)
	}
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%w: cert_file: %w", ErrTransportConfig, err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%w: key_file: %w", ErrTransportConfig, err)
	}
	keyPEM, err = decryptKeyPEM(keyPEM, password)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%w: key_file %s: %w", ErrTransportConfig, keyFile, err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%w: cert_file %s / key_file %s: %w", ErrTransportConfig, certFile, keyFile, err)
	}
	return cert, nil
}

// decryptKeyPEM returns the key unencrypted: legacy PEM encryption
// ("Proc-Type: 4,ENCRYPTED", what `openssl rsa -aes256` writes) is
// decrypted with password; PKCS#8 encryption is not supported by Go's
// standard library and is reported as such.
func decryptKeyPEM(keyPEM []byte, password string) ([]byte, error) {
	var out []byte
	rest := keyPEM
	found := false
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if !strings.HasSuffix(block.Type, "PRIVATE KEY") {
			continue
		}
		found = true
		if block.Type == "ENCRYPTED PRIVATE KEY" {
			return nil, errors.New("PKCS#8-encrypted keys are not supported; convert it with `openssl pkey -in KEY -aes256 -traditional`, or decrypt it")
		}
		//nolint:staticcheck // legacy PEM encryption is what CouchDB's `password` decrypts too
		if x509.IsEncryptedPEMBlock(block) {
			if password == "" {
				return nil, errors.New("the key is encrypted and [replicator] password is not set")
			}
			//nolint:staticcheck // see above
			der, err := x509.DecryptPEMBlock(block, []byte(password))
			if err != nil {
				return nil, errors.New("the key does not decrypt with [replicator] password")
			}
			block = &pem.Block{Type: block.Type, Bytes: der}
		}
		out = append(out, pem.EncodeToMemory(block)...)
	}
	if !found {
		return nil, errors.New("no PEM private key in it")
	}
	return out, nil
}

// PoolKey is the key of the pool of connections o gives to endpoint u, as
// CouchDB keys its connection pool: host, port, proxy host and proxy port,
// without credentials; the scheme and a digest of the TLS and socket
// settings (and of the proxy's credentials) keep endpoints whose
// connections differ apart. It is safe to show: it holds no secret.
func (o TransportOptions) PoolKey(u *url.URL) string {
	var sb strings.Builder
	if u != nil {
		sb.WriteString(HostKey(u))
	}
	if o.Proxy != nil {
		sb.WriteString(" via ")
		sb.WriteString(HostKey(o.Proxy))
	}
	sb.WriteString(" #")
	sb.WriteString(o.settingsDigest())
	return sb.String()
}

// settingsDigest is a short digest of everything but the endpoint.
func (o TransportOptions) settingsDigest() string {
	h := sha256.New()
	t := o.TLS
	fmt.Fprintf(h, "%t\x00%s\x00%d\x00%s\x00%s\x00%s\x00", t.Verify, t.CAFile, t.MaxDepth, t.CertFile, t.KeyFile, t.KeyPassword)
	if o.Proxy != nil {
		fmt.Fprintf(h, "%s\x00", o.Proxy.User.String())
	}
	fmt.Fprintf(h, "%d\x00%d\x00%d\x00%q\x00", o.ConnectTimeout, o.IdleTimeout, o.BufferSize, o.ConnectTo)
	s := o.Socket
	fmt.Fprintf(h, "%v\x00%v\x00%d\x00%d", boolPtr(s.KeepAlive), boolPtr(s.NoDelay), s.SndBuf, s.RecBuf)
	return hex.EncodeToString(h.Sum(nil)[:8])
}

func boolPtr(b *bool) string {
	if b == nil {
		return "-"
	}
	return strconv.FormatBool(*b)
}

// HostKey is "scheme://host:port" of u with the default port made explicit
// and credentials dropped.
func HostKey(u *url.URL) string {
	host := strings.ToLower(u.Hostname())
	port := u.Port()
	scheme := strings.ToLower(u.Scheme)
	if port == "" {
		switch scheme {
		case "https":
			port = "443"
		case "socks5":
			port = "1080"
		default:
			port = "80"
		}
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return scheme + "://" + host + ":" + port
}

var socketOptionRe = regexp.MustCompile(`\{\s*([a-z_]+)\s*,\s*([A-Za-z0-9_]+)\s*\}`)

// ParseSocketOptions reads CouchDB's socket_options, an Erlang term such as
// "[{keepalive, true}, {nodelay, false}]". keepalive, nodelay, sndbuf and
// recbuf are applied; others (priority, buffer) mean nothing here and are
// dropped, as CouchDB drops options outside valid_socket_options; a string
// that is not a list of {name, value} pairs gives no options (CouchDB: []).
func ParseSocketOptions(s string) SocketOptions {
	var o SocketOptions
	t := strings.TrimSpace(s)
	if !strings.HasPrefix(t, "[") || !strings.HasSuffix(t, "]") {
		return o
	}
	for _, m := range socketOptionRe.FindAllStringSubmatch(t, -1) {
		name, val := m[1], m[2]
		switch name {
		case "keepalive", "nodelay":
			b, err := strconv.ParseBool(val)
			if err != nil {
				continue
			}
			if name == "keepalive" {
				o.KeepAlive = &b
			} else {
				o.NoDelay = &b
			}
		case "sndbuf", "recbuf":
			n, err := strconv.Atoi(val)
			if err != nil || n <= 0 {
				continue
			}
			if name == "sndbuf" {
				o.SndBuf = n
			} else {
				o.RecBuf = n
			}
		}
	}
	return o
}

// Merge returns o with the options set in over replacing its own.
func (o SocketOptions) Merge(over SocketOptions) SocketOptions {
	if over.KeepAlive != nil {
		o.KeepAlive = over.KeepAlive
	}
	if over.NoDelay != nil {
		o.NoDelay = over.NoDelay
	}
	if over.SndBuf > 0 {
		o.SndBuf = over.SndBuf
	}
	if over.RecBuf > 0 {
		o.RecBuf = over.RecBuf
	}
	return o
}
