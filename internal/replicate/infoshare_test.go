package replicate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestInfoShare: runs asking while a request is in flight, or less than
// InfoShareFor after its answer, share it; later ones, other endpoints
// (URL, credentials) and runs after a failure send their own.
func TestInfoShare(t *testing.T) {
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	s := NewInfoShare()
	s.now = clock
	ctx := context.Background()
	central := EndpointParams{URL: "http://h/central"}
	var sent atomic.Int32
	ask := func(ep EndpointParams, fail error) error {
		_, err := s.share(ctx, infoKey("db", ep), func(c *infoCall) {
			sent.Add(1)
			c.err = fail
		})
		return err
	}
	expect := func(what string, n int32) {
		t.Helper()
		if got := sent.Swap(0); got != n {
			t.Errorf("%s: %d requests, want %d", what, got, n)
		}
	}

	// In flight: the callers wait for the one request.
	release := make(chan struct{})
	started := make(chan struct{})
	go func() {
		_, _ = s.share(ctx, infoKey("db", central), func(c *infoCall) {
			sent.Add(1)
			close(started)
			<-release
		})
	}()
	<-started
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			if err := ask(central, nil); err != nil {
				t.Error(err)
			}
		})
	}
	close(release)
	wg.Wait()
	expect("5 runs while the request is in flight", 1)

	advance(InfoShareFor - time.Millisecond)
	if err := ask(central, nil); err != nil {
		t.Fatal(err)
	}
	expect("just within InfoShareFor", 0)
	advance(time.Millisecond)
	if err := ask(central, nil); err != nil {
		t.Fatal(err)
	}
	expect("InfoShareFor after the answer", 1)

	for _, ep := range []EndpointParams{
		{URL: "http://h/other"},
		{URL: "http://u:p@h/central"},
		{URL: "http://h/central", HasBasic: true, BasicUser: "u", BasicPass: "p"},
		{URL: "http://h/central", Headers: []Header{{Name: "X-Auth", Value: "1"}}},
		{URL: "http://h/central", Proxy: "http://proxy"},
	} {
		if err := ask(ep, nil); err != nil {
			t.Fatal(err)
		}
		expect(ep.URL+" with other credentials, headers or proxy", 1)
	}

	// A failure is not shared.
	boom := errors.New("boom")
	failing := EndpointParams{URL: "http://h/failing"}
	if err := ask(failing, boom); !errors.Is(err, boom) {
		t.Fatalf("err %v, want boom", err)
	}
	if err := ask(failing, nil); err != nil {
		t.Fatal(err)
	}
	expect("after a failure", 2)
}

// TestInfoShareSweeps: answers too old to share are dropped as new ones
// come, so the share holds the last second's databases only.
func TestInfoShareSweeps(t *testing.T) {
	now := time.Unix(1000, 0)
	s := NewInfoShare()
	s.now = func() time.Time { return now }
	for i := range 100 {
		_, _ = s.share(context.Background(), infoKey("db", EndpointParams{URL: fmt.Sprintf("http://h/db%d", i)}), func(*infoCall) {})
		now = now.Add(100 * time.Millisecond)
	}
	s.mu.Lock()
	n := len(s.m)
	s.mu.Unlock()
	if n > 21 {
		t.Errorf("%d answers kept after 100 databases over 10 s, want at most the last 2 s' (21)", n)
	}
}
