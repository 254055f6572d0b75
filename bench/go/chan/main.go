// Command chan is the Go 1.19 peer of bench/bench_chan.c and bench/bench_sync.c:
// the same sub-benchmarks, arguments and output line (impl=go), standard
// library only.
//
//	chan pingpong       [procs=1] [round_trips=2000000]
//	chan buffered       [procs=2] [producers=1] [consumers=1] [items=4000000]
//	chan select_default [procs=1] [selects=10000000]
//	chan select_ready   [procs=1] [selects=5000000]
//	chan mutex          [procs=2] [workers=4] [locks_per_worker=1000000]
package main

import (
	"fmt"
	"os"
	"sync"
	"time"

	"colony.bench/peer"
)

func die(format string, a ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", a...)
	os.Exit(1)
}

// ---- pingpong over two unbuffered channels --------------------------------

func benchPingpong() {
	procs := peer.SetProcs(1)
	n := peer.Arg(1, 2000000)
	c1, c2 := make(chan int64), make(chan int64)
	var wg sync.WaitGroup
	wg.Add(2)
	t0 := time.Now()
	go func() { // echo
		for i := int64(0); i < n; i++ {
			v := <-c1
			c2 <- v + 1
		}
		wg.Done()
	}()
	go func() { // serve
		var v int64
		for i := int64(0); i < n; i++ {
			c1 <- v
			v = <-c2
		}
		if v != n {
			die("pingpong: got %d, want %d", v, n)
		}
		wg.Done()
	}()
	wg.Wait()
	dt := time.Since(t0)
	msgs := 2 * n
	peer.Report("chan_pingpong", procs, float64(dt.Nanoseconds())/float64(msgs), msgs, "")
}

// ---- buffered: P producers, C consumers, cap 1024 -------------------------

func benchBuffered() {
	procs := peer.SetProcs(2)
	np := peer.Arg(1, 1)
	nc := peer.Arg(2, 1)
	n := peer.Arg(3, 4000000)
	per := n / np
	total := per * np
	ch := make(chan int64, 1024)
	var prod, cons sync.WaitGroup
	var mu sync.Mutex
	var received, sum int64 // protected by mu
	prod.Add(int(np))
	cons.Add(int(nc))
	t0 := time.Now()
	for c := int64(0); c < nc; c++ {
		go func() {
			var got, s int64
			for v := range ch {
				got++
				s += v
			}
			mu.Lock()
			received += got
			sum += s
			mu.Unlock()
			cons.Done()
		}()
	}
	for p := int64(0); p < np; p++ {
		go func(idx int64) {
			for i := int64(0); i < per; i++ {
				ch <- idx*per + i
			}
			prod.Done()
		}(p)
	}
	prod.Wait()
	close(ch)
	cons.Wait()
	dt := time.Since(t0)
	if received != total || sum != total*(total-1)/2 {
		die("buffered: received %d (sum %d), want %d", received, sum, total)
	}
	peer.Report(fmt.Sprintf("chan_buffered_%dp%dc", np, nc), procs,
		float64(dt.Nanoseconds())/float64(total), total, "")
}

// ---- select with default over two empty channels --------------------------

func benchSelectDefault() {
	procs := peer.SetProcs(1)
	n := peer.Arg(1, 10000000)
	a, b := make(chan int64), make(chan int64)
	fired := 0
	t0 := time.Now()
	for i := int64(0); i < n; i++ {
		select {
		case <-a:
			fired++
		case <-b:
			fired++
		default:
		}
	}
	dt := time.Since(t0)
	if fired != 0 {
		die("select_default: %d selects did not take the default", fired)
	}
	peer.Report("select_default", procs, float64(dt.Nanoseconds())/float64(n), n, "")
}

// ---- select over two ready channels, refilling the one that fired ---------

func benchSelectReady() {
	procs := peer.SetProcs(1)
	n := peer.Arg(1, 5000000)
	a, b := make(chan int64, 1), make(chan int64, 1)
	a <- 1
	b <- 1
	var first int64
	t0 := time.Now()
	for i := int64(0); i < n; i++ {
		select {
		case <-a:
			first++
			a <- 1
		case <-b:
			b <- 1
		}
	}
	dt := time.Since(t0)
	peer.Report("select_ready", procs, float64(dt.Nanoseconds())/float64(n), n,
		fmt.Sprintf(" first_pct=%.1f", 100*float64(first)/float64(n)))
}

// ---- contended sync.Mutex --------------------------------------------------

func benchMutex() {
	procs := peer.SetProcs(2)
	workers := peer.Arg(1, 4)
	n := peer.Arg(2, 1000000)
	var mu sync.Mutex
	var counter int64 // protected by mu
	var wg sync.WaitGroup
	wg.Add(int(workers))
	t0 := time.Now()
	for w := int64(0); w < workers; w++ {
		go func() {
			for i := int64(0); i < n; i++ {
				mu.Lock()
				counter++
				mu.Unlock()
			}
			wg.Done()
		}()
	}
	wg.Wait()
	dt := time.Since(t0)
	ops := workers * n
	if counter != ops {
		die("mutex: counter %d, want %d", counter, ops)
	}
	peer.Report(fmt.Sprintf("mutex_%dco", workers), procs, float64(dt.Nanoseconds())/float64(ops), ops, "")
}

func main() {
	cmds := map[string]func(){
		"pingpong":       benchPingpong,
		"buffered":       benchBuffered,
		"select_default": benchSelectDefault,
		"select_ready":   benchSelectReady,
		"mutex":          benchMutex,
	}
	if len(os.Args) < 2 || cmds[os.Args[1]] == nil {
		fmt.Fprintf(os.Stderr, "usage: %s pingpong|buffered|select_default|select_ready|mutex [args]\n", os.Args[0])
		os.Exit(2)
	}
	peer.Args = os.Args[2:]
	cmds[os.Args[1]]()
}
