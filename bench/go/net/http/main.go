// The Go peer of examples/http_server.c for bench/run_net.sh: net/http
// serving the same bytes at / ("Hello, World!\n", text/plain; charset=utf-8,
// with Content-Length and Date, as ours). Standard library only.
//
//	httpsrv [port]    (0: any free port; the port is printed)
package main

import (
	"fmt"
	"net/http"

	"colony.bench/peer"
)

func main() {
	ln := peer.Listen(peer.PortArg(8081))
	srv := &http.Server{Handler: peer.Hello()}
	fmt.Printf("go httpsrv: listening on http://%s/\n", ln.Addr())
	peer.OnStop(func() { srv.Close() })
	srv.Serve(ln)
}
