//! The `/metrics` endpoint: a small HTTP/1.1 server on a thread of its own.
//!
//! It answers `GET /metrics` (and `HEAD`) with the registry encoded at that moment, in
//! OpenMetrics text when the `Accept` header asks for `application/openmetrics-text`, else in
//! the Prometheus text format 0.0.4; anything else gets 404 or 405. One connection at a time,
//! each closed after its answer: a scrape every few seconds needs no more. A request head is
//! bounded ([`MAX_REQUEST_BYTES`]) and must arrive within [`REQUEST_DEADLINE`], and the answer
//! must be taken within [`WRITE_DEADLINE`], so a slow or broken client delays the next scrape by
//! at most a few seconds and never blocks the endpoint.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;

/// Largest request head read; a longer one is answered 431.
pub const MAX_REQUEST_BYTES: usize = 8192;
/// Time a client has to send its whole request head.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
/// Time a client has to take the whole answer.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(5);

/// `Content-Type` of an OpenMetrics answer.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// `Content-Type` of a Prometheus text answer.
pub const PROMETHEUS_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// A running `/metrics` endpoint; dropping it stops the thread.
#[derive(Debug)]
pub struct MetricsServer {
    local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `addr` and serves `registry` from a thread named `thread_name`.
    pub fn start(addr: SocketAddr, registry: Registry, thread_name: &str) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        let local_addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new().name(thread_name.to_string()).spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                if let Err(error) = serve_connection(stream, &registry) {
                    tracing::debug!(%error, "metrics request failed");
                }
            }
        })?;
        Ok(MetricsServer { local_addr, stop, thread: Some(thread) })
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
    let mut lines = head.split("\r\n");
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

/// Reads the head (up to the blank line) within the deadline and the size bound.
fn read_head(stream: &mut TcpStream) -> io::Result<Result<String, u16>> {
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut buffer = [0u8; MAX_REQUEST_BYTES];
    let mut len = 0;
    loop {
        if let Some(end) = buffer[..len].windows(4).position(|window| window == b"\r\n\r\n") {
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

fn serve_connection(mut stream: TcpStream, registry: &Registry) -> io::Result<()> {
    let head = match read_head(&mut stream)? {
        Ok(head) => head,
        Err(code) => return respond(&mut stream, code, "text/plain; charset=utf-8", b"bad request\n", true),
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
    match encode(registry, format) {
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
    }

    #[test]
    fn serves_both_formats_404_and_survives_bad_clients() {
        let mut registry = Registry::default();
        let counter: Counter = Counter::default();
        counter.inc_by(3);
        registry.register("netdam_test_events", "Events for the test", counter);
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), registry, "metrics-test").unwrap();
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
