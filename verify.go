package couchrep

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	"github.com/couchrep/couchrep/internal/admin"
	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/verify"
	"github.com/couchrep/couchrep/messages"
)

// verifyRPC answers the admin Verify RPC (`couchrepctl verify`, `couchrepctl
// job verify`): internal/verify run by this node with its [replicator]
// settings, on a replication document or on a job's (its endpoints and
// credentials, its filter). Each difference is sent as it is found, the
// summary last.
func (n *Node) verifyRPC(ctx context.Context, req *messages.VerifyRequest, send func(*messages.VerifyResponse) error) error {
	body := []byte(req.GetDocument())
	switch {
	case req.GetJob() != "" && req.GetDocument() != "":
		return connect.NewError(connect.CodeInvalidArgument, errors.New("verify: give a document or a job, not both"))
	case req.GetJob() != "":
		rec, err := admin.FindJob(ctx, n.deps.RepJobs, req.GetJob())
		if err != nil {
			code := connect.CodeInternal
			switch {
			case errors.Is(err, admin.ErrNoSuchJob):
				code = connect.CodeNotFound
			case errors.Is(err, admin.ErrAmbiguousJob):
				code = connect.CodeInvalidArgument
			}
			return connect.NewError(code, redact.Error(err))
		}
		body = rec.GetBody()
	case len(body) == 0:
		return connect.NewError(connect.CodeInvalidArgument, errors.New("verify: no replication document and no job"))
	}
	p, o, err := verify.ParseRequest(body, replicate.JobDefaults(n.cfg.Replicator))
	if err != nil {
		return verifyError(err)
	}
	o.Extra = o.Extra || req.GetExtra()
	o.Repair = o.Repair || req.GetRepair()
	o.Replicate = replicate.Options{Logger: n.log, Endpoints: replicate.EndpointConfigFrom(n.cfg.Replicator)}
	var sendErr error
	o.OnDifference = func(d verify.Difference) {
		if sendErr == nil {
			sendErr = send(&messages.VerifyResponse{Line: string(d.MarshalLine())})
		}
	}
	sum, err := verify.Run(ctx, p, o)
	if sendErr != nil {
		return sendErr
	}
	if err != nil {
		return verifyError(err)
	}
	return send(&messages.VerifyResponse{Line: string(verify.SummaryLine(sum)), Summary: true})
}

// verifyError is a verify's error as a Connect error: its CouchDB error
// name and reason (redacted), the code after its HTTP status.
func verifyError(err error) error {
	status, name, reason := verify.Error(err)
	code := connect.CodeInternal
	switch status {
	case 400:
		code = connect.CodeInvalidArgument
	case 401:
		code = connect.CodePermissionDenied
	case 404:
		code = connect.CodeNotFound
	}
	return connect.NewError(code, fmt.Errorf("%s: %s", name, reason))
}
