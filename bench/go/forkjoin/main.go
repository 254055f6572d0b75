// The Go peer of bench/bench_forkjoin.c: parallel fib(n), a goroutine per
// call above a depth cut-off (fib(n) with n > cut-off), each parent joining
// its children with a sync.WaitGroup; at or below the cut-off a plain
// recursive fib.
//
//	forkjoin fib [procs=1] [n=40] [cutoff=11]
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"
)

var cutoff int

func fibSeq(n int) int64 {
	if n < 2 {
		return int64(n)
	}
	return fibSeq(n-1) + fibSeq(n-2)
}

func fibPar(n int) int64 {
	if n <= cutoff {
		return fibSeq(n)
	}
	var wg sync.WaitGroup
	var a, b int64
	if n-1 > cutoff {
		wg.Add(1)
		go func() { a = fibPar(n - 1); wg.Done() }()
	} else {
		a = fibSeq(n - 1)
	}
	if n-2 > cutoff {
		wg.Add(1)
		go func() { b = fibPar(n - 2); wg.Done() }()
	} else {
		b = fibSeq(n - 2)
	}
	wg.Wait()
	return a + b
}

func ncalls(n int) int64 {
	if n <= cutoff {
		return 0
	}
	k := int64(0)
	if n-1 > cutoff {
		k++
	}
	if n-2 > cutoff {
		k++
	}
	return k + ncalls(n-1) + ncalls(n-2)
}

func arg(i int, def int) int {
	if len(os.Args) > i {
		v, err := strconv.Atoi(os.Args[i])
		if err != nil || v <= 0 {
			fmt.Fprintf(os.Stderr, "bad argument %q\n", os.Args[i])
			os.Exit(2)
		}
		return v
	}
	return def
}

func main() {
	if len(os.Args) < 2 || os.Args[1] != "fib" {
		fmt.Fprintln(os.Stderr, "usage: forkjoin fib [procs=1] [n=40] [cutoff=11]")
		os.Exit(2)
	}
	procs, n := arg(2, 1), arg(3, 40)
	cutoff = arg(4, 11)
	runtime.GOMAXPROCS(procs)
	t0 := time.Now()
	r := fibPar(n)
	ns := time.Since(t0).Nanoseconds()
	var want, next int64 = 0, 1
	for i := 0; i < n; i++ {
		want, next = next, want+next
	}
	if r != want {
		fmt.Fprintf(os.Stderr, "fib(%d) = %d: wrong\n", n, r)
		os.Exit(1)
	}
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	cpu := float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e6
	fmt.Printf("bench=forkjoin impl=go procs=%d ns_per_op=%d.00 ops=1 peak_rss_kb=%d ms=%.1f cpu_ms=%.1f coroutines=%d n=%d cutoff=%d result=%d\n",
		procs, ns, ru.Maxrss, float64(ns)/1e6, cpu, ncalls(n), n, cutoff, r)
}
