// Package cutproxy is a loopback TCP proxy in front of an API server that
// a test cuts and restores, to play an outage: the server down
// (connections closed, new ones refused) or a network partition
// (connections open but carrying nothing). The chaos trials and the fleet
// view's browser test use it.
package cutproxy

import (
	"net"
	"sync"
	"time"
)

// Mode is how an API outage looks to the clients.
type Mode string

const (
	// Refuse: the API server is down. Connections are closed, and new
	// ones are refused (nothing listens on the port until the outage
	// ends).
	Refuse Mode = "refuse"
	// Blackhole: a network partition. Connections stay open and
	// carry nothing, new ones are accepted and carry nothing; when the
	// partition heals they are closed (their TCP timers would have
	// expired), and the client's next connection works.
	Blackhole Mode = "blackhole"
)

// Proxy is a loopback TCP proxy between clients and the API server
// that can be cut.
type Proxy struct {
	addr   string
	target string

	mu    sync.Mutex
	cut   Mode         // "" when up
	ln    net.Listener // nil while refusing
	open  map[net.Conn]bool
	heal  chan struct{} // closed when a blackhole ends
	wg    sync.WaitGroup
	close bool
}

// Start listens on a free loopback port and forwards to target
// (host:port).
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{addr: ln.Addr().String(), target: target, open: map[net.Conn]bool{}}
	p.listenOn(ln)
	return p, nil
}

// listenOn serves ln; the caller holds mu or has not shared p yet.
func (p *Proxy) listenOn(ln net.Listener) {
	p.ln = ln
	p.wg.Add(1)
	go p.serve(ln)
}

// Addr is the proxy's host:port; it stays the same across outages.
func (p *Proxy) Addr() string { return p.addr }

func (p *Proxy) serve(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(c)
		}()
	}
}

func (p *Proxy) handle(c net.Conn) {
	p.mu.Lock()
	mode, heal := p.cut, p.heal
	if mode == Refuse || p.close {
		p.mu.Unlock()
		_ = c.Close()
		return
	}
	p.open[c] = true
	p.mu.Unlock()
	defer p.forget(c)
	if mode == Blackhole {
		<-heal // then closed by Restore
		return
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	p.open[up] = true
	p.mu.Unlock()
	defer p.forget(up)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				p.mu.Lock()
				heal := p.heal
				blackhole := p.cut == Blackhole
				p.mu.Unlock()
				if blackhole {
					<-heal // the data is lost with the connection
					break
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		_ = dst.Close()
		_ = src.Close()
		done <- struct{}{}
	}
	go pipe(up, c)
	pipe(c, up)
	<-done
}

func (p *Proxy) forget(c net.Conn) {
	_ = c.Close()
	p.mu.Lock()
	delete(p.open, c)
	p.mu.Unlock()
}

// Cut starts an outage.
func (p *Proxy) Cut(mode Mode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = mode
	p.heal = make(chan struct{})
	if mode == Refuse {
		_ = p.ln.Close()
		p.ln = nil
		p.closeAllLocked()
	}
}

// Restore ends the outage: every connection open during it is closed.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut == "" {
		return
	}
	if p.cut == Refuse {
		// The same port again: the clients' kubeconfigs name it.
		for {
			ln, err := net.Listen("tcp", p.addr)
			if err == nil {
				p.listenOn(ln)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	p.cut = ""
	close(p.heal)
	p.closeAllLocked()
}

func (p *Proxy) closeAllLocked() {
	for c := range p.open {
		_ = c.Close()
	}
}

// Close stops the proxy and waits for its connections to end.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.close = true
	if p.cut == Blackhole {
		close(p.heal)
	}
	p.cut = ""
	p.closeAllLocked()
	if p.ln != nil {
		_ = p.ln.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
