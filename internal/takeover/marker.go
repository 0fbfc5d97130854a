package takeover

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/tuple"
)

// The marker: every couchrep store names itself in one _local document of
// each _replicator database its nodes follow, _local/couchrep-stores,
// {"stores": {"<store id>": {"node", "uuid", "updated", "every_s"}}}, and
// refreshes its entry at each competing-replicator check. One document per
// database (not one per store) is read with one GET on every server:
// PouchDB Server has no _local_docs to list several. A _local document is
// not replicated and does not show in _changes. An entry whose updated is
// older than StaleAfter(every) belongs to a store that stopped following the
// database (it is reported, never refused).

// MarkerDocID is the marker's _local document id in a _replicator database.
const MarkerDocID = "_local/couchrep-stores"

// markerDoc is the marker document.
type markerDoc struct {
	Rev    string                 `json:"_rev,omitempty"`
	Stores map[string]markerEntry `json:"stores"`
}

type markerEntry struct {
	Node    string    `json:"node,omitempty"`
	UUID    string    `json:"uuid,omitempty"`
	Updated time.Time `json:"updated"`
	EveryS  int64     `json:"every_s"`
}

// Marker is one store's entry in one database's marker.
type Marker struct {
	DB, Store, Node, UUID string
	Updated               time.Time
	// Every is how often the store refreshes it.
	Every time.Duration
	// Live: refreshed within StaleAfter(Every).
	Live bool
}

// StaleAfter is the age at which an entry refreshed every d is stale:
// three missed refreshes, plus a minute for clocks that differ.
func StaleAfter(d time.Duration) time.Duration { return 3*d + time.Minute }

// ErrMarkerConflict: the marker kept changing under a write.
var ErrMarkerConflict = errors.New("takeover: marker document kept changing")

func (p Prober) now() time.Time {
	if p.Clock != nil {
		return p.Clock()
	}
	return time.Now()
}

func (p Prober) markerDB(db string) *couch.DB {
	return couch.NewDB(p.at(escapeDB(db)+"/"), p.Options)
}

// escapeDB escapes a database name as one path segment ("a/_replicator"
// is a%2F_replicator).
func escapeDB(db string) string {
	return url.PathEscape(db)
}

// readMarker reads db's marker; a missing one is empty.
func (p Prober) readMarker(ctx context.Context, db string) (markerDoc, error) {
	var m markerDoc
	raw, err := p.markerDB(db).GetLocal(ctx, MarkerDocID)
	if errors.Is(err, couch.ErrNotFound) {
		return m, nil
	}
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return m, fmt.Errorf("%s is not a couchrep marker: %w", MarkerDocID, err)
	}
	return m, nil
}

func (p Prober) markers(ctx context.Context, dbs []string) Markers {
	if dbs == nil {
		var err error
		if dbs, err = p.replicatorDBs(ctx); err != nil {
			return Markers{Reason: failed("/_all_dbs", err)}
		}
	}
	out := Markers{Known: true, Databases: slices.Clone(dbs)}
	now := p.now()
	for _, db := range dbs {
		m, err := p.readMarker(ctx, db)
		if err != nil {
			out.Known = false
			out.Reason = failed("/"+db+"/"+MarkerDocID, err)
			continue
		}
		for _, id := range slices.Sorted(maps.Keys(m.Stores)) {
			if id == p.StoreID {
				continue
			}
			e := m.Stores[id]
			every := time.Duration(e.EveryS) * time.Second
			out.Others = append(out.Others, Marker{DB: db, Store: id, Node: e.Node, UUID: e.UUID, Updated: e.Updated, Every: every,
				Live: now.Sub(e.Updated) < StaleAfter(every)})
		}
	}
	return out
}

// Mark writes (or refreshes) this store's entry in db's marker: node and
// uuid name who follows it, every is how often it is refreshed.
func (p Prober) Mark(ctx context.Context, db, node, uuid string, every time.Duration) error {
	if p.StoreID == "" {
		return errors.New("takeover: Mark without a StoreID")
	}
	entry := markerEntry{Node: node, UUID: uuid, Updated: p.now().UTC().Truncate(time.Second), EveryS: int64(max(every/time.Second, 1))}
	return p.updateMarker(ctx, db, func(m *markerDoc) bool {
		if m.Stores == nil {
			m.Stores = map[string]markerEntry{}
		}
		m.Stores[p.StoreID] = entry
		return true
	})
}

// Unmark removes this store's entry from db's marker (a store that stops
// following the database for good).
func (p Prober) Unmark(ctx context.Context, db string) error {
	return p.updateMarker(ctx, db, func(m *markerDoc) bool {
		if _, ok := m.Stores[p.StoreID]; !ok {
			return false
		}
		delete(m.Stores, p.StoreID)
		return true
	})
}

// updateMarker reads db's marker, lets change edit it (false: nothing to
// write) and writes it back, again from a fresh read on a conflict with
// another store's write (five times at most).
func (p Prober) updateMarker(ctx context.Context, db string, change func(*markerDoc) bool) error {
	for range 5 {
		m, err := p.readMarker(ctx, db)
		if err != nil {
			return err
		}
		if !change(&m) {
			return nil
		}
		body, err := json.Marshal(m)
		if err != nil {
			return err
		}
		_, err = p.markerDB(db).PutLocal(ctx, MarkerDocID, body)
		if errors.Is(err, couch.ErrConflict) {
			continue
		}
		return err
	}
	return fmt.Errorf("%w: %s/%s", ErrMarkerConflict, db, MarkerDocID)
}

// storeIDKey is where the job store keeps its id, next to the server uuid.
var storeIDKey = tuple.Tuple{"couchrep", "store_id"}.Pack()

// StoreID returns the id of the job store db: every node sharing it has the
// same, and another store (another couchrep installation) another. The
// first node to ask makes it (random) in the transaction that found none.
func StoreID(ctx context.Context, db kv.Database) (string, error) {
	var out string
	err := db.Transact(ctx, func(tx kv.Tx) error {
		got, err := tx.Get(storeIDKey)
		if err != nil {
			return err
		}
		if len(got) > 0 {
			out = string(got)
			return nil
		}
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return err
		}
		out = hex.EncodeToString(b[:])
		tx.Set(storeIDKey, []byte(out))
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("takeover: store id in the job store: %w", err)
	}
	return out, nil
}
