//! UDP system calls both ends of netdam share.
//!
//! A target worker answers, and an initiator asks, in runs of datagrams to one peer: a receive
//! pass's answers, a window's worth of requests. Sent one `sendto` each, every datagram walks the
//! kernel's whole UDP and IP stack (on loopback, down and back up into the receiver's queue);
//! a [`Train`] sends a run as one `sendmsg` with `UDP_SEGMENT`, and the kernel cuts it into the
//! separate datagrams at the end of the walk. Nothing changes on the wire.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, RawFd};

pub mod train;

pub use train::Train;

/// Whether a failed send found the socket buffer full (`EAGAIN`, `ENOBUFS`): the datagram is
/// lost as the network may lose any, and retransmission recovers it.
pub fn is_full(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EAGAIN) | Some(libc::ENOBUFS))
}

/// Sends `bytes` to `peer` without blocking.
pub fn send_to(fd: &impl AsFd, peer: &SocketAddr, bytes: &[u8]) -> io::Result<()> {
    let socket = socket2::SockRef::from(fd);
    socket.send_to_with_flags(bytes, &socket2::SockAddr::from(*peer), libc::MSG_DONTWAIT).map(|_| ())
}

/// Sends `bytes` on a connected socket without blocking.
pub fn send(fd: &impl AsFd, bytes: &[u8]) -> io::Result<()> {
    socket2::SockRef::from(fd).send_with_flags(bytes, libc::MSG_DONTWAIT).map(|_| ())
}

/// Reads an integer socket option.
pub fn int_option(fd: RawFd, level: libc::c_int, option: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid socket and an int of the stated size to fill.
    let result = unsafe { libc::getsockopt(fd, level, option, (&mut value as *mut libc::c_int).cast(), &mut len) };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}
