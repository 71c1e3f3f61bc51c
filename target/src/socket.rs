//! The worker's UDP socket: shared port (`SO_REUSEPORT`), received-TTL and receive-timestamp
//! ancillary data, batched receive (`recvmmsg`) into buffers allocated once at start-up, and
//! a plain `recvfrom` for a worker that reads no control data (`worker::Stamps`).

use std::io;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use netdam_isa::limits::RECEIVE_BATCH;
use socket2::{Domain, Protocol, Socket, Type};

/// Kernel socket buffer asked for: deep enough for bursts, bounded like every queue.
const SOCKET_BUFFER_BYTES: usize = 4 << 20;
/// Room for the TTL/hop-limit and receive-timestamp control messages.
const CONTROL_BYTES: usize = 128;
/// The longest a blocking receive sleeps before its worker looks at the shutdown flag: a
/// backstop, as a stop wakes sleeping workers at once ([`wake_receiver`]). An idle target's
/// workers wake once a second for it, not ten times (each wake-up takes a core for 15-35 µs on
/// the VM this was measured on, from whatever runs there: docs/DECISIONS.md).
pub const BLOCKING_WAKE: std::time::Duration = std::time::Duration::from_secs(1);

/// Opens a socket bound to `addr` that other workers can bind too.
pub fn bind_shared(addr: SocketAddr) -> io::Result<OwnedFd> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_port(true)?;
    if addr.ip().is_unspecified() && addr.is_ipv6() {
        // `[::]` serves IPv4 initiators too, whatever the host's net.ipv6.bindv6only says.
        socket.set_only_v6(false)?;
    }
    // Best effort: the kernel caps these at net.core.{r,w}mem_max.
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER_BYTES);
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER_BYTES);
    set_receive_ttl(socket.as_raw_fd(), addr.is_ipv4(), true)?;
    // Kernel receive timestamps: how long a datagram waited in the socket is the target's
    // queueing. Never turned off: the kernel stamps datagrams only while some socket asks for
    // it, and turning that on and off rewrites kernel code on every CPU.
    set_int_option(socket.as_raw_fd(), libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)?;
    socket.set_read_timeout(Some(BLOCKING_WAKE))?;
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// Wakes a thread asleep in a receive on `fd` (another handle on a worker's socket) for good:
/// shutting the receive side of a UDP socket wakes its sleeping receivers, and every waiting
/// receive after it returns at once with an empty datagram (one without waiting finds nothing,
/// EAGAIN). Linux answers ENOTCONN for an unconnected socket, yet shuts and wakes.
pub fn wake_receiver(fd: &OwnedFd) {
    // SAFETY: `fd` is an open socket owned by the caller; shutdown takes no pointers.
    unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RD) };
}

/// Turns the received-TTL (hop limit) control message of a socket on or off. It costs every
/// receive time even when not read (docs/DECISIONS.md), so an idle busy-polling worker turns it
/// off while it serves lone requests (`worker`).
///
/// An IPv6 socket asks for both: a dual-stack one (bound to `[::]`) also receives IPv4
/// datagrams, as mapped addresses, and the kernel gives their TTL only under the IPv4 option
/// (without it every IPv4 initiator of such a target read as TTL 0, "unknown"). A socket that
/// takes IPv6 alone may refuse the IPv4 option; it needs none.
pub fn set_receive_ttl(fd: std::os::fd::RawFd, ipv4: bool, on: bool) -> io::Result<()> {
    if ipv4 {
        return set_int_option(fd, libc::IPPROTO_IP, libc::IP_RECVTTL, on.into());
    }
    set_int_option(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, on.into())?;
    let _ = set_int_option(fd, libc::IPPROTO_IP, libc::IP_RECVTTL, on.into());
    Ok(())
}

/// Sets an integer socket option.
fn set_int_option(
    fd: std::os::fd::RawFd,
    level: libc::c_int,
    option: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: a valid socket and a pointer to an int of the stated size.
    let result = unsafe {
        libc::setsockopt(
            fd,
            level,
            option,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The address a socket is bound to.
pub fn local_addr(fd: &OwnedFd) -> io::Result<SocketAddr> {
    let socket = socket2::SockRef::from(fd);
    socket.local_addr()?.as_socket().ok_or_else(|| io::Error::other("socket has no IP address"))
}

/// One received datagram of a batch.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    /// Bytes received (the datagram's length, or the buffer's if `truncated`).
    pub len: usize,
    /// The datagram was longer than the buffer; the kernel cut it.
    pub truncated: bool,
    /// IP TTL or IPv6 hop limit it arrived with; 0 if the kernel did not say.
    pub ttl: u8,
    /// When the kernel received it (CLOCK_REALTIME, ns); 0 if the kernel did not say.
    pub kernel_realtime_ns: u64,
}

impl Received {
    /// Whether it arrived after `free_since_ns` (CLOCK_REALTIME), when the worker last finished
    /// a pass with datagrams: it found the worker idle, not busy with others. False unstamped.
    pub fn arrived_idle(&self, free_since_ns: u64) -> bool {
        self.kernel_realtime_ns != 0 && self.kernel_realtime_ns >= free_since_ns
    }
}

/// Buffers and kernel headers for one `recvmmsg` batch, allocated once per worker.
pub struct ReceiveBatch {
    buffers: Vec<u8>,
    buffer_bytes: usize,
    iovecs: Vec<libc::iovec>,
    addresses: Vec<libc::sockaddr_storage>,
    controls: Vec<[u8; CONTROL_BYTES]>,
    headers: Vec<libc::mmsghdr>,
    received: [Received; RECEIVE_BATCH],
    count: usize,
}

impl ReceiveBatch {
    /// Room for `RECEIVE_BATCH` datagrams of `buffer_bytes` each.
    pub fn new(buffer_bytes: usize) -> ReceiveBatch {
        let mut batch = ReceiveBatch {
            buffers: vec![0u8; RECEIVE_BATCH * buffer_bytes],
            buffer_bytes,
            // SAFETY: iovec, sockaddr_storage and mmsghdr are plain C structs; all-zero is valid.
            iovecs: vec![unsafe { zeroed() }; RECEIVE_BATCH],
            addresses: vec![unsafe { zeroed() }; RECEIVE_BATCH],
            controls: vec![[0u8; CONTROL_BYTES]; RECEIVE_BATCH],
            headers: vec![unsafe { zeroed() }; RECEIVE_BATCH],
            received: [Received { len: 0, truncated: false, ttl: 0, kernel_realtime_ns: 0 }; RECEIVE_BATCH],
            count: 0,
        };
        // The vectors never grow, so these pointers stay valid for the batch's life.
        for index in 0..RECEIVE_BATCH {
            batch.reset_header(index);
            batch.iovecs[index] = libc::iovec {
                iov_base: batch.buffers[index * buffer_bytes..].as_mut_ptr().cast(),
                iov_len: buffer_bytes,
            };
            let header = &mut batch.headers[index].msg_hdr;
            header.msg_iov = &mut batch.iovecs[index];
            header.msg_iovlen = 1;
        }
        batch
    }

    /// Resets the headers the last batch used. The kernel shortens the lengths only of the
    /// headers it filled, so only those need it: an empty busy-polling pass resets nothing.
    fn reset_previous(&mut self) {
        for index in 0..self.count {
            self.reset_header(index);
        }
    }

    /// Points header `index` at its address and control buffers, at full length.
    fn reset_header(&mut self, index: usize) {
        let header = &mut self.headers[index].msg_hdr;
        header.msg_name = (&mut self.addresses[index] as *mut libc::sockaddr_storage).cast();
        header.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        header.msg_control = self.controls[index].as_mut_ptr().cast();
        header.msg_controllen = CONTROL_BYTES;
        header.msg_flags = 0;
    }

    /// Receives up to `limit` datagrams (at most `RECEIVE_BATCH`). With `wait`, blocks until one
    /// arrives (or the socket's timeout passes); without, returns at once. Returns how many
    /// arrived.
    pub fn receive(&mut self, fd: &OwnedFd, wait: bool, limit: usize) -> io::Result<usize> {
        self.reset_previous();
        let flags = if wait { libc::MSG_WAITFORONE } else { libc::MSG_DONTWAIT };
        // SAFETY: every header points into buffers owned by self, sized as stated.
        let count = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                self.headers.as_mut_ptr(),
                limit.clamp(1, RECEIVE_BATCH) as u32,
                flags,
                core::ptr::null_mut(),
            )
        };
        if count < 0 {
            self.count = 0;
            return Err(io::Error::last_os_error());
        }
        self.count = count as usize;
        for index in 0..self.count {
            let header = &self.headers[index];
            let (ttl, kernel_realtime_ns) = ancillary(&header.msg_hdr);
            self.received[index] = Received {
                len: (header.msg_len as usize).min(self.buffer_bytes),
                truncated: header.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
                ttl,
                kernel_realtime_ns,
            };
        }
        Ok(self.count)
    }

    /// Receives one datagram without waiting and without control data (`recvfrom`, the cheapest
    /// receive): for a socket whose control messages are off. Returns how many arrived (1).
    pub fn receive_unstamped(&mut self, fd: &OwnedFd) -> io::Result<usize> {
        self.reset_previous();
        self.count = 0;
        let header = &mut self.headers[0].msg_hdr;
        // SAFETY: buffer 0 and address 0 are owned by self and of the stated sizes; MSG_TRUNC
        // makes the kernel return the datagram's real length.
        let len = unsafe {
            libc::recvfrom(
                fd.as_raw_fd(),
                self.buffers.as_mut_ptr().cast(),
                self.buffer_bytes,
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                header.msg_name.cast(),
                &mut header.msg_namelen,
            )
        };
        if len < 0 {
            return Err(io::Error::last_os_error());
        }
        let len = len as usize;
        self.received[0] = Received {
            len: len.min(self.buffer_bytes),
            truncated: len > self.buffer_bytes,
            ttl: 0,
            kernel_realtime_ns: 0,
        };
        self.count = 1;
        Ok(1)
    }

    /// Datagram `index` of the last batch, with its bytes.
    pub fn get(&self, index: usize) -> (Received, &[u8]) {
        assert!(index < self.count, "datagram {index} beyond the batch of {}", self.count);
        let received = self.received[index];
        let start = index * self.buffer_bytes;
        (received, &self.buffers[start..start + received.len])
    }

    /// The sender of datagram `index`.
    pub fn peer(&self, index: usize) -> Option<SocketAddr> {
        assert!(index < self.count, "datagram {index} beyond the batch of {}", self.count);
        let header = &self.headers[index].msg_hdr;
        // SAFETY: recvmmsg filled the storage with msg_namelen bytes of a socket address.
        let address = unsafe { socket2::SockAddr::new(self.addresses[index], header.msg_namelen) };
        address.as_socket()
    }

    /// Sends `bytes` back to the sender of datagram `index`.
    pub fn reply(&self, fd: &OwnedFd, index: usize, bytes: &[u8]) -> io::Result<()> {
        assert!(index < self.count, "reply to datagram {index} beyond the batch of {}", self.count);
        let header = &self.headers[index].msg_hdr;
        // SAFETY: the address was filled in by recvmmsg with msg_namelen bytes.
        let sent = unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_DONTWAIT,
                header.msg_name.cast(),
                header.msg_namelen,
            )
        };
        if sent < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}

/// The received TTL and kernel receive timestamp from a message's control data.
fn ancillary(header: &libc::msghdr) -> (u8, u64) {
    let (mut ttl, mut timestamp_ns) = (0u8, 0u64);
    // SAFETY: the control buffer was filled by the kernel; CMSG_* walk it within msg_controllen.
    unsafe {
        let mut control = libc::CMSG_FIRSTHDR(header);
        while !control.is_null() {
            let level = (*control).cmsg_level;
            let kind = (*control).cmsg_type;
            if (level == libc::IPPROTO_IP && kind == libc::IP_TTL)
                || (level == libc::IPPROTO_IPV6 && kind == libc::IPV6_HOPLIMIT)
            {
                let value = core::ptr::read_unaligned(libc::CMSG_DATA(control).cast::<libc::c_int>());
                ttl = u8::try_from(value).unwrap_or(0);
            } else if level == libc::SOL_SOCKET && kind == libc::SCM_TIMESTAMPNS {
                let stamp = core::ptr::read_unaligned(libc::CMSG_DATA(control).cast::<libc::timespec>());
                timestamp_ns = (stamp.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(stamp.tv_nsec as u64);
            }
            control = libc::CMSG_NXTHDR(header, control);
        }
    }
    (ttl, timestamp_ns)
}

pub use netdam_isa::time::realtime_ns;
