//! A TCP proxy on a free loopback port for fault tests: it forwards to a
//! server's port and, on command, breaks the path the way networks break.
//!
//! - [`FaultProxy::cut_all`]: resets every open connection (the client gets
//!   `ECONNRESET` or EOF), as a server restart or a firewall's reset would;
//!   new connections are forwarded normally.
//! - [`FaultProxy::cut_after_next_request`]: the next chunk a client sends is
//!   forwarded, the server's reply is read and thrown away, then that
//!   connection is reset: the server ran the command and the client never
//!   hears (a lost reply).
//! - [`FaultProxy::delay_replies`]: every server→client chunk is held back
//!   before it is forwarded (a slow server or a congested path).
//! - [`FaultProxy::blackhole`]: connections are accepted but nothing is
//!   forwarded either way until [`FaultProxy::restore`] (a non-answering
//!   server, a partition). Bytes are held, not dropped: on restore they are
//!   delivered late, as TCP would after a partition heals. Combine with
//!   `cut_all` for connections that never come back.
//!
//! Caveat: a user-space proxy is not a partition. Its kernel still ACKs data
//! and keepalives, so TCP keepalive never detects a blackhole here; only
//! application-level timeouts and pings do, which is what these tests are for.
//!
//! Threads, not async: two per connection plus the acceptor, so the proxy
//! works under any test runtime (and under none).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::Duration;

/// A fault-injecting TCP proxy from `127.0.0.1:<port()>` to
/// `127.0.0.1:<upstream>`. Dropping it stops accepting and resets every
/// connection.
#[derive(Debug)]
pub struct FaultProxy {
    port: u16,
    upstream: u16,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled when `blackholed` clears or a connection is cut, for pumps
    /// waiting out a blackhole.
    changed: Condvar,
    stopped: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    blackholed: bool,
    reply_delay: Duration,
    /// Armed by `cut_after_next_request`, taken by the first client chunk.
    cut_after_request: bool,
    connections: Vec<Arc<Connection>>,
}

#[derive(Debug)]
struct Connection {
    client: TcpStream,
    server: TcpStream,
    /// Set once the connection is (being) reset: both pumps stop.
    cut: AtomicBool,
    /// A request was forwarded under `cut_after_next_request`: the next
    /// reply chunk is dropped and the connection reset.
    cut_on_reply: AtomicBool,
}

impl FaultProxy {
    /// Starts forwarding a free loopback port to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Self {
        let listener =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind the fault proxy's port");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = Arc::new(Shared::default());
        let acceptor = shared.clone();
        thread::Builder::new()
            .name(format!("fault-proxy-{port}"))
            .spawn(move || accept_loop(listener, upstream, &acceptor))
            .expect("start the fault proxy");
        FaultProxy {
            port,
            upstream,
            shared,
        }
    }

    /// The port clients connect to (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `url` (naming the upstream server as `127.0.0.1:<upstream>`) with the
    /// proxy's port instead: `redis://127.0.0.1:6379/0` becomes
    /// `redis://127.0.0.1:<port()>/0`. Panics if `url` does not name it.
    #[must_use]
    pub fn proxied_url(&self, url: &str) -> String {
        let from = format!("127.0.0.1:{}", self.upstream);
        assert!(url.contains(&from), "{url} does not name {from}");
        url.replacen(&from, &format!("127.0.0.1:{}", self.port), 1)
    }

    /// Resets every open connection now. New connections are forwarded.
    pub fn cut_all(&self) {
        let connections = std::mem::take(&mut self.shared.state().connections);
        for connection in connections {
            connection.reset();
        }
        self.shared.changed.notify_all();
    }

    /// Resets the open connections whose client end is one of `client_ports`
    /// (the ports of the client's own sockets), and no other: one process's
    /// connections break, its neighbours' stay up. Returns how many were
    /// reset.
    pub fn cut_clients(&self, client_ports: &[u16]) -> usize {
        let cut: Vec<_> = {
            let mut state = self.shared.state();
            let (cut, kept) = std::mem::take(&mut state.connections)
                .into_iter()
                .partition(|connection: &Arc<Connection>| {
                    connection
                        .client
                        .peer_addr()
                        .is_ok_and(|peer| client_ports.contains(&peer.port()))
                });
            state.connections = kept;
            cut
        };
        for connection in &cut {
            connection.reset();
        }
        self.shared.changed.notify_all();
        cut.len()
    }

    /// The local ports of the proxy's own connections to the upstream server
    /// that carry the clients whose ports are `client_ports`: what to cut to
    /// silence the hop's upstream while the hop itself stays up (the server
    /// sees these ports as its clients').
    pub fn upstream_ports_of(&self, client_ports: &[u16]) -> Vec<u16> {
        self.shared
            .state()
            .connections
            .iter()
            .filter(|connection| {
                connection
                    .client
                    .peer_addr()
                    .is_ok_and(|peer| client_ports.contains(&peer.port()))
            })
            .filter_map(|connection| connection.server.local_addr().ok())
            .map(|address| address.port())
            .collect()
    }

    /// Forwards the next chunk any client sends, then drops the server's
    /// reply and resets that connection: the server ran the request, the
    /// client never hears. One-shot.
    pub fn cut_after_next_request(&self) {
        self.shared.state().cut_after_request = true;
    }

    /// Holds back every server→client chunk by `delay` from now on
    /// (`Duration::ZERO` to stop delaying).
    pub fn delay_replies(&self, delay: Duration) {
        self.shared.state().reply_delay = delay;
    }

    /// Stops forwarding in both directions, on open and new connections,
    /// until [`restore`](Self::restore). Connections stay open.
    pub fn blackhole(&self) {
        self.shared.state().blackholed = true;
    }

    /// Ends a [`blackhole`](Self::blackhole) (held bytes are delivered now)
    /// and any reply delay.
    pub fn restore(&self) {
        let mut state = self.shared.state();
        state.blackholed = false;
        state.reply_delay = Duration::ZERO;
        drop(state);
        self.shared.changed.notify_all();
    }

    /// How many connections are open through the proxy.
    pub fn open_connections(&self) -> usize {
        self.shared.state().connections.len()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        // Wake the acceptor so it sees `stopped`.
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
        self.cut_all();
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits while the proxy is blackholed; false if `connection` was cut
    /// meanwhile.
    fn wait_while_blackholed(&self, connection: &Connection) -> bool {
        let mut state = self.state();
        while state.blackholed && !connection.is_cut() {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        !connection.is_cut()
    }

    fn forget(&self, connection: &Arc<Connection>) {
        self.state()
            .connections
            .retain(|open| !Arc::ptr_eq(open, connection));
    }
}

impl Connection {
    fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }

    /// Resets both sides: `SO_LINGER` 0 makes the final close send RST
    /// instead of FIN, and `shutdown(Read)` wakes both pumps' blocked reads
    /// without sending anything, so they exit and drop their handles.
    fn reset(&self) {
        if self.cut.swap(true, Ordering::SeqCst) {
            return;
        }
        for stream in [&self.client, &self.server] {
            set_linger_zero(stream);
            let _ = stream.shutdown(Shutdown::Read);
        }
    }
}

fn set_linger_zero(stream: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid fd and a correctly sized, initialised option value.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

fn accept_loop(listener: TcpListener, upstream: u16, shared: &Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, upstream));
        let Ok(server) = TcpStream::connect(upstream) else {
            // The server is down: the client sees its connection reset.
            set_linger_zero(&client);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (Ok(client_read), Ok(server_read)) = (client.try_clone(), server.try_clone()) else {
            continue;
        };
        let connection = Arc::new(Connection {
            client,
            server,
            cut: AtomicBool::new(false),
            cut_on_reply: AtomicBool::new(false),
        });
        shared.state().connections.push(connection.clone());
        let (requests, replies) = (connection.clone(), connection);
        let (shared_requests, shared_replies) = (shared.clone(), shared.clone());
        thread::spawn(move || pump_requests(client_read, &requests, &shared_requests));
        thread::spawn(move || pump_replies(server_read, &replies, &shared_replies));
    }
}

/// Client → server.
fn pump_requests(mut from: TcpStream, connection: &Arc<Connection>, shared: &Shared) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        if !shared.wait_while_blackholed(connection) {
            break;
        }
        let read = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if !shared.wait_while_blackholed(connection) {
            break;
        }
        if std::mem::take(&mut shared.state().cut_after_request) {
            connection.cut_on_reply.store(true, Ordering::SeqCst);
        }
        if (&connection.server).write_all(&buffer[..read]).is_err() {
            break;
        }
    }
    finish(connection, shared);
}

/// Server → client.
fn pump_replies(mut from: TcpStream, connection: &Arc<Connection>, shared: &Shared) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        if !shared.wait_while_blackholed(connection) {
            break;
        }
        let read = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if connection.cut_on_reply.load(Ordering::SeqCst) {
            // The server answered: drop the answer, reset the connection.
            break;
        }
        let delay = shared.state().reply_delay;
        if !delay.is_zero() {
            thread::sleep(delay);
        }
        if !shared.wait_while_blackholed(connection) {
            break;
        }
        if (&connection.client).write_all(&buffer[..read]).is_err() {
            break;
        }
    }
    finish(connection, shared);
}

/// Either side ended (or the connection was cut): reset both.
fn finish(connection: &Arc<Connection>, shared: &Shared) {
    connection.reset();
    shared.forget(connection);
    shared.changed.notify_all();
}
