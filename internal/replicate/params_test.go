package replicate

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/config"
)

const (
	pSrc = `"source":"http://a.example/src"`
	pTgt = `"target":"http://b.example/tgt"`
)

// TestParseParamsRejects covers every validation error class: the field
// named, CouchDB's error name and its reason text.
func TestParseParamsRejects(t *testing.T) {
	for _, tc := range []struct {
		name, doc, field, code, reason string
	}{
		{"not an object", `[1]`, "", CodeBadRequest, "replication document must be a JSON object"},
		{"null document", `null`, "", CodeBadRequest, "replication document must be a JSON object"},
		{"malformed json", `{"source":`, "", CodeBadRequest, "replication document must be a JSON object"},
		{"missing source", `{` + pTgt + `}`, "source", CodeBadRequest, "Missing `source` field"},
		{"null source", `{"source":null,` + pTgt + `}`, "source", CodeBadRequest, "Missing `source` field"},
		{"missing target", `{` + pSrc + `}`, "target", CodeBadRequest, "Missing `target` field"},
		{"source a number", `{"source":42,` + pTgt + `}`, "source", CodeBadRequest, "`source` must be a URL string or an object with a `url`"},
		{"source object without url", `{"source":{"headers":{}},` + pTgt + `}`, "source", CodeBadRequest, "`source` must be a URL string or an object with a `url`"},
		{"local source", `{"source":"mydb",` + pTgt + `}`, "source", CodeBadRequest, "`source`: local endpoints are not supported (\"mydb\")"},
		{"bad scheme", `{` + pSrc + `,"target":"ftp://b.example/tgt"}`, "target", CodeInvalidReplication, "`target`: endpoint has an invalid url"},
		{"no host", `{"source":"http:///db",` + pTgt + `}`, "source", CodeInvalidReplication, "`source`: endpoint has an invalid url"},
		{"unparseable url", `{"source":"http://a b:x/db",` + pTgt + `}`, "source", CodeInvalidReplication, "`source`: endpoint has an invalid url"},
		{"headers not strings", `{"source":{"url":"http://a.example/s","headers":{"X":1}},` + pTgt + `}`, "source", CodeBadRequest, "`source.headers` must be an object of strings"},
		{"auth not an object", `{"source":{"url":"http://a.example/s","auth":"x"},` + pTgt + `}`, "source", CodeBadRequest, "`source.auth` must be an object"},
		{"auth.basic without password", `{"source":{"url":"http://a.example/s","auth":{"basic":{"username":"u"}}},` + pTgt + `}`, "source", CodeBadRequest, "`source.auth.basic` must be an object with string `username` and `password`"},
		{"auth.iam without api_key", `{"source":{"url":"http://a.example/s","auth":{"iam":{"apikey":"k"}}},` + pTgt + `}`, "source", CodeBadRequest, "`source.auth.iam.api_key` must be a non-empty string"},
		{"auth.iam and basic", `{` + pSrc + `,"target":{"url":"http://b.example/t","auth":{"iam":{"api_key":"k"},"basic":{"username":"u","password":"p"}}}}`, "target", CodeBadRequest, "`target.auth` must hold one of \"basic\", \"iam\" and \"bearer\", not several"},
		{"auth.bearer.command a string", `{"source":{"url":"http://a.example/s","auth":{"bearer":{"command":"vault read"}}},` + pTgt + `}`, "source", CodeBadRequest, "`source.auth.bearer.command` must be a non-empty array of strings (the program and its arguments)"},
		{"auth.bearer.token_file relative", `{"source":{"url":"http://a.example/s","auth":{"bearer":{"token_file":"tok"}}},` + pTgt + `}`, "source", CodeBadRequest, "`source.auth.bearer.token_file` must be an absolute file path"},
		{"continuous not boolean", `{` + pSrc + `,` + pTgt + `,"continuous":"true"}`, "continuous", CodeBadRequest, "parameter `continuous` must be a boolean"},
		{"create_target null", `{` + pSrc + `,` + pTgt + `,"create_target":null}`, "create_target", CodeBadRequest, "parameter `create_target` must be a boolean"},
		{"use_checkpoints not boolean", `{` + pSrc + `,` + pTgt + `,"use_checkpoints":1}`, "use_checkpoints", CodeBadRequest, "parameter `use_checkpoints` must be a boolean"},
		{"use_bulk_get not boolean", `{` + pSrc + `,` + pTgt + `,"use_bulk_get":"no"}`, "use_bulk_get", CodeBadRequest, "parameter `use_bulk_get` must be a boolean"},
		{"winning_revs_only not boolean", `{` + pSrc + `,` + pTgt + `,"winning_revs_only":[]}`, "winning_revs_only", CodeBadRequest, "parameter `winning_revs_only` must be a boolean"},
		{"cancel not boolean", `{` + pSrc + `,` + pTgt + `,"cancel":"yes"}`, "cancel", CodeBadRequest, "parameter `cancel` must be a boolean"},
		{"create_target_params not object", `{` + pSrc + `,` + pTgt + `,"create_target_params":[1]}`, "create_target_params", CodeBadRequest, "parameter `create_target_params` must be a JSON object"},
		{"query_params not object", `{` + pSrc + `,` + pTgt + `,"query_params":"a=b"}`, "query_params", CodeBadRequest, "parameter `query_params` must be an object"},
		{"selector not object", `{` + pSrc + `,` + pTgt + `,"selector":true}`, "selector", CodeBadRequest, "parameter `selector` must be a JSON object"},
		{"doc_ids not a list", `{` + pSrc + `,` + pTgt + `,"doc_ids":"a"}`, "doc_ids", CodeBadRequest, "parameter `doc_ids` must be an array"},
		{"doc_ids an object", `{` + pSrc + `,` + pTgt + `,"doc_ids":{"a":1}}`, "doc_ids", CodeBadRequest, "parameter `doc_ids` must be an array"},
		{"doc_ids not strings", `{` + pSrc + `,` + pTgt + `,"doc_ids":["a",1]}`, "doc_ids", CodeBadRequest, "parameter `doc_ids` must be an array of strings"},
		{"filter not a string", `{` + pSrc + `,` + pTgt + `,"filter":{}}`, "filter", CodeBadRequest, "parameter `filter` must be a string"},
		{"filter not ddoc/name", `{` + pSrc + `,` + pTgt + `,"filter":"myfilter"}`, "filter", CodeBadRequest, "Invalid filter. Must match `ddocname/filtername`."},
		{"filter and doc_ids", `{` + pSrc + `,` + pTgt + `,"filter":"d/f","doc_ids":["a"]}`, "doc_ids", CodeBadRequest, "`doc_ids`,`filter`,`selector` are mutually exclusive"},
		{"selector and doc_ids", `{` + pSrc + `,` + pTgt + `,"selector":{},"doc_ids":["a"]}`, "doc_ids", CodeBadRequest, "`doc_ids`,`filter`,`selector` are mutually exclusive"},
		{"_view without view", `{` + pSrc + `,` + pTgt + `,"filter":"_view","query_params":{}}`, "query_params", CodeBadRequest, "Invalid `view` parameter."},
		{"_view with bad view", `{` + pSrc + `,` + pTgt + `,"filter":"_view","query_params":{"view":"ddoc/"}}`, "query_params", CodeBadRequest, "Invalid `view` parameter."},
		{"worker_processes zero", `{` + pSrc + `,` + pTgt + `,"worker_processes":0}`, "worker_processes", CodeBadRequest, "parameter `worker_processes` must be a positive integer"},
		{"worker_batch_size garbage", `{` + pSrc + `,` + pTgt + `,"worker_batch_size":"lots"}`, "worker_batch_size", CodeBadRequest, "parameter `worker_batch_size` must be a positive integer"},
		{"http_connections float", `{` + pSrc + `,` + pTgt + `,"http_connections":2.5}`, "http_connections", CodeBadRequest, "parameter `http_connections` must be a positive integer"},
		{"retries_per_request negative", `{` + pSrc + `,` + pTgt + `,"retries_per_request":-1}`, "retries_per_request", CodeBadRequest, "parameter `retries_per_request` must be a positive integer"},
		{"checkpoint_interval bool", `{` + pSrc + `,` + pTgt + `,"checkpoint_interval":true}`, "checkpoint_interval", CodeBadRequest, "parameter `checkpoint_interval` must be a positive integer (milliseconds)"},
		{"connection_timeout zero", `{` + pSrc + `,` + pTgt + `,"connection_timeout":"0"}`, "connection_timeout", CodeBadRequest, "parameter `connection_timeout` must be a positive integer (milliseconds)"},
		{"proxy with source_proxy", `{` + pSrc + `,` + pTgt + `,"proxy":"http://p:3128","source_proxy":"http://q:3128"}`, "proxy", CodeBadRequest, "`proxy` is mutually exclusive with `source_proxy`"},
		{"proxy with target_proxy", `{` + pSrc + `,` + pTgt + `,"proxy":"http://p:3128","target_proxy":"http://q:3128"}`, "proxy", CodeBadRequest, "`proxy` is mutually exclusive with `target_proxy`"},
		{"proxy bad scheme", `{` + pSrc + `,` + pTgt + `,"proxy":"ftp://p:21"}`, "proxy", CodeInvalidReplication, "`proxy`: proxy has an invalid url"},
		{"source_proxy no host", `{` + pSrc + `,` + pTgt + `,"source_proxy":"socks5://"}`, "source_proxy", CodeInvalidReplication, "`source_proxy`: proxy has an invalid url"},
		{"target_proxy not a string", `{` + pSrc + `,` + pTgt + `,"target_proxy":5}`, "target_proxy", CodeBadRequest, "`target_proxy`: Invalid proxy url"},
		{"user_ctx not an object", `{` + pSrc + `,` + pTgt + `,"user_ctx":"bob"}`, "user_ctx", CodeBadRequest, "parameter `user_ctx` must be an object with a string `name` and an array of strings `roles`"},
		{"user_ctx roles not strings", `{` + pSrc + `,` + pTgt + `,"user_ctx":{"name":"bob","roles":[1]}}`, "user_ctx", CodeBadRequest, "parameter `user_ctx` must be an object with a string `name` and an array of strings `roles`"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseParams([]byte(tc.doc))
			assertParamError(t, err, tc.field, tc.code, tc.reason)
		})
	}
}

func assertParamError(t *testing.T, err error, field, code, reason string) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted; want %s error %q", code, reason)
	}
	if !errors.Is(err, ErrInvalidParams) {
		t.Errorf("error %v does not wrap ErrInvalidParams", err)
	}
	var pe *ParamError
	if !errors.As(err, &pe) {
		t.Fatalf("error %T %v is not a *ParamError", err, err)
	}
	if pe.Field != field || pe.Code != code || pe.Reason != reason {
		t.Errorf("got field=%q code=%q reason=%q\nwant field=%q code=%q reason=%q", pe.Field, pe.Code, pe.Reason, field, code, reason)
	}
	if !strings.HasSuffix(err.Error(), ": "+reason) {
		t.Errorf("Error() = %q, want it to end with the reason", err.Error())
	}
}

func TestParseParamsAccepts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		doc   string
		check func(t *testing.T, p Params)
	}{
		{"defaults", `{` + pSrc + `,` + pTgt + `}`, func(t *testing.T, p Params) {
			want := DefaultParams()
			want.Source.URL, want.Target.URL = "http://a.example/src/", "http://b.example/tgt/"
			if !reflect.DeepEqual(p, want) {
				t.Errorf("got %+v\nwant %+v", p, want)
			}
		}},
		{"proxy sets both sides", `{` + pSrc + `,` + pTgt + `,"proxy":"http://p.example:3128"}`, func(t *testing.T, p Params) {
			if p.Source.Proxy != "http://p.example:3128" || p.Target.Proxy != "http://p.example:3128" {
				t.Errorf("proxies = %q, %q", p.Source.Proxy, p.Target.Proxy)
			}
		}},
		{"empty proxy with side proxies", `{` + pSrc + `,` + pTgt + `,"proxy":"","source_proxy":"socks5://s.example:1080","target_proxy":null}`, func(t *testing.T, p Params) {
			if p.Source.Proxy != "socks5://s.example:1080" || p.Target.Proxy != "" {
				t.Errorf("proxies = %q, %q", p.Source.Proxy, p.Target.Proxy)
			}
		}},
		{"doc_ids null ignored, numeric strings accepted", `{` + pSrc + `,` + pTgt + `,"doc_ids":null,"worker_processes":"2","checkpoint_interval":"5000","cancel":false}`, func(t *testing.T, p Params) {
			if p.DocIDs != nil || p.WorkerProcesses != 2 || p.CheckpointInterval != 5*time.Second {
				t.Errorf("got doc_ids=%v worker_processes=%d checkpoint_interval=%v", p.DocIDs, p.WorkerProcesses, p.CheckpointInterval)
			}
		}},
		{"doc_ids unquoted and sorted", `{` + pSrc + `,` + pTgt + `,"doc_ids":["b","a%2Fb","a+c","b"]}`, func(t *testing.T, p Params) {
			if want := []string{"a c", "a/b", "b"}; !reflect.DeepEqual(p.DocIDs, want) {
				t.Errorf("doc_ids = %q, want %q", p.DocIDs, want)
			}
		}},
		{"auth and user_ctx", `{"source":{"url":"http://a.example/s","auth":{"basic":{"username":"u","password":"p"}}},` + pTgt + `,"user_ctx":{"name":"bob","roles":["_admin"]}}`, func(t *testing.T, p Params) {
			if !p.Source.HasBasic || p.Source.BasicUser != "u" || p.Source.BasicPass != "p" {
				t.Errorf("basic auth = %+v", p.Source)
			}
			if p.UserCtx == nil || p.UserCtx.Name != "bob" || !reflect.DeepEqual(p.UserCtx.Roles, []string{"_admin"}) {
				t.Errorf("user_ctx = %+v", p.UserCtx)
			}
		}},
		{"unknown fields ignored", `{` + pSrc + `,` + pTgt + `,"socket_options":"[{keepalive, true}]","owner":"bob"}`, func(t *testing.T, p Params) {
			if p.Source.URL != "http://a.example/src/" {
				t.Errorf("source = %q", p.Source.URL)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParseParams([]byte(tc.doc))
			if err != nil {
				t.Fatalf("ParseParams: %v", err)
			}
			tc.check(t, p)
		})
	}
}

func TestParseReplicateRequest(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		body                 string
		wantCancel, wantEnds bool
		wantID               string
		field, code, reason  string // expected error, if any
	}{
		{name: "start", body: `{` + pSrc + `,` + pTgt + `}`, wantEnds: true},
		{name: "cancel by body", body: `{` + pSrc + `,` + pTgt + `,"cancel":true}`, wantCancel: true, wantEnds: true},
		{name: "cancel by replication_id", body: `{"replication_id":"abc+continuous","cancel":true}`, wantCancel: true, wantID: "abc+continuous"},
		{name: "cancel by id with a space", body: `{"id":"abc continuous","cancel":true}`, wantCancel: true, wantID: "abc+continuous"},
		{name: "cancel by _local_id", body: `{"_local_id":"abc","cancel":true}`, wantCancel: true, wantID: "abc"},
		{name: "replication_id preferred", body: `{"id":"x","replication_id":"y","cancel":true}`, wantCancel: true, wantID: "y"},
		{name: "id without cancel still needs endpoints", body: `{"id":"abc"}`, field: "source", code: CodeBadRequest, reason: "Missing `source` field"},
		{name: "cancel by id checks options", body: `{"id":"abc","cancel":true,"continuous":"x"}`, field: "continuous", code: CodeBadRequest, reason: "parameter `continuous` must be a boolean"},
		{name: "cancel not boolean", body: `{"id":"abc","cancel":1}`, field: "cancel", code: CodeBadRequest, reason: "parameter `cancel` must be a boolean"},
		{name: "id not a string", body: `{"replication_id":7,"cancel":true}`, field: "replication_id", code: CodeBadRequest, reason: "parameter `replication_id` must be a string"},
		{name: "empty id", body: `{"id":" ","cancel":true}`, field: "id", code: CodeBadRequest, reason: "parameter `id` must not be empty"},
		{name: "cancel without id or endpoints", body: `{"cancel":true}`, field: "source", code: CodeBadRequest, reason: "Missing `source` field"},
		{name: "not an object", body: `"hello"`, code: CodeBadRequest, reason: "Request body must be a JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseReplicateRequest([]byte(tc.body))
			if tc.reason != "" {
				assertParamError(t, err, tc.field, tc.code, tc.reason)
				return
			}
			if err != nil {
				t.Fatalf("ParseReplicateRequest: %v", err)
			}
			if r.Cancel != tc.wantCancel || r.HasEndpoints != tc.wantEnds || r.ID != tc.wantID {
				t.Errorf("got cancel=%v endpoints=%v id=%q, want %v %v %q", r.Cancel, r.HasEndpoints, r.ID, tc.wantCancel, tc.wantEnds, tc.wantID)
			}
			if tc.wantEnds && r.Params.Source.URL != "http://a.example/src/" {
				t.Errorf("source = %q", r.Params.Source.URL)
			}
		})
	}
}

// TestParseParamsSize: a document above MaxDocumentBytes (it would not fit
// in a job store record) is refused naming its largest field, by both
// parsers; one at the limit is accepted.
func TestParseParamsSize(t *testing.T) {
	ids := func(n int) string {
		s := make([]string, n)
		for i := range s {
			s[i] = fmt.Sprintf(`"document-%012d"`, i) // 24 bytes with quotes and comma
		}
		return "[" + strings.Join(s, ",") + "]"
	}
	selector := `{"type":{"$in":` + ids(5000) + `}}`
	for _, tc := range []struct {
		name, doc, field string
	}{
		{"10,000 doc_ids", `{` + pSrc + `,` + pTgt + `,"doc_ids":` + ids(10000) + `}`, "doc_ids"},
		{"big selector", `{` + pSrc + `,` + pTgt + `,"selector":` + selector + `}`, "selector"},
		{"big query_params", `{` + pSrc + `,` + pTgt + `,"filter":"d/f","query_params":{"ids":"` + strings.Repeat("x", 70_000) + `"}}`, "query_params"},
		{"spread over fields", `{` + pSrc + `,` + pTgt + `,"query_params":{"a":"` + strings.Repeat("a", 33_000) + `"},"create_target_params":{"b":"` + strings.Repeat("b", 32_000) + `"}}`, "query_params"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseParams([]byte(tc.doc))
			var pe *ParamError
			if !errors.As(err, &pe) || pe.Field != tc.field || pe.Code != CodeBadRequest ||
				!strings.HasPrefix(pe.Reason, "replication document is too large: ") || !strings.Contains(pe.Reason, "`"+tc.field+"`") {
				t.Fatalf("err = %v (%+v), want a bad_request naming `%s`", err, pe, tc.field)
			}
			_, err = ParseReplicateRequest([]byte(tc.doc))
			if !errors.As(err, &pe) || pe.Field != tc.field {
				t.Fatalf("ParseReplicateRequest err = %v, want one naming `%s`", err, tc.field)
			}
		})
	}
	// The largest document accepted: exactly MaxDocumentBytes, whitespace
	// not counted.
	doc := `{` + pSrc + `,` + pTgt + `,"doc_ids":["` + strings.Repeat("i", 1) + `"]}`
	doc = strings.Replace(doc, `"i"`, `"`+strings.Repeat("i", MaxDocumentBytes-len(doc)+1)+`"`, 1)
	if len(doc) != MaxDocumentBytes {
		t.Fatalf("test document is %d bytes", len(doc))
	}
	if _, err := ParseParams([]byte(strings.ReplaceAll(doc, ",", " ,  "))); err != nil {
		t.Fatalf("a document of exactly %d bytes: %v", MaxDocumentBytes, err)
	}
	if _, err := ParseParams([]byte(strings.Replace(doc, `"i`, `"ii`, 1))); err == nil {
		t.Fatalf("a document of %d bytes was accepted", MaxDocumentBytes+1)
	}
}

// A node's [replicator] section fills the options a document does not
// give; the document's own win (couch_replicator_parse's defaults).
// TestParseParamsCredentialCommands: a node whose operator did not set
// allow_credential_commands refuses a document whose auth.bearer reads a
// file or runs a program, naming the field; one that did takes it, and so
// does the parser without a node's defaults (the client refuses it then).
func TestParseParamsCredentialCommands(t *testing.T) {
	cmd := `{"source":{"url":"http://a.example/s","auth":{"iam":{"api_key":"k"}}},"target":{"url":"http://b.example/t","auth":{"bearer":{"command":["mint-jwt","--ttl","60"]}}}}`
	file := `{"source":{"url":"http://a.example/s","auth":{"bearer":{"token_file":"/run/secrets/tok"}}},` + pTgt + `}`
	c := config.Default().Replicator
	refused := JobDefaults(c)
	c.AllowCredentialCommands = true
	allowed := JobDefaults(c)
	for _, tc := range []struct {
		doc      string
		defaults Params
		field    string
		reason   string
	}{
		{cmd, refused, "target", "`target.auth.bearer.command` is not allowed on this node: a replication document may read a file or run a program of the node only where an administrator set [replicator] allow_credential_commands = true"},
		{file, refused, "source", "`source.auth.bearer.token_file` is not allowed on this node"},
		{cmd, allowed, "", ""},
		{file, allowed, "", ""},
		{cmd, DefaultParams(), "", ""},
	} {
		p, err := ParseParamsWith([]byte(tc.doc), tc.defaults)
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.doc, err)
			}
			continue
		}
		var pe *ParamError
		if !errors.As(err, &pe) || pe.Field != tc.field || !strings.HasPrefix(pe.Reason, tc.reason) {
			t.Errorf("%s: %v, want %s: %s", tc.doc, err, tc.field, tc.reason)
		}
		_ = p
	}
	p, err := ParseParamsWith([]byte(cmd), allowed)
	if err != nil {
		t.Fatal(err)
	}
	if p.Source.Token == nil || p.Source.Token.IAMKey != "k" || p.Target.Token == nil || len(p.Target.Token.Command) != 3 {
		t.Fatalf("tokens: %v %v", p.Source.Token, p.Target.Token)
	}
	// Object gives the auth back, as the endpoint's client reads it.
	if got := fmt.Sprint(p.Target.Object()["auth"]); got != "map[bearer:map[command:[mint-jwt --ttl 60]]]" {
		t.Fatalf("target object auth: %s", got)
	}
}

func TestParseParamsWithJobDefaults(t *testing.T) {
	node := config.Default().Replicator
	node.WorkerProcesses, node.WorkerBatchSize, node.HTTPConnections = 2, 100, 8
	node.ConnectionTimeout, node.RetriesPerRequest, node.CheckpointInterval = 5*time.Second, 1, time.Minute
	node.UseCheckpoints, node.UseBulkGet = false, false
	doc := `{"source":"http://h/a","target":"http://h/b"`
	for _, tc := range []struct {
		name     string
		defaults Params
		doc      string
		want     func(p Params) bool
	}{
		{"CouchDB's defaults", JobDefaults(config.Replicator{}), doc + `}`, func(p Params) bool {
			return p.WorkerProcesses == DefaultWorkerProcesses && p.UseBulkGet && p.UseCheckpoints && p.RetriesPerRequest == DefaultRetriesPerRequest
		}},
		{"the node's", JobDefaults(node), doc + `}`, func(p Params) bool {
			return p.WorkerProcesses == 2 && p.WorkerBatchSize == 100 && p.HTTPConnections == 8 && p.ConnectionTimeout == 5*time.Second &&
				p.RetriesPerRequest == 1 && p.CheckpointInterval == time.Minute && !p.UseBulkGet && !p.UseCheckpoints
		}},
		{"the document's over the node's", JobDefaults(node), doc + `,"use_bulk_get":true,"worker_processes":3}`, func(p Params) bool {
			return p.UseBulkGet && p.WorkerProcesses == 3 && p.WorkerBatchSize == 100 && !p.UseCheckpoints
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParseParamsWith([]byte(tc.doc), tc.defaults)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.want(p) {
				t.Errorf("params %+v", p)
			}
		})
	}
}
