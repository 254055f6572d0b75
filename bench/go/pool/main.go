// Command pool is the Go 1.19 peer of bench/bench_pool.c: raw goroutines
// with a sync.WaitGroup, and antsPool (ants.go), a small stand-in for
// github.com/panjf2000/ants v2.11 written here because the real module
// cannot be downloaded on this machine. Same arguments and output line as
// the C side (impl=go).
//
//	pool raw_sleep  [procs=2] [n=1000000] [ms=10]
//	pool ants_sleep [procs=2] [n=1000000] [cap=50000] [ms=10]
//	pool raw_tiny   [procs=2] [n=1000000]
//	pool ants_tiny  [procs=2] [n=1000000] [cap=1000]
//	pool ants_latency [procs=2] [n=200000] [cap=1000] [us=1000]
package main

import (
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"colony.bench/peer"
)

func rawSleep() {
	procs := peer.SetProcs(2)
	n, ms := peer.Arg(1, 1000000), peer.Arg(2, 10)
	d := time.Duration(ms) * time.Millisecond
	var wg sync.WaitGroup
	t0 := time.Now()
	wg.Add(int(n))
	for i := int64(0); i < n; i++ {
		go func() {
			time.Sleep(d)
			wg.Done()
		}()
	}
	wg.Wait()
	dt := time.Since(t0)
	peer.Report("raw_sleep", procs, float64(dt.Nanoseconds())/float64(n), n,
		fmt.Sprintf(" task_ms=%d wall_ms=%.1f", ms, float64(dt.Nanoseconds())/1e6))
}

func antsSleep() {
	procs := peer.SetProcs(2)
	n, c, ms := peer.Arg(1, 1000000), peer.Arg(2, 50000), peer.Arg(3, 10)
	d := time.Duration(ms) * time.Millisecond
	p := newAntsPool(int(c), 10*time.Second) // ants' benchmark uses a 10 s expiry
	before := peer.CurRSSKB()
	var wg sync.WaitGroup
	task := func() {
		time.Sleep(d)
		wg.Done()
	}
	t0 := time.Now()
	wg.Add(int(n))
	for i := int64(0); i < n; i++ {
		p.Submit(task)
	}
	wg.Wait()
	dt := time.Since(t0)
	peak := peer.PeakRSSKB()
	p.Release()
	floor := float64((n+c-1)/c) * float64(ms)
	peer.Report("pool_sleep", procs, float64(dt.Nanoseconds())/float64(n), n,
		fmt.Sprintf(" lock=spin cap=%d task_ms=%d wall_ms=%.1f floor_ms=%.0f rss_per_worker_b=%.0f",
			c, ms, float64(dt.Nanoseconds())/1e6, floor, float64(peak-before)*1024/float64(c)))
}

func rawTiny() {
	procs := peer.SetProcs(2)
	n := peer.Arg(1, 1000000)
	var wg sync.WaitGroup
	var counter int64
	t0 := time.Now()
	wg.Add(int(n))
	for i := int64(0); i < n; i++ {
		go func() {
			atomic.AddInt64(&counter, 1)
			wg.Done()
		}()
	}
	wg.Wait()
	dt := time.Since(t0)
	peer.Report("raw_tiny", procs, float64(dt.Nanoseconds())/float64(n), n,
		fmt.Sprintf(" wall_ms=%.1f mtasks_per_s=%.2f", float64(dt.Nanoseconds())/1e6,
			float64(n)/dt.Seconds()/1e6))
}

func antsTiny() {
	procs := peer.SetProcs(2)
	n, c := peer.Arg(1, 1000000), peer.Arg(2, 1000)
	p := newAntsPool(int(c), time.Second)
	var wg sync.WaitGroup
	var counter int64
	task := func() {
		atomic.AddInt64(&counter, 1)
		wg.Done()
	}
	t0 := time.Now()
	wg.Add(int(n))
	for i := int64(0); i < n; i++ {
		p.Submit(task)
	}
	wg.Wait()
	dt := time.Since(t0)
	p.Release()
	peer.Report("pool_tiny_co", procs, float64(dt.Nanoseconds())/float64(n), n,
		fmt.Sprintf(" lock=spin cap=%d wall_ms=%.1f mtasks_per_s=%.2f", c,
			float64(dt.Nanoseconds())/1e6, float64(n)/dt.Seconds()/1e6))
}

func antsLatency() {
	procs := peer.SetProcs(2)
	n, c, us := peer.Arg(1, 200000), peer.Arg(2, 1000), peer.Arg(3, 1000)
	d := time.Duration(us) * time.Microsecond
	p := newAntsPool(int(c), time.Second)
	task := func() { time.Sleep(d) }
	for i := int64(0); i < c; i++ {
		p.Submit(task)
	}
	lat := make([]int64, n)
	t0 := time.Now()
	for i := int64(0); i < n; i++ {
		a := time.Now()
		p.Submit(task)
		lat[i] = int64(time.Since(a))
	}
	dt := time.Since(t0)
	p.Release()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	q := func(f float64) int64 { return lat[int(f*float64(n-1)+0.5)] }
	peer.Report("pool_latency", procs, float64(dt.Nanoseconds())/float64(n), n,
		fmt.Sprintf(" lock=spin cap=%d task_us=%d p50_ns=%d p99_ns=%d max_ns=%d", c, us,
			q(0.5), q(0.99), lat[n-1]))
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: pool raw_sleep|ants_sleep|raw_tiny|ants_tiny|ants_latency [args]")
		os.Exit(2)
	}
	peer.Args = os.Args[2:]
	switch os.Args[1] {
	case "raw_sleep":
		rawSleep()
	case "ants_sleep":
		antsSleep()
	case "raw_tiny":
		rawTiny()
	case "ants_tiny":
		antsTiny()
	case "ants_latency":
		antsLatency()
	default:
		fmt.Fprintln(os.Stderr, "unknown benchmark", os.Args[1])
		os.Exit(2)
	}
}
