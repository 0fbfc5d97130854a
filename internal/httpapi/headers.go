package httpapi

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
)

// CouchDBVersion is the CouchDB release whose replicator HTTP API couchrep
// answers as (its answers, status codes and headers are checked against
// it).
const CouchDBVersion = "3.4.3"

// ServerHeader is the Server header of every answer. CouchDB sends
// "CouchDB/3.4.3 (Erlang OTP/25)"; couchrep names itself first and keeps a
// "CouchDB/<version>" token, which is what tools that detect CouchDB by
// this header look for.
var ServerHeader = "couchrep/" + Version + " (CouchDB/" + CouchDBVersion + " compatible)"

// Header names of CouchDB's default headers (chttpd:basic_headers).
const (
	headerRequestID = "X-Couch-Request-ID"
	headerBodyTime  = "X-CouchDB-Body-Time"
)

// maxRequestIDLen bounds a client's X-Couch-Request-ID that is kept
// (chttpd:nonce/1: at most 36 characters of [0-9A-Za-z_-]).
const maxRequestIDLen = 36

// setDefaultHeaders sets the headers CouchDB sends with every answer of
// its HTTP API, before any handler runs (so errors, redirects and the
// status page carry them too), and returns the request id: the client's
// X-Couch-Request-ID when it is one CouchDB would keep, else a new one of
// 10 hex digits as CouchDB makes. Content-Type is the handler's
// (application/json for every JSON answer, writeJSON).
func setDefaultHeaders(w http.ResponseWriter, r *http.Request) string {
	id := r.Header.Get(headerRequestID)
	if !validRequestID(id) {
		id = newRequestID()
	}
	h := w.Header()
	h.Set(headerRequestID, id)
	h.Set(headerBodyTime, "0")
	h.Set("Server", ServerHeader)
	h.Set("Cache-Control", "must-revalidate")
	return id
}

// validRequestID reports whether CouchDB would keep id as the request's
// id.
func validRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}

// newRequestID is couch_util:to_hex(crypto:strong_rand_bytes(5)).
func newRequestID() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
