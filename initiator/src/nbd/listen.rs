//! Where the NBD server listens: a unix socket or a TCP address, parsed from `unix:PATH` or
//! `tcp:HOST:PORT`, and bound before serving so that callers (and tests) learn the real
//! address, and bind errors surface before anything else starts.

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The usual NBD port, for messages.
pub const NBD_DEFAULT_PORT: u16 = 10809;

/// An address to serve NBD on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A unix socket at this path.
    Unix(PathBuf),
    /// A TCP address.
    Tcp(SocketAddr),
}

/// A listen address that did not parse, with the text at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid NBD listen address {text:?}: {reason} (expected unix:PATH or tcp:HOST:PORT, e.g. tcp:0.0.0.0:{NBD_DEFAULT_PORT})")]
pub struct ParseListenError {
    /// The text given.
    pub text: String,
    /// What is wrong with it.
    pub reason: String,
}

impl FromStr for Listen {
    type Err = ParseListenError;

    /// Parses `unix:PATH` or `tcp:HOST:PORT`. A host name is resolved here (first address);
    /// IPv6 addresses go in brackets: `tcp:[::1]:10809`.
    fn from_str(text: &str) -> Result<Listen, ParseListenError> {
        let error = |reason: String| ParseListenError { text: text.to_string(), reason };
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(error("the socket path is empty".into()));
            }
            return Ok(Listen::Unix(PathBuf::from(path)));
        }
        let Some(address) = text.strip_prefix("tcp:") else {
            return Err(error("unknown scheme".into()));
        };
        if let Ok(address) = SocketAddr::from_str(address) {
            return Ok(Listen::Tcp(address));
        }
        let Some((host, port)) = address.rsplit_once(':') else {
            return Err(error("the port is missing".into()));
        };
        let port: u16 = port.parse().map_err(|_| error(format!("{port:?} is not a port number")))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(error("the host is empty (use 0.0.0.0 or [::] for every address)".into()));
        }
        // The resolver would read "127.0.0" as 127.0.0.0: numeric hosts must be whole addresses.
        if host.parse::<IpAddr>().is_err() && host.chars().all(|c| c.is_ascii_digit() || c == '.' || c == ':') {
            return Err(error(format!("{host:?} is not an IP address (is the port missing?)")));
        }
        let mut resolved =
            (host, port).to_socket_addrs().map_err(|e| error(format!("cannot resolve {host:?}: {e}")))?;
        resolved.next().map(Listen::Tcp).ok_or_else(|| error(format!("{host:?} resolves to no address")))
    }
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Unix(path) => write!(f, "unix:{}", path.display()),
            Listen::Tcp(address) => write!(f, "tcp:{address}"),
        }
    }
}

/// A bound listening socket for [`crate::nbd::serve`]. Binding needs no runtime; serving does.
///
/// A unix socket file left behind by a server that died is removed on bind, but only after a
/// connection attempt shows that nothing listens there, and only if the path is a socket. The
/// file this listener created is removed when it is dropped (at the end of `serve`), unless
/// something else replaced it meanwhile.
#[derive(Debug)]
pub struct NbdListener {
    pub(crate) socket: BoundSocket,
    pub(crate) unix_file: Option<SocketFile>,
}

/// The bound socket, unconverted until a runtime takes it.
#[derive(Debug)]
pub(crate) enum BoundSocket {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl NbdListener {
    /// Binds `listen`. Errors name the address.
    pub fn bind(listen: &Listen) -> io::Result<NbdListener> {
        match listen {
            Listen::Tcp(address) => {
                let listener =
                    TcpListener::bind(address).map_err(|e| context(e, format!("cannot listen on {listen}")))?;
                Ok(NbdListener { socket: BoundSocket::Tcp(listener), unix_file: None })
            }
            Listen::Unix(path) => {
                let listener = bind_unix(path)?;
                let metadata = std::fs::symlink_metadata(path).map_err(|e| {
                    context(
                        e,
                        format!("cannot listen on unix:{}: cannot inspect the socket just bound", path.display()),
                    )
                })?;
                let unix_file = SocketFile { path: path.clone(), device: metadata.dev(), inode: metadata.ino() };
                Ok(NbdListener { socket: BoundSocket::Unix(listener), unix_file: Some(unix_file) })
            }
        }
    }

    /// The TCP address bound (with the real port when 0 was asked for); `None` for unix sockets.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match &self.socket {
            BoundSocket::Tcp(listener) => listener.local_addr().ok(),
            BoundSocket::Unix(_) => None,
        }
    }

    /// The unix socket path; `None` for TCP.
    pub fn unix_path(&self) -> Option<&Path> {
        self.unix_file.as_ref().map(|file| file.path.as_path())
    }

    /// Where clients reach this listener, as a [`Listen`] (TCP with the real port).
    pub fn endpoint(&self) -> Option<Listen> {
        match &self.socket {
            BoundSocket::Tcp(_) => self.local_addr().map(Listen::Tcp),
            BoundSocket::Unix(_) => self.unix_path().map(|path| Listen::Unix(path.to_path_buf())),
        }
    }
}

fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    let shown = path.display();
    match UnixListener::bind(path) {
        Ok(listener) => return Ok(listener),
        Err(error) if error.kind() == io::ErrorKind::AddrInUse => {}
        Err(error) => return Err(context(error, format!("cannot listen on unix:{shown}"))),
    }
    let metadata = std::fs::symlink_metadata(path)
        .map_err(|e| context(e, format!("cannot listen on unix:{shown}: cannot inspect the path")))?;
    if !metadata.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("cannot listen on unix:{shown}: the path exists and is not a socket (not removing it)"),
        ));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("cannot listen on unix:{shown}: another server is listening there"),
        )),
        Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => {
            // A socket file nobody listens on: left behind by a server that died.
            std::fs::remove_file(path).map_err(|e| {
                context(e, format!("cannot listen on unix:{shown}: cannot remove the stale socket there"))
            })?;
            UnixListener::bind(path).map_err(|e| context(e, format!("cannot listen on unix:{shown}")))
        }
        Err(error) => {
            Err(context(error, format!("cannot listen on unix:{shown}: the existing socket is in an unknown state")))
        }
    }
}

/// The socket file a unix listener created, removed on drop if it is still the same file.
#[derive(Debug)]
pub(crate) struct SocketFile {
    path: PathBuf,
    device: u64,
    inode: u64,
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        // Another server may have replaced the file (after removing ours as stale); leave it.
        if let Ok(metadata) = std::fs::symlink_metadata(&self.path) {
            if metadata.dev() == self.device && metadata.ino() == self.inode {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

fn context(error: io::Error, what: String) -> io::Error {
    io::Error::new(error.kind(), format!("{what}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_unix_and_tcp() {
        assert_eq!("unix:/run/nbd.sock".parse(), Ok(Listen::Unix("/run/nbd.sock".into())));
        assert_eq!("tcp:127.0.0.1:10809".parse(), Ok(Listen::Tcp("127.0.0.1:10809".parse().unwrap())));
        assert_eq!("tcp:[::1]:0".parse(), Ok(Listen::Tcp("[::1]:0".parse().unwrap())));
        let Ok(Listen::Tcp(address)) = "tcp:localhost:10809".parse::<Listen>() else { panic!("localhost resolves") };
        assert_eq!(address.port(), 10809);
        assert!(address.ip().is_loopback());
    }

    #[test]
    fn errors_name_the_text() {
        for text in ["unix:", "tcp:127.0.0.1", "tcp:127.0.0.1:http", "tcp::10809", "udp:1.2.3.4:5", "/tmp/x"] {
            let error = text.parse::<Listen>().unwrap_err();
            assert_eq!(error.text, text);
            assert!(error.to_string().contains(&format!("{text:?}")), "{error}");
        }
    }

    #[test]
    fn display_round_trips() {
        for text in ["unix:/tmp/a.sock", "tcp:127.0.0.1:10809", "tcp:[::1]:7"] {
            assert_eq!(text.parse::<Listen>().unwrap().to_string(), text);
        }
    }

    #[test]
    fn stale_unix_sockets_are_replaced_live_ones_are_not() {
        let dir = std::env::temp_dir().join(format!("netdam-nbd-listen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let listen = Listen::Unix(path.clone());

        // A stale socket: bound, then the listener dropped without removing the file.
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let listener = NbdListener::bind(&listen).expect("a stale socket is replaced");
        assert_eq!(listener.unix_path(), Some(path.as_path()));

        // A live one is left alone.
        let error = NbdListener::bind(&listen).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::AddrInUse);
        assert!(error.to_string().contains("another server"), "{error}");

        drop(listener);
        assert!(!path.exists(), "the listener removes its socket file");

        // Not a socket: never removed.
        std::fs::write(&path, b"data").unwrap();
        let error = NbdListener::bind(&listen).unwrap_err();
        assert!(error.to_string().contains("not a socket"), "{error}");
        assert!(path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tcp_reports_the_bound_port() {
        let listener = NbdListener::bind(&Listen::Tcp("127.0.0.1:0".parse().unwrap())).unwrap();
        let address = listener.local_addr().unwrap();
        assert_ne!(address.port(), 0);
        assert_eq!(listener.endpoint(), Some(Listen::Tcp(address)));
        assert!(listener.unix_path().is_none());
    }
}
