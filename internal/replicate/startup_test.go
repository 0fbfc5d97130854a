package replicate

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/couchrep/couchrep/internal/sharedfeed"
)

// TestStartupSlot: a run asks Options.Startup for a slot at its source's
// server before anything else and gives it back once, whatever the kind of
// run; a continuous run gives it back while it runs on (once it has read
// its catch-up), not when it ends; a Startup that fails (the job stopped
// while waiting) ends the run with its error.
func TestStartupSlot(t *testing.T) {
	tests := []struct {
		name   string
		extra  string
		shared bool
	}{
		{"continuous on a shared feed", `,"continuous":true`, true},
		{"continuous on a feed of its own", `,"continuous":true`, false},
		{"one-shot", ``, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, _ := continuousSource(t)
			progress, o := progressOptions()
			if tc.shared {
				o.Feeds = sharedfeed.New(sharedfeed.Options{})
			}
			var mu sync.Mutex
			var keys []string
			releases := 0
			o.Startup = func(ctx context.Context, server string) (func(), error) {
				mu.Lock()
				keys = append(keys, server)
				mu.Unlock()
				return func() {
					mu.Lock()
					releases++
					mu.Unlock()
				}, nil
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			New(fakeParams(t, tc.extra, f.URL+"/src", f.URL+"/tgt"), o).Start(ctx, func(_ Result, err error) { done <- err })
			if tc.extra != "" {
				awaitWritten(t, progress, done, 1)
				mu.Lock()
				if releases != 1 {
					t.Errorf("slot given back %d times while the continuous run goes on, want once", releases)
				}
				mu.Unlock()
				cancel()
			}
			if err := <-done; err != nil {
				t.Fatalf("run: %v", err)
			}
			u, _ := url.Parse(f.URL)
			mu.Lock()
			defer mu.Unlock()
			if len(keys) != 1 || keys[0] != "http://"+u.Host {
				t.Errorf("Startup asked for %q, want once for http://%s", keys, u.Host)
			}
			if releases != 1 {
				t.Errorf("slot given back %d times, want once", releases)
			}
		})
	}

	t.Run("refused", func(t *testing.T) {
		f, _ := continuousSource(t)
		_, o := progressOptions()
		stopped := errors.New("job stopped while waiting for a start-up slot")
		o.Startup = func(context.Context, string) (func(), error) { return nil, stopped }
		_, err := New(fakeParams(t, `,"continuous":true`, f.URL+"/src", f.URL+"/tgt"), o).Run(context.Background())
		if !errors.Is(err, stopped) {
			t.Fatalf("run: %v, want %v", err, stopped)
		}
	})
}

// TestStartupRequests: a run's start-up requests pass
// Options.StartupRequests (its infos and checkpoints at least; each
// admission ended once its answer is read); once its start-up slot is
// given back only its checkpoints' requests do (_ensure_full_commit and
// the _local writes: the final checkpoint of the run stopped here), not
// the workers'.
func TestStartupRequests(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(map[bool]string{false: "feed of its own", true: "shared feed"}[shared], func(t *testing.T) {
			f, _ := continuousSource(t)
			progress, o := progressOptions()
			if shared {
				o.Feeds = sharedfeed.New(sharedfeed.Options{})
			}
			var (
				mu                         sync.Mutex
				released                   bool
				admitted, held, late, ckpt int
			)
			feed := f.hook // the continuous feed's
			f.hook = func(w http.ResponseWriter, r *http.Request) bool {
				mu.Lock()
				if released && (strings.HasSuffix(r.URL.Path, "/_ensure_full_commit") || r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/_local/")) {
					ckpt++
				}
				mu.Unlock()
				return feed(w, r)
			}
			o.Startup = func(context.Context, string) (func(), error) {
				return func() {
					mu.Lock()
					released = true
					mu.Unlock()
				}, nil
			}
			o.StartupRequests = func(_ context.Context, server string) (func(), error) {
				mu.Lock()
				defer mu.Unlock()
				if released {
					late++
				}
				admitted++
				held++
				return sync.OnceFunc(func() {
					mu.Lock()
					held--
					mu.Unlock()
				}), nil
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			New(fakeParams(t, `,"continuous":true`, f.URL+"/src", f.URL+"/tgt"), o).Start(ctx, func(_ Result, err error) { done <- err })
			awaitWritten(t, progress, done, 1) // past its start-up: its writes went out
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("run: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if admitted-late < 3 || held != 0 || late != ckpt || ckpt == 0 {
				t.Errorf("%d requests admitted in the start-up (want at least the infos and checkpoints: 3), %d still held (want 0), "+
					"%d after it for %d checkpoint requests (want as many, at least one)", admitted-late, held, late, ckpt)
			}
		})
	}
}
