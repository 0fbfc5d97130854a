package couchrep

import (
	"context"
	"time"

	"github.com/couchrep/couchrep/internal/httpapi"
	"github.com/couchrep/couchrep/internal/kv"
)

// timedStore times every transaction of the node's job store for its
// metrics (couchrep_store_transaction_duration_seconds) and keeps the
// store's health check (kv.Checker) visible through the wrapper.
type timedStore struct {
	kv.Database
	m *httpapi.Metrics
}

func (s timedStore) Transact(ctx context.Context, fn func(kv.Tx) error) error {
	start := time.Now()
	err := s.Database.Transact(ctx, fn)
	s.m.ObserveStoreTx(true, time.Since(start), err)
	return err
}

func (s timedStore) ReadTransact(ctx context.Context, fn func(kv.ReadTx) error) error {
	start := time.Now()
	err := s.Database.ReadTransact(ctx, fn)
	s.m.ObserveStoreTx(false, time.Since(start), err)
	return err
}

// Check runs the store's own health check, if it has one.
func (s timedStore) Check(ctx context.Context) error {
	if c, ok := s.Database.(kv.Checker); ok {
		return c.Check(ctx)
	}
	return nil
}
