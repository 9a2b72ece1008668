// Package echo is the tiny server every test pod runs and the client the
// tests send requests with. A server answers each TCP line and each UDP
// datagram with one JSON line naming the pod and the source address it saw,
// so a test can tell which endpoint served it and whether the client's
// address survived the path. Servers and clients open their sockets inside
// a network namespace (see package nsutil).
package echo
