package couch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// ServerInfo is the answer to GET / on the server the database lives on.
type ServerInfo struct {
	// CouchDB is "Welcome" on Apache CouchDB; empty on PouchDB Server.
	CouchDB string
	// Version is the server's version string.
	Version string
	// UUID is the server's UUID (CouchDB's [couchdb] uuid); may be empty.
	UUID string
	// VendorName and VendorVersion come from the "vendor" object.
	VendorName, VendorVersion string
	// Features lists optional features (CouchDB 2+).
	Features []string
}

// ServerInfo asks the server root (the database URL minus its last path
// segment) who it is.
func (d *DB) ServerInfo(ctx context.Context) (ServerInfo, error) {
	r := &request{method: http.MethodGet, root: true}
	body, err := getJSON[struct {
		CouchDB  string          `json:"couchdb"`
		Version  json.RawMessage `json:"version"`
		UUID     string          `json:"uuid"`
		Features []string        `json:"features"`
		Vendor   struct {
			Name    json.RawMessage `json:"name"`
			Version json.RawMessage `json:"version"`
		} `json:"vendor"`
	}](ctx, d, r, d.lim.MaxBodyBytes, "response body")
	if err != nil {
		return ServerInfo{}, err
	}
	return ServerInfo{
		CouchDB: body.CouchDB, Version: scalarString(body.Version), UUID: body.UUID,
		VendorName: scalarString(body.Vendor.Name), VendorVersion: scalarString(body.Vendor.Version),
		Features: body.Features,
	}, nil
}

// scalarString renders a JSON string or number as text ("" for others).
func scalarString(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
	}
	return string(raw)
}

// DBInfo is the answer to GET /{db}/.
type DBInfo struct {
	DBName    string
	UpdateSeq Seq
	DocCount  int64
	// DocDelCount is the number of deleted documents.
	DocDelCount int64
	// InstanceStartTime is "0" on CouchDB 2+, a timestamp on PouchDB Server
	// and CouchDB 1.x; a checkpoint is only valid while it is unchanged.
	InstanceStartTime string
}

// Info reads the database's info. A missing database gives an error
// matching ErrNotFound. Like CouchDB's replicator it requires update_seq
// and instance_start_time in the answer.
func (d *DB) Info(ctx context.Context) (DBInfo, error) {
	return d.info(ctx, &request{method: http.MethodGet})
}

// InfoOf reads the info of the database name of d's server (GET /{name}
// at its root), as Info reads d's: d is any client of the server (a
// _db_updates feed's, at its root).
func (d *DB) InfoOf(ctx context.Context, name string) (DBInfo, error) {
	return d.info(ctx, &request{method: http.MethodGet, path: url.PathEscape(name), root: true})
}

// dbInfoBody is a database info as GET /db and POST /_dbs_info give it.
type dbInfoBody struct {
	DBName            string          `json:"db_name"`
	UpdateSeq         Seq             `json:"update_seq"`
	DocCount          int64           `json:"doc_count"`
	DocDelCount       int64           `json:"doc_del_count"`
	InstanceStartTime json.RawMessage `json:"instance_start_time"`
}

func (b dbInfoBody) info() (DBInfo, error) {
	if b.UpdateSeq == nil || b.InstanceStartTime == nil {
		return DBInfo{}, fmt.Errorf("database info lacks update_seq or instance_start_time")
	}
	return DBInfo{
		DBName: b.DBName, UpdateSeq: b.UpdateSeq, DocCount: b.DocCount, DocDelCount: b.DocDelCount,
		InstanceStartTime: scalarString(b.InstanceStartTime),
	}, nil
}

func (d *DB) info(ctx context.Context, r *request) (DBInfo, error) {
	body, err := getJSON[dbInfoBody](ctx, d, r, d.lim.MaxBodyBytes, "response body")
	if err != nil {
		return DBInfo{}, err
	}
	info, err := body.info()
	if err != nil {
		return DBInfo{}, badResponse(r, d, err)
	}
	return info, nil
}

// MaxDBsInfoKeys is the most databases one POST /_dbs_info may name:
// CouchDB 3.4.3 answers 400 too_many_keys beyond ([chttpd]
// max_db_number_for_dbs_info_req, 100).
const MaxDBsInfoKeys = 100

// DBsInfoResult is one database's line of a POST /_dbs_info answer: its
// info (what GET /db gives), or Err — matching ErrNotFound for a database
// that does not exist (CouchDB's {"key": db, "error": "not_found"}).
type DBsInfoResult struct {
	Info DBInfo
	Err  error
}

// DBsInfo reads the infos of the databases names of d's server in one
// request, POST /_dbs_info {"keys": names} at its root (CouchDB 2.2 and
// later; at most MaxDBsInfoKeys names), in the order of names. A server
// without it answers with an error status (PouchDB Server: 404
// no_db_file), returned as an *HTTPError; a CouchDB 3 answers 401 to
// credentials that are not a server admin's. A database the answer does
// not name gets an error.
func (d *DB) DBsInfo(ctx context.Context, names []string) ([]DBsInfoResult, error) {
	if len(names) > MaxDBsInfoKeys {
		return nil, fmt.Errorf("couch: _dbs_info: %d databases, at most %d a request", len(names), MaxDBsInfoKeys)
	}
	b, err := json.Marshal(struct {
		Keys []string `json:"keys"`
	}{names})
	if err != nil {
		return nil, err
	}
	body, n := bytesBody(b)
	r := &request{method: http.MethodPost, path: "_dbs_info", root: true, body: body, bodyLen: n, contentType: "application/json"}
	rows, err := getJSON[[]struct {
		Key   string          `json:"key"`
		Info  *dbInfoBody     `json:"info"`
		Error json.RawMessage `json:"error"`
	}](ctx, d, r, d.lim.MaxBodyBytes, "_dbs_info answer")
	if err != nil {
		return nil, err
	}
	byName := make(map[string]int, len(names))
	for i, name := range names {
		byName[name] = i
	}
	out := make([]DBsInfoResult, len(names))
	seen := make([]bool, len(names))
	for _, row := range rows {
		i, ok := byName[row.Key]
		if !ok || seen[i] {
			continue
		}
		seen[i] = true
		switch {
		case row.Info != nil:
			info, err := row.Info.info()
			if err != nil {
				err = badResponse(r, d, fmt.Errorf("%q: %w", row.Key, err))
			}
			out[i] = DBsInfoResult{Info: info, Err: err}
		default:
			name := scalarString(row.Error)
			dbr := &request{method: http.MethodGet, path: url.PathEscape(row.Key), root: true}
			he := &HTTPError{Method: http.MethodPost, URL: dbr.redactedURL(d), Status: http.StatusInternalServerError, ErrorName: name,
				Reason: "in the answer of POST " + r.redactedURL(d)}
			if name == "not_found" {
				he.Status = http.StatusNotFound
			}
			out[i] = DBsInfoResult{Err: he}
		}
	}
	for i, ok := range seen {
		if !ok {
			out[i] = DBsInfoResult{Err: badResponse(r, d, fmt.Errorf("_dbs_info answer lacks %q", names[i]))}
		}
	}
	return out, nil
}

// Create creates the database (PUT /{db}/?params, e.g. q=4&n=1, CouchDB's
// create_target_params). An existing database gives an error matching
// ErrExists.
func (d *DB) Create(ctx context.Context, params url.Values) error {
	r := &request{method: http.MethodPut, query: params.Encode()}
	resp, err := d.do(ctx, r)
	if err != nil {
		return err
	}
	drain(resp)
	return nil
}

// EnsureFullCommit asks the server to commit to disk (POST
// _ensure_full_commit) and returns the instance_start_time it reports.
func (d *DB) EnsureFullCommit(ctx context.Context) (instanceStartTime string, err error) {
	body, n := bytesBody([]byte("{}"))
	r := &request{method: http.MethodPost, path: "_ensure_full_commit", body: body, bodyLen: n, contentType: "application/json"}
	out, err := getJSON[struct {
		InstanceStartTime json.RawMessage `json:"instance_start_time"`
	}](ctx, d, r, d.lim.MaxBodyBytes, "response body")
	if err != nil {
		return "", err
	}
	return scalarString(out.InstanceStartTime), nil
}

func localPath(id string) string {
	return escapeDocID("_local/" + strings.TrimPrefix(id, "_local/"))
}

// GetLocal reads the _local document id (with or without the "_local/"
// prefix) and returns its JSON. A missing document gives an error matching
// ErrNotFound.
func (d *DB) GetLocal(ctx context.Context, id string) (json.RawMessage, error) {
	return d.getRaw(ctx, &request{method: http.MethodGet, path: localPath(id)})
}

// PutLocal writes the _local document id (with or without the "_local/"
// prefix); body must carry the current "_rev" when the document exists
// (else an error matching ErrConflict). It returns the new revision.
func (d *DB) PutLocal(ctx context.Context, id string, body json.RawMessage) (rev string, err error) {
	b, n := bytesBody(body)
	r := &request{method: http.MethodPut, path: localPath(id), body: b, bodyLen: n, contentType: "application/json"}
	out, err := getJSON[struct {
		Rev string `json:"rev"`
	}](ctx, d, r, d.lim.MaxBodyBytes, "response body")
	if err != nil {
		return "", err
	}
	return out.Rev, nil
}

// GetDoc reads one document (GET /{db}/{id}?query) and returns its JSON,
// e.g. a design document whose filter code goes into a replication ID.
func (d *DB) GetDoc(ctx context.Context, id string, query url.Values) (json.RawMessage, error) {
	return d.getRaw(ctx, &request{method: http.MethodGet, path: escapeDocID(id), query: query.Encode()})
}

func (d *DB) getRaw(ctx context.Context, r *request) (json.RawMessage, error) {
	return getJSON[json.RawMessage](ctx, d, r, d.lim.MaxDocumentBytes, "document")
}

// RevsDiff is the target's answer for one document in _revs_diff.
type RevsDiff struct {
	// Missing are the asked-for revisions the target does not have.
	Missing []string `json:"missing"`
	// PossibleAncestors are revisions the target has that may be ancestors
	// of the missing ones (absent on PouchDB Server).
	PossibleAncestors []string `json:"possible_ancestors,omitempty"`
}

// RevsDiff asks the target which of revs (doc ID → revisions) it lacks
// (POST _revs_diff). Documents with nothing missing are absent from the
// result.
func (d *DB) RevsDiff(ctx context.Context, revs map[string][]string) (map[string]RevsDiff, error) {
	body, n, err := jsonBody(revs)
	if err != nil {
		return nil, err
	}
	r := &request{method: http.MethodPost, path: "_revs_diff", body: body, bodyLen: n, contentType: "application/json", compress: true}
	return getJSON[map[string]RevsDiff](ctx, d, r, d.lim.MaxBodyBytes, "response body")
}
