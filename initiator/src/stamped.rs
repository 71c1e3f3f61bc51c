//! Receiving answers with the kernel's receive timestamp.
//!
//! A round trip measured to the moment this thread reads the answer includes however long the
//! thread took to get there: on a contended machine it waits for a core for milliseconds, and
//! Swift would read that as fabric congestion and shrink the window of a network that is idle.
//! The kernel stamps each datagram as it queues it on the socket (`SO_TIMESTAMPNS`, the same
//! stamp the target uses for its queueing); the time the answer then waited in the socket is
//! the initiator's own delay, and the session leaves it out of its round-trip samples (Swift
//! measures with NIC timestamps for the same reason).

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::RawFd;

use netdam_isa::time::realtime_ns;
use netdam_isa::Duration;

/// Room for one `SCM_TIMESTAMPNS` control message.
const CONTROL_BYTES: usize = 64;

/// Asks the kernel to stamp every datagram `fd` receives. Without it (an old kernel) answers
/// come unstamped and count as read the moment they arrived.
pub(crate) fn enable(fd: RawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: a valid socket and a c_int option of the stated length.
    let done = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Receives one datagram into `buffer` without blocking and without control data: the cheapest
/// receive (`recv`), for a driver that bounds the wait itself (a spinning client).
pub(crate) fn recv_unstamped(fd: RawFd, buffer: &mut [u8]) -> io::Result<usize> {
    // SAFETY: a valid socket and a live buffer of the stated length.
    let len = unsafe { libc::recv(fd, buffer.as_mut_ptr().cast(), buffer.len(), libc::MSG_DONTWAIT) };
    if len < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(len as usize)
}

/// Receives one datagram into `buffer` without blocking (the socket is non-blocking): its
/// length, and how long it waited in the socket before this call (`None` if unstamped: the
/// socket has no timestamps on, or the kernel gave none).
pub(crate) fn recv(fd: RawFd, buffer: &mut [u8]) -> io::Result<(usize, Option<Duration>)> {
    let mut control = [0u64; CONTROL_BYTES / 8];
    let mut iov = libc::iovec { iov_base: buffer.as_mut_ptr().cast(), iov_len: buffer.len() };
    // SAFETY: msghdr is plain data; every pointer set below outlives the call.
    let mut header: libc::msghdr = unsafe { zeroed() };
    header.msg_iov = &mut iov;
    header.msg_iovlen = 1;
    header.msg_control = control.as_mut_ptr().cast();
    header.msg_controllen = CONTROL_BYTES as _;
    // SAFETY: a valid socket and a message header whose buffers are live and of the stated sizes.
    let len = unsafe { libc::recvmsg(fd, &mut header, libc::MSG_DONTWAIT) };
    if len < 0 {
        return Err(io::Error::last_os_error());
    }
    let stamp = kernel_stamp_ns(&header);
    let waited = (stamp != 0).then(|| Duration::from_nanos(realtime_ns().saturating_sub(stamp)));
    Ok((len as usize, waited))
}

/// The kernel's receive timestamp (CLOCK_REALTIME ns) in a received message's control data.
fn kernel_stamp_ns(header: &libc::msghdr) -> u64 {
    // SAFETY: the CMSG macros walk the control buffer the kernel filled, within its length.
    unsafe {
        let mut message = libc::CMSG_FIRSTHDR(header);
        while !message.is_null() {
            if (*message).cmsg_level == libc::SOL_SOCKET && (*message).cmsg_type == libc::SCM_TIMESTAMPNS {
                let stamp: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(message).cast());
                return (stamp.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(stamp.tv_nsec as u64);
            }
            message = libc::CMSG_NXTHDR(header, message);
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_datagram_that_sat_in_the_socket_reports_its_wait() {
        let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
        receiver.set_nonblocking(true).unwrap();
        enable(receiver.as_raw_fd()).unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut buffer = [0u8; 64];
        // When no socket of the machine had receive timestamps on, the kernel turns them on in a
        // deferred work item: a datagram that arrives before that is stamped when it is read
        // (a wait of microseconds). A few tries let it; stamps that are never taken on arrival
        // still fail every one.
        let mut waits = Vec::new();
        for _ in 0..5 {
            sender.send_to(b"answer", receiver.local_addr().unwrap()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
            let (len, waited) = recv(receiver.as_raw_fd(), &mut buffer).unwrap();
            assert_eq!(&buffer[..len], b"answer");
            let waited = waited.unwrap_or(Duration::ZERO);
            waits.push(waited);
            if waited >= Duration::from_millis(19) {
                break;
            }
        }
        assert!(
            waits.last().is_some_and(|&waited| waited >= Duration::from_millis(19)),
            "by the kernel's stamps they waited {waits:?}, not the 20 ms they sat in the socket"
        );
        let empty = recv(receiver.as_raw_fd(), &mut buffer).unwrap_err();
        assert_eq!(empty.kind(), io::ErrorKind::WouldBlock);
    }
}
