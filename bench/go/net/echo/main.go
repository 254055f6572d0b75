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
	"time"

	"colony.bench/peer"
)

func main() {
	ln := peer.Listen(peer.PortArg(7008))
	fmt.Printf("go echosrv: listening on %s\n", ln.Addr())
	peer.OnStop(func() {
		ln.Close()
		os.Exit(0)
	})
	for {
		c, err := ln.Accept()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Temporary() {
				time.Sleep(5 * time.Millisecond) // EMFILE and friends, as net/http does
				continue
			}
			return
		}
		go peer.Echo(c, 4096)
	}
}
