package integration

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// BenchmarkStatusPage1000Jobs measures the status page with 1,000 jobs in
// the store (50 running, the rest pending or crashing: continuous
// replications from an unreachable source, max_jobs 50): per iteration one
// navigation to /_status until its first render; reported are the time
// from navigation start to the first render (ms/first-render, the page's
// own performance.now()), the time the script spent rendering a refresh
// (ms/render) and the size of /_status/data (bytes/data).
func BenchmarkStatusPage1000Jobs(b *testing.B) {
	const nJobs = 1000
	dir := b.TempDir()
	ini := filepath.Join(dir, "node.ini")
	if err := os.WriteFile(ini, []byte("[replicator]\nmax_jobs = 50\nstartup_jitter = 0\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "couchrepd"), "--data", dir, "--config", ini, "--http", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--log-level", "warn")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
	var addr string
	for deadline := time.Now().Add(time.Minute); addr == ""; {
		if raw, err := os.ReadFile(filepath.Join(dir, "http.addr")); err == nil && bytes.HasSuffix(raw, []byte("\n")) {
			addr = strings.TrimSpace(string(raw))
		} else if time.Now().After(deadline) {
			b.Fatalf("no http.addr:\n%s", logs.String())
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range nJobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			body := fmt.Sprintf(`{"source":"http://127.0.0.1:1/src%d","target":"http://127.0.0.1:1/tgt%d","continuous":true}`, i, i)
			resp, err := http.Post("http://"+addr+"/_replicate", "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	wg.Wait()
	resp, err := http.Get("http://" + addr + "/_status/data")
	if err != nil {
		b.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if n := bytes.Count(data, []byte(`"rep_id"`)); n != nJobs {
		b.Fatalf("/_status/data has %d jobs, want %d", n, nJobs)
	}

	br := startBrowser(b)
	var firstRender, render float64
	b.ResetTimer()
	for range b.N {
		br.do(b, chromedp.Navigate("http://"+addr+"/_status?refresh=60"))
		var ms string
		for deadline := time.Now().Add(time.Minute); ms == ""; {
			ms = eval[string](b, br, `document.body.dataset.firstRenderMs || ""`)
			if ms == "" && time.Now().After(deadline) {
				b.Fatal("the page did not render within a minute")
			}
		}
		v, _ := strconv.ParseFloat(ms, 64)
		r, _ := strconv.ParseFloat(eval[string](b, br, `document.body.dataset.renderMs`), 64)
		firstRender += v
		render += r
		if rows := eval[int](b, br, `document.querySelectorAll('#jobs tbody tr').length`); rows != nJobs {
			b.Fatalf("%d job rows, want %d", rows, nJobs)
		}
	}
	b.StopTimer()
	b.ReportMetric(firstRender/float64(b.N), "ms/first-render")
	b.ReportMetric(render/float64(b.N), "ms/render")
	b.ReportMetric(float64(len(data)), "bytes/data")
}
