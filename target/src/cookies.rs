//! HELLO cookies: proof that a sender receives datagrams at the address it sends from, checked
//! before the target keeps any state for it (as DTLS's HelloVerifyRequest and QUIC's Retry do).
//!
//! A cookie is the target's clock when it issued the cookie, in nanoseconds (the dispatcher
//! makes each issue time later than the last, so that two HELLOs never get the same cookie, and
//! so never share a session), followed by a SipHash-2-4 (128-bit) MAC over that time and the sender's IP address and port, keyed with a
//! secret drawn when the target starts. Checking one needs no state: recompute the MAC, compare,
//! check the age. SipHash is a keyed PRF made for short inputs; Linux keys its SYN cookies with
//! it for the same job. A forged source address never sees the cookie sent to it, so a HELLO
//! from a forged address cannot get past this step, and a cookie copied from elsewhere names
//! another address.

use std::hash::Hasher;
use std::net::{IpAddr, SocketAddr};

use netdam_isa::control::{Cookie, COOKIE_LEN};
use netdam_isa::limits::COOKIE_LIFETIME;
use netdam_isa::{Duration, Instant};
use siphasher::sip128::{Hasher128, SipHasher24};

/// Bytes of the MAC part of a cookie.
pub const COOKIE_TAG_LEN: usize = 16;
const ISSUED_LEN: usize = COOKIE_LEN - COOKIE_TAG_LEN;
const _: () = assert!(ISSUED_LEN == 8, "the issue time is a u64 of nanoseconds");

/// How far ahead of the checker's clock an issue time may lie: a worker issues each cookie
/// strictly later than its last (so two HELLOs never get the same one), which can run a little
/// ahead of its clock under a burst of HELLOs.
const ISSUED_AHEAD_LIMIT: Duration = Duration::from_millis(1);

/// The MAC of a valid cookie: what a session remembers so that a retransmitted HELLO with the
/// same cookie finds the session it already opened instead of opening another.
pub type CookieTag = [u8; COOKIE_TAG_LEN];

/// Why a cookie was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CookieRefusal {
    /// The HELLO carried no cookie: a first HELLO.
    Missing,
    /// The MAC does not match this sender's address and port (forged, mutated, or copied from
    /// another sender), or the issue time lies in the future.
    Invalid,
    /// Issued to this sender, but longer ago than [`COOKIE_LIFETIME`].
    Expired,
}

/// Issues and checks cookies under one secret.
#[derive(Clone)]
pub struct CookieJar {
    secret: [u8; 16],
}

impl std::fmt::Debug for CookieJar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret stays out of logs.
        f.write_str("CookieJar")
    }
}

impl CookieJar {
    /// A jar keyed with `secret` (tests and the simulator derive it from their seed).
    pub fn new(secret: [u8; 16]) -> CookieJar {
        CookieJar { secret }
    }

    /// A jar keyed with a secret from the operating system's random source.
    pub fn from_os_random() -> std::io::Result<CookieJar> {
        let mut secret = [0u8; 16];
        getrandom::fill(&mut secret).map_err(|error| std::io::Error::other(format!("no random source: {error}")))?;
        Ok(CookieJar { secret })
    }

    /// A cookie for `peer`, issued at `now`.
    pub fn issue(&self, peer: SocketAddr, now: Instant) -> Cookie {
        let issued_ns = now.as_nanos();
        let mut cookie = [0u8; COOKIE_LEN];
        cookie[..ISSUED_LEN].copy_from_slice(&issued_ns.to_le_bytes());
        cookie[ISSUED_LEN..].copy_from_slice(&self.tag(peer, issued_ns));
        cookie
    }

    /// Checks a cookie `peer` sent back at `now`; a valid one gives its MAC.
    pub fn check(&self, peer: SocketAddr, now: Instant, cookie: &Cookie) -> Result<CookieTag, CookieRefusal> {
        if cookie.iter().all(|&byte| byte == 0) {
            return Err(CookieRefusal::Missing);
        }
        let mut issued = [0u8; ISSUED_LEN];
        issued.copy_from_slice(&cookie[..ISSUED_LEN]);
        let issued_ns = u64::from_le_bytes(issued);
        let expected = self.tag(peer, issued_ns);
        // Compared without an early exit, so the time taken says nothing about how much matched.
        let difference = expected.iter().zip(&cookie[ISSUED_LEN..]).fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if difference != 0 || issued_ns > (now + ISSUED_AHEAD_LIMIT).as_nanos() {
            return Err(CookieRefusal::Invalid);
        }
        if now.as_nanos().saturating_sub(issued_ns) > COOKIE_LIFETIME.as_nanos() {
            return Err(CookieRefusal::Expired);
        }
        Ok(expected)
    }

    fn tag(&self, peer: SocketAddr, issued_ns: u64) -> CookieTag {
        let mut mac = SipHasher24::new_with_key(&self.secret);
        let ip = match peer.ip() {
            IpAddr::V4(ip) => ip.to_ipv6_mapped().octets(),
            IpAddr::V6(ip) => ip.octets(),
        };
        mac.write(b"netdam-cookie-v1");
        mac.write(&ip);
        mac.write(&peer.port().to_le_bytes());
        mac.write(&issued_ns.to_le_bytes());
        mac.finish128().as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_cookie_is_valid_only_for_its_address_port_and_lifetime() {
        let jar = CookieJar::new([9; 16]);
        let issued_at = Instant::ZERO + Duration::from_millis(10_000);
        let cookie = jar.issue(peer("127.0.0.1:4000"), issued_at);
        let tag = jar.check(peer("127.0.0.1:4000"), issued_at + Duration::from_millis(100), &cookie).unwrap();
        assert_eq!(tag[..], cookie[ISSUED_LEN..]);
        let later = issued_at + COOKIE_LIFETIME;
        assert!(jar.check(peer("127.0.0.1:4000"), later, &cookie).is_ok(), "valid to the end of its lifetime");
        let late = later + Duration::from_nanos(1);
        assert_eq!(jar.check(peer("127.0.0.1:4000"), late, &cookie), Err(CookieRefusal::Expired));
        assert_eq!(jar.check(peer("127.0.0.1:4001"), issued_at, &cookie), Err(CookieRefusal::Invalid), "other port");
        assert_eq!(jar.check(peer("127.0.0.2:4000"), issued_at, &cookie), Err(CookieRefusal::Invalid), "other host");
        let v6 = peer("[::ffff:127.0.0.1]:4000");
        assert!(jar.check(v6, issued_at, &cookie).is_ok(), "a v4-mapped address is the same sender");
        let slightly_before = Instant::ZERO + Duration::from_millis(9_999);
        assert!(jar.check(peer("127.0.0.1:4000"), slightly_before, &cookie).is_ok(), "a little ahead is allowed");
        let before = Instant::ZERO + Duration::from_nanos(8_999_999_999);
        assert_eq!(jar.check(peer("127.0.0.1:4000"), before, &cookie), Err(CookieRefusal::Invalid), "from the future");
        let other_secret = CookieJar::new([8; 16]);
        assert_eq!(other_secret.check(peer("127.0.0.1:4000"), issued_at, &cookie), Err(CookieRefusal::Invalid));
        assert_eq!(jar.check(peer("127.0.0.1:4000"), issued_at, &[0; COOKIE_LEN]), Err(CookieRefusal::Missing));
    }

    #[test]
    fn every_flipped_bit_invalidates_a_cookie() {
        let jar = CookieJar::new([1; 16]);
        let now = Instant::ZERO + Duration::from_millis(60_000);
        let cookie = jar.issue(peer("[2001:db8::1]:7000"), now);
        for bit in 0..COOKIE_LEN * 8 {
            let mut mutated = cookie;
            mutated[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(jar.check(peer("[2001:db8::1]:7000"), now, &mutated), Err(CookieRefusal::Invalid), "bit {bit}");
        }
    }
}
