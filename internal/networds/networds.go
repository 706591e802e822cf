// Package networds says why a connection failed in the words of the
// people who read it, not Go's: the commands' errors and evolve bench's.
package networds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
)

// Cause says why a connection failed in words, without Go's text of
// the request and the dial ('Get "http://...": dial tcp 127.0.0.1:8001:
// connect: connection refused').
func Cause(err error) string {
	var dns *net.DNSError
	var ne net.Error
	var ve *tls.CertificateVerificationError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused (nothing listens there)"
	case errors.Is(err, syscall.EHOSTUNREACH):
		return "no route to the host"
	case errors.Is(err, syscall.ENETUNREACH):
		return "the network is unreachable"
	case errors.Is(err, syscall.ECONNRESET):
		return "the connection was reset"
	case errors.Is(err, context.Canceled):
		return "interrupted"
	case errors.Is(err, io.EOF):
		return "the server closed the connection"
	case errors.As(err, &dns):
		return fmt.Sprintf("no such host %q", dns.Name)
	case errors.As(err, &ve):
		return "its TLS certificate is not trusted"
	case errors.As(err, &ne) && ne.Timeout():
		return "no answer in time"
	}
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 && i+2 < len(msg) {
		return msg[i+2:] // the cause, at the end of the chain
	}
	return msg
}
