// Package pgtest starts throw-away PostgreSQL servers for tests: initdb into
// a fresh directory, then the postgres server on a free 127.0.0.1 port with
// its unix socket in that directory, run as the postgres user when the tests
// run as root (PostgreSQL refuses to run as root). Servers come from
// Debian's postgresql packages (/usr/lib/postgresql/<version>/bin), which
// `make testdeps` installs when they are missing; without them the test
// fails with that hint, it is never skipped.
//
// Every server has a role with a password (Server.DSN connects through TCP
// with scram-sha-256), so that tests also see that the password stays out
// of logs and errors.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
	"github.com/jackc/pgx/v5"
)

// Password is the password of the role tests connect as: a string that
// must never show up in a log line, an error or an API answer.
const Password = "pgtest-S3cret-never-logged"

// Role is the role tests connect as.
const Role = "couchrep"

// startTimeout bounds initdb plus the server's start on a loaded machine.
const startTimeout = 2 * time.Minute

// ErrNoServer is returned when the PostgreSQL server binaries are missing.
var ErrNoServer = errors.New("pgtest: PostgreSQL server binaries (initdb, postgres, pg_ctl) not found under /usr/lib/postgresql/*/bin: run make testdeps")

// Server is a running throw-away PostgreSQL server.
type Server struct {
	bin  string // directory of initdb, postgres, pg_ctl
	dir  string // data directory and unix socket directory
	port int
	cred *syscall.Credential

	mu   sync.Mutex
	cmd  *exec.Cmd
	exit chan struct{}
	log  *os.File
}

// BinDir returns the directory holding the newest installed PostgreSQL
// server binaries.
func BinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) && isExec(filepath.Join(d, "pg_ctl")) {
			return d, nil
		}
	}
	return "", ErrNoServer
}

func version(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode()&0o111 != 0
}

// Start starts a server that is stopped and removed when the test ends.
func Start(t testing.TB, settings ...string) *Server {
	t.Helper()
	s, err := StartServer(settings...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

var (
	shared     = map[string]*Server{}
	sharedErr  = map[string]error{}
	sharedLock sync.Mutex
)

// Shared returns one server per test binary (and settings), started on
// first use, for packages whose tests each take a fresh database with
// NewDatabase. Call StopShared from TestMain after m.Run.
func Shared(t testing.TB, settings ...string) *Server {
	t.Helper()
	key := strings.Join(settings, " ")
	sharedLock.Lock()
	defer sharedLock.Unlock()
	if s := shared[key]; s != nil {
		return s
	}
	if err := sharedErr[key]; err != nil {
		t.Fatal(err)
	}
	s, err := StartServer(settings...)
	if err != nil {
		sharedErr[key] = err
		t.Fatal(err)
	}
	shared[key] = s
	return s
}

// StopShared stops the servers Shared started.
func StopShared() {
	sharedLock.Lock()
	defer sharedLock.Unlock()
	for k, s := range shared {
		s.Close()
		delete(shared, k)
	}
}

// StartServer starts a server; the caller must Close it. settings are
// extra "name=value" server settings (-c).
func StartServer(settings ...string) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "couchrep-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: running as root needs the postgres user (%w): run make testdeps", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	data := filepath.Join(dir, "data")
	out, err := s.command(ctx, "initdb", "-D", data, "-U", "postgres", "--auth-local=trust",
		"--auth-host=scram-sha-256", "--no-sync", "-E", "UTF8", "--locale=C").CombinedOutput()
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	conf := []string{
		"listen_addresses = '127.0.0.1'",
		"unix_socket_directories = '" + dir + "'",
		"max_connections = 200",
		"shared_buffers = 64MB",
		"fsync = off", // throw-away data; speed under a loaded machine
		"full_page_writes = off",
		"logging_collector = off",
		"log_min_messages = warning",
	}
	conf = append(conf, settings...)
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		s.Close()
		return nil, err
	}
	_, err = f.WriteString("\n" + strings.Join(conf, "\n") + "\n")
	f.Close()
	if err != nil {
		s.Close()
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		s.port, err = testserver.FreePort()
		if err == nil {
			err = s.Start()
		}
		if err == nil || attempt == 3 {
			break
		}
	}
	if err != nil {
		s.Close()
		return nil, err
	}
	// The role tests use, with a password (over TCP).
	c, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", dir, s.port))
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("pgtest: connect as postgres: %w", err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN CREATEDB PASSWORD '%s'", Role, Password)); err != nil {
		s.Close()
		return nil, fmt.Errorf("pgtest: create role: %w", err)
	}
	return s, nil
}

func (s *Server) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	return cmd
}

// Start starts the server (again, after Stop) and waits until it accepts
// connections.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("pgtest: server already running")
	}
	logf, err := os.OpenFile(filepath.Join(s.dir, "server.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := s.command(context.Background(), "postgres", "-D", filepath.Join(s.dir, "data"), "-p", strconv.Itoa(s.port))
	cmd.Stdout, cmd.Stderr = logf, logf
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT // no orphan server if the test binary dies
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	exit := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exit) }()
	s.cmd, s.exit, s.log = cmd, exit, logf
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", s.dir, s.port))
		cancel()
		if err == nil {
			c.Close(context.Background())
			return nil
		}
		select {
		case <-exit:
			s.cmd = nil
			logf.Close()
			return fmt.Errorf("pgtest: postgres exited at start:\n%s", s.logTail())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: postgres not ready after %s: %w\n%s", startTimeout, err, s.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Stop stops the server the way an operator restarting it would:
// pg_ctl stop -m fast (connections are closed, the server shuts down
// cleanly). Start starts it again on the same port and data.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	out, err := s.command(ctx, "pg_ctl", "-D", filepath.Join(s.dir, "data"), "-m", "fast", "-w", "stop").CombinedOutput()
	if err != nil {
		_ = s.cmd.Process.Kill()
	}
	<-s.exit
	s.cmd = nil
	s.log.Close()
	if err != nil {
		return fmt.Errorf("pgtest: pg_ctl stop: %w\n%s", err, out)
	}
	return nil
}

// Close stops the server and removes its directory.
func (s *Server) Close() {
	s.mu.Lock()
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-s.exit:
		case <-time.After(30 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exit
		}
		s.cmd = nil
		s.log.Close()
	}
	s.mu.Unlock()
	os.RemoveAll(s.dir)
}

// Port is the server's TCP port on 127.0.0.1.
func (s *Server) Port() int { return s.port }

// DSN returns the URL of database db as the password role.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s?sslmode=disable", Role, Password, s.port, db)
}

// NewDatabase creates a fresh, empty database and returns its URL.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", s.dir, s.port))
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s OWNER %s", name, Role)); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	return s.DSN(name)
}

// PID is the server's (postmaster's) process id, 0 when it is stopped.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// CPU returns the CPU time (user + system) the server with postmaster pid
// has used so far: the postmaster, its live children (backends, WAL
// writer...) and its exited children. Linux only (/proc); 0 elsewhere.
// Benchmarks use it to say how much server work an operation costs.
func CPU(pid int) time.Duration {
	ticks := func(p int, children bool) int64 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			return 0
		}
		// Fields after the parenthesised command: state is field 3; utime,
		// stime, cutime, cstime are fields 14-17.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			return 0
		}
		f := strings.Fields(s[i+1:])
		n := 2
		if children {
			n = 4
		}
		var t int64
		for _, x := range f[11 : 11+n] {
			v, _ := strconv.ParseInt(x, 10, 64)
			t += v
		}
		return t
	}
	if pid <= 0 {
		return 0
	}
	total := ticks(pid, true)
	kids, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	for _, k := range strings.Fields(string(kids)) {
		if p, err := strconv.Atoi(k); err == nil {
			total += ticks(p, false)
		}
	}
	const clkTck = 100 // USER_HZ on Linux
	return time.Duration(total) * time.Second / clkTck
}
