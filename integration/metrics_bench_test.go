package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
)

// BenchmarkMetricsScrape measures what a Prometheus scrape of GET /metrics
// costs a node whose store holds N jobs (COUCHREP_METRICS_JOBS, default
// 10,000: continuous replications of _replicator documents of one watched
// server; the node, in this process, is an api_frontend node, so they stay
// pending and nothing else moves): CPU of this process per scrape
// (cpu-ms/scrape; the HTTP client's share is negligible), with nothing
// written between scrapes (idle) and with one job's record written before
// each scrape (changed: what a scrape of a busy node pays).
//
//	go test -run '^$' -bench MetricsScrape -benchtime 20x ./integration/
func BenchmarkMetricsScrape(b *testing.B) {
	n := envInt(b, "COUCHREP_METRICS_JOBS", 10000)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	dir := b.TempDir()
	cfg := couchrep.DefaultConfig()
	cfg.Couchrep.DataDir = dir
	cfg.Couchrep.HTTPBind, cfg.Couchrep.AdminBind = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Couchrep.NodeTypes = []string{config.NodeTypeAPIFrontend}
	if err := cfg.Complete(); err != nil {
		b.Fatal(err)
	}
	db, err := sqlite.Open(ctx, filepath.Join(dir, config.StoreFileName), sqlite.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	store := repjob.NewFromConfig(jobqueue.New(db, jobqueue.Options{NodeName: "bench", Logger: zerolog.Nop()}), db, cfg, zerolog.Nop())
	if err := store.Init(ctx); err != nil {
		b.Fatal(err)
	}
	const server = "http://127.0.0.1:1/"
	for i := 0; i < n; i += 500 {
		err := db.Transact(ctx, func(tx kv.Tx) error {
			for j := i; j < min(i+500, n); j++ {
				body := fmt.Sprintf(`{"source":"%su%05d","target":"%scentral","continuous":true}`, server, j, server)
				doc := repjob.PersistentDoc{Server: server, DB: "_replicator", DocID: fmt.Sprintf("u%05d", j), Body: []byte(body)}
				if _, err := store.AddPersistentTx(tx, doc); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	node, err := couchrep.Start(ctx, cfg, couchrep.WithLogger(zerolog.Nop()))
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := node.Stop(c); err != nil {
			b.Errorf("node stop: %v", err)
		}
	}()
	var addr string
	for deadline := time.Now().Add(time.Minute); addr == ""; {
		if raw, err := os.ReadFile(filepath.Join(dir, "http.addr")); err == nil && strings.HasSuffix(string(raw), "\n") {
			addr = strings.TrimSpace(string(raw))
		} else if time.Now().After(deadline) {
			b.Fatal("no http.addr after a minute")
		} else {
			time.Sleep(20 * time.Millisecond) // a file another goroutine writes: poll
		}
	}
	client := &http.Client{Timeout: time.Minute}
	scrape := func() {
		resp, err := client.Get("http://" + addr + "/metrics")
		if err != nil {
			b.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			b.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
		}
		want := fmt.Sprintf(`couchrep_replication_jobs{database="_replicator",kind="persistent",server="%s",state="pending"} %d`, strings.TrimSuffix(server, "/"), n)
		if !strings.Contains(string(body), want) {
			var got []string
			for l := range strings.SplitSeq(string(body), "\n") {
				if strings.HasPrefix(l, "couchrep_replication_jobs{") {
					got = append(got, l)
				}
			}
			b.Fatalf("GET /metrics has no %s: %s", want, strings.Join(got, "; "))
		}
	}
	// rewrite removes the job of document u<i> and adds it again: record
	// writes, the counts the same at the next scrape.
	rewrite := func(i int) {
		body := fmt.Sprintf(`{"source":"%su%05d","target":"%scentral","continuous":true}`, server, i, server)
		doc := repjob.PersistentDoc{Server: server, DB: "_replicator", DocID: fmt.Sprintf("u%05d", i), Body: []byte(body)}
		if err := store.Remove(ctx, fmt.Sprintf("%s|_replicator|u%05d", strings.TrimSuffix(server, "/"), i)); err != nil {
			b.Fatal(err)
		}
		if _, err := store.AddPersistent(ctx, doc); err != nil {
			b.Fatal(err)
		}
	}
	for _, mode := range []string{"idle", "changed"} {
		b.Run(fmt.Sprintf("jobs=%d/%s", n, mode), func(b *testing.B) {
			scrape() // the first scrape after a change lists every job
			var cpu time.Duration
			for i := range b.N {
				if mode == "changed" {
					// A record written: the next scrape cannot use
					// the last listing.
					rewrite(i % n)
				}
				c0 := cpuTime()
				scrape()
				cpu += cpuTime() - c0
			}
			b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/scrape")
			b.Logf("jobs=%d %s: %d scrapes, CPU %s per scrape; load %s", n, mode, b.N, (cpu / time.Duration(b.N)).Round(10*time.Microsecond), loadAvg())
		})
	}
}
