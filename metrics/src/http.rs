//! The `/metrics` endpoint: a small HTTP/1.1 server on threads of its own.
//!
//! It answers `GET /metrics` (and `HEAD`) with the registry encoded at that moment, in
//! OpenMetrics text when the `Accept` header asks for `application/openmetrics-text`, else in
//! the Prometheus text format 0.0.4; anything else gets 404 or 405. Each connection is closed
//! after its answer.
//!
//! One thread accepts, and each connection is served on a thread of its own, so a client that
//! is slow or says nothing never delays another's scrape. Every resource stays bounded: at most
//! [`MAX_CONNECTIONS`] connections (and threads) at once; a request head is bounded
//! ([`MAX_REQUEST_BYTES`]) and must arrive within [`REQUEST_DEADLINE`], and the answer must be
//! taken within [`WRITE_DEADLINE`]. A connection beyond the cap takes the place of the oldest
//! one still waiting for its request head, which is closed; if every connection is being
//! answered, the new one is closed at once. Answers are encoded one at a time, so however many
//! clients scrape at once the endpoint takes no more CPU from the process's other threads than
//! one scrape after another would.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;

/// Largest request head read; a longer one is answered 431.
pub const MAX_REQUEST_BYTES: usize = 8192;
/// Time a client has to send its whole request head.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
/// Time a client has to take the whole answer.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(5);
/// How long what a client still sends after an answer to a request not read to its end (431)
/// is read and discarded, so that its connection is closed rather than reset.
const LINGER: Duration = Duration::from_secs(1);
/// Connections served at once, each on a thread with a request buffer of
/// [`MAX_REQUEST_BYTES`]. A Prometheus server scrapes over one at a time; the rest is room for
/// a few more scrapers (`netdam top`, `curl`) beside clients that hold a connection and say
/// nothing, which newer connections displace anyway.
pub const MAX_CONNECTIONS: usize = 8;
/// How long a new connection waits for the one it displaced to let go of its place (its
/// thread wakes as soon as its socket is shut down, so this is only a bound).
const DISPLACE_WAIT: Duration = Duration::from_millis(500);
/// How long stopping the server waits for its connections' threads, their sockets shut down.
const STOP_WAIT: Duration = Duration::from_secs(2);
/// Pause after a failed accept (out of file descriptors, say), so that the accepting thread
/// does not spin on an error that persists.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

const _: () = assert!(MAX_CONNECTIONS >= 2, "a scrape needs a place beside a connection being answered");

/// `Content-Type` of an OpenMetrics answer.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// `Content-Type` of a Prometheus text answer.
pub const PROMETHEUS_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// A running `/metrics` endpoint; dropping it stops its threads.
#[derive(Debug)]
pub struct MetricsServer {
    local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    connections: Arc<Connections>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `addr` and serves `registry` from threads named `thread_name`.
    pub fn start(addr: SocketAddr, registry: Registry, thread_name: &str) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        let local_addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let connections = Arc::new(Connections::default());
        let table = connections.clone();
        // The lock makes scrapes encode one after another (see the module's comment).
        let registry = Arc::new(Mutex::new(registry));
        let name = thread_name.to_string();
        let thread = std::thread::Builder::new().name(name.clone()).spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::Relaxed) {
                    break;
                }
                let stream = match stream {
                    Ok(stream) => stream,
                    Err(error) => {
                        tracing::debug!(%error, "metrics accept failed");
                        std::thread::sleep(ACCEPT_ERROR_PAUSE);
                        continue;
                    }
                };
                // Without a place the stream is dropped here: the client sees its connection closed.
                let Some(place) = Place::take(&table, &stream) else {
                    tracing::debug!("metrics connection refused: every place is taken by one being answered");
                    continue;
                };
                let registry = registry.clone();
                // If the thread cannot start, the closure and the place in it are dropped: the
                // place is given back and the connection closed.
                let spawned = std::thread::Builder::new().name(name.clone()).spawn(move || {
                    if let Err(error) = serve_connection(stream, &place, &registry) {
                        tracing::debug!(%error, "metrics request failed");
                    }
                });
                if let Err(error) = spawned {
                    tracing::debug!(%error, "cannot start a thread for a metrics connection");
                }
            }
        })?;
        Ok(MetricsServer { local_addr, stop, connections, thread: Some(thread) })
    }

    /// The address it serves on (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The scrape URL.
    pub fn url(&self) -> String {
        format!("http://{}/metrics", self.local_addr)
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept: a connection of our own, which the loop sees after the flag.
        let _ = TcpStream::connect_timeout(&self.local_addr, Duration::from_secs(1));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // No connection is admitted any more: end those open and wait for their threads.
        self.connections.close_all(STOP_WAIT);
    }
}

/// Where a connection is in its exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for its request head, for up to [`REQUEST_DEADLINE`]: a newer connection may
    /// take its place.
    ReadingHead,
    /// Its answer is being encoded or written, for up to [`WRITE_DEADLINE`]: it keeps its place.
    Answering,
    /// Its socket was shut down by the server; its thread is ending.
    Closing,
}

/// One open connection, served by its own thread.
#[derive(Debug)]
struct Connection {
    /// Order of acceptance: the smallest is the oldest.
    id: u64,
    phase: Phase,
    /// A handle on the connection's socket, to shut it down and so wake its thread.
    socket: TcpStream,
}

#[derive(Debug, Default)]
struct Table {
    /// Never longer than [`MAX_CONNECTIONS`].
    open: Vec<Connection>,
    next_id: u64,
}

/// The connections being served, and a signal for each that ends.
#[derive(Debug, Default)]
struct Connections {
    table: Mutex<Table>,
    released: Condvar,
}

impl Connections {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // Nothing panics while holding the lock, and the table stays consistent if it did.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a place for a new connection on `socket`: a free one, else that of the oldest
    /// connection still waiting for its request head (shut down, and waited for). `None` when
    /// every place is held by a connection being answered.
    fn admit(&self, socket: TcpStream) -> Option<u64> {
        let mut table = self.lock();
        if table.open.len() >= MAX_CONNECTIONS && !table.open.iter().any(|open| open.phase == Phase::Closing) {
            let oldest =
                table.open.iter_mut().filter(|open| open.phase == Phase::ReadingHead).min_by_key(|open| open.id)?;
            oldest.phase = Phase::Closing;
            // Wakes its thread from its read: it sees the end of the stream and gives its place back.
            let _ = oldest.socket.shutdown(Shutdown::Both);
        }
        let deadline = Instant::now() + DISPLACE_WAIT;
        while table.open.len() >= MAX_CONNECTIONS {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            table = self.released.wait_timeout(table, left).unwrap_or_else(PoisonError::into_inner).0;
        }
        let id = table.next_id;
        table.next_id += 1;
        table.open.push(Connection { id, phase: Phase::ReadingHead, socket });
        Some(id)
    }

    /// Marks connection `id` as being answered, so that no newer one displaces it; false if it
    /// was displaced already (its socket is shut down: there is no one to answer).
    fn answering(&self, id: u64) -> bool {
        let mut table = self.lock();
        match table.open.iter_mut().find(|open| open.id == id) {
            Some(open) if open.phase == Phase::ReadingHead => {
                open.phase = Phase::Answering;
                true
            }
            _ => false,
        }
    }

    /// Gives connection `id`'s place back.
    fn release(&self, id: u64) {
        let mut table = self.lock();
        table.open.retain(|open| open.id != id);
        drop(table);
        self.released.notify_all();
    }

    /// Shuts every open connection down and waits up to `wait` for their threads to end.
    fn close_all(&self, wait: Duration) {
        let mut table = self.lock();
        for open in &mut table.open {
            open.phase = Phase::Closing;
            let _ = open.socket.shutdown(Shutdown::Both);
        }
        let deadline = Instant::now() + wait;
        while !table.open.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::debug!(open = table.open.len(), "metrics connections still open when the server stopped");
                return;
            }
            table = self.released.wait_timeout(table, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// Connections open now.
    #[cfg(test)]
    fn open(&self) -> usize {
        self.lock().open.len()
    }
}

/// A connection's place in [`Connections`], given back when dropped (whether its thread ends,
/// panics, or never starts).
#[derive(Debug)]
struct Place {
    connections: Arc<Connections>,
    id: u64,
}

impl Place {
    /// A place for the connection on `stream`, if one is free or can be freed.
    fn take(connections: &Arc<Connections>, stream: &TcpStream) -> Option<Place> {
        let socket = stream.try_clone().ok()?;
        let id = connections.admit(socket)?;
        Some(Place { connections: connections.clone(), id })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.connections.release(self.id);
    }
}

/// Which text format an answer is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4.
    Prometheus,
    /// OpenMetrics text 1.0.0.
    OpenMetrics,
}

/// The format an `Accept` header asks for: OpenMetrics if it names it (with a non-zero q),
/// else Prometheus text.
pub fn negotiate(accept: Option<&str>) -> Format {
    let Some(accept) = accept else { return Format::Prometheus };
    let wants_openmetrics = accept.split(',').any(|range| {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("");
        let refused = parts.any(|parameter| {
            parameter.strip_prefix("q=").and_then(|q| q.trim().parse::<f64>().ok()).is_some_and(|q| q <= 0.0)
        });
        media.eq_ignore_ascii_case("application/openmetrics-text") && !refused
    });
    if wants_openmetrics {
        Format::OpenMetrics
    } else {
        Format::Prometheus
    }
}

/// Encodes `registry` in `format`.
pub fn encode(registry: &Registry, format: Format) -> Result<String, std::fmt::Error> {
    let mut body = String::with_capacity(64 * 1024);
    match format {
        Format::Prometheus => prometheus_client::encoding::prometheus_text::encode(&mut body, registry)?,
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut body, registry)?,
    }
    Ok(body)
}

/// A parsed request head: what the endpoint needs of it.
#[derive(Debug, PartialEq, Eq)]
struct RequestHead {
    method: String,
    path: String,
    accept: Option<String>,
}

fn parse_head(head: &str) -> Option<RequestHead> {
    // Lines end at LF, a CR before it dropped (RFC 7230 §3.5 lets a server accept a bare LF).
    let mut lines = head.lines();
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_string();
    let target = request_line.next()?;
    let version = request_line.next()?;
    if !version.starts_with("HTTP/1.") || request_line.next().is_some() {
        return None;
    }
    let path = target.split('?').next().unwrap_or("").to_string();
    let accept = lines
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("accept"))
        .map(|(_, value)| value.trim().to_string());
    Some(RequestHead { method, path, accept })
}

/// Where the head in `bytes` ends: before its blank line, whose line ends may be CRLF or a
/// bare LF (RFC 7230 §3.5), or `None` while no blank line has arrived.
fn head_end(bytes: &[u8]) -> Option<usize> {
    let blank_line = |at: usize| bytes[at + 1..].starts_with(b"\n") || bytes[at + 1..].starts_with(b"\r\n");
    let line_end = (0..bytes.len()).find(|&at| bytes[at] == b'\n' && blank_line(at))?;
    Some(if line_end > 0 && bytes[line_end - 1] == b'\r' { line_end - 1 } else { line_end })
}

/// Reads the head (up to the blank line) within the deadline and the size bound.
fn read_head(stream: &mut TcpStream) -> io::Result<Result<String, u16>> {
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut buffer = [0u8; MAX_REQUEST_BYTES];
    let mut len = 0;
    loop {
        if let Some(end) = head_end(&buffer[..len]) {
            return Ok(std::str::from_utf8(&buffer[..end]).map(str::to_string).map_err(|_| 400));
        }
        if len == buffer.len() {
            return Ok(Err(431));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "request head not complete in time"));
        }
        stream.set_read_timeout(Some(left))?;
        let read = stream.read(&mut buffer[len..])?;
        if read == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed before a request head"));
        }
        len += read;
    }
}

fn serve_connection(mut stream: TcpStream, place: &Place, registry: &Mutex<Registry>) -> io::Result<()> {
    let head = read_head(&mut stream)?;
    if !place.connections.answering(place.id) {
        return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "displaced by a newer connection"));
    }
    let head = match head {
        Ok(head) => head,
        Err(code) => {
            respond(&mut stream, code, "text/plain; charset=utf-8", b"bad request\n", true)?;
            return close_unread(&mut stream);
        }
    };
    let Some(head) = parse_head(&head) else {
        return respond(&mut stream, 400, "text/plain; charset=utf-8", b"bad request\n", true);
    };
    if head.path != "/metrics" {
        return respond(&mut stream, 404, "text/plain; charset=utf-8", b"not found: try /metrics\n", true);
    }
    let with_body = match head.method.as_str() {
        "GET" => true,
        "HEAD" => false,
        _ => return respond(&mut stream, 405, "text/plain; charset=utf-8", b"method not allowed\n", true),
    };
    let format = negotiate(head.accept.as_deref());
    let content_type = match format {
        Format::Prometheus => PROMETHEUS_CONTENT_TYPE,
        Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
    };
    // Encoded under the lock, written without it: a slow reader holds only its own connection.
    let encoded = encode(&registry.lock().unwrap_or_else(PoisonError::into_inner), format);
    match encoded {
        Ok(body) => respond(&mut stream, 200, content_type, body.as_bytes(), with_body),
        Err(_) => respond(&mut stream, 500, "text/plain; charset=utf-8", b"cannot encode the metrics\n", true),
    }
}

fn respond(stream: &mut TcpStream, code: u16, content_type: &str, body: &[u8], with_body: bool) -> io::Result<()> {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Internal Server Error",
    };
    let allow = if code == 405 { "Allow: GET, HEAD\r\n" } else { "" };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        body.len()
    );
    let deadline = Instant::now() + WRITE_DEADLINE;
    write_before(stream, head.as_bytes(), deadline)?;
    if with_body {
        write_before(stream, body, deadline)?;
    }
    Ok(())
}

/// Ends a connection answered before its request was read to its end: the write side first,
/// then what the client still sends is read and discarded until it closes its side, for at
/// most [`LINGER`]. A socket closed with bytes unread is reset, not closed, and a client still
/// sending its request (a long head sent in pieces) then fails on its next send and
/// never reads the answer.
fn close_unread(stream: &mut TcpStream) -> io::Result<()> {
    stream.shutdown(Shutdown::Write)?;
    let deadline = Instant::now() + LINGER;
    let mut discarded = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut discarded) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return Ok(()),
            Err(error) => return Err(error),
        }
    }
}

/// Writes all of `bytes` unless `deadline` passes first (a client that reads a byte at a time
/// cannot hold the endpoint longer).
fn write_before(stream: &mut TcpStream, mut bytes: &[u8], deadline: Instant) -> io::Result<()> {
    while !bytes.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the client did not take the answer in time"));
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(bytes) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "the connection closed")),
            Ok(written) => bytes = &bytes[written..],
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// A blocking `GET` of `url` (`http://HOST:PORT/PATH`) with `accept`, for tests and
/// `netdam top`: returns the status code, the content type and the body.
pub fn get(url: &str, accept: Option<&str>, timeout: Duration) -> io::Result<(u16, String, String)> {
    let invalid = |message: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{url}: {message}"));
    let rest = url.strip_prefix("http://").ok_or_else(|| invalid("only http:// URLs are supported"))?;
    let (host, path) = match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, "/"),
    };
    let addr = std::net::ToSocketAddrs::to_socket_addrs(host)
        .map_err(|error| invalid(&format!("cannot resolve {host}: {error}")))?
        .next()
        .ok_or_else(|| invalid("the host has no address"))?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let accept = accept.map(|accept| format!("Accept: {accept}\r\n")).unwrap_or_default();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {host}\r\n{accept}Connection: close\r\n\r\n")?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let answer = String::from_utf8(answer).map_err(|_| invalid("the answer is not UTF-8"))?;
    let (head, body) = answer.split_once("\r\n\r\n").ok_or_else(|| invalid("the answer has no head"))?;
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| invalid("the answer has no status code"))?;
    let content_type = head
        .split("\r\n")
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-type"))
        .map(|(_, value)| value.trim().to_string())
        .unwrap_or_default();
    Ok((code, content_type, body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    #[test]
    fn accept_header_chooses_the_format() {
        assert_eq!(negotiate(None), Format::Prometheus);
        assert_eq!(negotiate(Some("*/*")), Format::Prometheus);
        assert_eq!(negotiate(Some("text/plain;version=0.0.4;q=0.5,*/*;q=0.1")), Format::Prometheus);
        // What Prometheus 2.42 sends.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(negotiate(Some("application/openmetrics-text; q=0")), Format::Prometheus);
    }

    #[test]
    fn request_heads_parse() {
        let head = parse_head("GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\naccept: text/plain").unwrap();
        assert_eq!(head.method, "GET");
        assert_eq!(head.path, "/metrics");
        assert_eq!(head.accept.as_deref(), Some("text/plain"));
        assert_eq!(parse_head("GET /metrics"), None);
        assert_eq!(parse_head("GET /metrics SPDY/3 extra"), None);
        assert_eq!(parse_head(""), None);
        // Bare LF line ends, as RFC 7230 §3.5 lets a server accept.
        let head = parse_head("GET /metrics HTTP/1.1\nHost: a\nAccept: text/plain").unwrap();
        assert_eq!((head.path.as_str(), head.accept.as_deref()), ("/metrics", Some("text/plain")));
    }

    #[test]
    fn a_head_ends_at_a_blank_line_of_crlf_or_bare_lf() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"), Some(23));
        assert_eq!(head_end(b"GET / HTTP/1.1\nHost: a\n\n"), Some(22));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\n\r\n"), Some(23));
        assert_eq!(head_end(b"GET / HTTP/1.1\nHost: a\r\n\n"), Some(22));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n"), None, "no blank line yet");
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n\r"), None);
        assert_eq!(head_end(b""), None);
    }

    fn test_server() -> MetricsServer {
        let mut registry = Registry::default();
        let counter: Counter = Counter::default();
        counter.inc_by(3);
        registry.register("netdam_test_events", "Events for the test", counter);
        MetricsServer::start("127.0.0.1:0".parse().unwrap(), registry, "metrics-test").unwrap()
    }

    /// Whether the server closed `stream` within `wait` (end of stream, or a reset).
    fn closed_within(stream: &mut TcpStream, wait: Duration) -> bool {
        stream.set_read_timeout(Some(wait)).unwrap();
        let mut byte = [0u8; 1];
        match stream.read(&mut byte) {
            Ok(0) => true,
            Err(error) => error.kind() == io::ErrorKind::ConnectionReset,
            Ok(_) => panic!("the server sent bytes to a client that asked nothing"),
        }
    }

    #[test]
    fn idle_connections_do_not_delay_a_scrape() {
        const IDLE: u32 = 6;
        let server = test_server();
        let idle: Vec<TcpStream> = (0..IDLE).map(|_| TcpStream::connect(server.local_addr()).unwrap()).collect();
        let started = Instant::now();
        let (code, _, body) = get(&server.url(), None, Duration::from_secs(30)).unwrap();
        let elapsed = started.elapsed();
        assert_eq!(code, 200);
        assert!(body.contains("\nnetdam_test_events_total 3\n"), "{body}");
        // Served one after another, the idle connections would hold the scrape for
        // IDLE × REQUEST_DEADLINE (12 s). Served beside them it waits for none of them; the
        // bound leaves a loaded machine seconds to spare and is still far below 12 s.
        assert!(
            elapsed < REQUEST_DEADLINE * 2,
            "a scrape behind {IDLE} idle connections took {elapsed:?} (each may hold a connection {REQUEST_DEADLINE:?})"
        );
        // The idle connections still get only REQUEST_DEADLINE to send a request.
        for mut connection in idle {
            assert!(closed_within(&mut connection, REQUEST_DEADLINE * 5), "an idle connection outlived its deadline");
        }
        assert!(started.elapsed() < REQUEST_DEADLINE * 5);
    }

    #[test]
    fn connections_beyond_the_cap_displace_the_oldest_silent_ones() {
        const EXTRA: usize = 3;
        let server = test_server();
        let connected = Instant::now();
        let mut silent: Vec<TcpStream> =
            (0..MAX_CONNECTIONS + EXTRA).map(|_| TcpStream::connect(server.local_addr()).unwrap()).collect();
        // The oldest lose their places as the newest arrive: closed at once, not at their deadline.
        for displaced in &mut silent[..EXTRA] {
            assert!(closed_within(displaced, REQUEST_DEADLINE * 5), "a silent connection was never closed");
        }
        assert!(
            connected.elapsed() < REQUEST_DEADLINE,
            "the oldest silent connections were closed after {:?}, not as newer ones took their places",
            connected.elapsed()
        );
        assert!(server.connections.open() <= MAX_CONNECTIONS, "{} connections open", server.connections.open());
        // A scrape finds a place among them and is answered at once.
        let started = Instant::now();
        let (code, _, _) = get(&server.url(), None, Duration::from_secs(30)).unwrap();
        assert_eq!(code, 200);
        assert!(started.elapsed() < REQUEST_DEADLINE * 2, "the scrape took {:?}", started.elapsed());
        assert!(server.connections.open() <= MAX_CONNECTIONS);
        drop(server);
    }

    #[test]
    fn a_connection_beyond_the_cap_is_refused_at_once_when_every_place_is_answering() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // The listener's backlog completes the connections; nothing accepts them.
        let streams: Vec<TcpStream> = (0..=MAX_CONNECTIONS).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let connections = Connections::default();
        let ids: Vec<u64> = streams[..MAX_CONNECTIONS]
            .iter()
            .map(|stream| connections.admit(stream.try_clone().unwrap()).expect("a free place"))
            .collect();
        assert!(ids.iter().all(|&id| connections.answering(id)));
        let started = Instant::now();
        assert_eq!(connections.admit(streams[MAX_CONNECTIONS].try_clone().unwrap()), None);
        assert!(started.elapsed() < DISPLACE_WAIT, "refused after {:?}", started.elapsed());
        assert_eq!(connections.open(), MAX_CONNECTIONS);
        // An answered connection gives its place back, and the next one gets it.
        connections.release(ids[0]);
        assert!(connections.admit(streams[MAX_CONNECTIONS].try_clone().unwrap()).is_some());
        assert_eq!(connections.open(), MAX_CONNECTIONS);
    }

    /// Sends `request` on a new connection to `server` in two pieces 200 ms apart (as a
    /// client may send a long head), then reads the answer to its end.
    fn exchange_in_two_pieces(server: &MetricsServer, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(server.local_addr()).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let (first, second) = request.split_at(request.len() / 2);
        stream.write_all(first).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        stream.write_all(second).expect("the rest of the request was taken");
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).expect("the answer was read to its end");
        String::from_utf8(answer).unwrap()
    }

    #[test]
    fn a_head_with_bare_lf_line_ends_is_answered() {
        let server = test_server();
        let answer = exchange_in_two_pieces(&server, b"GET /metrics HTTP/1.1\nHost: x\nAccept: text/plain\n\n");
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.contains("\nnetdam_test_events_total 3\n"), "{answer}");
    }

    #[test]
    fn a_head_too_long_is_answered_431_not_reset() {
        let server = test_server();
        let mut request = b"GET /metrics HTTP/1.1\r\nX-Long: ".to_vec();
        request.extend([b'a'; 20 << 10]);
        request.extend(b"\r\n\r\n");
        let answer = exchange_in_two_pieces(&server, &request);
        assert!(answer.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"), "{answer}");
    }

    #[test]
    fn serves_both_formats_404_and_survives_bad_clients() {
        let server = test_server();
        let timeout = Duration::from_secs(5);

        // A client that connects and says nothing, and one that sends garbage without end.
        let _silent = TcpStream::connect(server.local_addr()).unwrap();
        let mut flood = TcpStream::connect(server.local_addr()).unwrap();
        let _ = flood.write_all(&[b'x'; MAX_REQUEST_BYTES + 10]);

        let started = Instant::now();
        let (code, content_type, body) = get(&server.url(), None, timeout).unwrap();
        assert!(started.elapsed() < Duration::from_secs(5), "a silent client held the endpoint");
        assert_eq!(code, 200);
        assert_eq!(content_type, PROMETHEUS_CONTENT_TYPE);
        assert!(body.contains("# TYPE netdam_test_events_total counter\n"), "{body}");
        assert!(body.contains("\nnetdam_test_events_total 3\n"), "{body}");
        assert!(!body.contains("# EOF"));

        let (code, content_type, body) =
            get(&server.url(), Some("application/openmetrics-text;version=1.0.0"), timeout).unwrap();
        assert_eq!(code, 200);
        assert_eq!(content_type, OPENMETRICS_CONTENT_TYPE);
        assert!(body.contains("# TYPE netdam_test_events counter\n"), "{body}");
        assert!(body.contains("\nnetdam_test_events_total 3\n"), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");

        let url = format!("http://{}/other", server.local_addr());
        assert_eq!(get(&url, None, timeout).unwrap().0, 404);
        drop(server);
    }
}
