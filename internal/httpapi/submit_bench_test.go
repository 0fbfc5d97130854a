package httpapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/httpapi"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/replicate"
)

// BenchmarkReplicateSubmission measures POST /_replicate of continuous
// replications per second: b.N distinct bodies from 32 clients to the API
// over a SQLite job store, alone and while a worker accepts and starts the
// jobs as they come (as a node's job server does: each start is an accept
// and a start transaction, then a progress write).
func BenchmarkReplicateSubmission(b *testing.B) {
	for _, starts := range []bool{false, true} {
		b.Run(fmt.Sprintf("starts=%v", starts), func(b *testing.B) {
			st, _ := pagingStore(b, 0)
			srv := httptest.NewServer(httpapi.New(httpapi.Options{Store: httpapi.NewRepjobStore(st, uuid)}))
			defer srv.Close()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
			defer client.CloseIdleConnections()
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			if starts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						run, err := st.Accept(ctx, true)
						if err != nil {
							if !errors.Is(err, jobqueue.ErrNotFound) && ctx.Err() == nil {
								b.Error(err)
							}
							continue
						}
						if err := run.Start(ctx, "n1"); err != nil && ctx.Err() == nil {
							b.Error(err)
						}
						if err := run.Progress(ctx, replicate.Stats{}); err != nil && ctx.Err() == nil {
							b.Error(err)
						}
					}
				}()
			}
			var next atomic.Int64
			b.ResetTimer()
			start := time.Now()
			var cwg sync.WaitGroup
			for range 32 {
				cwg.Add(1)
				go func() {
					defer cwg.Done()
					for {
						i := next.Add(1) - 1
						if i >= int64(b.N) {
							return
						}
						body := fmt.Sprintf(`{"source":"http://127.0.0.1:1/s%d","target":"http://127.0.0.1:1/t","continuous":true,"doc_ids":["d%d"]}`, i, i)
						resp, err := client.Post(srv.URL+"/_replicate", "application/json", bytes.NewReader([]byte(body)))
						if err != nil {
							b.Error(err)
							return
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != http.StatusAccepted {
							b.Errorf("POST /_replicate: %d", resp.StatusCode)
							return
						}
					}
				}()
			}
			cwg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
		})
	}
}
