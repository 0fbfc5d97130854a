package testserver

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The Debian test servers of the real-endpoint tests (installed by `make
// testdeps`): nginx terminates TLS in front of PouchDB Server, tinyproxy is
// an HTTP forward proxy (CONNECT included), microsocks a SOCKS5 server. Each
// runs as its own process on free loopback ports, with its configuration and
// logs in t.TempDir(), and is killed when the test ends. A missing binary
// fails the test: run `make testdeps`.

// Proc is a test server process whose log a test can read.
type Proc struct {
	// Name is the binary's name (nginx, tinyproxy, microsocks).
	Name string
	// LogPath is the file the process logs its requests or connections to.
	LogPath string

	cmd    *exec.Cmd
	exited chan struct{}
}

// Log returns the whole log so far.
func (p *Proc) Log() string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// Stop kills the process group and waits for it.
func (p *Proc) Stop() {
	if p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-p.exited
}

// binary finds a test server's binary on PATH or in /usr/sbin.
func binary(t testing.TB, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin"} {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	t.Fatalf("testserver: %s is not installed: run `make testdeps` (it installs Debian's %s package)", name, name)
	return ""
}

// startProc starts bin with args in dir, output to outPath, and waits until
// ready succeeds (or the process exits, or a minute passes).
func startProc(t testing.TB, name, bin, dir, outPath string, args []string, ready func() error) (*Proc, error) {
	out, err := os.OpenFile(outPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testserver: starting %s: %w", bin, err)
	}
	p := &Proc{Name: name, LogPath: outPath, cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	deadline := time.Now().Add(startTimeout)
	for {
		err := ready()
		if err == nil {
			break
		}
		select {
		case <-p.exited:
			b, _ := os.ReadFile(outPath)
			return nil, fmt.Errorf("testserver: %s exited during start: %s", name, tail(b, 2048))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("testserver: %s not ready after %s: %v", name, startTimeout, err)
		}
	}
	t.Cleanup(p.Stop)
	return p, nil
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func dialable(addr string) func() error {
	return func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}
}

// retryOnPort is retryStart for a server on one loopback port: each try
// gets a fresh directory and a port that was free, and its address.
func retryOnPort[T any](t testing.TB, what string, start func(dir string, port int, addr string) (T, error)) T {
	t.Helper()
	return retryStart(t, what, func() (T, error) {
		port, err := FreePort()
		if err != nil {
			var zero T
			return zero, err
		}
		return start(t.TempDir(), port, "127.0.0.1:"+strconv.Itoa(port))
	})
}

// retryStart tries start three times: a port found free may be taken by
// someone else before the server binds it.
func retryStart[T any](t testing.TB, what string, start func() (T, error)) T {
	t.Helper()
	var lastErr error
	for range 3 {
		v, err := start()
		if err == nil {
			return v
		}
		lastErr = err
	}
	t.Fatalf("testserver: %s did not start: %v", what, lastErr)
	var zero T
	return zero
}

// Nginx is an nginx process in front of one PouchDB Server.
type Nginx struct {
	*Proc
	// HTTPURL is the plain-HTTP server root ("http://127.0.0.1:<port>/").
	HTTPURL string
	// HTTPSURL is the TLS server root, with PKI.ServerCert.
	HTTPSURL string
	// ClientCertURL is a TLS server root that requires a client
	// certificate signed by the PKI's CA (ssl_verify_client on).
	ClientCertURL string
	// NoSessionURL is a plain-HTTP server root whose /_session answers
	// 404, as a server without cookie authentication does.
	NoSessionURL string
	// SmallBodyURL is a plain-HTTP server root that refuses request bodies
	// over SmallBodyLimit with 413, as a CouchDB with a small
	// max_http_request_size does.
	SmallBodyURL string
	// AccessLog is the path of nginx's access log: a line per request,
	// `<addr> "<request line>" <status> auth=<cookie|basic|>` telling
	// whether an AuthSession cookie and/or Basic credentials were sent
	// (never their values).
	AccessLog string

	start func() (*Proc, error)
}

// Restart starts nginx again with the same configuration and ports after
// Stop (a server that comes back).
func (n *Nginx) Restart(t testing.TB) {
	t.Helper()
	var err error
	for range 3 {
		var p *Proc
		if p, err = n.start(); err == nil {
			n.Proc = p
			return
		}
	}
	t.Fatalf("testserver: nginx did not restart: %v", err)
}

// SmallBodyLimit is the largest request body SmallBodyURL accepts.
const SmallBodyLimit = 1 << 20

// StartNginx starts nginx with three servers proxying to upstream (a
// PouchDB Server root URL): plain HTTP, HTTPS with pki's server
// certificate, and HTTPS requiring a client certificate of pki's CA.
// Streams are not buffered (continuous _changes pass through at once) and
// upstream connections are kept alive.
func StartNginx(t testing.TB, pki *PKI, upstream string) *Nginx {
	t.Helper()
	bin := binary(t, "nginx")
	up, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	return retryStart(t, "nginx", func() (*Nginx, error) {
		dir := t.TempDir()
		ports := make([]int, 5)
		for i := range ports {
			if ports[i], err = FreePort(); err != nil {
				return nil, err
			}
		}
		args, err := nginxConf(dir, "", fmt.Sprintf(`events { worker_connections 1024; }
http {
	map $http_cookie $auth_cookie { ~AuthSession= cookie; default ""; }
	map $http_authorization $auth_basic { ~^Basic basic; default ""; }
	log_format couchrep '$remote_addr "$request" $status auth=$auth_cookie$auth_basic';
%[12]s	proxy_set_header Connection "";
	proxy_set_header Host $http_host;
	upstream pouchdb { server %[2]s; keepalive 64; }
	ssl_protocols TLSv1.2 TLSv1.3;
	server {
		listen 127.0.0.1:%[3]d;
		location / { proxy_pass http://pouchdb; }
	}
	server {
		listen 127.0.0.1:%[4]d ssl;
		ssl_certificate %[6]s;
		ssl_certificate_key %[7]s;
		location / { proxy_pass http://pouchdb; }
	}
	server {
		listen 127.0.0.1:%[9]d;
		location = /_session { return 404; }
		location / { proxy_pass http://pouchdb; }
	}
	server {
		listen 127.0.0.1:%[10]d;
		client_max_body_size %[11]d;
		location / { proxy_pass http://pouchdb; }
	}
	server {
		listen 127.0.0.1:%[5]d ssl;
		ssl_certificate %[6]s;
		ssl_certificate_key %[7]s;
		ssl_client_certificate %[8]s;
		ssl_verify_client on;
		location / { proxy_pass http://pouchdb; }
	}
}
`, dir, up.Host, ports[0], ports[1], ports[2], pki.ServerCert, pki.ServerKey, pki.CAFile, ports[3], ports[4], SmallBodyLimit, nginxStreaming(dir)))
		if err != nil {
			return nil, err
		}
		n := &Nginx{
			HTTPURL:       fmt.Sprintf("http://127.0.0.1:%d/", ports[0]),
			HTTPSURL:      fmt.Sprintf("https://127.0.0.1:%d/", ports[1]),
			ClientCertURL: fmt.Sprintf("https://127.0.0.1:%d/", ports[2]),
			NoSessionURL:  fmt.Sprintf("http://127.0.0.1:%d/", ports[3]),
			SmallBodyURL:  fmt.Sprintf("http://127.0.0.1:%d/", ports[4]),
			AccessLog:     filepath.Join(dir, "access.log"),
		}
		ready := func() error {
			for _, p := range ports {
				if err := dialable("127.0.0.1:" + strconv.Itoa(p))(); err != nil {
					return err
				}
			}
			return nil
		}
		n.start = func() (*Proc, error) {
			return startProc(t, "nginx", bin, dir, filepath.Join(dir, "error.log"), args, ready)
		}
		p, err := n.start()
		if err != nil {
			return nil, err
		}
		n.Proc = p
		return n, nil
	})
}

// Access returns nginx's access log so far.
func (n *Nginx) Access() string {
	b, err := os.ReadFile(n.AccessLog)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// HTTPSClient is a client that trusts pki's CA (for test setup through
// nginx's TLS servers), presenting the client certificate.
func HTTPSClient(t testing.TB, pki *PKI) *http.Client {
	t.Helper()
	pool, err := loadPool(pki.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(pki.ClientCert, pki.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

// StreamModule is the path of nginx's stream module (Debian's
// libnginx-mod-stream, installed by `make testdeps`).
const StreamModule = "/usr/lib/nginx/modules/ngx_stream_module.so"

// StartTLSProxy puts TLS in front of the HTTP proxy p: an nginx stream
// server with pki's server certificate forwarding every connection to p.
// The result is an https:// proxy (the client speaks TLS to the proxy and
// HTTP, CONNECT included, inside it) with p's credentials and log.
func StartTLSProxy(t testing.TB, pki *PKI, p *ForwardProxy) *ForwardProxy {
	t.Helper()
	bin := binary(t, "nginx")
	if _, err := os.Stat(StreamModule); err != nil {
		t.Fatalf("testserver: %s is missing: run `make testdeps` (it installs Debian's libnginx-mod-stream)", StreamModule)
	}
	return retryOnPort(t, "nginx (TLS proxy front)", func(dir string, port int, addr string) (*ForwardProxy, error) {
		args, err := nginxConf(dir, "load_module "+StreamModule+";\n", fmt.Sprintf(`events { worker_connections 256; }
stream {
	server {
		listen 127.0.0.1:%d ssl;
		ssl_certificate %s;
		ssl_certificate_key %s;
		proxy_pass %s;
	}
}
`, port, pki.ServerCert, pki.ServerKey, p.Addr))
		if err != nil {
			return nil, err
		}
		front, err := startProc(t, "nginx", bin, dir, filepath.Join(dir, "error.log"), args, dialable(addr))
		if err != nil {
			return nil, err
		}
		u, _ := url.Parse(p.URL)
		u.Scheme, u.Host = "https", addr
		// The log that proves traffic is the proxy's own.
		return &ForwardProxy{Proc: &Proc{Name: "tinyproxy behind nginx", LogPath: p.LogPath, cmd: front.cmd, exited: front.exited},
			URL: u.String(), Addr: addr}, nil
	})
}

// nginxConf writes dir/nginx.conf for an nginx run in dir: modules (load_module
// lines), the main context every nginx here shares (in the foreground, one
// process, its pid file and error log in dir), then body. It returns nginx's
// command-line arguments.
// nginxStreaming is the http block's settings every test nginx shares: the
// access log (format "couchrep") and temporary files in dir, no body size
// limit, streams passed on unbuffered over HTTP/1.1 upstream connections.
func nginxStreaming(dir string) string {
	return fmt.Sprintf(`	access_log %[1]s/access.log couchrep;
	client_body_temp_path %[1]s/body;
	proxy_temp_path %[1]s/proxy;
	fastcgi_temp_path %[1]s/fastcgi;
	uwsgi_temp_path %[1]s/uwsgi;
	scgi_temp_path %[1]s/scgi;
	client_max_body_size 0;
	proxy_buffering off;
	proxy_request_buffering off;
	proxy_http_version 1.1;
	proxy_read_timeout 3600s;
	proxy_send_timeout 3600s;
	keepalive_requests 100000;
`, dir)
}

func nginxConf(dir, modules, body string) ([]string, error) {
	conf := modules + fmt.Sprintf("daemon off;\nmaster_process off;\nworker_processes 1;\npid %[1]s/nginx.pid;\nerror_log %[1]s/error.log info;\n", dir) + body
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	return []string{"-p", dir, "-c", path, "-e", filepath.Join(dir, "error.log")}, nil
}

// ForwardProxy is a real proxy process (tinyproxy or microsocks).
type ForwardProxy struct {
	*Proc
	// URL is the proxy's URL with its credentials, if any
	// ("http://user:pass@127.0.0.1:<port>" or "socks5://...").
	URL string
	// Addr is "127.0.0.1:<port>".
	Addr string
}

// StartTinyproxy starts tinyproxy, an HTTP forward proxy that also tunnels
// CONNECT, on a free loopback port; with user set it requires Basic proxy
// authentication. Its log (LogLevel Connect) has a line "Request (file
// descriptor N): <request line>" per request, CONNECT included.
func StartTinyproxy(t testing.TB, user, pass string) *ForwardProxy {
	t.Helper()
	bin := binary(t, "tinyproxy")
	return retryOnPort(t, "tinyproxy", func(dir string, port int, addr string) (*ForwardProxy, error) {
		logPath := filepath.Join(dir, "tinyproxy.log")
		conf := fmt.Sprintf("Port %d\nListen 127.0.0.1\nTimeout 600\nLogFile %q\nLogLevel Connect\nPidFile %q\nMaxClients 200\nAllow 127.0.0.1\nDisableViaHeader Yes\n",
			port, logPath, filepath.Join(dir, "tinyproxy.pid"))
		if user != "" {
			conf += fmt.Sprintf("BasicAuth %s %s\n", user, pass)
		}
		confPath := filepath.Join(dir, "tinyproxy.conf")
		if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
			return nil, err
		}
		p, err := startProc(t, "tinyproxy", bin, dir, filepath.Join(dir, "stderr.log"), []string{"-d", "-c", confPath}, dialable(addr))
		if err != nil {
			return nil, err
		}
		p.LogPath = logPath
		return &ForwardProxy{Proc: p, URL: proxyURL("http", user, pass, addr), Addr: addr}, nil
	})
}

// StartMicrosocks starts microsocks, a SOCKS5 server, on a free loopback
// port; with user set it requires username/password authentication. Its
// log has a line "client[N] 127.0.0.1: connected to <host>:<port>" per
// connection.
func StartMicrosocks(t testing.TB, user, pass string) *ForwardProxy {
	t.Helper()
	bin := binary(t, "microsocks")
	return retryOnPort(t, "microsocks", func(dir string, port int, addr string) (*ForwardProxy, error) {
		args := []string{"-i", "127.0.0.1", "-p", strconv.Itoa(port)}
		if user != "" {
			args = append(args, "-u", user, "-P", pass)
		}
		p, err := startProc(t, "microsocks", bin, dir, filepath.Join(dir, "microsocks.log"), args, dialable(addr))
		if err != nil {
			return nil, err
		}
		return &ForwardProxy{Proc: p, URL: proxyURL("socks5", user, pass, addr), Addr: addr}, nil
	})
}

func proxyURL(scheme, user, pass, addr string) string {
	u := url.URL{Scheme: scheme, Host: addr}
	if user != "" {
		u.User = url.UserPassword(user, pass)
	}
	return u.String()
}

// CountLines counts the lines of log that contain every one of subs.
func CountLines(log string, subs ...string) int {
	n := 0
	for _, line := range strings.Split(log, "\n") {
		ok := line != ""
		for _, s := range subs {
			if !strings.Contains(line, s) {
				ok = false
				break
			}
		}
		if ok {
			n++
		}
	}
	return n
}
