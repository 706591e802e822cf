package orchestrator

import (
	"net"
	"sync"
)

// One client must not take the whole connection budget: 4,300
// slow-header connections from one address made everyone else's request
// wait 9.4 s, since the router held its --max-connections (4096) for
// them. A client address holds at most a share of the budget; its
// connections past that are closed as they come, taking none of the
// budget, and the other clients' are accepted as before. Loopback
// addresses count apart (127.0.0.1, 127.0.0.2, ...), as any others.

// perClientListener closes the connections of a client address that holds
// max already.
type perClientListener struct {
	net.Listener
	max     int
	mu      sync.Mutex
	open    map[string]int
	refused func() // told of each connection closed for its address
}

// limitPerClient caps the connections ln holds from each client address
// at max (0: no cap); refused, when set, is told of each closed one.
func limitPerClient(ln net.Listener, max int, refused func()) net.Listener {
	if max <= 0 {
		return ln
	}
	return &perClientListener{Listener: ln, max: max, open: map[string]int{}, refused: refused}
}

func (l *perClientListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		host := clientHost(c.RemoteAddr())
		l.mu.Lock()
		if l.open[host] >= l.max {
			l.mu.Unlock()
			c.Close()
			if l.refused != nil {
				l.refused()
			}
			continue
		}
		l.open[host]++
		l.mu.Unlock()
		return &perClientConn{Conn: c, l: l, host: host}, nil
	}
}

func (l *perClientListener) release(host string) {
	l.mu.Lock()
	if l.open[host]--; l.open[host] <= 0 {
		delete(l.open, host)
	}
	l.mu.Unlock()
}

// perClientConn gives its address's share back once closed.
type perClientConn struct {
	net.Conn
	l    *perClientListener
	host string
	once sync.Once
}

func (c *perClientConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.host) })
	return err
}

// clientHost is the address a connection came from, without its port.
func clientHost(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}
