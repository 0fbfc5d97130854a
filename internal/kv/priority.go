package kv

import "context"

type priorityKey struct{}

// WithPriority marks the transactions run with the returned context as a
// node's liveness work: its heartbeat, the read of the members, the store
// health check and the renewal of its job lease. A backend whose
// connections are bounded (PostgreSQL) serves them from a lane of their
// own, ahead of the commits and reads queued by other transactions, so
// that thousands of job transactions waiting for the store never make a
// live node look dead or let its lease expire. Use it for little, periodic
// work only: what it bypasses is every other transaction's queue.
func WithPriority(ctx context.Context) context.Context {
	if IsPriority(ctx) {
		return ctx
	}
	return context.WithValue(ctx, priorityKey{}, true)
}

// IsPriority reports whether ctx was marked by WithPriority.
func IsPriority(ctx context.Context) bool {
	v, _ := ctx.Value(priorityKey{}).(bool)
	return v
}
