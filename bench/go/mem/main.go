// The Go peer of bench/bench_mem.c: the same measurements, printing the
// same line format (impl=go).
//
//	mem parked [procs=2] [n=1000000]
//	mem idle   [procs=2] [n=10000] <client>   (client: bench_mem's path)
package main

import (
	"bufio"
	"colony.bench/peer"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func parked(procs int, n int64) {
	park := make(chan int)
	done := make(chan struct{}, 1)
	var started int64
	var wg sync.WaitGroup
	rss0, pte0 := peer.StatusKB("VmRSS"), peer.StatusKB("VmPTE")
	wg.Add(int(n))
	t0 := time.Now()
	for i := int64(0); i < n; i++ {
		go func() {
			if atomic.AddInt64(&started, 1) == n {
				done <- struct{}{}
			}
			if _, ok := <-park; ok {
				panic("received a value")
			}
			wg.Done()
		}()
	}
	<-done
	el := time.Since(t0)
	time.Sleep(20 * time.Millisecond)
	rss1, pte1 := peer.StatusKB("VmRSS"), peer.StatusKB("VmPTE")
	close(park)
	wg.Wait()
	fn := float64(n)
	peer.Report("mem_parked", procs, float64(el.Nanoseconds())/fn, n,
		fmt.Sprintf(" n=%d start_ns=%.0f start_ms=%.1f rss_b=%.0f pte_b=%.0f total_b=%.0f", n,
			float64(el.Nanoseconds())/fn, float64(el.Nanoseconds())/1e6,
			float64(rss1-rss0)*1024/fn, float64(pte1-pte0)*1024/fn,
			float64(rss1-rss0+pte1-pte0)*1024/fn))
}

func idle(procs int, n int64, client string) {
	var rl syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl)
	limited := 0
	if rl.Max < uint64(n)+256 {
		fmt.Fprintf(os.Stderr, "idle: fd hard limit %d < %d + 256: %d connections\n", rl.Max, n, rl.Max-256)
		n = int64(rl.Max) - 256
		limited = 1
	}
	rl.Cur = rl.Max
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	var conns, closed int64
	allin := make(chan struct{}, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				if atomic.AddInt64(&conns, 1) == n {
					allin <- struct{}{}
				}
				buf := make([]byte, 512)
				for {
					r, err := c.Read(buf)
					if err != nil {
						break
					}
					if _, err := c.Write(buf[:r]); err != nil {
						break
					}
				}
				c.Close()
				atomic.AddInt64(&closed, 1)
			}(c)
		}
	}()
	time.Sleep(10 * time.Millisecond)
	rss0, pte0 := peer.StatusKB("VmRSS"), peer.StatusKB("VmPTE")
	port := ln.Addr().(*net.TCPAddr).Port
	t0 := time.Now()
	cmd := exec.Command(client, "client", strconv.Itoa(port), strconv.FormatInt(n, 10))
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		panic(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		fmt.Fprintln(os.Stderr, "idle: the client failed")
		os.Exit(1)
	}
	<-allin
	el := time.Since(t0)
	time.Sleep(50 * time.Millisecond)
	rss1, pte1 := peer.StatusKB("VmRSS"), peer.StatusKB("VmPTE")
	in.Close()
	io.Copy(io.Discard, out)
	cmd.Wait()
	for atomic.LoadInt64(&closed) < n {
		time.Sleep(time.Millisecond)
	}
	ln.Close()
	fn := float64(n)
	peer.Report("mem_idle", procs, float64(el.Nanoseconds())/fn, n,
		fmt.Sprintf(" n=%d limited=%d connect_ms=%.1f rss_b=%.0f pte_b=%.0f total_b=%.0f", n, limited,
			float64(el.Nanoseconds())/1e6, float64(rss1-rss0)*1024/fn, float64(pte1-pte0)*1024/fn,
			float64(rss1-rss0+pte1-pte0)*1024/fn))
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: mem parked [procs] [n] | mem idle [procs] [n] <client>")
		os.Exit(2)
	}
	peer.Args = os.Args[2:]
	procs := peer.SetProcs(2)
	switch os.Args[1] {
	case "parked":
		parked(procs, peer.Arg(1, 1000000))
	case "idle":
		if len(peer.Args) < 3 {
			fmt.Fprintln(os.Stderr, "mem idle: the client's path is missing")
			os.Exit(2)
		}
		idle(procs, peer.Arg(1, 10000), peer.Args[2])
	default:
		fmt.Fprintln(os.Stderr, "unknown benchmark", os.Args[1])
		os.Exit(2)
	}
}
