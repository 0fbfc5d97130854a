package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/couchrep/couchrep/internal/testserver"
)

// chromiumPath finds Debian's chromium (make testdeps installs it).
func chromiumPath(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatalf("chromium not found: run `make testdeps` (it installs Debian's chromium package)")
	return ""
}

// browser is a headless chromium driven by chromedp, with every console
// error, uncaught exception and JavaScript dialog recorded.
type browser struct {
	ctx      context.Context
	mu       sync.Mutex
	problems []string
	dialogs  []string
}

func startBrowser(t testing.TB) *browser {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox, // root in CI
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1440, 900),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(allocCtx)
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	b := &browser{ctx: ctx}
	// The first Run starts chromium (slow on a loaded machine); it must not
	// have a timeout of its own, which would stop the browser with it.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v (run `make testdeps`)", err)
	}
	if err := chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			b.mu.Lock()
			b.dialogs = append(b.dialogs, fmt.Sprintf("%s: %s", e.Type, e.Message))
			b.mu.Unlock()
			go func() {
				_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
			}()
		}
	}); err != nil {
		t.Fatalf("listen to chromium: %v", err)
	}
	console := chromedp.Console(ctx)
	go func() {
		for m, err := range console {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleWarning || m.IsException() {
				b.mu.Lock()
				b.problems = append(b.problems, m.String()+" "+m.URL)
				b.mu.Unlock()
			}
		}
	}()
	return b
}

func (b *browser) do(t testing.TB, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("chromium: %v", err)
	}
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](t testing.TB, b *browser, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("chromium: evaluate %s: %v", expr, err)
	}
	return v
}

// waitPage polls expr (a boolean JavaScript expression over the page) until
// it is true.
func (b *browser) waitPage(t *testing.T, what, expr string) {
	t.Helper()
	waitUntil(t, what, 2*time.Minute, func() bool { return eval[bool](t, b, "Boolean("+expr+")") })
}

func (b *browser) report() (problems, dialogs []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.problems...), append([]string(nil), b.dialogs...)
}

// changesGate is a reverse proxy that holds every _changes request until
// opened: a replication through it stays running until the test lets it
// finish.
type changesGate struct {
	*httptest.Server
	open chan struct{}
	once sync.Once
}

func newChangesGate(t *testing.T, target string) *changesGate {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	g := &changesGate{open: make(chan struct{})}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/_changes") {
			select {
			case <-g.open:
			case <-r.Context().Done():
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { g.release(); g.Close() })
	return g
}

func (g *changesGate) release() { g.once.Do(func() { close(g.open) }) }

// xssDocID is a _replicator document id that is markup: the page must show
// it as text.
const xssDocID = `<img src=x onerror=alert(1)>`

// TestStatusPageInBrowser drives the status page in Debian's chromium: it
// loads without console errors, shows a job started through POST
// /_replicate and its completion, a node's drain, an actor's restart, and a
// document id made of markup as text (no alert). A screenshot is saved in
// the test's temp dir (and at $COUCHREP_STATUS_SCREENSHOT when set).
func TestStatusPageInBrowser(t *testing.T) {
	skipShort(t)
	b := startBrowser(t)
	srv := testserver.StartPouchDB(t)
	plainReplicatorDB(t, srv, true)
	srcDB := srv.CreateDB(t, "pagesrc")
	const nDocs = 120
	var docs []map[string]any
	for i := range nDocs {
		docs = append(docs, map[string]any{"_id": fmt.Sprintf("doc%03d", i), "n": i})
	}
	srv.PutDocs(t, srcDB, docs...)
	gate := newChangesGate(t, srv.URL)

	dir := t.TempDir()
	cfg := jobsConfig + fmt.Sprintf("[couchrep]\nwatch = %s\n", strings.TrimSuffix(srv.URL, "/"))
	n := startNode(t, nodeOptions{name: "page-node", dataDir: dir, config: writeConfig(t, dir, cfg)})
	addr := n.httpAddr("")

	b.do(t, chromedp.Navigate("http://"+addr+"/_status?refresh=0.5"))
	b.waitPage(t, "first render", `document.body.dataset.generation >= 1`)
	b.waitPage(t, "node row", `document.querySelector('#nodes tr[data-node="page-node"]')`)
	b.waitPage(t, "tree", `document.querySelector('#tree tr[data-actor="http_api"]')`)

	// A one-shot replication through the gate: running until released.
	tgt := srv.DBURL("pagetgt")
	body := fmt.Sprintf(`{"source":%q,"target":%q,"create_target":true}`, gate.URL+"/pagesrc", tgt)
	replied := make(chan apiReply, 1)
	go func() {
		req, _ := http.NewRequest("POST", "http://"+addr+"/_replicate", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := (&http.Client{Timeout: 3 * time.Minute}).Do(req)
		if err != nil {
			replied <- apiReply{status: -1, body: []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		var raw json.RawMessage
		_ = json.NewDecoder(resp.Body).Decode(&raw)
		replied <- apiReply{status: resp.StatusCode, body: raw}
	}()
	var jobID string
	waitUntil(t, "the job in the store", time.Minute, func() bool {
		r := api(t, addr, "GET", "/_status/data", "")
		var d struct {
			Jobs []struct {
				ID, Kind string
			}
		}
		_ = json.Unmarshal(r.body, &d)
		for _, j := range d.Jobs {
			if j.Kind == "transient" {
				jobID = j.ID
				return true
			}
		}
		return false
	})
	row := fmt.Sprintf(`document.querySelector('#jobs tr[data-job-id=%q]')`, jobID)
	b.waitPage(t, "the running job on the page", row+`?.dataset.state === "running"`)
	text := eval[string](t, b, row+`.textContent`)
	if !strings.Contains(text, "(transient)") || !strings.Contains(text, "/pagesrc") {
		t.Fatalf("job row shows %q", text)
	}
	// The job column shows the short id couchrepctl accepts (repjob.ShortRepID).
	if id := eval[string](t, b, row+`.children[1].textContent`); len(id) < 12 || strings.Contains(id, "undefined") {
		t.Fatalf("job column shows %q", id)
	}
	gate.release()
	b.waitPage(t, "the completed job on the page", row+`?.dataset.state === "completed"`)
	b.waitPage(t, "docs written", row+fmt.Sprintf(`.children[6].textContent === %q`, fmt.Sprint(nDocs)))
	if r := <-replied; r.status != 200 {
		t.Fatalf("POST /_replicate: %d %s", r.status, r.body)
	}

	// A _replicator document whose id is markup is shown as text.
	srv.Do(t, "PUT", srv.DBURL("_replicator")+url.PathEscape(xssDocID),
		map[string]any{"source": srcDB, "target": srv.DBURL("xsstgt"), "create_target": true}, 201)
	docCell := `[...document.querySelectorAll('#jobs td.doc')].find(td => td.textContent.includes('onerror'))`
	b.waitPage(t, "the markup document's job", docCell)
	text = eval[string](t, b, docCell+`.textContent`)
	if text != strings.TrimSuffix(srv.URL, "/")+" _replicator / "+xssDocID { // the server, then the document
		t.Fatalf("document cell shows %q, want the id as text", text)
	}
	if imgs := eval[int](t, b, `document.querySelectorAll('img').length`); imgs != 0 {
		t.Fatalf("the page has %d <img> elements: a document id was parsed as markup", imgs)
	}

	// An actor's restart shows in the tree.
	if _, errOut, code := n.ctl("kill", "job_server/acceptor"); code != 0 {
		t.Fatalf("couchrepctl kill: %d %s", code, errOut)
	}
	b.waitPage(t, "acceptor restart count", `document.querySelector('#tree tr[data-actor="acceptor"]')?.children[3].textContent === "1"`)

	// The node's drain shows.
	if _, errOut, code := n.ctl("drain"); code != 0 {
		t.Fatalf("couchrepctl drain: %d %s", code, errOut)
	}
	b.waitPage(t, "drain on the page", `document.querySelector('#nodes tr[data-node="page-node"] td.drain')?.textContent === "draining"`)

	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	shot := filepath.Join(t.TempDir(), "status-page.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))
	if p := os.Getenv("COUCHREP_STATUS_SCREENSHOT"); p != "" {
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	problems, dialogs := b.report()
	if len(dialogs) != 0 {
		t.Fatalf("the page opened dialogs (injected script ran): %v", dialogs)
	}
	if len(problems) != 0 {
		t.Fatalf("console errors: %v", problems)
	}
}
