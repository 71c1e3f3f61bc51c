//! What a file-backed region does when its file shrinks under the running target.
//!
//! Someone truncating a region's file (or its storage going away) leaves the mapping's pages
//! past the new end without backing; the next touch of one is a SIGBUS, which kills the process.
//! Those bytes cannot be made readable again, and answering with zeroes in their place would
//! serve wrong data as if it were stored, so the target still stops. What this module adds is
//! the reason: before the process dies it writes which region and which file, and what to do.
//!
//! Every file mapping is registered in a fixed table of atomics that the signal handler reads
//! without a lock or an allocation; each entry's message is formatted when the mapping is made.
//! A fault outside every registered mapping, or one the kernel did not raise for an access (a
//! `kill -BUS`, an asynchronous machine-check notice), goes to the handler that was installed
//! before (the standard library's, which resets the default action) or takes the default.

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Mutex, Once, OnceLock};

/// Mappings that can be named at once: every region and every pmem namespace a target may
/// serve (`MAX_REGIONS` and `MAX_NAMESPACES`, 64 each). A mapping beyond them still works; its
/// fault stops the process unnamed, and its registration says so in the log.
const SLOTS: usize = 128;

/// `si_code`s of a bus error the kernel raises for an access to a mapping: `BUS_ADRALN`,
/// `BUS_ADRERR` (a page past the file's end, or one its storage failed to read),
/// `BUS_OBJERR`, `BUS_MCEERR_AR` (asm-generic/siginfo.h; the libc crate lacks them on Linux).
const ACCESS_FAULTS: core::ops::RangeInclusive<libc::c_int> = 1..=4;

struct Slot {
    /// First byte of the mapping; 0 while the slot is free.
    start: AtomicUsize,
    /// One past its last byte.
    end: AtomicUsize,
    /// The message the handler writes (a leaked `Box<[u8]>` while the slot is taken).
    message: AtomicPtr<u8>,
    message_len: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)] // Only to build the table's entries.
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    message: AtomicPtr::new(core::ptr::null_mut()),
    message_len: AtomicUsize::new(0),
};

static TABLE: [Slot; SLOTS] = [FREE; SLOTS];
/// Serialises registrations; the handler never takes it.
static REGISTERING: Mutex<()> = Mutex::new(());
static INSTALL: Once = Once::new();
/// The SIGBUS disposition found when ours was installed.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// A file mapping registered for naming; unregisters when dropped (before the unmap).
#[derive(Debug)]
pub(crate) struct Registration {
    slot: Option<usize>,
}

/// Registers the mapping `base..base+len` of `space` (`region "NAME"`, say) on `path`
/// (`size_bytes` long), so that a SIGBUS inside it is reported by name before the process stops.
pub(crate) fn register(
    base: *mut u8,
    len: usize,
    space: &str,
    path: &std::path::Path,
    size_bytes: u64,
) -> Registration {
    INSTALL.call_once(install_handler);
    // The program's name, as the daemon's own lines begin with it.
    let program = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.file_name().map(|name| name.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "netdam".to_string());
    let message = format!(
        "{program}: {space}: its file {} was cut short or its storage failed while the target ran \
         (a bus error touching the mapping); the target stops rather than answer with bytes it does not hold. \
         Put the file back at its size ({size_bytes} bytes), from a backup if its data is gone, then start again.\n",
        path.display()
    )
    .into_bytes()
    .into_boxed_slice();
    let _registering = REGISTERING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some(slot) = TABLE.iter().position(|slot| slot.start.load(Ordering::Acquire) == 0) else {
        tracing::warn!(
            "{space}: more than {SLOTS} file mappings are open; if its file is cut short while the target runs, \
             the target stops without naming it"
        );
        return Registration { slot: None };
    };
    let entry = &TABLE[slot];
    let message_len = message.len();
    entry.message.store(Box::leak(message).as_mut_ptr(), Ordering::Relaxed);
    entry.message_len.store(message_len, Ordering::Relaxed);
    entry.end.store(base as usize + len, Ordering::Relaxed);
    // Published last: the handler reads start first, with Acquire.
    entry.start.store(base as usize, Ordering::Release);
    Registration { slot: Some(slot) }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let Some(slot) = self.slot else { return };
        let _registering = REGISTERING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = &TABLE[slot];
        entry.start.store(0, Ordering::Release);
        let message = entry.message.swap(core::ptr::null_mut(), Ordering::Relaxed);
        let message_len = entry.message_len.load(Ordering::Relaxed);
        if !message.is_null() {
            // SAFETY: the pointer and length are those of the Box leaked in `register`, and the
            // handler cannot be reading it: a fault in this mapping needs an access to it, and
            // the region is being dropped, so nothing accesses it any more.
            drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(message, message_len)) });
        }
    }
}

fn install_handler() {
    // SAFETY: sigaction with a zeroed struct filled in here; the handler only reads atomics,
    // writes to fd 2 and resets its own disposition, all async-signal-safe.
    unsafe {
        let mut action: libc::sigaction = core::mem::zeroed();
        let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = on_bus_error;
        action.sa_sigaction = handler as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut action.sa_mask);
        let mut previous: libc::sigaction = core::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, &action, &mut previous) == 0 {
            let _ = PREVIOUS.set(previous);
        }
    }
}

extern "C" fn on_bus_error(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel hands a valid siginfo_t to an SA_SIGINFO handler.
    let (address, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    let ours = ACCESS_FAULTS.contains(&code).then_some(()).and(TABLE.iter().find(|slot| {
        let start = slot.start.load(Ordering::Acquire);
        start != 0 && (start..slot.end.load(Ordering::Relaxed)).contains(&address)
    }));
    match ours {
        Some(slot) => {
            let message = slot.message.load(Ordering::Relaxed);
            if !message.is_null() {
                // SAFETY: the message of a taken slot is live (see Registration::drop).
                let message = unsafe { core::slice::from_raw_parts(message, slot.message_len.load(Ordering::Relaxed)) };
                write_all_to_stderr(message);
            }
            // Returning re-runs the access, which now takes the default action: the process
            // stops with SIGBUS, as without this handler, so supervisors see the same signal.
            reset_to_default(signal);
        }
        None => match PREVIOUS.get() {
            Some(previous) if previous.sa_flags & libc::SA_SIGINFO != 0 && previous.sa_sigaction > libc::SIG_IGN => {
                // SAFETY: an SA_SIGINFO handler installed before ours, called as the kernel would.
                let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { core::mem::transmute(previous.sa_sigaction) };
                handler(signal, info, context);
            }
            Some(previous) if previous.sa_sigaction > libc::SIG_IGN => {
                // SAFETY: a plain handler installed before ours.
                let handler: extern "C" fn(libc::c_int) = unsafe { core::mem::transmute(previous.sa_sigaction) };
                handler(signal);
            }
            // Default or ignored: a fault cannot be ignored, so the default action.
            _ => reset_to_default(signal),
        },
    }
}

/// `write(2)` until all of `bytes` is written, or it fails other than by an interruption.
fn write_all_to_stderr(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: writes from a live slice; async-signal-safe.
        let written = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        match usize::try_from(written) {
            Ok(written) if written > 0 => bytes = &bytes[written..],
            // errno is read through its thread-local location: async-signal-safe.
            _ if written < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => continue,
            _ => return,
        }
    }
}

fn reset_to_default(signal: libc::c_int) {
    // SAFETY: resets this signal's disposition; async-signal-safe.
    unsafe {
        let mut action: libc::sigaction = core::mem::zeroed();
        action.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(signal, &action, core::ptr::null_mut());
    }
}
