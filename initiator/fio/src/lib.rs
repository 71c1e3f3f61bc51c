//! A fio external ioengine for netdam targets: `libnetdam_fio.so`.
//!
//! fio has no stable plugin ABI: an engine must be compiled against the headers of the very fio
//! that loads it. So the engine is two halves linked into one shared object:
//! - `shim/netdam_fio.c`, compiled against fio's own headers (Debian's source package for the
//!   fio it ships), fills fio's `struct ioengine_ops` and its option table, and translates fio's
//!   structures into the small C ABI of `shim/netdam_fio.h`;
//! - this crate, which implements that ABI with the netdam initiator: per fio thread, one or
//!   more blocking [`netdam_initiator::Client`] sessions driven without blocking from fio's own
//!   thread (`queue` queues, `commit` sends, `getevents` reads the sockets), with no thread or
//!   runtime of its own.
//!
//! `build.rs` compiles the shim when `FIO_SOURCE` names a configured fio source tree
//! (`ops/fio-plugin.sh` sets it); without it the crate builds (and tests) without the shim, and
//! the library is no fio engine.
//!
//! Every entry point catches panics: unwinding into fio's C frames is undefined behaviour, so a
//! bug becomes an error code (and a message on stderr) instead.

pub mod engine;
pub mod settings;

use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use crate::engine::{Cookie, Engine, Io, IoBuffer, Kind, OpenError};
use crate::settings::{RawSettings, Settings};

/// `struct netdam_fio_settings`.
#[repr(C)]
#[derive(Debug)]
pub struct FioSettings {
    /// fio's job name.
    pub job: *const c_char,
    /// `target=`.
    pub target: *const c_char,
    /// `namespace=`.
    pub namespace_name: *const c_char,
    /// `region=`.
    pub region: *const c_char,
    /// `sessions=`.
    pub sessions: u32,
    /// `poll=`.
    pub poll: *const c_char,
    /// `key=`.
    pub key: *const c_char,
    /// `encrypt=` (0 or 1).
    pub encrypt: u32,
    /// `coalesce=` (0 or 1).
    pub coalesce: u32,
    /// fio's `sync=` other than none (0 or 1).
    pub fua: u32,
}

/// `struct netdam_fio_space`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct FioSpace {
    /// Size in bytes.
    pub size_bytes: u64,
    /// Offsets and lengths must be multiples of it.
    pub block_bytes: u32,
}

/// `struct netdam_fio_completion`.
#[repr(C)]
#[derive(Debug)]
pub struct FioCompletion {
    /// The cookie given to `netdam_fio_submit`.
    pub cookie: *mut c_void,
    /// 0 or a positive errno.
    pub error: i32,
}

/// The opaque `struct netdam_fio_engine`.
pub struct FioEngine(Engine);

/// Runs `body`, turning a panic into `on_panic` after saying so: nothing may unwind into fio.
fn guarded<T>(what: &str, on_panic: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(_) => {
            // The panic hook has printed the panic itself; say where it surfaced.
            eprintln!("netdam: internal error in {what} (a bug: please report it with the message above)");
            on_panic
        }
    }
}

/// A C string from fio, or `None` for NULL or text that is not UTF-8 (reported as such).
///
/// # Safety
/// `text` is NULL or a NUL-terminated string that outlives the returned borrow.
unsafe fn text<'a>(option: &str, text: *const c_char) -> Result<Option<&'a str>, String> {
    if text.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null, and NUL-terminated and live per this function's contract.
    let bytes = unsafe { CStr::from_ptr(text) };
    bytes.to_str().map(Some).map_err(|_| format!("{option}={}: not valid UTF-8", bytes.to_string_lossy()))
}

/// The settings fio parsed, checked.
///
/// # Safety
/// `settings` is NULL or points to a `struct netdam_fio_settings` whose strings are NULL or
/// NUL-terminated, all valid for the call.
unsafe fn settings_of(settings: *const FioSettings) -> Result<Settings, OpenError> {
    let invalid = |message: String| OpenError { errno: libc::EINVAL, message };
    // SAFETY: NULL or a valid, live struct per this function's contract.
    let Some(settings) = (unsafe { settings.as_ref() }) else {
        return Err(invalid("no settings given (a bug in the fio shim)".to_string()));
    };
    // SAFETY: each string is NULL or NUL-terminated and live for this call.
    let raw = unsafe {
        RawSettings {
            target: text("target", settings.target).map_err(invalid)?,
            namespace: text("namespace", settings.namespace_name).map_err(invalid)?,
            region: text("region", settings.region).map_err(invalid)?,
            sessions: settings.sessions,
            poll: text("poll", settings.poll).map_err(invalid)?,
            key: text("key", settings.key).map_err(invalid)?,
            encrypt: settings.encrypt != 0,
            coalesce: settings.coalesce != 0,
            fua: settings.fua != 0,
        }
    };
    Settings::parse(&raw).map_err(|error| invalid(error.0))
}

/// Prints an error the way every message of the engine looks: `netdam: option=value: what`.
fn complain(message: &str) {
    eprintln!("netdam: {message}");
}

/// See `netdam_fio_probe` in `shim/netdam_fio.h`.
///
/// # Safety
/// `settings` as in the header; `space` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn netdam_fio_probe(settings: *const FioSettings, space: *mut FioSpace) -> i32 {
    guarded("netdam_fio_probe", libc::EIO, || {
        // SAFETY: the caller passes settings as the header describes.
        let probed = unsafe { settings_of(settings) }.and_then(|settings| engine::probe(&settings));
        match probed {
            Ok(size) => {
                // SAFETY: NULL or a writable `struct netdam_fio_space` per the caller.
                if let Some(space) = unsafe { space.as_mut() } {
                    *space = FioSpace { size_bytes: size.size_bytes, block_bytes: size.block_bytes };
                }
                0
            }
            Err(error) => {
                complain(&error.message);
                error.errno
            }
        }
    })
}

/// See `netdam_fio_open` in `shim/netdam_fio.h`.
///
/// # Safety
/// `settings` as in the header; `engine` writable.
#[no_mangle]
pub unsafe extern "C" fn netdam_fio_open(
    settings: *const FioSettings,
    iodepth: u32,
    engine: *mut *mut FioEngine,
) -> i32 {
    guarded("netdam_fio_open", libc::EIO, || {
        if engine.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the caller passes settings as the header describes.
        let opened = unsafe { settings_of(settings) }.and_then(|settings| Engine::open(&settings, iodepth as usize));
        match opened {
            Ok(opened) => {
                // SAFETY: non-null and writable per the caller.
                unsafe { *engine = Box::into_raw(Box::new(FioEngine(opened))) };
                0
            }
            Err(error) => {
                complain(&error.message);
                error.errno
            }
        }
    })
}

/// See `netdam_fio_submit` in `shim/netdam_fio.h`.
///
/// # Safety
/// `engine` came from `netdam_fio_open` and is not closed; for reads and writes `buffer` is
/// valid for `len` bytes and left alone until the completion carrying `cookie` is reaped.
#[no_mangle]
pub unsafe extern "C" fn netdam_fio_submit(
    engine: *mut FioEngine,
    kind: u32,
    offset: u64,
    buffer: *mut c_void,
    len: u64,
    cookie: *mut c_void,
) -> i32 {
    guarded("netdam_fio_submit", libc::EIO, || {
        // SAFETY: NULL or a live engine, used by fio's thread alone, per the caller.
        let Some(engine) = (unsafe { engine.as_mut() }) else { return libc::EINVAL };
        let Some(kind) = Kind::from_abi(kind) else { return libc::EINVAL };
        let io = match kind {
            Kind::Read | Kind::Write => {
                let Ok(len) = usize::try_from(len) else { return libc::EINVAL };
                if buffer.is_null() && len != 0 {
                    return libc::EINVAL;
                }
                // SAFETY: fio's io_u buffer, valid for `len` bytes and untouched until the I/O
                // is reaped, per the caller.
                let buffer = unsafe { IoBuffer::new(buffer.cast(), len) };
                if kind == Kind::Read {
                    Io::Read { offset, buffer }
                } else {
                    Io::Write { offset, buffer }
                }
            }
            Kind::Sync => Io::Sync,
            Kind::Trim => Io::Trim { offset, len },
        };
        match engine.0.submit(io, Cookie(cookie)) {
            Ok(()) => 0,
            Err(errno) => errno,
        }
    })
}

/// See `netdam_fio_commit` in `shim/netdam_fio.h`.
///
/// # Safety
/// `engine` came from `netdam_fio_open` and is not closed.
#[no_mangle]
pub unsafe extern "C" fn netdam_fio_commit(engine: *mut FioEngine) {
    guarded("netdam_fio_commit", (), || {
        // SAFETY: NULL or a live engine, used by fio's thread alone, per the caller.
        if let Some(engine) = unsafe { engine.as_mut() } {
            engine.0.commit();
        }
    })
}

/// See `netdam_fio_reap` in `shim/netdam_fio.h`.
///
/// # Safety
/// `engine` came from `netdam_fio_open` and is not closed; `out` has room for `max` entries.
#[no_mangle]
pub unsafe extern "C" fn netdam_fio_reap(
    engine: *mut FioEngine,
    min: u32,
    max: u32,
    timeout_ns: i64,
    out: *mut FioCompletion,
) -> u32 {
    guarded("netdam_fio_reap", 0, || {
        // SAFETY: NULL or a live engine, used by fio's thread alone, per the caller.
        let Some(engine) = (unsafe { engine.as_mut() }) else { return 0 };
        if out.is_null() || max == 0 {
            return 0;
        }
        let timeout = u64::try_from(timeout_ns).ok().map(Duration::from_nanos);
        let mut written = 0usize;
        let taken = engine.0.reap(min as usize, max as usize, timeout, |completion| {
            // SAFETY: `reap` hands over at most `max` completions and `out` has room for
            // `max`, per the caller.
            unsafe { out.add(written).write(FioCompletion { cookie: completion.cookie.0, error: completion.errno }) };
            written += 1;
        });
        taken as u32
    })
}

/// See `netdam_fio_close` in `shim/netdam_fio.h`.
///
/// # Safety
/// `engine` is NULL or came from `netdam_fio_open` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn netdam_fio_close(engine: *mut FioEngine) {
    guarded("netdam_fio_close", (), || {
        if engine.is_null() {
            return;
        }
        // SAFETY: from `Box::into_raw` in `netdam_fio_open`, given back once, per the caller.
        let engine = unsafe { Box::from_raw(engine) };
        engine.0.close();
    })
}

/// fio looks an external engine up by this name (`dlsym(handle, "get_ioengine")`). The shim's
/// `struct ioengine_ops` is a C symbol, which a Rust cdylib does not export; this Rust-exported
/// function hands fio the shim's.
///
/// # Safety
/// `ops` is NULL or writable (fio passes the address of its `struct ioengine_ops *`).
#[cfg(netdam_fio_shim)]
#[no_mangle]
pub unsafe extern "C" fn get_ioengine(ops: *mut *mut c_void) {
    extern "C" {
        fn netdam_fio_shim_ioengine() -> *mut c_void;
    }
    if ops.is_null() {
        return;
    }
    // SAFETY: the shim's function takes nothing and returns the address of its static
    // `struct ioengine_ops`; `ops` is non-null and fio's to write to.
    unsafe { *ops = netdam_fio_shim_ioengine() };
}
