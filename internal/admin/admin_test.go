package admin

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/messages/messagesconnect"
)

// failing is a Requester whose every request fails with err.
type failing struct{ err error }

func (f failing) Request(context.Context, proto.Message) (proto.Message, error) { return nil, f.err }

// TestErrorsAreRedacted: an actor's error that quotes credentials reaches
// the admin client (couchrepctl) with them masked, and still classifies by
// the wrapped sentinel.
func TestErrorsAreRedacted(t *testing.T) {
	sentinel := errors.New("no such job")
	err := errors.Join(sentinel, errors.New(`GET http://bob:s3cr3t@h:5984/db/: refused; Authorization: Basic s3cr3tQ==; Cookie: AuthSession=s3cr3t`))
	path, h := Handler(failing{err}, Options{Classify: func(e error) connect.Code {
		if errors.Is(e, sentinel) {
			return connect.CodeNotFound
		}
		return connect.CodeInternal
	}})
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := messagesconnect.NewAdminServiceClient(http.DefaultClient, srv.URL, connect.WithInterceptors(connect.UnaryInterceptorFunc(
		func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set(VersionHeader, Version)
				return next(ctx, req)
			}
		})))
	_, got := c.GetJob(context.Background(), connect.NewRequest(&messages.GetJobRequest{Id: "j"}))
	if connect.CodeOf(got) != connect.CodeNotFound {
		t.Fatalf("code %v, want not_found: %v", connect.CodeOf(got), got)
	}
	if strings.Contains(got.Error(), "s3cr3t") || !strings.Contains(got.Error(), "http://bob:*****@h:5984/db/") {
		t.Fatalf("admin error shows a credential: %v", got)
	}
}

// TestPprof: [admin] pprof serves Go's profiles on the admin endpoint, and
// only with the admin token when one is set.
func TestPprof(t *testing.T) {
	tests := []struct {
		name, token, sent string
		want              int
	}{
		{name: "no token", want: http.StatusOK},
		{name: "token sent", token: "s3cret", sent: "Bearer s3cret", want: http.StatusOK},
		{name: "token missing", token: "s3cret", want: http.StatusUnauthorized},
		{name: "token wrong", token: "s3cret", sent: "Bearer nope", want: http.StatusUnauthorized},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(Pprof(tc.token))
			defer srv.Close()
			req, _ := http.NewRequest(http.MethodGet, srv.URL+PprofPath+"heap?debug=1", nil)
			if tc.sent != "" {
				req.Header.Set("Authorization", tc.sent)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("GET heap: %d, want %d", resp.StatusCode, tc.want)
			}
			if tc.want == http.StatusOK && !strings.Contains(string(body), "heap profile") {
				t.Fatalf("GET heap: not a heap profile: %.200s", body)
			}
			if strings.Contains(string(body), "s3cret") {
				t.Fatal("the answer shows the token")
			}
		})
	}
}
