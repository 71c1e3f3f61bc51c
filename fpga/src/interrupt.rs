//! The completion interrupt (FPGA.md §6): an `eventfd` the device writes when it posts a
//! completion while the host has enabled the interrupt (`INTERRUPT_MASK` bit 0), so that a host
//! thread waiting for a slow instruction (a block instruction on the SSD) can sleep instead of
//! spinning.
//!
//! A card raises MSI-X vector 0, which VFIO delivers to an eventfd the host bound with
//! `VFIO_DEVICE_SET_IRQS`. A model's window file has no MSI, so the host creates the eventfd
//! and hands it to the model over a Unix socket beside the window (`<window>.irq`, one
//! `SCM_RIGHTS` message per eventfd); the model writes to every eventfd it was given. Either
//! way the host's side is the same: arm, poll the ring once more, wait on the eventfd.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Eventfds one model keeps at most: one per host that attached, a few restarts' worth.
pub const MAX_LISTENERS: usize = 8;

/// The Unix socket beside a model's window file on which it takes eventfds.
pub fn socket_path(window: &Path) -> PathBuf {
    let mut name = window.as_os_str().to_owned();
    name.push(".irq");
    PathBuf::from(name)
}

/// How long either side waits for the other during the hand-over of an eventfd.
const HANDOVER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// The device side: the eventfds it raises, each under the id of the connection it came on.
#[derive(Debug, Default)]
pub struct InterruptLine {
    eventfds: Mutex<Vec<(u64, OwnedFd)>>,
}

impl InterruptLine {
    /// Adds an eventfd to raise under `id`; false (and the eventfd closed) when
    /// `MAX_LISTENERS` are held.
    pub fn connect(&self, id: u64, eventfd: OwnedFd) -> bool {
        let mut eventfds = self.eventfds.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if eventfds.len() >= MAX_LISTENERS {
            return false;
        }
        eventfds.push((id, eventfd));
        true
    }

    /// Stops raising (and closes) the eventfd given under `id`.
    pub fn disconnect(&self, id: u64) {
        self.eventfds.lock().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|(held, _)| *held != id);
    }

    /// How many eventfds it raises.
    pub fn listeners(&self) -> usize {
        self.eventfds.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// Raises the interrupt: adds 1 to every eventfd (a full counter is ignored: the host
    /// re-polls the ring whenever it wakes).
    pub fn raise(&self) {
        let eventfds = self.eventfds.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (_, eventfd) in eventfds.iter() {
            let one = 1u64;
            // SAFETY: a valid eventfd and 8 readable bytes.
            let _ = unsafe { libc::write(eventfd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }
}

/// Takes eventfds on `path` (replacing a stale socket file), for as long as the process lives,
/// into the returned line. Each host keeps its connection open while it wants the interrupt:
/// when the connection ends (the host closed it, or exited), its eventfd is dropped, so hosts
/// that come and go do not use up the `MAX_LISTENERS` places.
pub fn serve(path: &Path) -> io::Result<Arc<InterruptLine>> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    let line = Arc::new(InterruptLine::default());
    let serving = Arc::clone(&line);
    std::thread::Builder::new().name("netdam-fpga-irq".into()).spawn(move || {
        for (id, stream) in (0u64..).zip(listener.incoming()) {
            let Ok(stream) = stream else { continue };
            let line = Arc::clone(&serving);
            // One thread per connection, each ending with its host; at most MAX_LISTENERS
            // hold an eventfd, the rest are answered 0 and end at once.
            let _ = std::thread::Builder::new().name("netdam-fpga-irq-host".into()).spawn(move || {
                let _ = stream.set_read_timeout(Some(HANDOVER_TIMEOUT));
                let _ = stream.set_write_timeout(Some(HANDOVER_TIMEOUT));
                let eventfd = match receive_fd(&stream) {
                    Ok(eventfd) => eventfd,
                    Err(error) => {
                        eprintln!("netdam-fpga-model: an interrupt request carried no eventfd: {error}");
                        return;
                    }
                };
                let accepted = line.connect(id, eventfd);
                if std::io::Write::write_all(&mut &stream, &[u8::from(accepted)]).is_err() || !accepted {
                    line.disconnect(id);
                    return;
                }
                // Held until the host's end closes: a read returns 0 (or fails).
                let _ = stream.set_read_timeout(None);
                let mut byte = [0u8; 1];
                while matches!(std::io::Read::read(&mut &stream, &mut byte), Ok(n) if n > 0) {}
                line.disconnect(id);
            });
        }
    })?;
    Ok(line)
}

/// A host's completion interrupt from a model: the eventfd the model raises, and the
/// connection that keeps it raised (dropping this ends both).
#[derive(Debug)]
pub struct InterruptLink {
    /// The eventfd to wait on.
    pub eventfd: OwnedFd,
    _connection: UnixStream,
}

/// The host side: creates an eventfd and hands it to the model serving `path`; the model raises
/// it for as long as the returned link lives.
pub fn request(path: &Path) -> io::Result<InterruptLink> {
    let eventfd = new_eventfd()?;
    let stream = UnixStream::connect(path)?;
    stream.set_read_timeout(Some(HANDOVER_TIMEOUT))?;
    stream.set_write_timeout(Some(HANDOVER_TIMEOUT))?;
    send_fd(&stream, eventfd.as_raw_fd())?;
    let mut answer = [0u8; 1];
    std::io::Read::read_exact(&mut &stream, &mut answer)?;
    if answer[0] != 1 {
        return Err(io::Error::other(format!(
            "the model at {} holds {MAX_LISTENERS} eventfds already",
            path.display()
        )));
    }
    Ok(InterruptLink { eventfd, _connection: stream })
}

/// A non-blocking eventfd.
pub fn new_eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd has no memory-safety preconditions.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor this function owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Waits at most `timeout` for the eventfd to be raised, and consumes what was raised; true if
/// it was.
pub fn wait(eventfd: &OwnedFd, timeout: std::time::Duration) -> bool {
    let mut poll = libc::pollfd { fd: eventfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let millis = timeout.as_millis().clamp(0, i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&mut poll, 1, millis) };
    if ready <= 0 {
        return false;
    }
    let mut count = 0u64;
    // SAFETY: 8 writable bytes; the eventfd is non-blocking.
    unsafe { libc::read(eventfd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) == 8 }
}

/// Room for one `SCM_RIGHTS` message of one descriptor.
fn control_space() -> usize {
    // SAFETY: CMSG_SPACE is a pure computation.
    unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize }
}

/// A message header over one byte (`iov`) and `control`; both must outlive its use.
fn message_header(iov: &mut libc::iovec, control: &mut [u8]) -> libc::msghdr {
    // SAFETY: msghdr is plain data; all-zero is valid.
    let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
    header.msg_iov = iov;
    header.msg_iovlen = 1;
    header.msg_control = control.as_mut_ptr().cast();
    header.msg_controllen = control.len() as _;
    header
}

fn send_fd(stream: &UnixStream, fd: RawFd) -> io::Result<()> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    let mut control = vec![0u8; control_space()];
    let header = message_header(&mut iov, &mut control);
    // SAFETY: the control buffer holds one SCM_RIGHTS message of one descriptor.
    unsafe {
        let message = libc::CMSG_FIRSTHDR(&header);
        (*message).cmsg_level = libc::SOL_SOCKET;
        (*message).cmsg_type = libc::SCM_RIGHTS;
        (*message).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(message).cast::<RawFd>(), fd);
    }
    // SAFETY: a connected socket and a header whose buffers are live.
    if unsafe { libc::sendmsg(stream.as_raw_fd(), &header, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn receive_fd(stream: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    let mut control = vec![0u8; control_space()];
    let mut header = message_header(&mut iov, &mut control);
    // SAFETY: a connected socket and a header whose buffers are live.
    if unsafe { libc::recvmsg(stream.as_raw_fd(), &mut header, libc::MSG_CMSG_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the CMSG macros walk the control data the kernel filled, within its length.
    unsafe {
        let message = libc::CMSG_FIRSTHDR(&header);
        if message.is_null() || (*message).cmsg_level != libc::SOL_SOCKET || (*message).cmsg_type != libc::SCM_RIGHTS {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "no SCM_RIGHTS message"));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(message).cast::<RawFd>());
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_eventfd_handed_over_the_socket_is_raised_by_the_line() {
        let directory = tempfile::tempdir().unwrap();
        let path = socket_path(&directory.path().join("window"));
        assert!(path.to_string_lossy().ends_with("window.irq"));
        let line = serve(&path).unwrap();
        assert_eq!(line.listeners(), 0);
        let link = request(&path).unwrap();
        assert_eq!(line.listeners(), 1);
        assert!(!wait(&link.eventfd, std::time::Duration::ZERO), "nothing raised yet");
        line.raise();
        line.raise();
        assert!(wait(&link.eventfd, std::time::Duration::from_secs(5)), "raised");
        assert!(!wait(&link.eventfd, std::time::Duration::ZERO), "a wait consumes every raise so far");
        // A host that goes away gives its place back: more hosts than MAX_LISTENERS, one after
        // the other, each get the interrupt.
        drop(link);
        for _ in 0..MAX_LISTENERS + 2 {
            let started = std::time::Instant::now();
            while line.listeners() > 0 {
                assert!(started.elapsed() < std::time::Duration::from_secs(5), "a closed link is let go");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let link = request(&path).expect("a place is free again");
            line.raise();
            assert!(wait(&link.eventfd, std::time::Duration::from_secs(5)));
        }
    }

    #[test]
    fn the_line_holds_a_bounded_number_of_eventfds() {
        let line = InterruptLine::default();
        for id in 0..MAX_LISTENERS as u64 {
            assert!(line.connect(id, new_eventfd().unwrap()));
        }
        assert!(!line.connect(99, new_eventfd().unwrap()), "one more than MAX_LISTENERS is refused");
        line.disconnect(3);
        assert!(line.connect(99, new_eventfd().unwrap()), "a place given back is taken again");
    }
}
