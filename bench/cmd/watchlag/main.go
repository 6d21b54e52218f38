// Command watchlag runs a change stream consumer, `stockctl -json watch
// ledger ...` given as its arguments, and writes, for each entry the
// consumer prints, when it was printed and its lag then: that time less the
// entry's createdAt (the appending transaction's start, Postgres's now()),
// one line each, "UNIX_SECONDS LAG_SECONDS". make bench-changestream keeps
// the lines of its load's window and takes their percentiles.
//
//	watchlag bin/stockctl -json watch ledger -consumer bench-1 >lag-1
//
// SIGTERM or SIGINT ends the consumer; watchlag then writes what it has and
// exits.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

// lineMax bounds one line of the consumer's output: an entry and a cursor,
// well under 4 KiB.
const lineMax = 64 << 10

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "watchlag:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: watchlag COMMAND [ARGS...] (a stockctl -json watch ledger)")
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	w := bufio.NewWriter(stdout)
	err = lags(out, w, time.Now)
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	cmd.Wait() // killed (ctx ended) or the stream ended: either way, what it printed is written
	return err
}

// lags reads the consumer's lines from r and writes each entry's line to w,
// timed by now.
func lags(r io.Reader, w io.Writer, now func() time.Time) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), lineMax)
	for sc.Scan() {
		var m struct {
			Entry *struct {
				CreatedAt time.Time `json:"createdAt"`
			} `json:"entry"`
		}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			return fmt.Errorf("the consumer printed %q: %w", sc.Text(), err)
		}
		if m.Entry == nil {
			continue // a progress message: a cursor alone
		}
		t := now()
		if _, err := fmt.Fprintf(w, "%.6f %.6f\n", float64(t.UnixMicro())/1e6, t.Sub(m.Entry.CreatedAt).Seconds()); err != nil {
			return err
		}
	}
	return sc.Err()
}
