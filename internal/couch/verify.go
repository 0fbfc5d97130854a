package couch

import (
	"context"
	"encoding/json"
	"net/http"
)

// DocOf reads the metadata of a document body as BulkGet delivers it (id,
// rev, deletion, whether it has attachments; Stubs lists them). body is
// kept, not copied.
func DocOf(body json.RawMessage) (Doc, error) { return newDoc(body) }

// BulkGetStubs fetches exactly the revisions reqs name (no latest=true,
// no history) with attachment stubs only (digest and length, no data):
// what a verify compares. Revisions the server lacks are not delivered;
// fn may keep nothing of a Doc after it returns.
func (d *DB) BulkGetStubs(ctx context.Context, reqs []BulkGetRequest, fn func(Doc) error) error {
	return d.bulkGet(ctx, reqs, "attachments=false", fn)
}

// DocState is a document's winning revision on a server, as POST
// _all_docs with keys answers: absent (Missing), or its winning rev and
// whether that is a deletion.
type DocState struct {
	ID      string
	Rev     string
	Deleted bool
	Missing bool
}

// DocStates asks the server for the winning revision of each of ids
// (POST _all_docs {"keys": ids}; deleted documents come back with their
// tombstone's rev). The answer holds one small row per id and is read
// whole, under the DB's MaxBodyBytes.
func (d *DB) DocStates(ctx context.Context, ids []string) ([]DocState, error) {
	body, n, err := jsonBody(struct {
		Keys []string `json:"keys"`
	}{ids})
	if err != nil {
		return nil, err
	}
	r := &request{method: http.MethodPost, path: "_all_docs", body: body, bodyLen: n, contentType: "application/json", compress: true}
	res, err := getJSON[struct {
		Rows []struct {
			Key   string `json:"key"`
			Error string `json:"error"`
			Value *struct {
				Rev     string `json:"rev"`
				Deleted bool   `json:"deleted"`
			} `json:"value"`
		} `json:"rows"`
	}](ctx, d, r, d.lim.MaxBodyBytes, "response body")
	if err != nil {
		return nil, err
	}
	out := make([]DocState, 0, len(res.Rows))
	for _, row := range res.Rows {
		s := DocState{ID: row.Key}
		if row.Value == nil || row.Error != "" {
			s.Missing = true
		} else {
			s.Rev, s.Deleted = row.Value.Rev, row.Value.Deleted
		}
		out = append(out, s)
	}
	return out, nil
}
