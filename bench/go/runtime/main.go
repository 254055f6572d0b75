// Command runtime is the Go 1.19 peer of bench/bench_runtime.c: the same
// sub-benchmarks, arguments and output line (impl=go), standard library only.
//
//	runtime yield  [procs=1] [yields=5000000]
//	runtime spawn  [procs=2] [n=1000000]
//	runtime park   [procs=2] [n=1000000]
//	runtime sleep  [procs=2] [n=100000] [ms=10]
//	runtime timer  [procs=2] [n=1000] [us=100]
//	runtime spread [procs=2] [tasks=20000] [work=20000]
//	runtime spread_long [procs=2] [chunks=2000] [work=200000]
package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/trace"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"colony.bench/peer"
)

// ---- yield: two goroutines on one P ping-pong runtime.Gosched -------------

func benchYield() {
	procs := peer.SetProcs(1)
	n := peer.Arg(1, 5000000)
	var wg sync.WaitGroup
	var last, switches int64 // GOMAXPROCS=1: the two never run at once; atomics keep -race quiet
	worker := func(me int64) {
		for i := int64(0); i < n; i++ {
			if atomic.LoadInt64(&last) != me {
				atomic.StoreInt64(&last, me)
				atomic.AddInt64(&switches, 1)
			}
			runtime.Gosched()
		}
		wg.Done()
	}
	wg.Add(2)
	t0 := time.Now()
	go worker(1)
	go worker(2)
	wg.Wait()
	dt := time.Since(t0)
	ops := 2 * n
	peer.Report("yield", procs, float64(dt.Nanoseconds())/float64(ops), ops,
		fmt.Sprintf(" switches=%d", switches))
}

// ---- spawn: n empty goroutines joined by a WaitGroup ----------------------

func benchSpawn() {
	procs := peer.SetProcs(2)
	n := peer.Arg(1, 1000000)
	var wg sync.WaitGroup
	t0 := time.Now()
	wg.Add(int(n))
	for i := int64(0); i < n; i++ {
		go func() { wg.Done() }()
	}
	wg.Wait()
	dt := time.Since(t0)
	peer.Report("spawn", procs, float64(dt.Nanoseconds())/float64(n), n, "")
}

// ---- park: n goroutines alive at once, each parked on a WaitGroup ---------

func benchPark() {
	procs := peer.SetProcs(2)
	n := peer.Arg(1, 1000000)
	base := peer.CurRSSKB()
	var started, gate, finished sync.WaitGroup
	started.Add(int(n))
	finished.Add(int(n))
	gate.Add(1)
	t0 := time.Now()
	for i := int64(0); i < n; i++ {
		go func() {
			started.Done()
			gate.Wait()
			finished.Done()
		}()
	}
	started.Wait()
	dt := time.Since(t0)
	alive := runtime.NumGoroutine() - 1
	parked := peer.CurRSSKB()
	gate.Done()
	finished.Wait()
	peak := peer.PeakRSSKB()
	perCo := float64(peak-base) * 1024 / float64(n)
	peer.Report("park", procs, float64(dt.Nanoseconds())/float64(n), n,
		fmt.Sprintf(" bytes_per_co=%.0f base_rss_kb=%d parked_rss_kb=%d alive=%d",
			perCo, base, parked, alive))
}

// ---- sleep: n goroutines each sleeping ms ---------------------------------

func benchSleep() {
	procs := peer.SetProcs(2)
	n := peer.Arg(1, 100000)
	d := time.Duration(peer.Arg(2, 10)) * time.Millisecond
	var started, gate, wg sync.WaitGroup
	var pending, maxPending, errors int64
	started.Add(int(n))
	gate.Add(1)
	wg.Add(int(n))
	t0 := time.Now()
	for i := int64(0); i < n; i++ {
		go func() {
			started.Done()
			gate.Wait() // every goroutine exists before the first timer is armed
			p := atomic.AddInt64(&pending, 1)
			for {
				m := atomic.LoadInt64(&maxPending)
				if p <= m || atomic.CompareAndSwapInt64(&maxPending, m, p) {
					break
				}
			}
			t := time.Now()
			time.Sleep(d)
			if time.Since(t) < d {
				atomic.AddInt64(&errors, 1)
			}
			atomic.AddInt64(&pending, -1)
			wg.Done()
		}()
	}
	started.Wait()
	spawned := time.Since(t0)
	t1 := time.Now()
	gate.Done()
	wg.Wait()
	dt := time.Since(t1)
	peer.Report("sleep", procs, float64(dt.Nanoseconds())/float64(n), n,
		fmt.Sprintf(" wall_ms=%.2f spawn_ms=%.2f max_pending=%d errors=%d",
			float64(dt.Nanoseconds())/1e6, float64(spawned.Nanoseconds())/1e6,
			atomic.LoadInt64(&maxPending), atomic.LoadInt64(&errors)))
}

// ---- timer: overshoot of a short sleep ------------------------------------

func quantile(v []int64, q float64) int64 {
	i := int(q*float64(len(v)-1) + 0.5)
	return v[i]
}

func benchTimer() {
	procs := peer.SetProcs(2)
	n := peer.Arg(1, 1000)
	d := time.Duration(peer.Arg(2, 100)) * time.Microsecond
	over := make([]int64, n)
	early := 0
	for i := range over {
		t := time.Now()
		time.Sleep(d)
		o := time.Since(t) - d
		if o < 0 {
			early++
		}
		over[i] = int64(o)
	}
	sort.Slice(over, func(i, j int) bool { return over[i] < over[j] })
	p50, p99 := quantile(over, 0.50), quantile(over, 0.99)
	peer.Report("timer", procs, float64(p50), n,
		fmt.Sprintf(" sleep_ns=%d p50_ns=%d p99_ns=%d min_ns=%d max_ns=%d early=%d",
			int64(d), p50, p99, over[0], over[n-1], early))
}

// ---- spread: 2 CPU-bound streams ------------------------------------------

const spreadBatch = 64

var sink uint64

// compute is the same serial xorshift chain as spread_compute in C.
func compute(x uint64, iters int64) uint64 {
	for i := int64(0); i < iters; i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	return x
}

func xorSink(v uint64) {
	for {
		o := atomic.LoadUint64(&sink)
		if atomic.CompareAndSwapUint64(&sink, o, o^v) {
			return
		}
	}
}

func spreadRun(name string, long bool, defTasks, defWork int64) {
	procs := peer.SetProcs(2)
	tasks := peer.Arg(1, defTasks)
	work := peer.Arg(2, defWork)
	var streams sync.WaitGroup
	stream := func(seed uint64) {
		defer streams.Done()
		if long {
			x := seed | 1
			for c := int64(0); c < tasks/2; c++ {
				x = compute(x, work)
				runtime.Gosched()
			}
			xorSink(x)
			return
		}
		var wg sync.WaitGroup
		for todo := tasks / 2; todo > 0; {
			k := todo
			if k > spreadBatch {
				k = spreadBatch
			}
			wg.Add(int(k))
			for i := int64(0); i < k; i++ {
				go func() {
					xorSink(compute(seed|1, work))
					wg.Done()
				}()
			}
			wg.Wait()
			todo -= k
		}
	}
	t0 := time.Now()
	streams.Add(2)
	go stream(12345)
	go stream(67890)
	streams.Wait()
	dt := time.Since(t0)
	ops := tasks / 2 * 2
	peer.Report(name, procs, float64(dt.Nanoseconds())/float64(ops), ops,
		fmt.Sprintf(" tasks_per_s=%.0f work=%d sink=%d", float64(ops)*1e9/float64(dt.Nanoseconds()),
			work, atomic.LoadUint64(&sink)&0xff))
}

func main() {
	cmds := map[string]func(){
		"yield":       benchYield,
		"spawn":       benchSpawn,
		"park":        benchPark,
		"sleep":       benchSleep,
		"timer":       benchTimer,
		"spread":      func() { spreadRun("spread", false, 20000, 20000) },
		"spread_long": func() { spreadRun("spread_long", true, 2000, 200000) },
	}
	if len(os.Args) < 2 || cmds[os.Args[1]] == nil {
		fmt.Fprintf(os.Stderr, "usage: %s yield|spawn|park|sleep|timer|spread|spread_long [args]\n", os.Args[0])
		os.Exit(2)
	}
	peer.Args = os.Args[2:]
	// GO_TRACE=path: the run under runtime/trace, the anchor for colony's
	// COLONY_TRACE overhead (bench/trace.sh)
	if p := os.Getenv("GO_TRACE"); p != "" {
		f, err := os.Create(p)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := trace.Start(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer func() { trace.Stop(); f.Close() }()
	}
	cmds[os.Args[1]]()
}
