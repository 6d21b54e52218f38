package admission

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// scrapeTimeout bounds the query behind the waitlist gauge.
const scrapeTimeout = 2 * time.Second

// metrics count tokens and tickets as this process handed them out; the
// sum over allocators is the service's.
type metrics struct {
	// granted counts tokens given (at once or to a ticket from the
	// waitlist), admitted those given to a ticket from the waitlist.
	granted, admitted prometheus.Counter
	// direct counts the tokens granted directly, with no ticket.
	direct prometheus.Counter
	// waiting counts tickets that entered a waitlist, cancelled those
	// taken out by CancelTicket, soldOut those answered SOLD_OUT while
	// they waited.
	waiting, cancelled, soldOut prometheus.Counter
	// passes counts the worker's passes over a SKU's waitlist: flat while
	// tickets wait means no worker holds the SKU's lease.
	passes prometheus.Counter
	// memoryRefusals counts RequestToken calls refused from memory.
	memoryRefusals prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, store Store) *metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := &metrics{
		granted:   c("shardstock_admission_tokens_granted_total", "Purchase tokens granted (a reservation each): at once, or to a ticket from the waitlist."),
		admitted:  c("shardstock_admission_tickets_admitted_total", "Waiting tickets admitted with a token as units came back."),
		direct:    c("shardstock_admission_tokens_direct_total", "Purchase tokens granted directly, with no ticket: units were free and no ticket queued."),
		waiting:   c("shardstock_admission_tickets_enqueued_total", "Tickets that entered a SKU's waitlist."),
		cancelled: c("shardstock_admission_tickets_cancelled_total", "Tickets taken out of a waitlist by CancelTicket."),
		soldOut:   c("shardstock_admission_tickets_sold_out_total", "Waiting tickets answered SOLD_OUT: their SKU sold out for good."),
		passes:    c("shardstock_admission_worker_passes_total", "Passes of the admission worker over a SKU's waitlist, under the SKU's lease."),
		memoryRefusals: c("shardstock_admission_soldout_memory_refusals_total",
			"RequestToken calls refused OUT_OF_STOCK from memory: their SKU is marked sold out for good and no ticket of it has their key; no query, no shard call."),
	}
	if reg != nil {
		reg.MustRegister(m.granted, m.admitted, m.direct, m.waiting, m.cancelled, m.soldOut, m.passes, m.memoryRefusals)
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "shardstock_admission_tickets_waiting", Help: "Tickets in every SKU's waitlist (read from the database at each scrape; -1 if it could not be read).",
		}, func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
			defer cancel()
			n, err := store.WaitingTotal(ctx)
			if err != nil {
				return -1
			}
			return float64(n)
		}))
	}
	return m
}
