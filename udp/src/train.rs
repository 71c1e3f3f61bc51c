//! Datagrams to one peer sent in one system call: UDP generic segmentation offload
//! (`UDP_SEGMENT`).
//!
//! A `sendto` of a 4 KiB datagram on loopback costs ~3.4 µs here, most of it the kernel's walk
//! down its stack and back up into the receiver's queue; a `sendmsg` with `UDP_SEGMENT` carrying
//! 14 such datagrams costs ~0.9 µs per datagram, since the stack is walked once and the
//! segments are cut at the end (docs/DECISIONS.md, "Answers leave in trains"). A target worker
//! that answers several datagrams in one pass, and an initiator that sends several requests at
//! once, queue them here, and each run of datagrams to the same peer leaves as one train: every
//! datagram but the last of a train has the train's segment size, and the receiver gets them as
//! the separate datagrams they are (unless its socket asked for `UDP_GRO`).
//!
//! Where the kernel refuses a train (a segment larger than the route's MTU allows, a device
//! without checksum offload), its datagrams go out one by one, and the train shrinks or stops
//! for good: nothing is lost to the fallback. The buffer is allocated once; nothing on the way
//! allocates.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};

use netdam_isa::{Duration, Instant};

/// The most bytes one train carries: under the 64 KiB an IP datagram (and so a segmentation
/// offload's whole payload) may have, with room for IPv6's larger header.
pub const TRAIN_BYTES: usize = 65_000;

/// The most datagrams in one train (the kernel's `UDP_MAX_SEGMENTS` is 64 on older kernels).
pub const TRAIN_DATAGRAMS: usize = 64;

/// How long the oldest datagram of a train may wait for others to join before the train leaves
/// (checked by the caller as its pass goes on): a target's answer, stamped with its service
/// time before it joins, does not count this wait, which the initiator then reads as network
/// delay.
pub const TRAIN_WAIT: Duration = Duration::from_micros(20);

/// The datagrams waiting to leave, and whether trains work on this socket.
#[derive(Debug)]
pub struct Train {
    buffer: Box<[u8]>,
    peer: Option<SocketAddr>,
    /// The peer the socket is connected to, if it is: datagrams to it go without an address.
    connected: Option<SocketAddr>,
    /// Size of every datagram of the train but its last.
    segment: usize,
    datagrams: usize,
    len: usize,
    /// The last datagram was shorter than the segment: nothing may follow it in this train.
    closed: bool,
    /// Datagrams longer than this are not put in trains (a refused train lowers it); 0: trains
    /// are off.
    max_segment: usize,
    /// Trains sent since the caller last took the count.
    trains_sent: u64,
    /// When the first datagram waiting now joined (the caller bounds how long it waits).
    first_at: Instant,
    /// A train was refused with EINVAL already (said once at info, then at debug).
    refused_before: bool,
    /// The first send that failed for a reason other than a full buffer, since the caller last
    /// took it, if it takes it: an initiator learns so that nothing listens at the target's
    /// address; a target counts failed sends and leaves this alone.
    error: Option<io::Error>,
}

impl Train {
    /// A train for the socket `fd`, with its buffer allocated; `enabled` false, or a kernel that
    /// does not know `UDP_SEGMENT` (before Linux 4.18, where the option would be ignored and a
    /// train would leave as one datagram), sends every datagram on its own, and has no buffer
    /// (trains never turn on again once off).
    pub fn new(fd: &impl AsFd, enabled: bool) -> Train {
        let enabled = enabled && segmentation_known(fd);
        Train {
            buffer: if enabled { vec![0u8; TRAIN_BYTES].into_boxed_slice() } else { Box::default() },
            peer: None,
            connected: None,
            segment: 0,
            datagrams: 0,
            len: 0,
            closed: false,
            max_segment: if enabled { TRAIN_BYTES / 2 } else { 0 },
            trains_sent: 0,
            first_at: Instant::ZERO,
            refused_before: false,
            error: None,
        }
    }

    /// Says that the socket is connected to `peer` (an initiator's): what goes to `peer` is sent
    /// without an address, so the kernel takes the socket's cached route instead of looking one
    /// up for each send (0.2-0.3 µs of a train's 6-10 µs on loopback, docs/DECISIONS.md).
    pub fn connected_to(mut self, peer: SocketAddr) -> Train {
        self.connected = Some(peer);
        self
    }

    /// Trains sent since the last call (the caller counts them).
    pub fn take_trains_sent(&mut self) -> u64 {
        std::mem::take(&mut self.trains_sent)
    }

    /// The first send that failed since the last call, other than for a full socket buffer
    /// (counted as lost, like any datagram the network drops).
    pub fn take_error(&mut self) -> Option<io::Error> {
        self.error.take()
    }

    /// Datagrams waiting to be sent.
    pub fn waiting(&self) -> usize {
        self.datagrams
    }

    /// When the oldest datagram waiting joined, if any waits.
    fn waiting_since(&self) -> Option<Instant> {
        (self.datagrams > 0).then_some(self.first_at)
    }

    /// Whether what waits should leave at `now`: its oldest datagram has waited `TRAIN_WAIT`.
    pub fn due(&self, now: Instant) -> bool {
        self.waiting_since().is_some_and(|since| now.saturating_since(since) > TRAIN_WAIT)
    }

    /// Queues `datagram` for `peer` at `now`, sending what waits first when it cannot join
    /// them; returns how many datagrams failed to go out in doing so.
    pub fn push(&mut self, fd: &impl AsFd, peer: SocketAddr, datagram: &[u8], now: Instant) -> u64 {
        let mut failed = 0;
        if datagram.len() > self.max_segment || datagram.is_empty() {
            failed += self.flush(fd);
            return failed + self.send_alone(fd, &peer, datagram);
        }
        let joins = self.datagrams > 0
            && self.peer == Some(peer)
            && !self.closed
            && datagram.len() <= self.segment
            && self.len + datagram.len() <= TRAIN_BYTES
            && self.datagrams < TRAIN_DATAGRAMS;
        if !joins {
            failed += self.flush(fd);
            // A refused train may have lowered the bound (or turned trains off) just now.
            if datagram.len() > self.max_segment {
                return failed + self.send_alone(fd, &peer, datagram);
            }
            self.peer = Some(peer);
            self.segment = datagram.len();
            self.first_at = now;
        }
        self.buffer[self.len..self.len + datagram.len()].copy_from_slice(datagram);
        self.len += datagram.len();
        self.datagrams += 1;
        self.closed = datagram.len() < self.segment;
        failed
    }

    /// Sends what waits; returns how many datagrams failed to go out.
    pub fn flush(&mut self, fd: &impl AsFd) -> u64 {
        let datagrams = std::mem::take(&mut self.datagrams);
        let len = std::mem::take(&mut self.len);
        self.closed = false;
        let Some(peer) = self.peer else { return 0 };
        match datagrams {
            0 => 0,
            1 => {
                let result = self.send_one(fd, &peer, &self.buffer[..len]);
                self.failed(result)
            }
            _ => match send_segmented(fd, self.address_for(&peer), &self.buffer[..len], self.segment) {
                Ok(()) => {
                    self.trains_sent += 1;
                    0
                }
                Err(error) => self.refused(fd, peer, len, error),
            },
        }
    }

    /// Sends one datagram outside any train.
    fn send_alone(&mut self, fd: &impl AsFd, peer: &SocketAddr, datagram: &[u8]) -> u64 {
        let result = self.send_one(fd, peer, datagram);
        self.failed(result)
    }

    /// The address a send to `peer` names: none where the socket is connected to it.
    fn address_for<'a>(&self, peer: &'a SocketAddr) -> Option<&'a SocketAddr> {
        (self.connected != Some(*peer)).then_some(peer)
    }

    /// One datagram to `peer`, with or without its address (`address_for`).
    fn send_one(&self, fd: &impl AsFd, peer: &SocketAddr, datagram: &[u8]) -> io::Result<()> {
        match self.address_for(peer) {
            Some(peer) => crate::send_to(fd, peer, datagram),
            None => crate::send(fd, datagram),
        }
    }

    /// 1 if a send failed (its error kept for `take_error` unless the socket buffer was full).
    fn failed(&mut self, result: io::Result<()>) -> u64 {
        match result {
            Ok(()) => 0,
            Err(error) => {
                if !crate::is_full(&error) && self.error.is_none() {
                    self.error = Some(error);
                }
                1
            }
        }
    }

    /// A train the kernel refused: its datagrams go out one by one, and trains of this segment
    /// size (EINVAL: larger than the route's MTU allows) or all trains (the socket or device
    /// cannot segment) stop.
    fn refused(&mut self, fd: &impl AsFd, peer: SocketAddr, len: usize, error: io::Error) -> u64 {
        if crate::is_full(&error) {
            // The train is lost as separate sends would have been.
            return self.buffer[..len].chunks(self.segment).count() as u64;
        }
        match error.raw_os_error() {
            // A segment larger than the route's MTU allows (or the socket sends without
            // checksums): smaller trains may still go.
            Some(libc::EINVAL) | Some(libc::EMSGSIZE) => {
                self.max_segment = self.max_segment.min(self.segment.saturating_sub(1));
                if self.refused_before {
                    tracing::debug!(%error, segment = self.segment, "a train of datagrams was refused");
                } else {
                    tracing::info!(%error, segment = self.segment, "a train of datagrams was refused (a route's MTU?); datagrams this long go one by one");
                }
                self.refused_before = true;
            }
            // The device cannot segment or checksum: no train will go.
            Some(libc::EIO) | Some(libc::EOPNOTSUPP) | Some(libc::ENOPROTOOPT) => {
                self.max_segment = 0;
                tracing::warn!(%error, "UDP segmentation offload refused; datagrams go one by one");
            }
            // Anything else (a firewall's refusal, an unreachable route, nothing listening) is
            // this train's: its datagrams go one by one, as they would have without trains,
            // and the caller hears of it as of any failed send.
            _ => {
                tracing::debug!(%error, "a train of datagrams was refused");
                self.error.get_or_insert(error);
            }
        }
        let mut failed = 0;
        let segment = self.segment;
        for start in (0..len).step_by(segment) {
            let end = (start + segment).min(len);
            let result = self.send_one(fd, &peer, &self.buffer[start..end]);
            failed += self.failed(result);
        }
        failed
    }
}

/// One `sendmsg` of `bytes` to `peer` (`None`: the peer the socket is connected to), which the
/// kernel cuts into datagrams of `segment` bytes (the last may be shorter).
fn send_segmented(fd: &impl AsFd, peer: Option<&SocketAddr>, bytes: &[u8], segment: usize) -> io::Result<()> {
    let Ok(segment) = u16::try_from(segment) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    let address = peer.map(|peer| socket2::SockAddr::from(*peer));
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    // Room for one control message of a u16, aligned as the kernel expects.
    let mut control = [0u64; 4];
    // SAFETY: msghdr is a plain C struct; all-zero is valid, and every pointer set below
    // outlives the call.
    let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
    if let Some(address) = &address {
        header.msg_name = address.as_ptr() as *mut libc::c_void;
        header.msg_namelen = address.len();
    }
    header.msg_iov = &mut iov;
    header.msg_iovlen = 1;
    header.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is arithmetic.
    header.msg_controllen = unsafe { libc::CMSG_SPACE(size_of_u16()) } as _;
    // SAFETY: the control buffer holds CMSG_SPACE(2) bytes (32 available), so the first header
    // and its data fit.
    let sent = unsafe {
        let message = libc::CMSG_FIRSTHDR(&header);
        (*message).cmsg_level = libc::SOL_UDP;
        (*message).cmsg_type = libc::UDP_SEGMENT;
        (*message).cmsg_len = libc::CMSG_LEN(size_of_u16()) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(message).cast::<u16>(), segment);
        libc::sendmsg(fd.as_fd().as_raw_fd(), &header, libc::MSG_DONTWAIT)
    };
    if sent < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Whether the kernel knows `UDP_SEGMENT` on this socket (Linux 4.18 and later): an older
/// one ignores the control message and would send a train as one datagram.
fn segmentation_known(fd: &impl AsFd) -> bool {
    let known = crate::int_option(fd.as_fd().as_raw_fd(), libc::SOL_UDP, libc::UDP_SEGMENT).is_ok();
    if !known {
        tracing::info!("this kernel does not know UDP_SEGMENT; datagrams go one by one");
    }
    known
}

fn size_of_u16() -> u32 {
    std::mem::size_of::<u16>() as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::OwnedFd;
    use std::time::Duration;

    fn pair() -> (OwnedFd, UdpSocket) {
        pair_on("127.0.0.1:0")
    }

    fn pair_on(address: &str) -> (OwnedFd, UdpSocket) {
        let sender = UdpSocket::bind(address).unwrap();
        let receiver = UdpSocket::bind(address).unwrap();
        receiver.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        (OwnedFd::from(sender), receiver)
    }

    fn receive_all(receiver: &UdpSocket, count: usize) -> Vec<Vec<u8>> {
        let mut buffer = vec![0u8; 65_536];
        (0..count)
            .map(|_| {
                let len = receiver.recv(&mut buffer).expect("a datagram");
                buffer[..len].to_vec()
            })
            .collect()
    }

    /// Datagrams of mixed sizes and peers leave as the separate datagrams they are, in order:
    /// equal ones to one peer in trains, a shorter one closing its train, a longer one or
    /// another peer starting a new one.
    #[test]
    fn datagrams_arrive_as_what_they_are_in_order() {
        let (fd, receiver) = pair();
        let (_, other) = pair();
        let to = receiver.local_addr().unwrap();
        let elsewhere = other.local_addr().unwrap();
        let mut train = Train::new(&fd, true);
        let datagrams: Vec<Vec<u8>> = [4100, 4100, 4100, 100, 4100, 9000, 9000, 20, 20]
            .iter()
            .enumerate()
            .map(|(index, &len)| vec![index as u8; len])
            .collect();
        let mut failed = 0;
        for (index, datagram) in datagrams.iter().enumerate() {
            failed += train.push(&fd, to, datagram, Instant::ZERO);
            if index == 4 {
                // A datagram to someone else in between: the train to `to` leaves first.
                failed += train.push(&fd, elsewhere, b"elsewhere", Instant::ZERO);
            }
        }
        failed += train.flush(&fd);
        assert_eq!(failed, 0);
        assert_eq!(train.waiting(), 0);
        assert_eq!(receive_all(&receiver, datagrams.len()), datagrams);
        assert_eq!(receive_all(&other, 1), [b"elsewhere".to_vec()]);
        // 4100 x3 + 100, then 9000 x2 + 20; the lone 4100 and the last 20 go on their own.
        assert_eq!(train.take_trains_sent(), 2);
    }

    /// A train holds at most `TRAIN_DATAGRAMS` datagrams and `TRAIN_BYTES` bytes: more leave in
    /// further trains, none lost.
    #[test]
    fn long_runs_are_split_into_trains_within_the_bounds() {
        let (fd, receiver) = pair();
        let to = receiver.local_addr().unwrap();
        let mut train = Train::new(&fd, true);
        // More datagrams than a train holds, then more bytes; each run is read before the next
        // is sent, so the receiver's default socket buffer holds it.
        let small: Vec<Vec<u8>> = (0..100u8).map(|index| vec![index; 64]).collect();
        let large: Vec<Vec<u8>> = (0..12u8).map(|index| vec![index; 8300]).collect();
        for run in [&small, &large] {
            for datagram in run.iter() {
                assert_eq!(train.push(&fd, to, datagram, Instant::ZERO), 0);
                assert!(train.len <= TRAIN_BYTES && train.datagrams <= TRAIN_DATAGRAMS);
            }
            assert_eq!(train.flush(&fd), 0);
            assert_eq!(train.take_trains_sent(), 2, "the run took two trains");
            assert_eq!(&receive_all(&receiver, run.len()), run);
        }
    }

    /// On a socket connected to its peer, trains and lone datagrams to that peer go without an
    /// address and arrive as they are; another peer is still named.
    #[test]
    fn a_connected_socket_sends_to_its_peer_without_an_address() {
        let (fd, receiver) = pair();
        let (_, other) = pair();
        let to = receiver.local_addr().unwrap();
        let elsewhere = other.local_addr().unwrap();
        socket2::SockRef::from(&fd).connect(&to.into()).unwrap();
        let mut train = Train::new(&fd, true).connected_to(to);
        let datagrams: Vec<Vec<u8>> =
            [900, 900, 900, 40, 40_000].iter().enumerate().map(|(index, &len)| vec![index as u8; len]).collect();
        let mut failed = 0;
        for datagram in &datagrams {
            failed += train.push(&fd, to, datagram, Instant::ZERO);
        }
        failed += train.push(&fd, elsewhere, b"elsewhere", Instant::ZERO);
        failed += train.flush(&fd);
        assert_eq!(failed, 0);
        assert_eq!(receive_all(&receiver, datagrams.len()), datagrams);
        assert_eq!(receive_all(&other, 1), [b"elsewhere".to_vec()]);
        assert_eq!(train.take_trains_sent(), 1, "900 x3 + 40 in one train; 40,000 (over the segment bound) alone");

        // The address is left out indeed: on a socket that is not connected, a train told it
        // is cannot send (EDESTADDRREQ), alone or in a train.
        let (unconnected, _receiver) = pair();
        let mut told_wrongly = Train::new(&unconnected, true).connected_to(to);
        assert_eq!(told_wrongly.push(&unconnected, to, &[1; 100], Instant::ZERO), 0, "it waits in the train");
        assert_eq!(told_wrongly.push(&unconnected, to, &[2; 100], Instant::ZERO), 0);
        assert_eq!(told_wrongly.flush(&unconnected), 2);
        assert_eq!(told_wrongly.push(&unconnected, to, &[3; 40_000], Instant::ZERO), 1);
    }

    /// With trains off every datagram goes on its own, the same bytes in the same order.
    #[test]
    fn a_disabled_train_sends_each_datagram_alone() {
        let (fd, receiver) = pair();
        let to = receiver.local_addr().unwrap();
        let mut train = Train::new(&fd, false);
        assert_eq!(train.max_segment, 0, "trains are off");
        for index in 0..5u8 {
            train.push(&fd, to, &[index; 300], Instant::ZERO);
            assert_eq!(train.waiting(), 0, "nothing waits when trains are off");
        }
        let received = receive_all(&receiver, 5);
        assert_eq!(received, (0..5u8).map(|index| vec![index; 300]).collect::<Vec<_>>());
        assert_eq!(train.take_trains_sent(), 0);
    }

    /// A train the kernel refuses (here: a socket that sends without UDP checksums, which
    /// segmentation offload cannot do) goes out datagram by datagram, nothing lost, and datagrams of
    /// that size stop forming trains.
    #[test]
    fn a_refused_train_goes_datagram_by_datagram() {
        let (fd, receiver) = pair();
        let to = receiver.local_addr().unwrap();
        let on: libc::c_int = 1;
        // SAFETY: a live int and its length.
        let set = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_NO_CHECK,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(set, 0);
        let mut train = Train::new(&fd, true);
        let datagrams: Vec<Vec<u8>> = (0..6u8).map(|index| vec![index; 1000]).collect();
        for datagram in &datagrams[..3] {
            assert_eq!(train.push(&fd, to, datagram, Instant::ZERO), 0);
        }
        assert_eq!(train.flush(&fd), 0, "refused, then sent one by one");
        assert_eq!(train.take_trains_sent(), 0);
        assert!(train.max_segment < 1000, "datagrams this long no longer form trains");
        for datagram in &datagrams[3..] {
            assert_eq!(train.push(&fd, to, datagram, Instant::ZERO), 0);
            assert_eq!(train.waiting(), 0, "sent at once");
        }
        assert_eq!(receive_all(&receiver, datagrams.len()), datagrams);
    }

    /// Trains reach IPv6 peers too, where the machine has IPv6 loopback.
    #[test]
    fn trains_reach_ipv6_peers() {
        if UdpSocket::bind("[::1]:0").is_err() {
            eprintln!("skipped: no IPv6 loopback here");
            return;
        }
        let (fd, receiver) = pair_on("[::1]:0");
        let to = receiver.local_addr().unwrap();
        let mut train = Train::new(&fd, true);
        let datagrams: Vec<Vec<u8>> = (0..5u8).map(|index| vec![index; 2000]).collect();
        for datagram in &datagrams {
            assert_eq!(train.push(&fd, to, datagram, Instant::ZERO), 0);
        }
        assert_eq!(train.flush(&fd), 0);
        assert_eq!(train.take_trains_sent(), 1);
        assert_eq!(receive_all(&receiver, datagrams.len()), datagrams);
    }

    /// `waiting_since` tells when the oldest waiting datagram joined, and `due` when it has
    /// waited long enough.
    #[test]
    fn the_oldest_datagram_s_arrival_is_known() {
        let (fd, receiver) = pair();
        let to = receiver.local_addr().unwrap();
        let mut train = Train::new(&fd, true);
        assert_eq!(train.waiting_since(), None);
        let at = |us| Instant::ZERO + netdam_isa::Duration::from_micros(us);
        train.push(&fd, to, &[1; 100], at(5));
        train.push(&fd, to, &[2; 100], at(9));
        assert_eq!(train.waiting_since(), Some(at(5)));
        assert!(!train.due(at(25)) && train.due(at(26)), "due once the oldest has waited TRAIN_WAIT");
        train.flush(&fd);
        assert_eq!(train.waiting_since(), None);
        assert_eq!(receive_all(&receiver, 2), [vec![1; 100], vec![2; 100]]);
    }

    /// A send refused by the peer's host (nothing listens: ECONNREFUSED on a connected socket,
    /// after the ICMP error of an earlier send) is kept for `take_error`, once; a full buffer
    /// is not an error.
    #[test]
    fn a_refusal_is_kept_for_the_caller() {
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        let gone = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = gone.local_addr().unwrap();
        drop(gone);
        sender.connect(to).unwrap();
        let fd = OwnedFd::from(sender);
        let mut train = Train::new(&fd, true);
        // The first send draws the ICMP port-unreachable; a later one (the train, or one of
        // its datagrams sent again one by one) reports it.
        let mut error = None;
        for _ in 0..200 {
            for index in 0..3u8 {
                train.push(&fd, to, &[index; 500], Instant::ZERO);
            }
            train.flush(&fd);
            error = train.take_error();
            if error.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let error = error.expect("the refusal is kept");
        assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused);
        assert!(train.take_error().is_none(), "taken once");
        assert!(train.max_segment > 0, "a refusal by the peer does not stop trains");
    }
}
