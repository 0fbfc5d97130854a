package httpapi

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/internal/repjob"
)

// ServerName is how every view and metric names a watched server: its URL
// without credentials and without a trailing slash, as the doc processor
// keys it ("http://couch-a:5984"). It is bounded by [couchrep] watch.
func ServerName(server string) string {
	if server == "" {
		return ""
	}
	return strings.TrimRight(redact.StripUserinfo(redact.URL(server)), "/")
}

// hostOf is the host:port of a server name, "" if it has none.
func hostOf(name string) string {
	u, err := url.Parse(name)
	if err != nil {
		return ""
	}
	return u.Host
}

// pickServer resolves a ?server= value: a server URL (credentials and a
// trailing slash ignored) or its host:port alone, matched against the
// watched servers; a URL no watched server has is taken as given (another
// node may watch it). ok is false for a host:port no watched server has.
func (s *Server) pickServer(v string) (name string, ok bool) {
	v = strings.TrimSpace(v)
	if strings.Contains(v, "://") {
		return ServerName(v), true
	}
	for _, w := range s.servers {
		if hostOf(w) == v || strings.TrimPrefix(strings.TrimPrefix(w, "http://"), "https://") == strings.TrimRight(v, "/") {
			return w, true
		}
	}
	return "", false
}

// serverParam is the server a _scheduler/docs request names with
// ?server=, "" when it names none.
func (s *Server) serverParam(r *http.Request) (string, error) {
	q := r.URL.Query()
	if !q.Has("server") {
		return "", nil
	}
	v := q.Get("server")
	name, ok := s.pickServer(v)
	if !ok || name == "" {
		shown := v
		if at := strings.LastIndexByte(shown, '@'); at >= 0 {
			shown = shown[at+1:] // "user:password@host:port" without a scheme
		}
		return "", errorf(http.StatusBadRequest, "bad_request", "unknown server %q: give a watched server's URL or host:port (%s)",
			redact.URL(shown), strings.Join(s.servers, ", "))
	}
	return name, nil
}

// schedulerDoc finds the job of document docID of _replicator database db:
// on server when given; otherwise the one such document on any server,
// refusing (400) a document id that exists in db on several watched
// servers, which then must be told apart with ?server=.
func (s *Server) schedulerDoc(ctx context.Context, server, db, docID string) (*Job, error) {
	if server != "" {
		j, err := s.store.Get(ctx, repjob.PersistentJobID(server, db, docID))
		if err == nil && (j.Transient || j.Database != db || j.DocID != docID) {
			err = ErrNotFound
		}
		if errors.Is(err, ErrNotFound) {
			return nil, errorf(http.StatusNotFound, "not_found", "no replication document %s in %s on %s", docID, db, server)
		}
		return j, err
	}
	j, err := s.store.SchedulerDoc(ctx, db, docID)
	if errors.Is(err, ErrNotFound) {
		return nil, errorf(http.StatusNotFound, "not_found", "no replication document %s in %s", docID, db)
	}
	if err != nil {
		return nil, err
	}
	on := []string{j.Server}
	for _, w := range s.servers {
		if w == j.Server {
			continue
		}
		other, err := s.store.Get(ctx, repjob.PersistentJobID(w, db, docID))
		switch {
		case errors.Is(err, ErrNotFound):
			continue
		case err != nil:
			return nil, err
		}
		if !other.Transient && other.Database == db && other.DocID == docID {
			on = append(on, w)
		}
	}
	if len(on) > 1 {
		slices.Sort(on)
		return nil, errorf(http.StatusBadRequest, "bad_request",
			"document %s is in %s on %d servers (%s): name one with ?server=%s", docID, db, len(on), strings.Join(on, ", "), url.QueryEscape(on[0]))
	}
	return j, nil
}
