//! Parsing of what people write in flags and settings: byte counts and offsets (`4096`,
//! `0x1000`, `64KiB`, `1MiB`), and the address a server listens on (`127.0.0.1:7800`,
//! `[::]:7800`), refused with the reason rather than "invalid socket address syntax".

use std::net::{IpAddr, SocketAddr};

/// Parses a byte count or offset: a decimal or `0x` hexadecimal number, optionally followed by
/// `K`/`KiB`, `M`/`MiB`, `G`/`GiB` or `T`/`TiB` (powers of 1024).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed.find(|c: char| c.is_ascii_alphabetic() && !trimmed.starts_with("0x")).unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(split);
    let value = if let Some(hex) = number.strip_prefix("0x").or_else(|| number.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16)
    } else {
        number.trim().parse::<u64>()
    }
    .map_err(|_| format!("{text:?} is not a byte count (examples: 4096, 0x1000, 64KiB, 1MiB)"))?;
    let multiplier: u64 = match suffix.trim() {
        "" | "B" => 1,
        "K" | "KiB" | "k" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        other => return Err(format!("{text:?}: unknown unit {other:?} (use KiB, MiB, GiB or TiB)")),
    };
    value.checked_mul(multiplier).ok_or_else(|| format!("{text:?} does not fit in 64 bits"))
}

/// Parses the address a server listens on: an IP address and a port, an IPv6 address in
/// brackets (scoped by an interface's index, `[fe80::1%2]:7800`, where it needs one). Host
/// names are refused rather than resolved (which of a name's addresses to listen on would be a
/// guess), and every refusal says what is wrong: the port, the brackets, the scope.
pub fn parse_listen_addr(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let examples = "(examples: 127.0.0.1:7800, 0.0.0.0:7800, [::1]:7800, [::]:7800)";
    let unbracketed = |host: &str| host.strip_prefix('[').and_then(|host| host.strip_suffix(']')).map(str::to_string);
    let whole = unbracketed(text).unwrap_or_else(|| text.to_string());
    if let Ok(address) = whole.parse::<IpAddr>() {
        // `::1:7800` is an IPv6 address too; most likely its writer meant a port.
        let port_meant = text.rsplit_once(':').filter(|(host, port)| {
            address.is_ipv6() && !text.starts_with('[') && host.parse::<IpAddr>().is_ok() && port_number(port).is_ok()
        });
        return Err(match port_meant {
            Some((host, port)) => format!("{text:?}: an IPv6 address takes brackets before its port: [{host}]:{port}"),
            None => format!("{text:?} has no port: give an IP address and a port {examples}"),
        });
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!("{text:?} has no port: give an IP address and a port {examples}"));
    };
    let bare = unbracketed(host).unwrap_or_else(|| host.to_string());
    let address = bare.split_once('%').map_or(bare.as_str(), |(address, _)| address);
    if host.is_empty() {
        return Err(format!("{text:?} has no address before the port {examples}"));
    }
    if address.parse::<IpAddr>().is_err() {
        return Err(format!("{text:?}: {host:?} is not an IP address (host names are not taken here) {examples}"));
    }
    port_number(port).map_err(|problem| format!("{text:?}: {problem}"))?;
    Err(match address.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) if bare == host => {
            format!("{text:?}: an IPv6 address takes brackets before its port: [{host}]:{port}")
        }
        Ok(IpAddr::V4(_)) if bare != host => format!("{text:?}: an IPv4 address takes no brackets: {bare}:{port}"),
        _ if bare.contains('%') => {
            format!("{text:?}: give a scope as the interface's index (`ip link` lists them), as in [fe80::1%2]:{port}")
        }
        _ => format!("{text:?} is not an IP address and port {examples}"),
    })
}

/// A port number: 0 to 65535, said so when it is out of range.
pub fn port_number(text: &str) -> Result<u16, String> {
    match text.parse::<u64>() {
        Ok(port) => u16::try_from(port).map_err(|_| format!("port {port} is out of range (0 to 65535)")),
        Err(_) => Err(format!("{text:?} is not a port number (0 to 65535)")),
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_bytes, parse_listen_addr};

    #[test]
    fn listen_addresses_are_taken_as_written_and_refused_with_the_reason() {
        assert_eq!(parse_listen_addr("127.0.0.1:7800"), Ok("127.0.0.1:7800".parse().unwrap()));
        assert_eq!(parse_listen_addr("[::]:7800"), Ok("[::]:7800".parse().unwrap()));
        let refused = |text: &str| parse_listen_addr(text).unwrap_err();
        assert!(refused("::1:7800").contains("takes brackets before its port: [::1]:7800"), "{}", refused("::1:7800"));
        assert!(refused("localhost:7800").contains("\"localhost\" is not an IP address (host names are not taken"));
        assert!(refused("127.0.0.1:99999").contains("port 99999 is out of range (0 to 65535)"));
        assert!(refused("127.0.0.1:http").contains("\"http\" is not a port number"));
        assert!(refused("127.0.0.1").contains("has no port"));
        assert!(refused("[fe80::1%lo]:7800").contains("give a scope as the interface's index"));
        assert_eq!(parse_listen_addr("[fe80::1%2]:7800").map(|addr| addr.port()), Ok(7800));
        assert!(refused(":7800").contains("has no address before the port"));
        assert!(refused("::1").contains("has no port"), "{}", refused("::1"));
        assert!(refused("[::1]").contains("has no port"));
        assert!(refused("[127.0.0.1]:80").contains("an IPv4 address takes no brackets: 127.0.0.1:80"));
    }

    #[test]
    fn parses_what_people_write() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("0x1000"), Ok(4096));
        assert_eq!(parse_bytes("64KiB"), Ok(65536));
        assert_eq!(parse_bytes("64 MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert!(parse_bytes("12 bananas").unwrap_err().contains("unknown unit"));
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("17179869184TiB").unwrap_err().contains("64 bits"));
    }
}
