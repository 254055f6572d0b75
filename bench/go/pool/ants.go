// A small stand-in for github.com/panjf2000/ants v2.11's Pool, written for
// this benchmark because ants itself cannot be fetched here (no module
// proxy). It keeps the parts that decide ants' speed and memory: one
// goroutine per worker, parked on its own task channel (capacity 1 when
// GOMAXPROCS > 1, as ants' workerChanCap); idle workers on a LIFO stack
// sorted by last use; a backoff spinlock (1, 2, 4 ... 16 Gosched) as the
// pool lock and as the sync.Cond locker; blocking Submit waits on the cond;
// worker structs recycled through a sync.Pool; a purge goroutine retiring
// workers idle longer than the expiry; a ticktock goroutine that caches
// time.Now every 500 ms for lastUsed. Left out: options other than expiry,
// Tune, PoolWithFunc, panics, MultiPool.
package main

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

type spinLock uint32

func (l *spinLock) Lock() {
	backoff := 1
	for !atomic.CompareAndSwapUint32((*uint32)(l), 0, 1) {
		for i := 0; i < backoff; i++ {
			runtime.Gosched()
		}
		if backoff < 16 {
			backoff <<= 1
		}
	}
}

func (l *spinLock) Unlock() { atomic.StoreUint32((*uint32)(l), 0) }

type worker struct {
	pool     *antsPool
	task     chan func()
	lastUsed int64 // unix nanoseconds, from the pool's cached clock
}

type antsPool struct {
	capacity int32
	running  int32
	waiting  int32
	closed   int32
	lock     spinLock
	cond     *sync.Cond
	idle     []*worker // LIFO: the newest on top, the oldest (first purged) at 0
	cache    sync.Pool
	expiry   time.Duration
	now      atomic.Value // time.Time, refreshed by ticktock
	stop     chan struct{}
}

var workerChanCap = func() int {
	if runtime.GOMAXPROCS(0) == 1 {
		return 0
	}
	return 1
}()

func newAntsPool(size int, expiry time.Duration) *antsPool {
	p := &antsPool{capacity: int32(size), expiry: expiry, stop: make(chan struct{})}
	p.cond = sync.NewCond(&p.lock)
	p.cache.New = func() any { return &worker{pool: p, task: make(chan func(), workerChanCap)} }
	p.now.Store(time.Now())
	go p.purge()
	go p.ticktock()
	return p
}

func (p *antsPool) ticktock() {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.now.Store(time.Now())
		}
	}
}

func (p *antsPool) purge() {
	t := time.NewTicker(p.expiry)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		cutoff := time.Now().Add(-p.expiry).UnixNano()
		p.lock.Lock()
		n := 0
		for n < len(p.idle) && p.idle[n].lastUsed <= cutoff {
			n++
		}
		expired := append([]*worker(nil), p.idle[:n]...)
		m := copy(p.idle, p.idle[n:])
		for i := m; i < len(p.idle); i++ {
			p.idle[i] = nil
		}
		p.idle = p.idle[:m]
		p.lock.Unlock()
		for _, w := range expired {
			w.task <- nil
		}
		if atomic.LoadInt32(&p.running) == 0 && atomic.LoadInt32(&p.waiting) > 0 {
			p.cond.Broadcast()
		}
	}
}

// run starts the worker's goroutine; the caller has counted it in running
// (under the pool lock, as ants does since v2.11.4, #376).
func (w *worker) run() {
	p := w.pool
	go func() {
		defer func() {
			atomic.AddInt32(&p.running, -1)
			p.cache.Put(w)
			p.cond.Signal()
		}()
		for f := range w.task {
			if f == nil {
				return
			}
			f()
			if !p.revert(w) {
				return
			}
		}
	}()
}

func (p *antsPool) revert(w *worker) bool {
	if c := atomic.LoadInt32(&p.capacity); (c > 0 && atomic.LoadInt32(&p.running) > c) ||
		atomic.LoadInt32(&p.closed) == 1 {
		p.cond.Broadcast()
		return false
	}
	w.lastUsed = p.now.Load().(time.Time).UnixNano()
	p.lock.Lock()
	if atomic.LoadInt32(&p.closed) == 1 {
		p.lock.Unlock()
		return false
	}
	p.idle = append(p.idle, w)
	p.cond.Signal()
	p.lock.Unlock()
	return true
}

func (p *antsPool) retrieve() *worker {
	p.lock.Lock()
	for {
		if n := len(p.idle); n > 0 {
			w := p.idle[n-1]
			p.idle[n-1] = nil
			p.idle = p.idle[:n-1]
			p.lock.Unlock()
			return w
		}
		if c := atomic.LoadInt32(&p.capacity); c == -1 || c > atomic.LoadInt32(&p.running) {
			atomic.AddInt32(&p.running, 1)
			p.lock.Unlock()
			w := p.cache.Get().(*worker)
			w.run()
			return w
		}
		atomic.AddInt32(&p.waiting, 1)
		p.cond.Wait()
		atomic.AddInt32(&p.waiting, -1)
		if atomic.LoadInt32(&p.closed) == 1 {
			p.lock.Unlock()
			return nil
		}
	}
}

func (p *antsPool) Submit(f func()) bool {
	if atomic.LoadInt32(&p.closed) == 1 {
		return false
	}
	w := p.retrieve()
	if w == nil {
		return false
	}
	w.task <- f
	return true
}

func (p *antsPool) Release() {
	if !atomic.CompareAndSwapInt32(&p.closed, 0, 1) {
		return
	}
	close(p.stop)
	p.lock.Lock()
	for _, w := range p.idle {
		w.task <- nil
	}
	p.idle = nil
	p.lock.Unlock()
	p.cond.Broadcast()
}
