package replicate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/redact"
)

// ErrInvalidParams is wrapped by every error ParseParams and
// ParseReplicateRequest return (each a *ParamError); the message names the
// offending field as CouchDB's does.
var ErrInvalidParams = errors.New("replication: invalid parameters")

// CouchDB's error names ("error" member of an error reply) for invalid
// replication parameters.
const (
	// CodeBadRequest is CouchDB's bad_request: a field of the wrong type or
	// form, fields that exclude each other, a missing field.
	CodeBadRequest = "bad_request"
	// CodeInvalidReplication is CouchDB's invalid_replication: an endpoint
	// or proxy URL that cannot be used.
	CodeInvalidReplication = "invalid_replication"
)

// ParamError is one invalid replication parameter: the field at fault,
// CouchDB's error name for it and the reason text CouchDB gives. It wraps
// ErrInvalidParams.
type ParamError struct {
	// Field is the offending top-level field ("source", "doc_ids", ...),
	// empty when the document as a whole is wrong.
	Field string
	// Code is CouchDB's error name: CodeBadRequest or CodeInvalidReplication.
	Code string
	// Reason is the human-readable text, CouchDB's where it has one.
	Reason string
}

// Error implements error.
func (e *ParamError) Error() string { return ErrInvalidParams.Error() + ": " + e.Reason }

// Unwrap returns ErrInvalidParams.
func (e *ParamError) Unwrap() error { return ErrInvalidParams }

// CouchDB's defaults for the per-job options (couch_replicator_parse:default_options/0).
const (
	DefaultWorkerProcesses    = 4
	DefaultWorkerBatchSize    = 500
	DefaultHTTPConnections    = 20
	DefaultConnectionTimeout  = 30 * time.Second
	DefaultRetriesPerRequest  = 5
	DefaultCheckpointInterval = 30 * time.Second
	// DefaultMissingDocRetry is missing_doc_retry_msec: the wait before
	// asking the source again for a document it answered 404 for.
	DefaultMissingDocRetry = 2 * time.Second
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
	// Proxy is the proxy URL for this endpoint ("proxy", or
	// "source_proxy"/"target_proxy"), empty for none. It is not part of
	// the replication ID.
	Proxy string
	// Token is auth.iam or auth.bearer: a credential that expires, sent
	// as a bearer token and renewed (couch.TokenAuth). Like CouchDB's
	// auth plugins other than basic, it is not part of the replication ID:
	// a new token, key or command keeps the job's checkpoints.
	Token *couch.TokenAuth
}

// Object is the endpoint as the JSON object of a replication document
// ({"url", "headers", "auth": {"basic"}}); the proxy is not part of it.
// It holds the credentials: redact before showing it.
func (ep EndpointParams) Object() map[string]any {
	m := map[string]any{"url": ep.URL}
	if len(ep.Headers) > 0 {
		h := map[string]any{}
		for _, x := range ep.Headers {
			h[x.Name] = x.Value
		}
		m["headers"] = h
	}
	if ep.HasBasic {
		m["auth"] = map[string]any{"basic": map[string]any{"username": ep.BasicUser, "password": ep.BasicPass}}
	}
	if ep.Token != nil {
		m["auth"] = ep.Token.Object()
	}
	return m
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
	// StopOnWriteFailure ends the job (failed, with the document's reason)
	// at the first document the target refuses to write, instead of
	// counting it in doc_write_failures and moving on (CouchDB's way, the
	// default). couchrep's own field; not part of the replication id.
	StopOnWriteFailure bool
	// UserCtx is the document's user_ctx, nil when absent.
	UserCtx *UserCtx
	// SocketOptions is the job's socket_options (an Erlang list such as
	// "[{nodelay, true}]"), applied over the node's; empty for none.
	SocketOptions string

	// IdleParkAfter and ParkRecheck are the node's [replicator]
	// idle_park_after and park_recheck (JobDefaults; a document cannot set
	// them, and they are not part of the replication id): a continuous run
	// with Options.Park set ends parked after IdleParkAfter without a
	// change (zero: never), and a parked job re-checks its source once per
	// ParkRecheck.
	IdleParkAfter, ParkRecheck time.Duration

	// CredentialCommands is the node's [replicator]
	// allow_credential_commands as JobDefaults gives it (a document cannot
	// set it; not part of the replication id): with CredentialCommandsRefused
	// ParseParamsWith refuses an endpoint whose auth.bearer reads a file or
	// runs a program of the node. The zero value does not check (the
	// endpoint's client refuses such a credential at its first request
	// unless allowed: couch.TokenOptions.AllowCommands).
	CredentialCommands CredentialPolicy

	// FilterCode is the named filter's function source from the source
	// design document; it is part of the replication id (see WithFilterCode).
	FilterCode    string
	filterCodeSet bool
}

// CredentialPolicy is Params.CredentialCommands.
type CredentialPolicy int

// The values of CredentialPolicy.
const (
	// CredentialCommandsUnchecked: the parser does not look.
	CredentialCommandsUnchecked CredentialPolicy = iota
	// CredentialCommandsRefused: auth.bearer token_file and command are
	// refused ([replicator] allow_credential_commands = false).
	CredentialCommandsRefused
	// CredentialCommandsAllowed: the operator allows them.
	CredentialCommandsAllowed
)

// CheckCredentials refuses, under CredentialCommandsRefused, an endpoint
// whose auth.bearer reads a file or runs a program of the node, with a
// *ParamError naming the field.
func (p Params) CheckCredentials(policy CredentialPolicy) error {
	if policy != CredentialCommandsRefused {
		return nil
	}
	for _, ep := range []struct {
		name string
		tok  *couch.TokenAuth
	}{{"source", p.Source.Token}, {"target", p.Target.Token}} {
		if ep.tok.Local() {
			return paramErr(ep.name, "`%s.%s` is not allowed on this node: a replication document may read a file or run a program of the node only where an administrator set [replicator] allow_credential_commands = true",
				ep.name, ep.tok.Field())
		}
	}
	return nil
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

// paramErr is a bad_request about field.
func paramErr(field, format string, a ...any) error {
	return &ParamError{Field: field, Code: CodeBadRequest, Reason: fmt.Sprintf(format, a...)}
}

// urlErr is an invalid_replication about field's URL.
func urlErr(field, format string, a ...any) error {
	return &ParamError{Field: field, Code: CodeInvalidReplication, Reason: fmt.Sprintf(format, a...)}
}

// ParseParams parses a replication document (the body of POST /_replicate or
// a _replicator document) the way couch_replicator_parse does, with messages
// naming the field; every error is a *ParamError. Unknown fields are ignored,
// as in CouchDB. Unlike CouchDB it also checks that use_checkpoints is a
// boolean, that the integer options are positive, that doc_ids holds only
// strings and that user_ctx has CouchDB's shape, and it reports every problem
// as a 400-class error (CouchDB answers some with a 500).
func ParseParams(doc []byte) (Params, error) {
	return ParseParamsWith(doc, DefaultParams())
}

// ParseParamsWith is ParseParams with the options the document does not
// give taken from defaults (a node's [replicator] section: JobDefaults),
// as CouchDB fills a job's options from its config.
func ParseParamsWith(doc []byte, defaults Params) (Params, error) {
	fields, err := objectFields(doc, "replication document must be a JSON object")
	if err != nil {
		return defaults, err
	}
	return parseFieldsWith(fields, true, defaults)
}

// JobDefaults are the per-job options of a node's [replicator] section
// (worker_processes, worker_batch_size, http_connections,
// connection_timeout, retries_per_request, checkpoint_interval,
// use_checkpoints, use_bulk_get) as the defaults of ParseParamsWith. A
// section that was never parsed (its zero value: worker_processes 0) gives
// CouchDB's defaults.
func JobDefaults(c config.Replicator) Params {
	p := DefaultParams()
	if c.WorkerProcesses <= 0 {
		return p
	}
	p.WorkerProcesses = c.WorkerProcesses
	if c.WorkerBatchSize > 0 {
		p.WorkerBatchSize = c.WorkerBatchSize
	}
	if c.HTTPConnections > 0 {
		p.HTTPConnections = c.HTTPConnections
	}
	if c.ConnectionTimeout > 0 {
		p.ConnectionTimeout = c.ConnectionTimeout
	}
	if c.RetriesPerRequest >= 0 {
		p.RetriesPerRequest = c.RetriesPerRequest
	}
	if c.CheckpointInterval > 0 {
		p.CheckpointInterval = c.CheckpointInterval
	}
	p.UseCheckpoints, p.UseBulkGet = c.UseCheckpoints, c.UseBulkGet
	p.IdleParkAfter, p.ParkRecheck = c.IdleParkAfter, c.ParkRecheck
	p.CredentialCommands = CredentialCommandsRefused
	if c.AllowCredentialCommands {
		p.CredentialCommands = CredentialCommandsAllowed
	}
	return p
}

// ReplicateRequest is a parsed POST /_replicate body.
type ReplicateRequest struct {
	// Params are the replication's parameters. Without HasEndpoints (a
	// cancel by ID) only the options are set and Source/Target are empty.
	Params Params
	// HasEndpoints reports that source and target were parsed: always,
	// except for a cancel that names the replication by ID.
	HasEndpoints bool
	// Cancel is the body's "cancel": stop the replication instead of
	// starting it.
	Cancel bool
	// ID is the replication ID given by "replication_id", "id" or
	// "_local_id" (in that order of preference), with spaces turned back
	// into "+" as CouchDB does (a "+" in a URL query arrives as a space);
	// empty when none was given.
	ID string
}

// ParseReplicateRequest parses and validates the body of POST /_replicate:
// a replication document plus "cancel" and an optional replication ID. As in
// CouchDB (couch_replicator_parse:parse_rep_doc), a cancel that names the
// replication by ID needs no source or target, but every option given is
// still checked. Errors are *ParamError values.
func ParseReplicateRequest(body []byte) (ReplicateRequest, error) {
	var r ReplicateRequest
	fields, err := objectFields(body, "Request body must be a JSON object")
	if err != nil {
		r.Params = DefaultParams()
		return r, err
	}
	if err := boolField(fields, "cancel", &r.Cancel); err != nil {
		return r, err
	}
	for _, name := range []string{"replication_id", "id", "_local_id"} {
		raw, ok := fields[name]
		if !ok || isNull(raw) {
			continue
		}
		var id string
		if err := json.Unmarshal(raw, &id); err != nil {
			return r, paramErr(name, "parameter `%s` must be a string", name)
		}
		if id = strings.ReplaceAll(strings.TrimSpace(id), " ", "+"); id == "" {
			return r, paramErr(name, "parameter `%s` must not be empty", name)
		}
		if r.ID == "" {
			r.ID = id
		}
	}
	r.HasEndpoints = !(r.Cancel && r.ID != "")
	r.Params, err = parseFields(fields, r.HasEndpoints)
	return r, err
}

// objectFields decodes a JSON object's members; notObject is the reason
// given for anything else.
func objectFields(doc []byte, notObject string) (map[string]json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(doc, &fields); err != nil || fields == nil {
		return nil, paramErr("", "%s", notObject)
	}
	return fields, nil
}

func boolField(fields map[string]json.RawMessage, name string, dst *bool) error {
	raw, ok := fields[name]
	if !ok {
		return nil
	}
	if err := json.Unmarshal(raw, dst); err != nil || isNull(raw) {
		return paramErr(name, "parameter `%s` must be a boolean", name)
	}
	return nil
}

// MaxDocumentBytes bounds a replication document (compact JSON): a job
// keeps it in one job store record, and the store refuses values above
// FoundationDB's 100,000 bytes on every backend (kv.MaxValueSize); the
// rest of the record (history, last error, stats) fits in what remains.
// About 2,500 doc_ids of 20 characters fit.
const MaxDocumentBytes = 64_000

// checkSize refuses a document above MaxDocumentBytes, naming its largest
// field (doc_ids, selector, query_params...), the one to shrink.
func checkSize(fields map[string]json.RawMessage) error {
	var buf bytes.Buffer
	// The compact object: braces, and per field its quoted name, a colon,
	// the value and a comma but for one.
	total, largest, largestSize := 1, "", 0
	for name, raw := range fields {
		buf.Reset()
		n := len(raw)
		if json.Compact(&buf, raw) == nil {
			n = buf.Len()
		}
		total += len(name) + 4 + n
		if n > largestSize || n == largestSize && name < largest {
			largest, largestSize = name, n
		}
	}
	if total <= MaxDocumentBytes {
		return nil
	}
	return paramErr(largest, "replication document is too large: %d bytes, at most %d; its largest field `%s` has %d",
		total, MaxDocumentBytes, largest, largestSize)
}

// parseFields checks every known field; the endpoints only with endpoints.
func parseFields(fields map[string]json.RawMessage, endpoints bool) (Params, error) {
	return parseFieldsWith(fields, endpoints, DefaultParams())
}

func parseFieldsWith(fields map[string]json.RawMessage, endpoints bool, defaults Params) (Params, error) {
	p := defaults
	if err := checkSize(fields); err != nil {
		return p, err
	}
	var err error
	srcProxy, tgtProxy, err := parseProxies(fields)
	if err != nil {
		return p, err
	}
	if endpoints {
		if p.Source, err = parseEndpoint(fields, "source"); err != nil {
			return p, err
		}
		if p.Target, err = parseEndpoint(fields, "target"); err != nil {
			return p, err
		}
		p.Source.Proxy, p.Target.Proxy = srcProxy, tgtProxy
		if err := p.CheckCredentials(p.CredentialCommands); err != nil {
			return p, err
		}
	}
	var cancel bool
	for _, b := range []struct {
		name string
		dst  *bool
	}{
		{"continuous", &p.Continuous}, {"create_target", &p.CreateTarget},
		{"use_checkpoints", &p.UseCheckpoints}, {"use_bulk_get", &p.UseBulkGet},
		{"winning_revs_only", &p.WinningRevsOnly}, {"cancel", &cancel},
		{"stop_on_write_failure", &p.StopOnWriteFailure},
	} {
		if err := boolField(fields, b.name, b.dst); err != nil {
			return p, err
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
			return p, paramErr(o.name, "parameter `%s` must be %s", o.name, what)
		}
		*o.dst = compactCopy(raw)
	}
	if raw, ok := fields["since_seq"]; ok && !isNull(raw) {
		p.SinceSeq = compactCopy(raw)
	}
	if raw, ok := fields["doc_ids"]; ok && !isNull(raw) {
		if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '[' {
			return p, paramErr("doc_ids", "parameter `doc_ids` must be an array")
		}
		var ids []string
		if err := json.Unmarshal(raw, &ids); err != nil {
			return p, paramErr("doc_ids", "parameter `doc_ids` must be an array of strings")
		}
		p.DocIDs = normalizeDocIDs(ids)
	}
	if raw, ok := fields["filter"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &p.Filter); err != nil {
			return p, paramErr("filter", "parameter `filter` must be a string")
		}
		if !strings.HasPrefix(p.Filter, "_") && !strings.Contains(p.Filter, "/") {
			return p, paramErr("filter", "Invalid filter. Must match `ddocname/filtername`.")
		}
	}
	n := 0
	for _, set := range []bool{p.DocIDs != nil, p.Filter != "", p.Selector != nil} {
		if set {
			n++
		}
	}
	if n > 1 {
		return p, paramErr("doc_ids", "`doc_ids`,`filter`,`selector` are mutually exclusive")
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
			if errors.Is(err, strconv.ErrRange) && !bytes.HasPrefix(bytes.TrimSpace(raw), []byte("-")) {
				return p, paramErr(o.name, "parameter `%s` is too large: at most %d", o.name, math.MaxInt)
			}
			if err != nil || v < 1 && o.name != "retries_per_request" || v < 0 {
				return p, paramErr(o.name, "parameter `%s` must be a positive integer", o.name)
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
			if (errors.Is(err, strconv.ErrRange) || err == nil && int64(v) > maxMillis) && !bytes.HasPrefix(bytes.TrimSpace(raw), []byte("-")) {
				return p, paramErr(o.name, "parameter `%s` is too large: at most %d (milliseconds)", o.name, maxMillis)
			}
			if err != nil || v < 1 {
				return p, paramErr(o.name, "parameter `%s` must be a positive integer (milliseconds)", o.name)
			}
			*o.dst = time.Duration(v) * time.Millisecond
		}
	}
	if raw, ok := fields["socket_options"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &p.SocketOptions); err != nil {
			return p, paramErr("socket_options", "parameter `socket_options` must be a string")
		}
	}
	if raw, ok := fields["user_ctx"]; ok && !isNull(raw) {
		uc, err := parseUserCtx(raw)
		if err != nil {
			return p, err
		}
		p.UserCtx = uc
	}
	if p.Filter == "_view" {
		if _, err := viewParam(p.QueryParams); err != nil {
			return p, err
		}
	}
	if err := checkIDTerms(p); err != nil {
		return p, err
	}
	return p, nil
}

// checkIDTerms checks that the JSON values that go into the replication id
// can be encoded as CouchDB encodes them (a number such as 1e400 cannot),
// so that a valid document always has a replication id.
func checkIDTerms(p Params) error {
	for _, f := range []struct {
		name string
		raw  json.RawMessage
	}{{"query_params", p.QueryParams}, {"since_seq", p.SinceSeq}, {"selector", p.Selector}} {
		if f.raw == nil {
			continue
		}
		v, err := ejson(f.raw)
		if err == nil && f.name == "selector" {
			_, err = normalizeSelector(v)
		}
		if err != nil {
			return paramErr(f.name, "parameter `%s` cannot be used: %s", f.name, strings.TrimPrefix(err.Error(), "replication: "))
		}
	}
	return nil
}

// UserCtx is a replication document's user_ctx: the user whose rights the
// replication runs with ({"name": ..., "roles": [...]}).
type UserCtx struct {
	Name  string   `json:"name"`
	Roles []string `json:"roles"`
}

func parseUserCtx(raw json.RawMessage) (*UserCtx, error) {
	var obj struct {
		Name  json.RawMessage `json:"name"`
		Roles json.RawMessage `json:"roles"`
	}
	bad := paramErr("user_ctx", "parameter `user_ctx` must be an object with a string `name` and an array of strings `roles`")
	if !isObject(raw) || json.Unmarshal(raw, &obj) != nil {
		return nil, bad
	}
	uc := &UserCtx{}
	if len(obj.Name) > 0 && !isNull(obj.Name) && json.Unmarshal(obj.Name, &uc.Name) != nil {
		return nil, bad
	}
	if len(obj.Roles) > 0 && !isNull(obj.Roles) && json.Unmarshal(obj.Roles, &uc.Roles) != nil {
		return nil, bad
	}
	return uc, nil
}

// proxySchemes are CouchDB's valid_proxy_protocols.
var proxySchemes = map[string]bool{"http": true, "https": true, "socks5": true}

// parseProxies applies couch_replicator_parse:parse_proxy_settings: "proxy"
// sets both sides and excludes the per-side keys; "" and null mean none.
func parseProxies(fields map[string]json.RawMessage) (src, tgt string, err error) {
	get := func(name string) (string, error) {
		raw, ok := fields[name]
		if !ok || isNull(raw) {
			return "", nil
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", paramErr(name, "`%s`: Invalid proxy url", name)
		}
		if s == "" {
			return "", nil
		}
		u, err := url.Parse(s)
		if err != nil || !proxySchemes[strings.ToLower(u.Scheme)] || u.Host == "" {
			return "", urlErr(name, "`%s`: proxy has an invalid url", name)
		}
		return s, nil
	}
	proxy, err := get("proxy")
	if err != nil {
		return "", "", err
	}
	if src, err = get("source_proxy"); err != nil {
		return "", "", err
	}
	if tgt, err = get("target_proxy"); err != nil {
		return "", "", err
	}
	if proxy != "" {
		if src != "" {
			return "", "", paramErr("proxy", "`proxy` is mutually exclusive with `source_proxy`")
		}
		if tgt != "" {
			return "", "", paramErr("proxy", "`proxy` is mutually exclusive with `target_proxy`")
		}
		return proxy, proxy, nil
	}
	return src, tgt, nil
}

// viewParam returns query_params.view for the _view filter.
func viewParam(qp json.RawMessage) (string, error) {
	var m map[string]any
	_ = json.Unmarshal(qp, &m)
	v, _ := m["view"].(string)
	if parts := strings.Split(v, "/"); len(parts) != 2 || parts[0] == "" || parts[1] == "" {
		return "", paramErr("query_params", "Invalid `view` parameter.")
	}
	return v, nil
}

func parseEndpoint(fields map[string]json.RawMessage, name string) (EndpointParams, error) {
	var ep EndpointParams
	raw, ok := fields[name]
	if !ok || isNull(raw) {
		return ep, paramErr(name, "Missing `%s` field", name)
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
		return ep, paramErr(name, "`%s` must be a URL string or an object with a `url`", name)
	}
	u := *obj.URL
	if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
		if !strings.Contains(u, "://") {
			return ep, paramErr(name, "`%s`: local endpoints are not supported (%q)", name, redact.URL(u))
		}
		return ep, urlErr(name, "`%s`: endpoint has an invalid url", name)
	}
	if pu, err := url.Parse(u); err != nil || pu.Host == "" {
		return ep, urlErr(name, "`%s`: endpoint has an invalid url", name)
	}
	if !strings.Contains(u, "?") && !strings.HasSuffix(u, "/") {
		u += "/"
	}
	ep.URL = u
	if len(obj.Headers) > 0 && !isNull(obj.Headers) {
		hs, err := orderedStringObject(obj.Headers)
		if err != nil {
			return ep, paramErr(name, "`%s.headers` must be an object of strings", name)
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
			Basic json.RawMessage `json:"basic"`
		}
		var all map[string]any
		if !isObject(obj.Auth) || json.Unmarshal(obj.Auth, &auth) != nil || json.Unmarshal(obj.Auth, &all) != nil {
			return ep, paramErr(name, "`%s.auth` must be an object", name)
		}
		tok, err := couch.ParseTokenAuth(all)
		var fe *couch.AuthFieldError
		if errors.As(err, &fe) {
			return ep, paramErr(name, "`%s.%s` %s", name, fe.Field, fe.Reason)
		}
		ep.Token = tok
		if len(auth.Basic) > 0 && !isNull(auth.Basic) {
			var basic struct {
				Username *string `json:"username"`
				Password *string `json:"password"`
			}
			if !isObject(auth.Basic) || json.Unmarshal(auth.Basic, &basic) != nil ||
				basic.Username == nil || basic.Password == nil {
				return ep, paramErr(name, "`%s.auth.basic` must be an object with string `username` and `password`", name)
			}
			ep.BasicUser, ep.BasicPass, ep.HasBasic = *basic.Username, *basic.Password, true
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

// maxMillis is the largest millisecond option a time.Duration holds.
const maxMillis = int64(math.MaxInt64 / int64(time.Millisecond))

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

// ShownEndpoint is how CouchDB's _scheduler/docs shows the source or
// target of a document it reads (couch_replicator:strip_url_creds): the
// endpoint's URL as parsing leaves it (a trailing slash added) without
// credentials; a local endpoint's name as given; null (nil) for a value
// that does not parse, so that nothing of a malformed URL shows.
func ShownEndpoint(raw json.RawMessage) json.RawMessage {
	ep, err := parseEndpoint(map[string]json.RawMessage{"source": raw}, "source")
	if err == nil {
		b, _ := json.Marshal(redact.StripUserinfo(ep.URL))
		return b
	}
	var s string
	if json.Unmarshal(raw, &s) == nil && s != "" && !strings.Contains(s, "://") && !strings.Contains(s, "@") {
		b, _ := json.Marshal(s) // local_endpoints_not_supported: CouchDB shows it as given
		return b
	}
	return nil
}
