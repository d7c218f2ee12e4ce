package netpolicy

// The admission writer: the one goroutine that puts resolver answers into
// the sandboxes' dynamic sets. A resolver used to commit its own nftables
// transactions, two per answered address, from the goroutine serving the
// query: a sandbox flooding its resolver with names that answer 200
// addresses each queued thousands of commits, each holding an OS thread
// blocked in the kernel's nfnetlink mutex (659 threads after 90 s), and
// Teardown, under the Manager's lock, waited for all of them (minutes).
// Now every answer goes through a bounded queue to this writer, which
// takes what is queued and commits it as one transaction: one OS thread
// at most for admissions whatever the load, and a full queue answers
// SERVFAIL at once instead of growing.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// MaxAdmitted is the most addresses the resolver admits into one
// sandbox's dynamic set (the set's size in the kernel). Past it an
// answer is still served, but its new addresses are not admitted (and
// are counted in Stats.AddressesOverCap) until older ones expire.
const MaxAdmitted = 4096

const (
	// admitQueue bounds the answers waiting for the writer, across every
	// sandbox; a resolver whose answer finds it full answers SERVFAIL.
	admitQueue = 1024
	// admitBatchElems is how many elements the writer gathers into one
	// transaction before it commits (the batch must fit one netlink
	// send: see MaxEntries).
	admitBatchElems = 2048
	// admitAloneElems: a batch of more elements is committed in a
	// transaction of its own, not with the rule writer's other changes.
	admitAloneElems = 256
	// admitWait bounds how long a query waits for its admission.
	admitWait = 5 * time.Second
)

// Errors of an admission, each answered SERVFAIL.
var (
	errAdmitQueueFull = errors.New("admission queue full")
	errRevoked        = errors.New("name no longer admitted by the policy")
)

// Stats counts, since New, what the resolvers and the admission writer
// refused and did. Every field only grows.
type Stats struct {
	// QueriesRateLimited are DNS queries dropped unanswered because their
	// sandbox's resolver was over its rate (ResolverRate, ResolverBurst);
	// a TCP connection over the rate is closed and counted once.
	QueriesRateLimited uint64
	// QueriesBusy are DNS queries dropped unanswered because their
	// sandbox's resolver already served ResolverInflight queries.
	QueriesBusy uint64
	// TCPConnsRefused are TCP connections to a resolver closed at accept
	// because it already held ResolverTCPConns.
	TCPConnsRefused uint64
	// AddressesOverCap are answered addresses not admitted because their
	// sandbox's dynamic set held MaxAdmitted (the answer was served).
	AddressesOverCap uint64
	// AdmissionsQueueFull are answers refused (SERVFAIL) because the
	// admission writer's queue was full.
	AdmissionsQueueFull uint64
	// AddressesAdmitted are elements the writer added or refreshed.
	AddressesAdmitted uint64
	// AdmissionCommits are the writer's nftables transactions.
	AdmissionCommits uint64
	// RuleCommits are the rule writer's nftables transactions (every
	// change of the table after New, admissions included), RuleChanges
	// the changes they carried, RuleBatchesRetried the batches that
	// failed whole and were committed again change by change.
	RuleCommits, RuleChanges, RuleBatchesRetried uint64
}

// stats are the Manager's counters behind Stats.
type stats struct {
	rateLimited, busy, tcpRefused, overCap, queueFull, admitted, commits atomic.Uint64
}

// Stats returns the counters of the resolvers and the admission writer.
// Safe to call at any time, after Close too.
func (m *Manager) Stats() Stats {
	s := &m.stats
	st := Stats{
		QueriesRateLimited:  s.rateLimited.Load(),
		QueriesBusy:         s.busy.Load(),
		TCPConnsRefused:     s.tcpRefused.Load(),
		AddressesOverCap:    s.overCap.Load(),
		AdmissionsQueueFull: s.queueFull.Load(),
		AddressesAdmitted:   s.admitted.Load(),
		AdmissionCommits:    s.commits.Load(),
	}
	if m.rw != nil {
		st.RuleCommits, st.RuleChanges, st.RuleBatchesRetried = m.rw.commits.Load(), m.rw.ops.Load(), m.rw.retried.Load()
	}
	return st
}

// admission is one answer waiting for the writer.
type admission struct {
	r     *resolver
	name  string // the question, for the writer's policy check
	addrs []netip.Addr
	ttl   time.Duration // clamped
	done  chan error    // buffered: the writer never blocks on it
}

// admitter is the writer. Its queue is the only way into the dynamic
// sets besides SetPolicy's and denyAll's flushes, which take m.dynMu, as
// the writer does from its policy check to its commit: an answer for a
// name that a policy update revokes lands before the flush or not at all.
type admitter struct {
	m     *Manager
	queue chan *admission
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

func (m *Manager) startAdmitter() {
	a := &admitter{m: m, queue: make(chan *admission, admitQueue), stop: make(chan struct{}), done: make(chan struct{})}
	m.adm = a
	go a.run()
}

// close stops the writer and waits for it; queued answers get ErrClosed.
// Idempotent.
func (a *admitter) close() {
	a.once.Do(func() {
		close(a.stop)
		<-a.done
	})
}

// submit queues x and waits for its result, at most until ctx ends. It
// never blocks on a full queue.
func (a *admitter) submit(ctx context.Context, x *admission) error {
	select {
	case a.queue <- x:
	default:
		a.m.stats.queueFull.Add(1)
		return errAdmitQueueFull
	}
	select {
	case err := <-x.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (a *admitter) run() {
	defer close(a.done)
	for {
		var batch []*admission
		select {
		case <-a.stop:
			for {
				select {
				case x := <-a.queue:
					x.done <- ErrClosed
				default:
					return
				}
			}
		case x := <-a.queue:
			batch = append(batch, x)
		}
		n := len(batch[0].addrs)
	gather:
		for n < admitBatchElems {
			select {
			case x := <-a.queue:
				batch = append(batch, x)
				n += len(x.addrs)
			default:
				break gather
			}
		}
		a.commit(batch)
	}
}

// dynWrite is what one transaction adds to one sandbox's dynamic set,
// after deleting dels (present elements whose timeout an add would not
// restart on this kernel).
type dynWrite struct {
	n     sbNames
	dels  []nftables.SetElement
	elems []nftables.SetElement
}

// refreshMargin: an element with less life left than this may expire
// before the transaction that deletes it commits, so it is only added.
const refreshMargin = 2 * time.Second

// plan is one sandbox's share of a batch.
type plan struct {
	r     *resolver
	ttl   map[netip.Addr]time.Duration // address → lifetime to write
	fresh int                          // addresses of ttl not yet in r.admitted
	// live are addresses of ttl whose element the kernel still holds:
	// where an "add" does not restart a timeout (m.addRefreshes false),
	// they are deleted and added again in the same transaction.
	live map[netip.Addr]bool
	adms []*admission
}

// commit writes a batch: the answers whose names the policy still
// admits, minus addresses admitted recently enough (an element is
// refreshed once less than half its lifetime is left) and past each
// set's MaxAdmitted, in one transaction. If that fails, each sandbox's
// share is retried alone, so one sandbox's failure (its set deleted by a
// Teardown, or full in the kernel) fails no other's.
func (a *admitter) commit(batch []*admission) {
	m := a.m
	m.dynMu.Lock()
	defer m.dynMu.Unlock()
	now := time.Now()
	var plans []*plan
	byRes := map[*resolver]*plan{}
	for _, x := range batch {
		r := x.r
		if r.ctx.Err() != nil {
			x.done <- ErrClosed
			continue
		}
		if !r.policy.Load().admitsAnswers(x.name) {
			x.done <- errRevoked
			continue
		}
		p := byRes[r]
		if p == nil {
			p = &plan{r: r, ttl: map[netip.Addr]time.Duration{}, live: map[netip.Addr]bool{}}
			byRes[r] = p
			plans = append(plans, p)
		}
		p.adms = append(p.adms, x)
		for _, ip := range x.addrs {
			if t, ok := p.ttl[ip]; ok {
				p.ttl[ip] = max(t, x.ttl)
				continue
			}
			el, ok := r.admitted[ip]
			if ok && el.exp.Sub(now) > x.ttl/2 {
				continue // fresh enough: no kernel write
			}
			if !ok {
				if len(r.admitted)+p.fresh >= MaxAdmitted {
					r.pruneAdmitted(now)
				}
				if len(r.admitted)+p.fresh >= MaxAdmitted {
					m.stats.overCap.Add(1)
					continue
				}
				p.fresh++
			} else if !m.addRefreshes && el.exp.Sub(now) > refreshMargin {
				p.live[ip] = true
			} else if el.timeout == x.ttl {
				// The kernel restarts the timer of a present element
				// only when the timeout it is given differs from the
				// element's (the expiration attribute, which would force
				// it, is not one google/nftables sends): a second more.
				p.ttl[ip] = x.ttl + time.Second
				continue
			}
			p.ttl[ip] = x.ttl
		}
	}
	var ws []dynWrite
	for _, p := range plans {
		if w := p.write(true); len(w.elems) > 0 {
			ws = append(ws, w)
		}
	}
	if len(ws) == 0 {
		for _, p := range plans {
			p.reply(nil)
		}
		return
	}
	err := m.writeDyn(ws)
	m.stats.commits.Add(1)
	if err == nil {
		for _, p := range plans {
			p.apply(m, now, true)
			p.reply(nil)
		}
		return
	}
	for _, p := range plans {
		// Alone, and without deletes: a delete of an element that expired
		// meanwhile fails the transaction. An add of a live element then
		// may not restart its timeout (apply keeps its old expiry, so the
		// next answer tries again).
		w := p.write(false)
		if len(w.elems) == 0 {
			p.reply(nil)
			continue
		}
		err := m.writeDyn([]dynWrite{w})
		m.stats.commits.Add(1)
		switch {
		case err == nil:
			p.apply(m, now, len(p.live) == 0)
			p.reply(nil)
		case errors.Is(err, unix.ENFILE):
			// The kernel's set is full (elements this writer does not
			// know of: a previous runnerd's, not yet expired): the answer
			// is served, its addresses are not admitted.
			m.stats.overCap.Add(uint64(len(w.elems)))
			p.reply(nil)
		default:
			p.reply(err)
		}
	}
}

// write is the plan's share of a transaction; with dels, the live
// elements to delete first (see plan.live).
func (p *plan) write(dels bool) dynWrite {
	w := dynWrite{n: p.r.n}
	for ip, ttl := range p.ttl {
		w.elems = append(w.elems, nftables.SetElement{Key: ip.AsSlice(), Timeout: ttl})
		if dels && p.live[ip] {
			w.dels = append(w.dels, nftables.SetElement{Key: ip.AsSlice()})
		}
	}
	return w
}

// apply records the plan's addresses as admitted; with refreshed false,
// a live element keeps the expiry it had. The caller holds m.dynMu.
func (p *plan) apply(m *Manager, now time.Time, refreshed bool) {
	for ip, ttl := range p.ttl {
		if !refreshed && p.live[ip] {
			continue
		}
		p.r.admitted[ip] = admittedElem{exp: now.Add(ttl), timeout: ttl}
	}
	m.stats.admitted.Add(uint64(len(p.ttl)))
}

func (p *plan) reply(err error) {
	for _, x := range p.adms {
		x.done <- err
	}
}

// admittedElem is what the writer knows of an element it wrote: when it
// expires and the timeout it was given.
type admittedElem struct {
	exp     time.Time
	timeout time.Duration
}

// pruneAdmitted forgets the addresses whose elements have expired. The
// caller holds m.dynMu.
func (r *resolver) pruneAdmitted(now time.Time) {
	for ip, el := range r.admitted {
		if !el.exp.After(now) {
			delete(r.admitted, ip)
		}
	}
}

// writeDyn adds the elements of ws in one transaction, each after its
// sandbox's dels. An "add" of a present element with another timeout
// restarts its timer where the kernel supports it (Linux 6.10 and
// later; m.addRefreshes), so there dels is empty.
func (m *Manager) writeDyn(ws []dynWrite) error {
	// Through the rule writer, which commits it alone or with other
	// changes in one transaction; the admission writer waits for it
	// holding dynMu, which the rule writer never takes.
	total := 0
	for _, w := range ws {
		total += len(w.dels) + len(w.elems)
	}
	// A batch of thousands of elements fills a netlink send by itself.
	alone := total > admitAloneElems
	err := m.apply(context.Background(), alone, func(c *nftables.Conn, ids *batchIDs) error {
		t := m.table()
		for _, w := range ws {
			_, dyn := sandboxSets(t, w.n, ids)
			dels := w.dels
			for len(dels) > 0 {
				k := min(len(dels), setChunk)
				if err := c.SetDeleteElements(dyn, dels[:k]); err != nil {
					return fmt.Errorf("refresh in %s: %w", w.n.dyn, err)
				}
				dels = dels[k:]
			}
			elems := w.elems
			for len(elems) > 0 {
				k := min(len(elems), setChunk)
				if err := c.SetAddElements(dyn, elems[:k]); err != nil {
					return fmt.Errorf("admit into %s: %w", w.n.dyn, err)
				}
				elems = elems[k:]
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("admit addresses: %w", err)
	}
	return nil
}

// forgetAdmitted empties the writer's view of sandbox id's dynamic set,
// after a flush of it. The caller holds m.dynMu (m.mu is taken here: it
// is a leaf lock).
func (m *Manager) forgetAdmitted(id string) {
	m.mu.Lock()
	l := m.live[id]
	m.mu.Unlock()
	if l != nil {
		clear(l.res.admitted)
	}
}

// probeAddRefresh asks the kernel whether an "add" of a present set
// element with another timeout restarts its timer (Linux 6.10 and later)
// or leaves it (older kernels, where a refresh must delete and add), with
// a set of its own in the table that it deletes again.
func (m *Manager) probeAddRefresh() (bool, error) {
	s := &nftables.Set{Table: m.table(), Name: "probe-refresh", ID: idProbe, KeyType: nftables.TypeIPAddr, HasTimeout: true}
	key := []byte{192, 0, 2, 1}
	step := func(f func(c *nftables.Conn) error) error {
		c, err := m.nft()
		if err != nil {
			return err
		}
		if err := f(c); err != nil {
			return err
		}
		return c.Flush()
	}
	defer step(func(c *nftables.Conn) error {
		if err := c.AddSet(s, nil); err != nil {
			return err
		}
		c.DelSet(s)
		return nil
	})
	for _, ttl := range []time.Duration{time.Minute, time.Hour} {
		if err := step(func(c *nftables.Conn) error {
			if err := c.AddSet(s, nil); err != nil {
				return err
			}
			return c.SetAddElements(s, []nftables.SetElement{{Key: key, Timeout: ttl}})
		}); err != nil {
			return false, fmt.Errorf("probe set element timeouts: %w", err)
		}
	}
	c, err := m.nft()
	if err != nil {
		return false, err
	}
	els, err := c.GetSetElements(s)
	if err != nil || len(els) != 1 {
		return false, fmt.Errorf("probe set element timeouts: list: %v (%d elements)", err, len(els))
	}
	return els[0].Timeout > time.Minute || els[0].Expires > time.Minute, nil
}

// seedAdmitted fills a new resolver's view of its dynamic set from the
// kernel: a set a previous runnerd filled (re-adoption) holds elements
// the writer must count against MaxAdmitted and must not believe fresher
// than they are.
func (m *Manager) seedAdmitted(r *resolver) error {
	c, err := m.nft()
	if err != nil {
		return err
	}
	_, dyn := sandboxSets(m.table(), r.n, &batchIDs{})
	els, err := c.GetSetElements(dyn)
	if err != nil {
		return fmt.Errorf("list set %s: %w", r.n.dyn, err)
	}
	now := time.Now()
	m.dynMu.Lock()
	defer m.dynMu.Unlock()
	for _, e := range els {
		if ip, ok := netip.AddrFromSlice(e.Key); ok && e.Expires > 0 {
			r.admitted[ip] = admittedElem{exp: now.Add(e.Expires), timeout: e.Timeout}
		}
	}
	return nil
}
