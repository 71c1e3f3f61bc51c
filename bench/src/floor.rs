//! The floor: a raw UDP echo with the same thread layout and polling as netdam, answering with a
//! datagram of the same size netdam would. No protocol, no work: the least any UDP request/response
//! protocol can cost on this machine.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// An echo server thread on loopback.
pub struct EchoServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl EchoServer {
    /// Starts the server; `busy` spins on a non-blocking socket, otherwise it blocks.
    pub fn start(busy: bool, response_bytes: usize) -> EchoServer {
        let socket = server_socket(busy);
        let addr = socket.local_addr().expect("echo address");
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buffer = vec![0u8; 65_536];
            let response = vec![0x5Au8; response_bytes];
            while !stop_flag.load(Ordering::Relaxed) {
                match socket.recv_from(&mut buffer) {
                    Ok((_, from)) => {
                        let _ = socket.send_to(&response, from);
                    }
                    Err(_) => std::hint::spin_loop(),
                }
            }
        });
        EchoServer { addr, stop, thread }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops and joins the thread.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// A server's socket on loopback: non-blocking when it is `busy` (the server spins), otherwise
/// blocking for at most 100 ms per receive, so that its loop can see a stop.
pub fn server_socket(busy: bool) -> UdpSocket {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind echo socket");
    ask_for_buffers(&socket);
    if busy {
        socket.set_nonblocking(true).expect("non-blocking echo socket");
    } else {
        socket.set_read_timeout(Some(Duration::from_millis(100))).expect("echo timeout");
    }
    socket
}

/// Socket buffers as large as netdam's target and sessions ask for (4 MiB each way), so a
/// window of large datagrams in flight fits the echo's queues as it fits netdam's; best effort,
/// as for netdam (the kernel caps them at `net.core.{r,w}mem_max`).
fn ask_for_buffers(socket: &UdpSocket) {
    let socket = socket2::SockRef::from(socket);
    let _ = socket.set_recv_buffer_size(4 << 20);
    let _ = socket.set_send_buffer_size(4 << 20);
}

/// A client socket connected to the echo at `addr`: non-blocking when it `spins`, else blocking
/// for at most `timeout` per receive.
pub fn client_socket(addr: SocketAddr, spins: bool, timeout: Duration) -> UdpSocket {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind client socket");
    ask_for_buffers(&socket);
    socket.connect(addr).expect("connect to echo");
    if spins {
        socket.set_nonblocking(true).expect("non-blocking client socket");
    } else {
        socket.set_read_timeout(Some(timeout)).expect("client timeout");
    }
    socket
}

/// Times `requests` round trips of `request_bytes` after `warmup` unmeasured ones.
pub fn measure(addr: SocketAddr, busy: bool, request_bytes: usize, warmup: u64, requests: u64) -> Histogram<u64> {
    measure_with_cpu(addr, busy, request_bytes, warmup, requests).0
}

/// As [`measure`], with the client thread's CPU time per measured round trip (ns).
// Never inlined: `ops/client-instructions.sh` counts instructions from its entry to its exit.
#[inline(never)]
pub fn measure_with_cpu(
    addr: SocketAddr,
    busy: bool,
    request_bytes: usize,
    warmup: u64,
    requests: u64,
) -> (Histogram<u64>, u64) {
    let socket = client_socket(addr, busy, Duration::from_secs(1));
    let request = vec![0xA5u8; request_bytes];
    let mut buffer = vec![0u8; 65_536];
    let mut histogram = crate::histogram();
    let mut cpu_from = crate::thread_cpu_ns();
    for index in 0..warmup + requests {
        if index == warmup {
            cpu_from = crate::thread_cpu_ns();
        }
        let started = Instant::now();
        socket.send(&request).expect("send to echo");
        loop {
            match socket.recv(&mut buffer) {
                Ok(_) => break,
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock && busy => std::hint::spin_loop(),
                Err(error) => panic!("echo did not answer: {error}"),
            }
        }
        if index >= warmup {
            crate::record(&mut histogram, started.elapsed());
        }
    }
    (histogram, (crate::thread_cpu_ns() - cpu_from) / requests.max(1))
}
