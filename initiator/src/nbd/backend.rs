//! What an NBD export serves: a disk of whole blocks with NVMe-like durability rules. The
//! netdam `Volume` implements it over sessions to a target; tests may implement it in memory.

use std::future::Future;

#[cfg(doc)]
use crate::nbd::codec::{STATE_HOLE, STATE_ZERO};

/// Why a backend request failed, as NBD reports it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The device failed (NBD `EIO`).
    #[error("I/O error: {0}")]
    Io(String),
    /// The request lies beyond the end or is not aligned (NBD `EINVAL`).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The device is full (NBD `ENOSPC`).
    #[error("no space left: {0}")]
    NoSpace(String),
    /// The operation is not supported (NBD `ENOTSUP`).
    #[error("not supported: {0}")]
    NotSupported(String),
    /// The backend refused the operation to this export (NBD `EPERM`): the export's key holds
    /// no grant for it.
    #[error("not permitted: {0}")]
    NotPermitted(String),
}

/// A disk an NBD export serves. Offsets and lengths are in bytes and are multiples of
/// [`NbdBackend::block_bytes`]; the server checks that before calling.
pub trait NbdBackend: Send + Sync + 'static {
    /// Size in bytes.
    fn size_bytes(&self) -> u64;
    /// The smallest unit of I/O: requests are multiples of it.
    fn block_bytes(&self) -> u32;
    /// The size requests are best split into (at most `max_request_bytes`).
    fn preferred_bytes(&self) -> u32;
    /// The largest request the backend takes at once.
    fn max_request_bytes(&self) -> u32;
    /// Reads `out.len()` bytes at `offset`.
    fn read(&self, offset: u64, out: &mut [u8]) -> impl Future<Output = Result<(), BackendError>> + Send;
    /// Writes `data` at `offset`; with `fua` it is durable when this returns.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> impl Future<Output = Result<(), BackendError>> + Send;
    /// Makes every write that completed before this call durable, whichever connection made it.
    fn flush(&self) -> impl Future<Output = Result<(), BackendError>> + Send;
    /// Deallocates a range: it reads as zeroes afterwards.
    fn trim(&self, offset: u64, len: u64) -> impl Future<Output = Result<(), BackendError>> + Send;
    /// Writes zeroes over a range.
    fn write_zeroes(&self, offset: u64, len: u64) -> impl Future<Output = Result<(), BackendError>> + Send;
    /// Whether a trimmed range is guaranteed to read back as zeroes, as [`NbdBackend::trim`]
    /// promises. Then the export zeroes ranges by trimming when the client allows holes, and
    /// fast-zero requests succeed. A backend whose trim may leave old data behind (a discard on
    /// a device that does not read deallocated blocks as zeroes) returns `false`: the export
    /// then zeroes only with [`NbdBackend::write_zeroes`], and fast-zero requests fail at once
    /// with `ENOTSUP` (which clients handle by writing zeroes themselves).
    fn trim_reads_zeroes(&self) -> bool {
        true
    }
    /// Whether [`NbdBackend::block_status`] can tell holes from data. Then the export offers
    /// the `base:allocation` metadata context; otherwise it offers none, and clients treat the
    /// whole export as allocated data.
    fn can_report_allocation(&self) -> bool {
        false
    }
    /// The allocation of the range of `len` bytes at `offset`: consecutive extents
    /// `(length in bytes, flags)` from `offset` on, flags as NBD's `base:allocation` defines
    /// them ([`STATE_HOLE`], [`STATE_ZERO`]). Each length is a positive multiple of
    /// [`NbdBackend::block_bytes`]; together they cover at least one block and at most `len`
    /// bytes (a short answer is fine: the client asks again from where it ends). The server
    /// calls it only when [`NbdBackend::can_report_allocation`] says so.
    fn block_status(
        &self,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<Vec<(u64, u32)>, BackendError>> + Send {
        let _ = (offset, len);
        std::future::ready(Err(BackendError::NotSupported("this backend cannot report allocation".into())))
    }
}
