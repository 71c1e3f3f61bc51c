//! Where a process serves `/metrics`: an address, or nowhere (`off`).

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

/// The `metrics_listen` setting: `off`, or a TCP address such as `127.0.0.1:9464`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsListen {
    /// No `/metrics` endpoint.
    Off,
    /// Serve `/metrics` on this address (port 0: any free port).
    On(SocketAddr),
}

impl MetricsListen {
    /// The address, when on.
    pub fn addr(self) -> Option<SocketAddr> {
        match self {
            MetricsListen::Off => None,
            MetricsListen::On(addr) => Some(addr),
        }
    }
}

impl FromStr for MetricsListen {
    type Err = String;

    fn from_str(text: &str) -> Result<MetricsListen, String> {
        if text.eq_ignore_ascii_case("off") {
            return Ok(MetricsListen::Off);
        }
        netdam_isa::units::parse_listen_addr(text)
            .map(MetricsListen::On)
            .map_err(|problem| format!("{problem}; or \"off\" for no metrics endpoint"))
    }
}

impl fmt::Display for MetricsListen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetricsListen::Off => f.write_str("off"),
            MetricsListen::On(addr) => addr.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_off_and_addresses() {
        assert_eq!("off".parse(), Ok(MetricsListen::Off));
        assert_eq!("OFF".parse(), Ok(MetricsListen::Off));
        let on: MetricsListen = "127.0.0.1:9464".parse().unwrap();
        assert_eq!(on.addr(), Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(on.to_string(), "127.0.0.1:9464");
        let error = "localhost".parse::<MetricsListen>().unwrap_err();
        assert!(error.contains("\"off\""), "{error}");
    }
}
