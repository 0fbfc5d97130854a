package couchrep_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep"
)

// TestSameNameOnOneStore: embedded nodes on one store under one name: the
// second refuses to start, naming the name and when the holder's lease
// expires, and leaves the store's uuid alone; once the first stopped (it
// left), the name is free.
func TestSameNameOnOneStore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, err := couchrep.OpenStore(ctx, t.TempDir()+"/shared.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	config := func(uuid string) couchrep.Config {
		cfg := couchrep.DefaultConfig()
		cfg.Couchrep.DataDir = t.TempDir()
		cfg.Couchrep.HTTPBind = "127.0.0.1:0"
		cfg.Couchrep.NodeName = "twin"
		cfg.CouchDB.UUID = uuid
		return cfg
	}
	const uuid = "0123456789abcdef0123456789abcdef"
	first, err := couchrep.Start(ctx, config(uuid), couchrep.WithStore(store))
	if err != nil {
		t.Fatal(err)
	}
	_, err = couchrep.Start(ctx, config("fedcba9876543210fedcba9876543210"), couchrep.WithStore(store))
	if !errors.Is(err, couchrep.ErrNodeNameInUse) {
		t.Fatalf("second node under the same name: %v, want ErrNodeNameInUse", err)
	}
	for _, want := range []string{`"twin"`, "lease expires at", "--node-name"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if err := first.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := couchrep.Start(ctx, config(uuid), couchrep.WithStore(store))
	if err != nil {
		t.Fatalf("start after the holder stopped: %v", err)
	}
	if again.ServerUUID() != uuid {
		t.Fatalf("server uuid %q, want %q (the refused node must not have changed it)", again.ServerUUID(), uuid)
	}
	if err := again.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestConfiguredUUIDMismatch: a node whose [couchdb] uuid is not the one
// its store recorded refuses to start; adopted on purpose, the uuid
// replaces the recorded one and the node reports the change.
func TestConfiguredUUIDMismatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	config := func(uuid string, adopted bool) couchrep.Config {
		cfg := couchrep.DefaultConfig()
		cfg.Couchrep.DataDir = dir
		cfg.Couchrep.HTTPBind = "127.0.0.1:0"
		cfg.CouchDB.UUID, cfg.CouchDB.Adopted = uuid, adopted
		return cfg
	}
	const a, b = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	n, err := couchrep.Start(ctx, config(a, false))
	if err != nil {
		t.Fatal(err)
	}
	if _, changed := n.UUIDChange(); changed {
		t.Fatal("a first start reports a uuid change")
	}
	if err := n.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = couchrep.Start(ctx, config(b, false))
	if !errors.Is(err, couchrep.ErrUUIDMismatch) || !strings.Contains(err.Error(), a) || !strings.Contains(err.Error(), b) {
		t.Fatalf("start with another configured uuid: %v, want ErrUUIDMismatch naming both", err)
	}
	n, err = couchrep.Start(ctx, config(b, true))
	if err != nil {
		t.Fatalf("start with the uuid adopted: %v", err)
	}
	defer func() {
		if err := n.Stop(ctx); err != nil {
			t.Error(err)
		}
	}()
	c, changed := n.UUIDChange()
	if !changed || c.From != a || c.To != b || c.Err != nil || n.ServerUUID() != b {
		t.Fatalf("UUIDChange = %+v, %v; uuid %q; want a change from %s to %s", c, changed, n.ServerUUID(), a, b)
	}
}
