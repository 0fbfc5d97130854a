// Command couchrepd runs a couchrep node: the replicator's supervision tree,
// its job store, its HTTP API and its admin endpoint.
//
//	couchrepd [--config FILE] [--data DIR] [--store PATH] [--http ADDR]
//	          [--admin ADDR] [--node-name NAME] [--log-level LEVEL]
//	couchrepd --version
//	couchrepd replicate [flags] SOURCE_URL TARGET_URL
//	couchrepd verify [flags] SOURCE_URL TARGET_URL
//	couchrepd hash-password < password
//
// Settings come from CouchDB's defaults, then the ini file, then COUCHREP_*
// environment variables, then flags. SIGINT or SIGTERM stops the node
// cleanly, its actors in reverse start order; so does couchrepctl stop (an
// admin StopNodeRequest), and the process then exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep"
	"github.com/couchrep/couchrep/actors/httpserver"
	"github.com/couchrep/couchrep/internal/admin"
	"github.com/couchrep/couchrep/internal/buildinfo"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/httpapi"
	clog "github.com/couchrep/couchrep/internal/log"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run is couchrepd's whole life; it returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "replicate" {
		logger, _ := clog.New(stderr, "warn", "auto")
		return runReplicate(ctx, args[1:], stdout, stderr, logger)
	}
	if len(args) > 0 && args[0] == "verify" {
		logger, _ := clog.New(stderr, "warn", "auto")
		return runVerify(ctx, args[1:], stdout, stderr, logger)
	}
	if len(args) > 0 && args[0] == "hash-password" {
		return runHashPassword(args[1:], os.Stdin, stdout, stderr)
	}
	cfg, adoptFrom, err := loadConfig(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if errors.Is(err, errVersion) {
		fmt.Fprintf(stdout, "couchrepd %s\n", buildinfo.Read())
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "couchrepd: %v\n", err)
		return 2
	}
	logger, err := clog.New(stderr, cfg.Log.Level, cfg.Log.Format)
	if err != nil {
		fmt.Fprintf(stderr, "couchrepd: %v\n", err)
		return 2
	}
	// The data directory is this process's until it exits.
	lock, err := lockDataDir(cfg.Couchrep.DataDir)
	if err != nil {
		fmt.Fprintf(stderr, "couchrepd: %v\n", err)
		return 2
	}
	defer lock.release()
	// As CouchDB: plain [admins] passwords are hashed on start, in the
	// config file too, so that it holds no password after the first start.
	// A config file the node may not write (a read-only /etc under
	// systemd's ProtectSystem=strict) keeps them: they are hashed in memory
	// only, with a warning, and the node starts (never a crash loop).
	admins, files, err := cfg.HashAdmins(httpapi.HashPassword)
	switch {
	case errors.Is(err, config.ErrAdminsNotRewritten):
		logger.Warn().Err(err).Strs("admins", admins).Strs("rewritten", files).
			Msg("plain [admins] passwords hashed in memory only: the config file still holds them in plain text; " +
				"put the hash `couchrepd hash-password` prints in their place (see docs/operations.md, Under systemd)")
	case err != nil:
		fmt.Fprintf(stderr, "couchrepd: %v\n", err)
		return 1
	case len(admins) > 0:
		logger.Info().Strs("admins", admins).Strs("rewritten", files).Msg("plain [admins] passwords replaced by their pbkdf2 hash")
	}
	if adoptFrom != "" {
		if err := adoptUUID(ctx, &cfg, adoptFrom, logger); err != nil {
			fmt.Fprintf(stderr, "couchrepd: --adopt-uuid: %v\n", err)
			return 1
		}
	}
	if err := serve(ctx, cfg, logger, stderr); err != nil {
		logger.Error().Err(err).Msg("couchrepd stopped with an error")
		if errors.Is(err, couchrep.ErrNodeNameInUse) || errors.Is(err, couchrep.ErrUUIDMismatch) {
			// Refused to start: the node's name or uuid is not this
			// process's to take. Said plainly too (the log may be JSON).
			fmt.Fprintf(stderr, "couchrepd: %v\n", err)
			return 2
		}
		return 1
	}
	return 0
}

// errVersion is loadConfig's answer to --version: print the build and exit.
var errVersion = errors.New("version requested")

// loadConfig applies defaults < file < environment < flags. It also
// returns the --adopt-uuid URL.
func loadConfig(args []string, stderr io.Writer) (config.Config, string, error) {
	var configPath, adoptFrom string
	var version bool
	newFlags := func(cfg *config.Config) *flag.FlagSet {
		fs := flag.NewFlagSet("couchrepd", flag.ContinueOnError)
		fs.SetOutput(stderr)
		fs.StringVar(&configPath, "config", "", "ini `file` with CouchDB-style sections ([replicator], [replicator.shares], [couchrep], ...)")
		fs.StringVar(&adoptFrom, "adopt-uuid", "", "take the server uuid ([couchdb] uuid) from GET / of the CouchDB server at `URL` (or give the uuid itself), keep it in the data directory and the job store in place of the one recorded, and so resume from that server's replication checkpoints; the jobs that restart from zero are listed")
		fs.BoolVar(&version, "version", false, "print the version (module version, VCS revision, Go version) and exit")
		cfg.RegisterFlags(fs)
		fs.Usage = func() {
			fmt.Fprintf(fs.Output(), "Usage:\n  couchrepd [flags]                          run a node\n  couchrepd replicate [flags] SOURCE TARGET  run one replication in the foreground (see couchrepd replicate --help)\n  couchrepd verify [flags] SOURCE TARGET     check that TARGET holds what the replication carries (see couchrepd verify --help)\n  couchrepd hash-password                    read a password on stdin, print its [admins] hash\n\nFlags (override COUCHREP_* environment variables, which override the file):\n")
			fs.PrintDefaults()
		}
		return fs
	}
	// First pass: find --config (and --help) without applying anything.
	scratch := config.Default()
	if err := newFlags(&scratch).Parse(args); err != nil {
		return config.Config{}, "", err
	}
	if version {
		return config.Config{}, "", errVersion
	}
	cfg := config.Default()
	if configPath != "" {
		loaded, err := config.Load(configPath)
		if err != nil {
			return config.Config{}, "", err
		}
		cfg = loaded
	}
	if err := cfg.ApplyEnv(os.Environ()); err != nil {
		return config.Config{}, "", err
	}
	fs := newFlags(&cfg)
	if err := fs.Parse(args); err != nil {
		return config.Config{}, "", err
	}
	if fs.NArg() > 0 {
		return config.Config{}, "", fmt.Errorf("unexpected argument %q (see --help)", fs.Arg(0))
	}
	if err := cfg.Validate(); err != nil {
		return config.Config{}, "", err
	}
	return cfg, adoptFrom, nil
}

// ShutdownTimeout bounds a clean stop after SIGTERM (deploy/systemd's
// TimeoutStopSec is above it): running jobs checkpoint and go back to the
// queue within it.
const ShutdownTimeout = 60 * time.Second

// serve runs a node until ctx ends or the node's tree gives up. Under
// systemd (Type=notify) it reports READY=1 once the node and its admin
// endpoint run, pets the watchdog while the tree answers, and reports
// STOPPING=1 when it stops.
func serve(ctx context.Context, cfg config.Config, logger zerolog.Logger, stderr io.Writer) error {
	if err := cfg.Complete(); err != nil {
		return err
	}
	node, err := couchrep.Start(ctx, cfg, couchrep.WithLogger(logger))
	if err != nil {
		return err
	}
	if c, ok := node.UUIDChange(); ok {
		printUUIDChange(stderr, c)
	}
	adminSrv, adminAddr, err := startAdmin(cfg, node, logger)
	if err != nil {
		_ = node.Stop(context.Background())
		return err
	}
	ready := logger.Info().Str("admin", adminAddr).Str("node", node.Name())
	if u := statusPageURL(cfg); u != "" {
		ready = ready.Str("status_page", u)
	}
	ready.Msg("couchrepd ready")
	if err := sdNotify("READY=1\nSTATUS=node " + node.Name() + " running"); err != nil {
		logger.Warn().Err(err).Msg("sd_notify READY")
	}
	wdCtx, stopWatchdog := context.WithCancel(ctx)
	defer stopWatchdog()
	if every := watchdogInterval(); every > 0 {
		go watchdog(wdCtx, node, every, logger)
	}
	go governGC(wdCtx, cfg.Couchrep.IdleGCPercent, logger)

	var runErr error
	select {
	case <-ctx.Done():
		logger.Info().Msg("signal received, stopping")
	case <-node.Done():
		if err := node.Err(); err != nil {
			runErr = fmt.Errorf("supervision tree stopped: %w", err)
		} else {
			// A StopNode admin request: the node stops itself as on SIGTERM.
			logger.Info().Msg("stop requested, stopping")
		}
	}
	stopWatchdog()
	_ = sdNotify("STOPPING=1")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	if err := adminSrv.Shutdown(shutdownCtx); err != nil {
		logger.Warn().Err(err).Msg("admin endpoint shutdown")
	}
	if err := node.Stop(shutdownCtx); err != nil && runErr == nil {
		runErr = err
	}
	return runErr
}

// statusPageURL is the address of the node's status page, from the address
// its HTTP API wrote to <data>/http.addr as it started listening ("" on a
// node without the API). An unspecified host (0.0.0.0, ::) is shown as
// 127.0.0.1, where a browser on this machine reaches it.
func statusPageURL(cfg config.Config) string {
	if !cfg.HasNodeType(config.NodeTypeAPIFrontend) {
		return ""
	}
	b, err := os.ReadFile(filepath.Join(cfg.Couchrep.DataDir, httpserver.AddrFile))
	if err != nil {
		return ""
	}
	host, port, err := net.SplitHostPort(strings.TrimSpace(string(b)))
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	scheme := "http"
	if cfg.SSL.Enable {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, port) + "/_status"
}

// startAdmin serves the admin endpoint. The address it really listens on
// (useful with port 0) is written to <data>/admin.addr.
func startAdmin(cfg config.Config, node *couchrep.Node, logger zerolog.Logger) (*http.Server, string, error) {
	if !config.IsLoopback(cfg.Couchrep.AdminBind) && cfg.Admin.Token == "" {
		return nil, "", fmt.Errorf("admin endpoint: %s is not a loopback address: set [admin] token (or COUCHREP_ADMIN_TOKEN) so that requests must carry it", cfg.Couchrep.AdminBind)
	}
	ln, err := net.Listen("tcp", cfg.Couchrep.AdminBind)
	if err != nil {
		return nil, "", fmt.Errorf("admin endpoint: %w", err)
	}
	mux := http.NewServeMux()
	path, handler := node.AdminHandler(cfg.Admin.Token)
	mux.Handle(path, handler)
	if cfg.Admin.Pprof {
		mux.Handle(admin.PprofPath, admin.Pprof(cfg.Admin.Token))
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error().Err(err).Msg("admin endpoint failed")
		}
	}()
	addr := ln.Addr().String()
	if cfg.Couchrep.DataDir != "" {
		if err := os.WriteFile(filepath.Join(cfg.Couchrep.DataDir, "admin.addr"), []byte(addr+"\n"), 0o644); err != nil {
			logger.Warn().Err(err).Msg("write admin.addr")
		}
	}
	return srv, addr, nil
}
