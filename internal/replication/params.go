package replication

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ErrInvalidParams is wrapped by every error ParseParams returns; the message
// names the offending field as CouchDB's does.
var ErrInvalidParams = errors.New("replication: invalid parameters")

// CouchDB's defaults for the per-job options (couch_replicator_parse:default_options/0).
const (
	DefaultWorkerProcesses    = 4
	DefaultWorkerBatchSize    = 500
	DefaultHTTPConnections    = 20
	DefaultConnectionTimeout  = 30 * time.Second
	DefaultRetriesPerRequest  = 5
	DefaultCheckpointInterval = 30 * time.Second
)

// Header is one HTTP header given for an endpoint.
type Header struct {
	Name, Value string
}

// EndpointParams is a source or target as written in a replication document:
// a URL (CouchDB adds a trailing "/" unless the URL has a query string), user
// headers sorted by name, and the "auth" object.
type EndpointParams struct {
	URL     string
	Headers []Header
	// BasicUser and BasicPass are auth.basic's credentials, if given.
	BasicUser, BasicPass string
	HasBasic             bool
}

// Params is a parsed replication document / POST /_replicate body with
// CouchDB's defaults filled in. JSON-valued options are kept as the raw bytes
// the user sent, because their exact form (key order, number spelling) feeds
// the replication id.
type Params struct {
	Source, Target     EndpointParams
	Continuous         bool
	CreateTarget       bool
	CreateTargetParams json.RawMessage // JSON object or nil
	DocIDs             []string        // unquoted, sorted, unique; nil when absent
	Filter             string          // "ddoc/name" or "_builtin"
	QueryParams        json.RawMessage // JSON object or nil
	Selector           json.RawMessage // JSON object or nil
	SinceSeq           json.RawMessage // any JSON or nil
	UseCheckpoints     bool
	CheckpointInterval time.Duration
	WorkerProcesses    int
	WorkerBatchSize    int
	HTTPConnections    int
	ConnectionTimeout  time.Duration
	RetriesPerRequest  int
	UseBulkGet         bool
	WinningRevsOnly    bool

	// FilterCode is the named filter's function source from the source
	// design document; it is part of the replication id (see WithFilterCode).
	FilterCode    string
	filterCodeSet bool
}

// DefaultParams returns Params with CouchDB's defaults and no endpoints.
func DefaultParams() Params {
	return Params{
		UseCheckpoints:     true,
		CheckpointInterval: DefaultCheckpointInterval,
		WorkerProcesses:    DefaultWorkerProcesses,
		WorkerBatchSize:    DefaultWorkerBatchSize,
		HTTPConnections:    DefaultHTTPConnections,
		ConnectionTimeout:  DefaultConnectionTimeout,
		RetriesPerRequest:  DefaultRetriesPerRequest,
		UseBulkGet:         true,
	}
}

func paramErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidParams, fmt.Sprintf(format, a...))
}

// ParseParams parses a replication document (the body of POST /_replicate or
// a _replicator document) the way couch_replicator_parse does, with messages
// naming the field. Unknown fields are ignored, as in CouchDB. Unlike CouchDB
// it also checks that use_checkpoints is a boolean and that the integer
// options are positive.
func ParseParams(doc []byte) (Params, error) {
	p := DefaultParams()
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(doc, &fields); err != nil || fields == nil {
		return p, paramErr("replication document must be a JSON object")
	}
	var err error
	if p.Source, err = parseEndpoint(fields, "source"); err != nil {
		return p, err
	}
	if p.Target, err = parseEndpoint(fields, "target"); err != nil {
		return p, err
	}
	for _, b := range []struct {
		name string
		dst  *bool
	}{
		{"continuous", &p.Continuous}, {"create_target", &p.CreateTarget},
		{"use_checkpoints", &p.UseCheckpoints}, {"use_bulk_get", &p.UseBulkGet},
		{"winning_revs_only", &p.WinningRevsOnly},
	} {
		raw, ok := fields[b.name]
		if !ok {
			continue
		}
		if err := json.Unmarshal(raw, b.dst); err != nil || isNull(raw) {
			return p, paramErr("parameter `%s` must be a boolean", b.name)
		}
	}
	for _, o := range []struct {
		name string
		dst  *json.RawMessage
	}{
		{"create_target_params", &p.CreateTargetParams},
		{"query_params", &p.QueryParams},
		{"selector", &p.Selector},
	} {
		raw, ok := fields[o.name]
		if !ok {
			continue
		}
		if !isObject(raw) {
			what := "a JSON object"
			if o.name == "query_params" {
				what = "an object"
			}
			return p, paramErr("parameter `%s` must be %s", o.name, what)
		}
		*o.dst = compactCopy(raw)
	}
	if raw, ok := fields["since_seq"]; ok && !isNull(raw) {
		p.SinceSeq = compactCopy(raw)
	}
	if raw, ok := fields["doc_ids"]; ok && !isNull(raw) {
		var ids []string
		if err := json.Unmarshal(raw, &ids); err != nil {
			return p, paramErr("parameter `doc_ids` must be an array")
		}
		p.DocIDs = normalizeDocIDs(ids)
	}
	if raw, ok := fields["filter"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &p.Filter); err != nil {
			return p, paramErr("parameter `filter` must be a string")
		}
		if !strings.HasPrefix(p.Filter, "_") && !strings.Contains(p.Filter, "/") {
			return p, paramErr("Invalid filter. Must match `ddocname/filtername`.")
		}
	}
	n := 0
	for _, set := range []bool{p.DocIDs != nil, p.Filter != "", p.Selector != nil} {
		if set {
			n++
		}
	}
	if n > 1 {
		return p, paramErr("`doc_ids`,`filter`,`selector` are mutually exclusive")
	}
	for _, o := range []struct {
		name string
		dst  *int
	}{
		{"worker_processes", &p.WorkerProcesses}, {"worker_batch_size", &p.WorkerBatchSize},
		{"http_connections", &p.HTTPConnections}, {"retries_per_request", &p.RetriesPerRequest},
	} {
		if raw, ok := fields[o.name]; ok {
			v, err := toInteger(raw)
			if err != nil || v < 1 && o.name != "retries_per_request" || v < 0 {
				return p, paramErr("parameter `%s` must be a positive integer", o.name)
			}
			*o.dst = v
		}
	}
	for _, o := range []struct {
		name string
		dst  *time.Duration
	}{
		{"checkpoint_interval", &p.CheckpointInterval}, {"connection_timeout", &p.ConnectionTimeout},
	} {
		if raw, ok := fields[o.name]; ok {
			v, err := toInteger(raw)
			if err != nil || v < 1 {
				return p, paramErr("parameter `%s` must be a positive integer (milliseconds)", o.name)
			}
			*o.dst = time.Duration(v) * time.Millisecond
		}
	}
	if p.Filter == "_view" {
		if _, err := viewParam(p.QueryParams); err != nil {
			return p, err
		}
	}
	return p, nil
}

// viewParam returns query_params.view for the _view filter.
func viewParam(qp json.RawMessage) (string, error) {
	var m map[string]any
	_ = json.Unmarshal(qp, &m)
	v, _ := m["view"].(string)
	if parts := strings.Split(v, "/"); len(parts) != 2 {
		return "", paramErr("Invalid `view` parameter.")
	}
	return v, nil
}

func parseEndpoint(fields map[string]json.RawMessage, name string) (EndpointParams, error) {
	var ep EndpointParams
	raw, ok := fields[name]
	if !ok || isNull(raw) {
		return ep, paramErr("Missing `%s` field", name)
	}
	var obj struct {
		URL     *string         `json:"url"`
		Headers json.RawMessage `json:"headers"`
		Auth    json.RawMessage `json:"auth"`
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		obj.URL = &s
	} else if err := json.Unmarshal(raw, &obj); err != nil || obj.URL == nil {
		return ep, paramErr("`%s` must be a URL string or an object with a `url`", name)
	}
	u := *obj.URL
	if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
		if !strings.Contains(u, "://") {
			return ep, paramErr("`%s`: local endpoints are not supported (%q)", name, u)
		}
		return ep, paramErr("`%s`: %s has an invalid url", name, "endpoint")
	}
	if _, err := url.Parse(u); err != nil {
		return ep, paramErr("`%s`: endpoint has an invalid url", name)
	}
	if !strings.Contains(u, "?") && !strings.HasSuffix(u, "/") {
		u += "/"
	}
	ep.URL = u
	if len(obj.Headers) > 0 && !isNull(obj.Headers) {
		hs, err := orderedStringObject(obj.Headers)
		if err != nil {
			return ep, paramErr("`%s.headers` must be an object of strings", name)
		}
		// lists:ukeysort(1, ...): sorted by name, first of equal names kept.
		sort.SliceStable(hs, func(i, j int) bool { return hs[i].Name < hs[j].Name })
		for i, h := range hs {
			if i > 0 && hs[i-1].Name == h.Name {
				continue
			}
			ep.Headers = append(ep.Headers, h)
		}
	}
	if len(obj.Auth) > 0 && !isNull(obj.Auth) {
		var auth struct {
			Basic *struct {
				Username any `json:"username"`
				Password any `json:"password"`
			} `json:"basic"`
		}
		if err := json.Unmarshal(obj.Auth, &auth); err != nil {
			return ep, paramErr("`%s.auth` must be an object", name)
		}
		if auth.Basic != nil {
			user, uok := auth.Basic.Username.(string)
			pass, pok := auth.Basic.Password.(string)
			if uok && pok {
				ep.BasicUser, ep.BasicPass, ep.HasBasic = user, pass, true
			}
		}
	}
	return ep, nil
}

// orderedStringObject decodes a JSON object of strings keeping key order.
func orderedStringObject(raw []byte) ([]Header, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("not an object")
	}
	var out []Header
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, err
		}
		vt, err := dec.Token()
		if err != nil {
			return nil, err
		}
		v, ok := vt.(string)
		if !ok {
			return nil, errors.New("not a string")
		}
		out = append(out, Header{Name: kt.(string), Value: v})
	}
	return out, nil
}

// normalizeDocIDs unquotes each id as couch_httpd:unquote does (percent
// decoding, "+" as a space — CouchDB's default decode_plus_to_space) and
// returns them sorted and unique (lists:usort).
func normalizeDocIDs(ids []string) []string {
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		if u, err := url.QueryUnescape(id); err == nil {
			id = u
		} else {
			id = strings.ReplaceAll(id, "+", " ")
		}
		out = append(out, id)
	}
	sort.Strings(out)
	uniq := out[:0]
	for i, id := range out {
		if i == 0 || out[i-1] != id {
			uniq = append(uniq, id)
		}
	}
	return uniq
}

func toInteger(raw json.RawMessage) (int, error) {
	var n json.Number
	if err := json.Unmarshal(raw, &n); err == nil {
		i, err := strconv.Atoi(string(n))
		return i, err
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(s))
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

func isObject(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && t[0] == '{' && json.Valid(t)
}

func compactCopy(raw json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return append(json.RawMessage(nil), raw...)
	}
	return b.Bytes()
}
