package stockctlcmd

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	v1 "github.com/shardstock/shardstock/gen/shardstock/v1"
)

// stringList is a flag that may be given many times.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }

// cmdWatch follows the change stream until ctx ends: `watch ledger` or
// `watch stock`. Each message is a line (protojson with -json); the
// stream's own end is an error, after which `watch ledger` names the
// last cursor received on stderr, to resume from.
func cmdWatch(ctx context.Context, c *cli, args []string) error {
	if len(args) == 0 {
		return usagef("watch: want ledger or stock")
	}
	switch args[0] {
	case "ledger":
		return watchLedger(ctx, c, args[1:])
	case "stock":
		return watchStock(ctx, c, args[1:])
	}
	return usagef("watch %q: want ledger or stock", args[0])
}

func watchLedger(ctx context.Context, c *cli, args []string) error {
	fs := flag.NewFlagSet("watch ledger", flag.ContinueOnError)
	cursor := fs.String("cursor", "", "")
	consumer := fs.String("consumer", "", "")
	var skus stringList
	fs.Var(&skus, "sku", "")
	if _, err := parse(fs, args, 0, "no arguments but flags"); err != nil {
		return err
	}
	s, err := c.admin.WatchLedger(ctx, req(c, &v1.WatchLedgerRequest{Cursor: *cursor, Skus: skus, Consumer: *consumer}))
	if err != nil {
		return err
	}
	defer s.Close()
	last := *cursor
	if !c.json {
		fmt.Fprintln(c.out, "DATABASE\t"+ledgerHeader+"\tCURSOR")
	}
	for s.Receive() {
		m := s.Msg()
		last = m.GetCursor()
		if err := c.line(m, func() string {
			if m.GetEntry() == nil {
				return "-\t\t\t\t\t\t\t\t\t\t\t" + m.GetCursor()
			}
			return m.GetDatabase() + "\t" + ledgerRow(m.GetEntry()) + "\t" + m.GetCursor()
		}); err != nil {
			return err
		}
	}
	return streamEnd(ctx, c, s.Err(), last)
}

func watchStock(ctx context.Context, c *cli, args []string) error {
	skus, err := parse(flag.NewFlagSet("watch stock", flag.ContinueOnError), args, -1, "SKU [SKU...]")
	if err != nil {
		return err
	}
	if len(skus) == 0 {
		return usagef("watch stock: want SKU [SKU...]")
	}
	s, err := c.inv.WatchStock(ctx, req(c, &v1.WatchStockRequest{Skus: skus}))
	if err != nil {
		return err
	}
	defer s.Close()
	if !c.json {
		fmt.Fprintln(c.out, "EVENT\tSKU\tSTATUS\tAVAILABLE\tRESERVED\tSOLD\tIN TRANSIT")
	}
	for s.Receive() {
		m := s.Msg()
		st := m.GetStock()
		if err := c.line(m, func() string {
			return fmt.Sprintf("%s\t%s\t%s\t%d\t%d\t%d\t%d", strings.TrimPrefix(m.GetEvent().String(), "STOCK_EVENT_"), st.GetSku(),
				strings.TrimPrefix(st.GetStatus().String(), "SKU_STATUS_"), st.GetAvailable(), st.GetReserved(), st.GetSold(), st.GetInTransit())
		}); err != nil {
			return err
		}
	}
	return streamEnd(ctx, c, s.Err(), "")
}

// line prints one message of a stream: protojson with -json, else text's
// line, its columns tab-separated (lines come one at a time: no table to
// align them in).
func (c *cli) line(msg proto.Message, text func() string) error {
	if c.json {
		return c.show(msg, nil)
	}
	_, err := fmt.Fprintln(c.out, text())
	return err
}

// streamEnd is a watch's result: nil when interrupted (ctx ended), else
// the stream's error, after naming the cursor to resume from, if any.
func streamEnd(ctx context.Context, c *cli, err error, cursor string) error {
	if ctx.Err() != nil {
		return nil
	}
	if err == nil {
		err = connect.NewError(connect.CodeUnavailable, fmt.Errorf("the stream ended"))
	}
	if cursor != "" {
		fmt.Fprintf(c.errw, "stockctl: resume with: stockctl watch ledger -cursor %s\n", cursor)
	}
	return err
}
