package main

// The commands that change the scheduler's policy at run time: shares
// get|set, config set.

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/couchrep/couchrep/messages"
)

func runSharesGet(ctx context.Context, e *env, _ []string) error {
	return request(ctx, e, e.client.GetShares, &messages.GetSharesRequest{}, func(w io.Writer, r *messages.GetSharesResponse) error {
		return printShares(w, r.GetShares(), r.GetDefaultShares())
	})
}

func printShares(w io.Writer, shares map[string]uint32, def uint32) error {
	keys := slices.Sorted(maps.Keys(shares))
	tw := newTable(w)
	fmt.Fprintln(tw, "KEY\tSHARES")
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%d\n", k, shares[k])
	}
	fmt.Fprintf(tw, "(any other)\t%d\n", def)
	return tw.Flush()
}

func runSharesSet(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		return usagef("shares set takes KEY=SHARES pairs")
	}
	req := &messages.SetSharesRequest{Shares: map[string]uint32{}}
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		n, err := strconv.ParseUint(v, 10, 32)
		if !ok || k == "" || err != nil || n > 1000 {
			return usagef("%q is not KEY=SHARES with SHARES 0..1000", a)
		}
		req.Shares[k] = uint32(n)
	}
	return request(ctx, e, e.client.SetShares, req, func(w io.Writer, r *messages.SetSharesResponse) error {
		return printShares(w, r.GetShares(), r.GetDefaultShares())
	})
}

func runConfigSet(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		return usagef("config set takes max_jobs=N and/or max_churn=N")
	}
	req := &messages.SetConfigRequest{}
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		u, err := strconv.ParseUint(v, 10, 32)
		n := uint32(u)
		if !ok || err != nil || n == 0 {
			return usagef("%q is not KEY=N with N a positive integer", a)
		}
		switch k {
		case "max_jobs":
			req.MaxJobs = &n
		case "max_churn":
			req.MaxChurn = &n
		default:
			return usagef("unknown key %q (max_jobs, max_churn)", k)
		}
	}
	return request(ctx, e, e.client.SetConfig, req, func(w io.Writer, r *messages.SetConfigResponse) error {
		_, err := fmt.Fprintf(w, "max_jobs = %d\nmax_churn = %d\n", r.GetMaxJobs(), r.GetMaxChurn())
		return err
	})
}
