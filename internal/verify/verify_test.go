package verify

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/replicate"
)

func TestParseRequest(t *testing.T) {
	for _, tc := range []struct {
		name, body   string
		extra, rep   bool
		wantErr      string
		wantDocIDs   int
		wantSelector bool
	}{
		{name: "plain", body: `{"source":"http://a/s","target":"http://a/t"}`},
		{name: "flags", body: `{"source":"http://a/s","target":"http://a/t","extra":true,"repair":true}`, extra: true, rep: true},
		{name: "doc_ids", body: `{"source":"http://a/s","target":"http://a/t","doc_ids":["x","y"]}`, wantDocIDs: 2},
		{name: "selector", body: `{"source":"http://a/s","target":"http://a/t","selector":{"a":1}}`, wantSelector: true},
		{name: "bad extra", body: `{"source":"http://a/s","target":"http://a/t","extra":"yes"}`, wantErr: "`extra` must be a boolean"},
		{name: "exclusive", body: `{"source":"http://a/s","target":"http://a/t","doc_ids":["x"],"selector":{"a":1}}`, wantErr: "mutually exclusive"},
		{name: "no target", body: `{"source":"http://a/s"}`, wantErr: "Missing `target`"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, o, err := ParseRequest([]byte(tc.body), replicate.DefaultParams())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, replicate.ErrInvalidParams) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				if status, _, _ := Error(err); status != 400 {
					t.Errorf("status %d", status)
				}
				return
			}
			if err != nil || o.Extra != tc.extra || o.Repair != tc.rep || len(p.DocIDs) != tc.wantDocIDs || (p.Selector != nil) != tc.wantSelector {
				t.Fatalf("%+v %+v %v", p, o, err)
			}
		})
	}
}

func TestErrorRedacted(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		name   string
	}{
		{fmt.Errorf("%w: could not open http://bob:hunter2@h/db/: gone", replicate.ErrDBNotFound), 404, "db_not_found"},
		{fmt.Errorf("%w: http://bob:hunter2@h/db/", replicate.ErrUnauthorized), 401, "unauthorized"},
		{fmt.Errorf("%w: _revs_diff on http://bob:hunter2@h/db/: reset", ErrFailed), 500, "verify_failed"},
	} {
		status, name, reason := Error(tc.err)
		if status != tc.status || name != tc.name || strings.Contains(reason, "hunter2") || strings.Contains(string(ErrorLine(tc.err)), "hunter2") {
			t.Errorf("Error(%v) = %d %s %q", tc.err, status, name, reason)
		}
	}
}

func TestSameAtt(t *testing.T) {
	a := couch.AttachmentStub{Name: "a", Digest: "md5-x", Length: 5}
	for _, tc := range []struct {
		name string
		b    couch.AttachmentStub
		want bool
	}{
		{"same", couch.AttachmentStub{Digest: "md5-x", Length: 5}, true},
		{"digest", couch.AttachmentStub{Digest: "md5-y", Length: 5}, false},
		{"length", couch.AttachmentStub{Digest: "md5-x", Length: 6}, false},
		{"no digest", couch.AttachmentStub{Length: 5}, true},
		{"no length", couch.AttachmentStub{Digest: "md5-x", Length: -1}, true},
	} {
		if got := sameAtt(a, tc.b); got != tc.want {
			t.Errorf("%s: %v", tc.name, got)
		}
	}
}

func TestRepairable(t *testing.T) {
	for k, want := range map[Kind]bool{Missing: true, LeafMissing: true, DeletedOnSource: true,
		DeletedOnTarget: false, AttachmentMissing: false, AttachmentDifferent: false, Extra: false, ChangedSinceStart: false, Unchecked: false} {
		if k.Repairable() != want {
			t.Errorf("%s", k)
		}
	}
}
