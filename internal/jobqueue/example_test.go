package jobqueue_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
)

// A user adds a job; a worker accepts it, records progress together with
// its own writes in one transaction, and finishes it.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "jobs-example-")
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(ctx, filepath.Join(dir, "jobs.db"), sqlite.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	q := jobqueue.New(db, jobqueue.Options{NodeName: "node1"})

	_ = q.SetTypeTimeout(ctx, "replication", time.Minute)
	_ = q.Add(ctx, "replication", "db1+db2", jobqueue.AddOptions{Data: []byte(`{"source":"db1"}`)})

	job, err := q.Accept(ctx, "replication", jobqueue.AcceptOptions{Wait: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	// The checkpoint and the lock check commit together, or not at all.
	err = db.Transact(ctx, func(tx kv.Tx) error {
		if err := job.UpdateTx(tx, []byte(`{"source":"db1","seq":42}`)); err != nil {
			return err // ErrWorkerConflict or ErrCanceled: stop working on it
		}
		tx.Set([]byte("my-checkpoint"), []byte("42"))
		return nil
	})
	if errors.Is(err, jobqueue.ErrWorkerConflict) {
		fmt.Println("lost the job")
		return
	}
	_ = job.Finish(ctx, []byte(`{"result":"completed"}`))

	info, _ := q.Get(ctx, "replication", "db1+db2")
	fmt.Println(info.State, string(info.Data))

	_, err = q.Accept(ctx, "replication", jobqueue.AcceptOptions{})
	fmt.Println(errors.Is(err, jobqueue.ErrNotFound))
	// Output:
	// finished {"result":"completed"}
	// true
}
