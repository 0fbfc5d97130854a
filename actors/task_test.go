package actors_test

import (
	"context"
	"testing"
	"time"

	"github.com/couchrep/couchrep/actors"
)

func TestTaskStopCancelsAndWaits(t *testing.T) {
	var task actors.Task
	if !task.Stop(0) || task.Running() {
		t.Fatal("a task never started must stop at once and not run")
	}
	returned := make(chan struct{})
	task.Go(func(ctx context.Context) {
		<-ctx.Done()
		close(returned)
	})
	if !task.Running() {
		t.Fatal("started task does not report running")
	}
	if !task.Stop(0) {
		t.Fatal("Stop without bound did not wait")
	}
	select {
	case <-returned:
	default:
		t.Fatal("Stop returned before the goroutine did")
	}
	if task.Running() {
		t.Fatal("stopped task reports running")
	}
}

func TestTaskStopTimesOutOnAStuckGoroutine(t *testing.T) {
	var task actors.Task
	release := make(chan struct{})
	task.Go(func(context.Context) { <-release }) // ignores its context
	if task.Stop(10 * time.Millisecond) {
		t.Fatal("Stop reported a stuck goroutine as returned")
	}
	close(release)
}

func TestTaskGoReplacesTheRunningGoroutine(t *testing.T) {
	var task actors.Task
	first := make(chan struct{})
	task.Go(func(ctx context.Context) {
		<-ctx.Done()
		close(first)
	})
	task.Go(func(ctx context.Context) { <-ctx.Done() })
	select {
	case <-first:
	default:
		t.Fatal("Go did not stop the previous goroutine first")
	}
	task.Stop(0)
}
