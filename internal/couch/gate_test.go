package couch

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// TestGate: a request made with WithGate's context waits for the gate's
// admission (keyed by the server's scheme and host) and ends it once its
// answer is read, a feed at its headers; a refusal fails the request
// without sending it; a nil release sends it uncounted.
func TestGate(t *testing.T) {
	var mu sync.Mutex
	sent := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sent++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("feed") == "continuous" {
			w.Write([]byte(`{"seq":"1","id":"a","changes":[{"rev":"1-a"}]}` + "\n"))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		w.Write([]byte(`{"db_name":"db","update_seq":"1","instance_start_time":"0"}`))
	}))
	defer srv.Close()
	ep, err := ParseEndpoint(srv.URL + "/db")
	if err != nil {
		t.Fatal(err)
	}
	db := NewDB(ep, Options{HTTPClient: srv.Client()})

	var (
		servers []string
		held    int
	)
	gate := func(_ context.Context, server string) (func(), error) {
		mu.Lock()
		defer mu.Unlock()
		servers = append(servers, server)
		held++
		return sync.OnceFunc(func() {
			mu.Lock()
			held--
			mu.Unlock()
		}), nil
	}
	ctx := WithGate(context.Background(), gate)
	if _, err := db.Info(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(servers) != 1 || servers[0] != srv.URL || held != 0 {
		t.Errorf("after Info: gate asked for %q, %d held; want once for %s, none held", servers, held, srv.URL)
	}
	mu.Unlock()

	// A feed ends its admission at its headers: it may stay open.
	fctx, cancel := context.WithCancel(ctx)
	rows := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		_, err := db.Changes(fctx, ChangesOptions{Feed: FeedContinuous}, func(Change) error {
			select {
			case rows <- struct{}{}:
			default:
			}
			return nil
		})
		done <- err
	}()
	<-rows
	mu.Lock()
	if held != 0 {
		t.Errorf("a feed open: %d admissions held, want none", held)
	}
	mu.Unlock()
	cancel()
	<-done

	// Refused: not sent.
	mu.Lock()
	before := sent
	mu.Unlock()
	refused := errors.New("job stopped")
	rctx := WithGate(context.Background(), func(context.Context, string) (func(), error) { return nil, refused })
	if _, err := db.Info(rctx); !errors.Is(err, refused) {
		t.Errorf("refused: %v, want %v", err, refused)
	}
	// Uncounted: sent.
	nctx := WithGate(context.Background(), func(context.Context, string) (func(), error) { return nil, nil })
	if _, err := db.Info(nctx); err != nil {
		t.Errorf("uncounted: %v", err)
	}
	mu.Lock()
	if sent != before+1 {
		t.Errorf("%d requests sent after the refused and the uncounted one, want 1", sent-before)
	}
	mu.Unlock()
}
