package config

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Files Complete keeps in the data directory.
const (
	// UUIDFile holds the generated server UUID ([couchdb] uuid).
	UUIDFile = "couchdb_uuid"
	// NodeIDFile holds the random part of the derived node name.
	NodeIDFile = "node_id"
)

// Complete fills the settings that are derived from the data directory,
// creating it if needed: Couchrep.Store (<data>/couchrep.db),
// CouchDB.UUID (EnsureUUID) and Couchrep.NodeName (EnsureNodeName) when
// they are empty. Call it once, after Validate, before starting a node.
func (c *Config) Complete() error {
	dir := c.Couchrep.DataDir
	if dir == "" {
		return &Error{Section: SectionCouchrep, Key: "data_dir", Expected: "a directory path", Got: ""}
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("config: data directory: %w", err)
	}
	if c.Couchrep.Store == "" {
		c.Couchrep.Store = filepath.Join(dir, StoreFileName)
	}
	if c.CouchDB.UUID == "" {
		id, err := EnsureUUID(dir)
		if err != nil {
			return err
		}
		c.CouchDB.UUID, c.CouchDB.Generated = id, true
	}
	if c.Couchrep.NodeName == "" {
		name, err := EnsureNodeName(dir)
		if err != nil {
			return err
		}
		c.Couchrep.NodeName = name
	}
	return nil
}

// EnsureUUID returns the server UUID persisted in dir (file couchdb_uuid),
// generating it on first use: 32 lowercase hex digits, like CouchDB's
// couch_uuids:random(). Concurrent first calls from several processes
// sharing dir agree on one UUID.
func EnsureUUID(dir string) (string, error) {
	return ensureFile(dir, UUIDFile, 16)
}

// AdoptUUID records uuid as the server UUID of data directory dir (file
// couchdb_uuid), replacing the one there: nodes started later on dir
// without [couchdb] uuid use it (couchrepd --adopt-uuid).
func AdoptUUID(dir, uuid string) error {
	if !validUUID(uuid) {
		return &Error{Section: SectionCouchDB, Key: "uuid", Expected: "a server UUID without spaces", Got: uuid}
	}
	return placeFile(dir, UUIDFile, uuid, os.Rename)
}

// placeFile writes content and a newline to a synced temporary file in dir
// (created if needed), then puts it at dir/name with place: os.Rename
// replaces the file there, os.Link fails with fs.ErrExist if there is one.
func placeFile(dir, name, content string, place func(tmp, path string) error) error {
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("config: data directory: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+name+".*")
	if err != nil {
		return fmt.Errorf("config: writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.WriteString(content + "\n")
	if werr == nil {
		werr = tmp.Sync()
	}
	if cerr := tmp.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = place(tmp.Name(), path)
	}
	if werr != nil {
		return fmt.Errorf("config: writing %s: %w", path, werr)
	}
	return nil
}

// EnsureNodeName returns the default node name for data directory dir:
// couchrep-<8 hex>@<hostname>, where the hex digits are generated once and
// kept in dir (file node_id). Two nodes on one host with their own data
// directories get different names, and a restarted node keeps its name. The
// host part (up to the first dot) is read on each call, so renaming the host
// renames the node; set [couchrep] node_name to fix the whole name.
func EnsureNodeName(dir string) (string, error) {
	id, err := ensureFile(dir, NodeIDFile, 4)
	if err != nil {
		return "", err
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	if i := strings.IndexByte(host, '.'); i > 0 {
		host = host[:i]
	}
	return "couchrep-" + id + "@" + host, nil
}

// ensureFile reads dir/name, or creates it holding n random bytes in hex.
// The file is written under a temporary name and hard-linked into place, so
// a racing process either wins or reads the winner's complete file.
func ensureFile(dir, name string, n int) (string, error) {
	path := filepath.Join(dir, name)
	if id, err := readID(path, 2*n); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return id, err
	}
	buf := make([]byte, n)
	if _, err := rand.Read(buf); err != nil {
		return "", fmt.Errorf("config: generating %s: %w", name, err)
	}
	id := hex.EncodeToString(buf)
	if err := placeFile(dir, name, id, os.Link); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return readID(path, 2*n)
		}
		return "", err
	}
	return id, nil
}

// readID reads a hex id of length n from path. The server UUID file may
// also hold an adopted UUID (AdoptUUID) of any form [couchdb] uuid accepts.
func readID(path string, n int) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("config: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if filepath.Base(path) == UUIDFile && validUUID(id) {
		return id, nil
	}
	if _, herr := hex.DecodeString(id); herr != nil || len(id) != n {
		return "", fmt.Errorf("config: %s: expected %d hex digits, got %q: %w", path, n, id, ErrInvalid)
	}
	return id, nil
}
