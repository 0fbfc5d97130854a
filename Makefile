# couchrep — `make help` lists the targets.
# Every tool the build and tests need is installed here, pinned, into ./bin
# (Go tools) or integration/node_modules (test servers). Re-running is cheap.

GO            ?= go
BIN           := $(CURDIR)/bin
export PATH   := $(BIN):$(PATH)

BUF_VERSION           := v1.70.0
PROTOC_GEN_GO_VERSION := v1.36.12
CONNECT_GO_VERSION    := v1.21.1
NFPM_VERSION          := v2.45.2
TOXIPROXY_VERSION     := v2.12.0

BUF                  := $(BIN)/.stamp-buf-$(BUF_VERSION)
PROTOC_GEN_GO        := $(BIN)/.stamp-protoc-gen-go-$(PROTOC_GEN_GO_VERSION)
PROTOC_GEN_CONNECT   := $(BIN)/.stamp-protoc-gen-connect-go-$(CONNECT_GO_VERSION)
NFPM                 := $(BIN)/.stamp-nfpm-$(NFPM_VERSION)
TOXIPROXY            := $(BIN)/.stamp-toxiproxy-$(TOXIPROXY_VERSION)
NODE_MODULES         := integration/node_modules/.couchrep-stamp

DATA       ?= $(CURDIR)/.data
GOTESTFLAGS ?=

.PHONY: help run build release install uninstall deb test test-couchdb test-short bench chaos fuzz proto proto-check lint tools testdeps clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## build couchrepd and couchrepctl into ./bin
	$(GO) build -o $(BIN)/ ./cmd/...

run: build ## run one node on the embedded store in ./.data (HTTP API on 127.0.0.1:5986, admin on 127.0.0.1:5987)
	@mkdir -p $(DATA)
	$(BIN)/couchrepd --config $(CURDIR)/couchrep.ini --data $(DATA)

test: proto-check lint testdeps build ## everything CI runs: generated code, lint, all tests
	@out=$$(mktemp); { $(GO) test -count=1 -timeout 25m $(GOTESTFLAGS) ./... 2>&1; echo $$? > $$out.rc; } | tee $$out; \
	  rc=$$(cat $$out.rc); if [ "$$rc" != 0 ]; then \
	    echo; echo "=== make test failed (exit $$rc); the failures, each with its first lines (node logs: $${COUCHREP_TEST_LOGS:-/tmp/couchrep-test-logs}):"; \
	    grep -E -A8 -- '^[[:space:]]*--- FAIL|^panic:|^FAIL[[:space:]]' $$out | cut -c1-240 | head -150; fi; \
	  rm -f $$out $$out.rc; exit $$rc

test-short: ## the fast unit tests only (go test -short)
	$(GO) test -short -count=1 ./...

# The integration tests that matter for compatibility, against a CouchDB you
# run (issue 23): its URL with a server admin's credentials; the tests make
# databases named couchrep-test-<random>-* and delete them. Turn its own
# replicator off first ([replicator] max_jobs = 0) or it races couchrep.
# CouchDB's replicator scenarios (TestScenario*) run there too, and
# TestCouchDBAnswers checks on it every answer the tests' proxies and fakes
# give in CouchDB's place (issue 32).
# A cluster (issue 32): COUCH_CLUSTER lists its nodes' URLs (comma-separated,
# admin credentials in each); COUCH_CLUSTER_CMD is a command run as
# `<cmd> stop N` and `<cmd> start N` (N = 1.. in COUCH_CLUSTER's order) that
# returns once node N is gone / answers GET /_up again:
# TestCouchDBClusterNodeDown replicates from and to the cluster with node 3
# stopped mid-way. Without COUCH_URL the first node is the server of the
# other tests. COUCH_CONFIG_LOCK names a file the tests that change the
# server's _config (put back at once) hold an exclusive flock on meanwhile.
# TestCouchDBJWTBearerCommand turns on the JWT handler, which CouchDB reads
# at start: it restarts every node twice (about 2.5 minutes under the lock).
# TestTakeoverGoingBack (docs/takeover.md's way back) turns CouchDB's
# replicator on for about a minute and off again (under that lock), with the
# databases src, copy and _replicator/backup.
COUCH_URL         ?=
COUCH_CLUSTER     ?=
COUCH_CLUSTER_CMD ?=
COUCH_CONFIG_LOCK ?=
comma := ,
COUCHDB_TESTS ?= ^(TestPouchDB.*|TestVerifyDifferences|TestVerifyRepair|TestVerifyLiveSource|TestVerifyBadInput|TestReplicationPouchDB|TestReplicationResumeFromCheckpoint|TestReplicationContinuous|TestLargeAttachmentStreams|TestTargetRequestSizeLimit|TestNoChangesAnswer|TestLiveProgress|TestAttachmentPutStalls|TestMetricsCountOnlyOwnWork|TestReplicatorDBScenarios|TestScenario.*|TestCouchDBAnswers|TestCouchDBCluster.*|TestCouchDBJWTBearerCommand|TestCouchDBVerifiesItsOwnCopy|TestReplicatorDocFilterError|TestReplicatorDocWrittenTerminal|TestReplicatorDocEditKeepingState|TestTakeoverGoingBack|TestWriteFailuresInSight|TestPauseResumeReset|TestHTTPAPI.*|TestHostileEndpoints|TestRequestTimeoutEndpoint|TestJobsRunToCompletion|TestKilledJobActorsLoseNoJob|TestReplicationTargetRateLimited|TestSharedFeedEquivalence|TestSharedFeedFailure|TestParkedRechecksBatched)$$
COUCHDB_SKIP  ?= ^TestLargeAttachmentStreams$$/^_replicator
test-couchdb: testdeps build ## the compatibility tests against your CouchDB: make test-couchdb COUCH_URL=http://admin:password@127.0.0.1:5984 [COUCH_CLUSTER=url1,url2,url3 COUCH_CLUSTER_CMD=cmd] (not part of make test)
	@[ -n "$(COUCH_URL)$(COUCH_CLUSTER)" ] || { echo "usage: make test-couchdb COUCH_URL=http://admin:password@host:5984/ [COUCH_CLUSTER=url1,url2,url3 COUCH_CLUSTER_CMD=<cmd: stop N / start N>] [COUCH_CONFIG_LOCK=file]"; exit 2; }
	COUCHREP_TEST_COUCH_URL='$(or $(COUCH_URL),$(firstword $(subst $(comma), ,$(COUCH_CLUSTER))))' \
	COUCHREP_TEST_COUCH_CLUSTER='$(COUCH_CLUSTER)' COUCHREP_TEST_COUCH_CLUSTER_CMD='$(COUCH_CLUSTER_CMD)' \
	COUCHREP_TEST_COUCH_CONFIG_LOCK='$(COUCH_CONFIG_LOCK)' \
	  $(GO) test -count=1 -timeout 40m -run '$(COUCHDB_TESTS)' -skip '$(COUCHDB_SKIP)' ./integration/ ./internal/couch/ ./internal/dbupdates/

CHAOS_DURATION ?= 10m
CHAOS_SEED     ?=
CHAOS_STORE    ?= sqlite
chaos: testdeps build ## randomized soak: 3 nodes, SIGKILL/SIGTERM/actor kills for CHAOS_DURATION (seed printed; replay with CHAOS_SEED=n; CHAOS_STORE=postgres runs it on PostgreSQL)
	COUCHREP_CHAOS_DURATION=$(CHAOS_DURATION) COUCHREP_CHAOS_SEED=$(CHAOS_SEED) COUCHREP_CHAOS_STORE=$(CHAOS_STORE) \
	  $(GO) test -count=1 -v -run '^TestChaosSoak$$' -timeout 60m ./integration/

# Every fuzz target, as package:Name. Their seed corpora (f.Add and
# testdata/fuzz/<Name>/) run as ordinary tests in `make test`.
FUZZ_TIME    ?= 30s
FUZZ_TARGETS := internal/couch:FuzzScanValue internal/couch:FuzzChangesFeed internal/couch:FuzzOpenRevs \
                internal/couch:FuzzBulkGet internal/replicate:FuzzParseReplicateRequest \
                internal/replicate:FuzzCheckpointReader internal/httpapi:FuzzRouter internal/config:FuzzParse \
                internal/mango:FuzzMatch internal/couch:FuzzDBUpdatesFeed
fuzz: ## run every fuzz target for FUZZ_TIME (30s) each; a crasher is written to the package's testdata/fuzz: fix it and commit it as a regression seed
	@set -e; for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; name=$${t##*:}; echo "== $$name ($$pkg), $(FUZZ_TIME)"; \
	  $(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZ_TIME) ./$$pkg; \
	done

bench: testdeps build ## Go benchmarks (numbers go to BENCHMARKS.md)
	$(GO) test -run '^$$' -bench . -benchmem -timeout 60m ./...

lint: ## gofmt + go vet
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

proto: tools ## regenerate messages/ from proto/
	cd $(CURDIR) && buf lint && buf generate

proto-check: tools ## fail if `make proto` would change a committed file
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	  buf generate -o $$tmp && \
	  diff -r $$tmp/messages messages >/dev/null || \
	  { echo "messages/ is stale: run 'make proto' and commit"; diff -r $$tmp/messages messages | head -20; exit 1; }

tools: $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_CONNECT) $(NFPM) ## install pinned Go tools into ./bin

$(BUF):
	GOBIN=$(BIN) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	@mkdir -p $(@D) && touch $@
$(PROTOC_GEN_GO):
	GOBIN=$(BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	@mkdir -p $(@D) && touch $@
$(PROTOC_GEN_CONNECT):
	GOBIN=$(BIN) $(GO) install connectrpc.com/connect/cmd/protoc-gen-connect-go@$(CONNECT_GO_VERSION)
	@mkdir -p $(@D) && touch $@
$(NFPM):
	GOBIN=$(BIN) $(GO) install github.com/goreleaser/nfpm/v2/cmd/nfpm@$(NFPM_VERSION)
	@mkdir -p $(@D) && touch $@

# toxiproxy's server (the WAN of integration/wan_*_test.go, started by
# internal/testserver.StartToxiproxy): its main package is cmd/server, so it
# is installed into a scratch GOBIN and renamed ./bin/toxiproxy-server.
$(TOXIPROXY):
	@tmp=$$(mktemp -d) && GOBIN=$$tmp $(GO) install github.com/Shopify/toxiproxy/v2/cmd/server@$(TOXIPROXY_VERSION) && \
	  mkdir -p $(BIN) && mv $$tmp/server $(BIN)/toxiproxy-server && rm -rf $$tmp
	@mkdir -p $(@D) && touch $@

testdeps: $(NODE_MODULES) $(NFPM) $(TOXIPROXY) chromium curl postgresql nginx tinyproxy microsocks systemd-analyze ## install the pinned test servers (PouchDB Server) from npm and the Debian packages the tests drive

# Debian packages, installed only when their binary is missing (other jobs may
# hold the dpkg lock meanwhile: wait for it). apt-get update only if the
# package is not found in the lists the machine has.
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_GET  := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600
APT_INSTALL = $(APT_GET) install -y --no-install-recommends $(1) || { $(APT_GET) update && $(APT_GET) install -y --no-install-recommends $(1); }

.PHONY: chromium
chromium: ## Debian's chromium for the status page's browser test (chromedp)
	@command -v chromium >/dev/null 2>&1 || { $(call APT_INSTALL,chromium); }

.PHONY: curl
curl: ## Debian's curl: the README's examples run in the tests (integration/readme_test.go)
	@command -v curl >/dev/null 2>&1 || { $(call APT_INSTALL,curl); }

.PHONY: postgresql
postgresql: ## Debian's PostgreSQL server for the postgres job store's tests (internal/kv/postgres/pgtest)
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { $(call APT_INSTALL,postgresql); }

# The real-endpoint tests (issue 11, integration/endpoints_test.go): nginx
# terminates TLS in front of PouchDB Server, tinyproxy is the HTTP forward
# proxy (CONNECT), microsocks the SOCKS5 server. Debian stable's versions (apt
# cannot pin across security updates); the tests start their own processes on
# loopback ports, never the packages' services.
.PHONY: nginx tinyproxy microsocks
nginx: ## Debian's nginx and its stream module (TLS in front of PouchDB Server and of tinyproxy in the real-endpoint tests)
	@PATH="$$PATH:/usr/sbin:/sbin" command -v nginx >/dev/null 2>&1 || { $(call APT_INSTALL,nginx); }
	@[ -f /usr/lib/nginx/modules/ngx_stream_module.so ] || { $(call APT_INSTALL,libnginx-mod-stream); }
tinyproxy: ## Debian's tinyproxy (HTTP forward proxy of the real-endpoint tests)
	@command -v tinyproxy >/dev/null 2>&1 || { $(call APT_INSTALL,tinyproxy); }
microsocks: ## Debian's microsocks (SOCKS5 server of the real-endpoint tests)
	@command -v microsocks >/dev/null 2>&1 || { $(call APT_INSTALL,microsocks); }

.PHONY: systemd-analyze
systemd-analyze: ## Debian's systemd, for systemd-analyze verify of the installed unit (integration/install_test.go); nothing is started
	@command -v systemd-analyze >/dev/null 2>&1 || { $(call APT_INSTALL,systemd); }

$(NODE_MODULES): integration/package.json integration/package-lock.json
	cd integration && npm ci --no-audit --no-fund --loglevel=error
	@mkdir -p $(@D) && touch $@

# --- install and package ---------------------------------------------------
# `make release` builds the binaries that `make install` and `make deb` ship:
# with the VCS revision (couchrepd --version; -buildvcs=true over the
# machine's GOFLAGS), without local paths (-trimpath), static (CGO_ENABLED=0;
# a FoundationDB build is `go build -tags fdb`, see internal/kv/fdb). They are
# rebuilt only when a Go file changed, so that `make release && sudo make
# install` does not build as root.
PREFIX       ?= /usr/local
DESTDIR      ?=
BINDIR       ?= $(PREFIX)/bin
SYSCONFDIR   ?= /etc
UNITDIR      ?= $(PREFIX)/lib/systemd/system
BASHCOMPDIR  ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR   ?= $(PREFIX)/share/zsh/site-functions
FISHCOMPDIR  ?= $(PREFIX)/share/fish/vendor_completions.d
RELEASE_BIN  ?= $(CURDIR)/build/bin
RELEASE_ENV  ?= CGO_ENABLED=0
RELEASE_FLAGS ?= -buildvcs=true -trimpath
GO_SOURCES   := $(wildcard $(shell git ls-files -co --exclude-standard -- '*.go' go.mod go.sum 2>/dev/null))

release: $(RELEASE_BIN)/couchrepd $(RELEASE_BIN)/couchrepctl ## build the binaries install and deb ship into ./build/bin (-buildvcs=true -trimpath)

$(RELEASE_BIN)/couchrepd $(RELEASE_BIN)/couchrepctl &: $(GO_SOURCES)
	@mkdir -p $(RELEASE_BIN)
	$(RELEASE_ENV) $(GO) build $(RELEASE_FLAGS) -o $(RELEASE_BIN)/ ./cmd/couchrepd ./cmd/couchrepctl

install: release ## install the binaries, systemd unit, /etc/couchrep/couchrep.ini (kept if present) and shell completion (PREFIX=/usr/local, DESTDIR, SYSCONFDIR=/etc)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSCONFDIR)/couchrep \
	  $(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR) $(DESTDIR)$(FISHCOMPDIR)
	install -m 0755 $(RELEASE_BIN)/couchrepd $(RELEASE_BIN)/couchrepctl $(DESTDIR)$(BINDIR)/
	sed -e '/^ExecStart=/ s|/usr/local/bin/|$(BINDIR)/|; /^ExecStart=/ s|/etc/couchrep/|$(SYSCONFDIR)/couchrep/|' \
	  deploy/systemd/couchrepd.service > $(DESTDIR)$(UNITDIR)/.couchrepd.service.tmp
	chmod 0644 $(DESTDIR)$(UNITDIR)/.couchrepd.service.tmp
	mv -f $(DESTDIR)$(UNITDIR)/.couchrepd.service.tmp $(DESTDIR)$(UNITDIR)/couchrepd.service
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/couchrep/couchrep.ini ]; then \
	  echo "kept $(DESTDIR)$(SYSCONFDIR)/couchrep/couchrep.ini (this version's is couchrep.ini in the repository)"; \
	else \
	  echo "install -m 0644 couchrep.ini $(DESTDIR)$(SYSCONFDIR)/couchrep/couchrep.ini"; \
	  install -m 0644 couchrep.ini $(DESTDIR)$(SYSCONFDIR)/couchrep/couchrep.ini; \
	fi
	$(RELEASE_BIN)/couchrepctl completion bash > $(DESTDIR)$(BASHCOMPDIR)/couchrepctl
	$(RELEASE_BIN)/couchrepctl completion zsh > $(DESTDIR)$(ZSHCOMPDIR)/_couchrepctl
	$(RELEASE_BIN)/couchrepctl completion fish > $(DESTDIR)$(FISHCOMPDIR)/couchrepctl.fish
	chmod 0644 $(DESTDIR)$(BASHCOMPDIR)/couchrepctl $(DESTDIR)$(ZSHCOMPDIR)/_couchrepctl $(DESTDIR)$(FISHCOMPDIR)/couchrepctl.fish

uninstall: ## remove what install installed, except the config (same PREFIX, DESTDIR, SYSCONFDIR)
	rm -f $(DESTDIR)$(BINDIR)/couchrepd $(DESTDIR)$(BINDIR)/couchrepctl $(DESTDIR)$(UNITDIR)/couchrepd.service \
	  $(DESTDIR)$(BASHCOMPDIR)/couchrepctl $(DESTDIR)$(ZSHCOMPDIR)/_couchrepctl $(DESTDIR)$(FISHCOMPDIR)/couchrepctl.fish

# The Debian package holds exactly what `make install PREFIX=/usr` lays out
# in DEB_ROOT (zsh completion where Debian's zsh looks), packed by nfpm
# (deploy/nfpm.yaml; maintainer scripts in deploy/debian/). Its version is
# the git tag (v1.2.3 -> 1.2.3, +N.g<hash> after it) or 0.0.0~git<commit
# time>.<hash> before the first tag.
DEB_ROOT     ?= $(CURDIR)/build/deb/root
DEB_ARCH     ?= $(shell $(GO) env GOARCH)
DEB_VERSION  ?= $(shell v=$$(git describe --tags --match 'v[0-9]*' 2>/dev/null) && echo "$${v\#v}" | sed 's/-\([0-9]*\)-g/+\1.g/' || \
                  echo "0.0.0~git$$(git log -1 --format=%cd --date=format:%Y%m%d%H%M%S).$$(git rev-parse --short=12 HEAD)")
DEB_FILE     ?= $(CURDIR)/build/couchrep_$(DEB_VERSION)_$(DEB_ARCH).deb
DEB_MAINTAINER ?= couchrep maintainers <maintainers@couchrep.invalid>

deb: $(NFPM) release ## build the Debian package (nfpm) into ./build: binaries, unit, conffile, completion; a couchrep user and /var/lib/couchrep; starts nothing
	rm -rf $(DEB_ROOT)
	$(MAKE) --no-print-directory install DESTDIR=$(DEB_ROOT) PREFIX=/usr SYSCONFDIR=/etc ZSHCOMPDIR=/usr/share/zsh/vendor-completions
	@mkdir -p $(dir $(DEB_FILE))
	DEB_ROOT=$(DEB_ROOT) DEB_VERSION=$(DEB_VERSION) DEB_ARCH=$(DEB_ARCH) DEB_MAINTAINER='$(DEB_MAINTAINER)' \
	  nfpm package --config deploy/nfpm.yaml --packager deb --target $(DEB_FILE)

clean: ## remove build outputs and the local data directory
	rm -rf $(BIN) $(DATA) $(CURDIR)/build
