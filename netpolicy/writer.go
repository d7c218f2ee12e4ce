package netpolicy

// The rule writer: the one goroutine that commits the Manager's nftables
// changes once New has prepared the table. Every change (a sandbox's
// chain and sets, a policy's set contents, a teardown's deletes, the
// admission writer's dynamic elements) is an op queued here; the writer
// takes what is queued and commits it as one transaction.
//
// Why: the kernel serializes nftables transactions on one mutex per
// network namespace and each commit waits for an RCU grace period (~1 ms
// quiet, ~12 ms under load), and a commit that adds a jump validates the
// table's whole jump graph (cost in proportion to its sandboxes). One
// transaction per change made N parallel creates cost N grace periods and
// N validations, each caller holding an OS thread blocked in the kernel;
// one writer makes them one of each per batch, and a caller waiting for
// it is a parked goroutine, not a thread.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/google/nftables"
)

const (
	// ruleQueue bounds the ops waiting for the writer; a caller beyond it
	// waits (parked) for room, at most until its context ends.
	ruleQueue = 256
	// ruleBatchOps is the most ops one transaction carries: a sandbox's
	// chain and sets are ~20 netlink messages, and one batch must fit one
	// netlink send (the socket's send buffer).
	ruleBatchOps = 32
)

// ruleBuild adds one op's messages to c. ids hands out the batch-local
// set IDs of sets the op creates, unique within the transaction.
type ruleBuild func(c *nftables.Conn, ids *batchIDs) error

// ruleOp is one queued change.
type ruleOp struct {
	build ruleBuild
	// alone: commit in a transaction of its own (a policy with thousands
	// of prefixes fills a netlink send by itself).
	alone bool
	done  chan error // buffered: the writer never blocks on it
}

// batchIDs hands out set IDs: the first op of a transaction gets
// idStatic and idDyn (so a transaction of one op is byte for byte what it
// was before the writer: see the golden tests), later ones IDs above
// every constant ID.
type batchIDs struct{ n uint32 }

const firstBatchID = 16

func (b *batchIDs) pair() (uint32, uint32) {
	b.n++
	if b.n == 1 {
		return idStatic, idDyn
	}
	base := firstBatchID + 2*(b.n-2)
	return base, base + 1
}

// ruleWriter owns the queue and the goroutine that drains it.
type ruleWriter struct {
	m     *Manager
	queue chan *ruleOp
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
	// batchOps is ruleBatchOps; a benchmark sets 1 to measure one
	// transaction per change.
	batchOps atomic.Int32

	// commits and ops count transactions and the changes they carried;
	// retried counts batches that failed as a whole and were committed
	// again op by op.
	commits, ops, retried atomic.Uint64
}

func (m *Manager) startRuleWriter() {
	w := &ruleWriter{m: m, queue: make(chan *ruleOp, ruleQueue), stop: make(chan struct{}),
		done: make(chan struct{})}
	w.batchOps.Store(ruleBatchOps)
	m.rw = w
	go w.run()
}

// close stops the writer after the ops already queued; ops queued after
// get ErrClosed. Idempotent.
func (w *ruleWriter) close() {
	w.once.Do(func() {
		close(w.stop)
		<-w.done
	})
}

// apply commits build's messages: through the writer once it runs, else
// (New, before it starts; the golden tests) in a transaction of its own
// on this goroutine. It waits for the commit: once queued, an op is
// committed or refused as a whole, and its caller learns which; ctx
// bounds only the wait for room in the queue.
func (m *Manager) apply(ctx context.Context, alone bool, build ruleBuild) error {
	if m.rw == nil {
		return m.commitOne(build)
	}
	op := &ruleOp{build: build, alone: alone, done: make(chan error, 1)}
	select {
	case m.rw.queue <- op:
	case <-m.rw.stop:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	return <-op.done
}

// commitOne commits one op in its own transaction.
func (m *Manager) commitOne(build ruleBuild) error {
	c, err := m.nft()
	if err != nil {
		return err
	}
	if err := build(c, &batchIDs{}); err != nil {
		return err
	}
	return c.Flush()
}

func (w *ruleWriter) run() {
	defer close(w.done)
	for {
		var first *ruleOp
		select {
		case first = <-w.queue:
		case <-w.stop:
			// What was queued before close still commits: its callers
			// wait for an answer, and Close waits for them.
			for {
				select {
				case op := <-w.queue:
					op.done <- w.commit([]*ruleOp{op})
				default:
					return
				}
			}
		}
		batch := []*ruleOp{first}
	gather:
		for !first.alone && len(batch) < int(w.batchOps.Load()) {
			select {
			case op := <-w.queue:
				if op.alone {
					// Its own transaction, right after this one.
					w.commitBatch(batch)
					batch = nil
					op.done <- w.commit([]*ruleOp{op})
					break gather
				}
				batch = append(batch, op)
			default:
				break gather
			}
		}
		if batch != nil {
			w.commitBatch(batch)
		}
	}
}

// commitBatch commits batch as one transaction and answers each op. A
// transaction is all or nothing, so when it fails each op is committed
// again alone: one sandbox's failure (its set deleted meanwhile, a kernel
// limit) fails no other's.
func (w *ruleWriter) commitBatch(batch []*ruleOp) {
	err := w.commit(batch)
	if err != nil && len(batch) > 1 {
		w.retried.Add(1)
	}
	if err == nil || len(batch) == 1 {
		for _, op := range batch {
			op.done <- err
		}
		return
	}
	for _, op := range batch {
		op.done <- w.commit([]*ruleOp{op})
	}
}

func (w *ruleWriter) commit(batch []*ruleOp) error {
	c, err := w.m.nft()
	if err != nil {
		return err
	}
	ids := &batchIDs{}
	var errs []error
	for _, op := range batch {
		if err := op.build(c, ids); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		// A build error leaves its op's messages half added: nothing of
		// this connection is sent.
		return err
	}
	w.ops.Add(uint64(len(batch)))
	w.commits.Add(1)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("commit nftables transaction: %w", err)
	}
	return nil
}
