// The Go peer of examples/echo_server.c for bench/run_net.sh: one goroutine
// per connection, echoing through a 4 KiB buffer until EOF (the idiomatic
// Go echo server). No pool: every connection gets a goroutine.
//
//	echosrv [port]    (0: any free port; the port is printed)
package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func serve(c net.Conn) {
	defer c.Close()
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func main() {
	port := 7008
	if len(os.Args) > 1 {
		port, _ = strconv.Atoi(os.Args[1])
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("go echosrv: listening on %s\n", ln.Addr())
	go func() {
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
		<-c
		ln.Close()
		os.Exit(0)
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Temporary() {
				time.Sleep(5 * time.Millisecond) // EMFILE and friends, as net/http does
				continue
			}
			return
		}
		go serve(c)
	}
}
