package schedpolicy_test

import (
	"container/heap"
	"time"
)

// memQueue stands in for internal/jobqueue in the simulations and benchmarks:
// pending jobs ordered exactly as jobs.Accept orders them (lowest priority
// first, then scheduled time, then id), with jobs scheduled in the future
// kept apart until due (the store's READY and DELAYED ranges).
type memQueue struct {
	ready   readyHeap
	delayed delayedHeap
}

type qItem struct {
	id       string
	priority uint64
	at       time.Time
}

type readyHeap []qItem

func (h readyHeap) Len() int { return len(h) }
func (h readyHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if a.priority != b.priority {
		return a.priority < b.priority
	}
	if !a.at.Equal(b.at) {
		return a.at.Before(b.at)
	}
	return a.id < b.id
}
func (h readyHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *readyHeap) Push(x any)   { *h = append(*h, x.(qItem)) }
func (h *readyHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

type delayedHeap []qItem

func (h delayedHeap) Len() int { return len(h) }
func (h delayedHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].id < h[j].id
}
func (h delayedHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *delayedHeap) Push(x any)   { *h = append(*h, x.(qItem)) }
func (h *delayedHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

// add enqueues (jobs.Add / jobs.Resubmit).
func (q *memQueue) add(id string, priority uint64, at, now time.Time) {
	it := qItem{id: id, priority: priority, at: at}
	if at.After(now) {
		heap.Push(&q.delayed, it)
	} else {
		heap.Push(&q.ready, it)
	}
}

func (q *memQueue) promote(now time.Time) {
	for q.delayed.Len() > 0 && !q.delayed[0].at.After(now) {
		heap.Push(&q.ready, heap.Pop(&q.delayed))
	}
}

// due is the number of pending jobs whose time has come.
func (q *memQueue) due(now time.Time) int {
	q.promote(now)
	return q.ready.Len()
}

// accept takes the next job (jobs.Accept).
func (q *memQueue) accept(now time.Time) (qItem, bool) {
	q.promote(now)
	if q.ready.Len() == 0 {
		return qItem{}, false
	}
	return heap.Pop(&q.ready).(qItem), true
}
