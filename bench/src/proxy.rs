//! A fault-injecting UDP proxy for integration tests on real sockets: it relays datagrams between
//! initiators and a target, losing, duplicating and reordering them with seeded probabilities in
//! both directions.
//!
//! Each initiator address gets its own upstream socket, so the target sees one source per
//! initiator, as without the proxy. Reordering holds a datagram back for `reorder_delay` while
//! later ones pass. Everything the proxy did is counted.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use netdam_isa::rng::Rng;

/// The seed of a fault test: `NETDAM_SEED` when set (to replay a failure), else the clock;
/// printed as `SEED=...` so that a failing run can be replayed.
pub fn test_seed() -> u64 {
    let seed = std::env::var("NETDAM_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    println!("SEED={seed}");
    seed
}

/// Fault probabilities, applied to each datagram in each direction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    /// Probability of dropping a datagram.
    pub loss: f64,
    /// Probability of sending it twice.
    pub duplicate: f64,
    /// Probability of holding it back while later ones pass.
    pub reorder: f64,
    /// How long a reordered datagram is held.
    pub reorder_delay: Duration,
    /// Seed of every random choice.
    pub seed: u64,
}

/// What the proxy did, by the time it stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyCounts {
    /// Datagrams received from either side.
    pub received: u64,
    /// Datagrams dropped on purpose.
    pub dropped: u64,
    /// Extra copies sent.
    pub duplicated: u64,
    /// Datagrams held back.
    pub reordered: u64,
}

/// A running proxy.
pub struct Proxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<io::Result<ProxyCounts>>,
}

/// Initiators a proxy relays for at most.
const MAX_CLIENTS: usize = 64;
/// Datagrams held for reordering at most.
const MAX_HELD: usize = 1024;

impl Proxy {
    /// Starts relaying from a fresh loopback port to `target`.
    pub fn start(target: SocketAddr, faults: Faults) -> io::Result<Proxy> {
        let front = UdpSocket::bind("127.0.0.1:0")?;
        front.set_nonblocking(true)?;
        let addr = front.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("netdam-proxy".to_string())
            .spawn(move || relay(front, target, faults, &stop_flag))?;
        Ok(Proxy { addr, stop, thread })
    }

    /// Where initiators send to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops relaying and returns the counts.
    pub fn stop(self) -> io::Result<ProxyCounts> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().map_err(|_| io::Error::other("proxy thread panicked"))?
    }
}

/// Where a datagram goes: back to an initiator through the front socket, or upstream through
/// the initiator's own socket.
#[derive(Debug, Clone, Copy)]
enum Route {
    ToInitiator(SocketAddr),
    ToTarget(usize),
}

fn relay(front: UdpSocket, target: SocketAddr, faults: Faults, stop: &AtomicBool) -> io::Result<ProxyCounts> {
    let mut rng = Rng::new(faults.seed);
    let mut counts = ProxyCounts::default();
    let mut upstream: Vec<(SocketAddr, UdpSocket)> = Vec::new();
    let mut by_client: HashMap<SocketAddr, usize> = HashMap::new();
    let mut held: VecDeque<(Instant, Route, Vec<u8>)> = VecDeque::new();
    let mut buffer = vec![0u8; 65_536];
    let send = |route: Route, bytes: &[u8], upstream: &[(SocketAddr, UdpSocket)]| {
        // A full socket buffer is one more loss; the transport recovers it like any other.
        let _ = match route {
            Route::ToInitiator(addr) => front.send_to(bytes, addr),
            Route::ToTarget(index) => upstream[index].1.send(bytes),
        };
    };
    while !stop.load(Ordering::Relaxed) {
        let mut fds = vec![libc::pollfd { fd: front.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        fds.extend(upstream.iter().map(|(_, socket)| libc::pollfd {
            fd: socket.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
        let wait_ms = if held.is_empty() { 10 } else { 1 };
        // SAFETY: a valid array of pollfds of the stated length.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait_ms) };
        let now = Instant::now();
        let mut arrived: Vec<(Route, Vec<u8>)> = Vec::new();
        while let Ok((len, from)) = front.recv_from(&mut buffer) {
            let index = match by_client.get(&from) {
                Some(index) => *index,
                None if upstream.len() < MAX_CLIENTS => {
                    let socket = UdpSocket::bind("127.0.0.1:0")?;
                    socket.connect(target)?;
                    socket.set_nonblocking(true)?;
                    upstream.push((from, socket));
                    by_client.insert(from, upstream.len() - 1);
                    upstream.len() - 1
                }
                None => continue,
            };
            arrived.push((Route::ToTarget(index), buffer[..len].to_vec()));
        }
        for (client, socket) in &upstream {
            while let Ok(len) = socket.recv(&mut buffer) {
                arrived.push((Route::ToInitiator(*client), buffer[..len].to_vec()));
            }
        }
        for (route, bytes) in arrived {
            counts.received += 1;
            if rng.chance(faults.loss) {
                counts.dropped += 1;
                continue;
            }
            let copies = if rng.chance(faults.duplicate) {
                counts.duplicated += 1;
                2
            } else {
                1
            };
            for _ in 0..copies {
                if held.len() < MAX_HELD && rng.chance(faults.reorder) {
                    counts.reordered += 1;
                    held.push_back((now + faults.reorder_delay, route, bytes.clone()));
                } else {
                    send(route, &bytes, &upstream);
                }
            }
        }
        while held.front().is_some_and(|(release, _, _)| *release <= now) {
            let (_, route, bytes) = held.pop_front().expect("checked");
            send(route, &bytes, &upstream);
        }
    }
    Ok(counts)
}
