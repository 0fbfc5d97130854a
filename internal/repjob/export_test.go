package repjob

import (
	"context"

	"google.golang.org/protobuf/proto"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/share"
	"github.com/couchrep/couchrep/messages"
)

// ShareLag is how far key's account with its charges summed (unfloored)
// is ahead of the frontier (negative: behind it), in virtual µs, and the
// cost of one reserved quantum of key: what BenchmarkCrashStorm samples to
// see whether a key banks lag as credit.
func (s *Store) ShareLag(ctx context.Context, key string) (ahead int64, quantum int64, err error) {
	err = s.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		f, err := s.frontierTx(tx)
		if err != nil {
			return err
		}
		b, err := tx.Get(s.k.shareKey(key))
		if err != nil {
			return err
		}
		var a share.Account
		if b != nil {
			m := &messages.ShareAccount{}
			if err := proto.Unmarshal(b, m); err != nil {
				return err
			}
			_, a = share.AccountFromProto(m)
		}
		d, err := tx.Get(s.k.chargesKey(key))
		if err != nil {
			return err
		}
		sum := int64(a.Finish) + kv.Int64LE(d)
		ahead = sum - int64(f)
		quantum = s.shareParams().ReserveCost(s.sharesOf(key))
		return nil
	})
	return ahead, quantum, err
}
