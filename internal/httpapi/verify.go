package httpapi

import (
	"net/http"

	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/verify"
)

// verify is POST /_verify: the body is a replication document (the fields
// of POST /_replicate: endpoints with their credentials and headers,
// proxies, filter, selector, doc_ids, since_seq, winning_revs_only) plus
// "extra" and "repair". The answer streams (application/x-ndjson) one
// JSON line per difference, then {"summary": ...}; an error before the
// first line is a CouchDB-style JSON error with its status (400, 401,
// 404, 500), one after it a last {"error", "reason"} line.
func (s *Server) verify(w http.ResponseWriter, r *http.Request, _ string) error {
	body, err := s.readJSONBody(w, r)
	if err != nil {
		return err
	}
	p, o, err := verify.ParseRequest(body, replicate.JobDefaults(s.replicator))
	if err != nil {
		return paramError(err)
	}
	o.Replicate = replicate.Options{Logger: s.log, Endpoints: replicate.EndpointConfigFrom(s.replicator)}
	flusher, _ := w.(http.Flusher)
	started := false
	line := func(b []byte) {
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.Header().Set("Cache-Control", "must-revalidate")
			w.WriteHeader(http.StatusOK)
		}
		_, _ = w.Write(append(b, '\n'))
		if flusher != nil {
			flusher.Flush()
		}
	}
	o.OnDifference = func(d verify.Difference) { line(d.MarshalLine()) }
	sum, err := verify.Run(r.Context(), p, o)
	if err != nil {
		if !started {
			status, name, reason := verify.Error(err)
			return errorf(status, name, "%s", reason)
		}
		line(verify.ErrorLine(err))
		return nil
	}
	line(verify.SummaryLine(sum))
	return nil
}
