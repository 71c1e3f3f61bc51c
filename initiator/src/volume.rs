//! A block namespace as one disk: the piece the NBD export, the fio engine and the benchmarks
//! all drive.
//!
//! A `Volume` addresses the namespace in bytes (offsets and lengths multiples of its block
//! size), splits each request into datagram-sized instructions, and spreads them over one or
//! more sessions, all in flight together. Each session has its own socket, so the target's
//! kernel hashes them to different workers: several sessions let several workers share the
//! load. Every instruction is idempotent (block reads and writes, FLUSH, TRIM, WRITE_ZEROES,
//! BLOCK_STATUS), so a lost answer or a target that lost the session is recovered by sending it
//! again.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use netdam_isa::block::{decode_extents, EXTENT_FLAG_HOLE, EXTENT_FLAG_ZERO};
use netdam_isa::control::NamespaceInfo;

use crate::async_client::{AsyncClient, Pending};
use crate::client::ClientOptions;
use crate::error::ClientError;
use crate::metrics::InitiatorMetrics;
use crate::nbd::backend::{BackendError, NbdBackend};
use crate::nbd::codec::{STATE_HOLE, STATE_ZERO};
use crate::op::Op;
use crate::pieces::{pieces, zeroing_piece_bytes};

/// Most sessions one volume opens.
pub const MAX_VOLUME_SESSIONS: usize = 64;

/// How a volume connects.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VolumeOptions {
    /// Sessions to spread requests over (each on its own socket, so on its own target worker
    /// when the target has several).
    pub sessions: usize,
    /// Settings of each session's client.
    pub client: ClientOptions,
}

impl Default for VolumeOptions {
    fn default() -> VolumeOptions {
        VolumeOptions { sessions: 1, client: ClientOptions::default() }
    }
}

/// Refuses a request that is not a whole number of blocks inside a namespace of `size_bytes`
/// (before anything is sent; the target would refuse it too). `what` names it in the error.
pub fn check_request(what: &str, offset: u64, len: u64, block_bytes: u32, size_bytes: u64) -> Result<(), ClientError> {
    misaligned(what, offset, len, block_bytes, size_bytes).map_or(Ok(()), Err)
}

/// A request that is not a whole number of blocks inside the namespace.
fn misaligned(what: &str, offset: u64, len: u64, block_bytes: u32, size_bytes: u64) -> Option<ClientError> {
    let block = u64::from(block_bytes);
    if !offset.is_multiple_of(block) || !len.is_multiple_of(block) {
        return Some(ClientError::Unaligned { what: what.to_string(), offset, len, block_bytes });
    }
    match offset.checked_add(len) {
        Some(end) if end <= size_bytes => None,
        _ => Some(ClientError::BeyondEnd { offset, len, size_bytes }),
    }
}

/// One namespace of one target, over one or more sessions.
#[derive(Debug)]
pub struct Volume {
    sessions: Vec<AsyncClient>,
    namespace: NamespaceInfo,
    /// Next session to give a piece to (round robin).
    next: AtomicUsize,
}

impl Volume {
    /// Opens `options.sessions` sessions to `target` and finds namespace `namespace` (a name,
    /// or an id). Runs on the current tokio runtime.
    pub async fn open(target: SocketAddr, namespace: &str, options: VolumeOptions) -> Result<Volume, ClientError> {
        Volume::open_observed(target, namespace, options, None).await
    }

    /// As [`Volume::open`], each session recording its completions in a shard of `metrics`.
    pub async fn open_observed(
        target: SocketAddr,
        namespace: &str,
        options: VolumeOptions,
        metrics: Option<&InitiatorMetrics>,
    ) -> Result<Volume, ClientError> {
        if !(1..=MAX_VOLUME_SESSIONS).contains(&options.sessions) {
            return Err(ClientError::Setting(format!(
                "sessions = {}: must be between 1 and {MAX_VOLUME_SESSIONS}",
                options.sessions
            )));
        }
        let mut sessions = Vec::with_capacity(options.sessions);
        // One count of outstanding requests for all of them: a caller at depth 2 over two
        // sessions is not two callers that wait for each answer.
        let outstanding = Arc::new(AtomicUsize::new(0));
        for _ in 0..options.sessions {
            let shard = metrics.map(InitiatorMetrics::new_session);
            sessions.push(AsyncClient::connect_sharing(target, options.client, shard, outstanding.clone()).await?);
        }
        let namespace = sessions[0].info().namespace(namespace)?.clone();
        // No write would fit (and hardly a read): refused here, naming both sizes, not at
        // every write.
        if sessions[0].info().blocks_per_transfer(namespace.block_bytes) == 0 {
            return Err(ClientError::Setting(format!(
                "namespace {:?} has {}-byte blocks, and the datagram size this session negotiated ({} bytes) carries \
                 no whole block with its headers: ask for larger datagrams (max_datagram_bytes), up to what the \
                 target's max_datagram_bytes allows",
                namespace.name,
                namespace.block_bytes,
                sessions[0].info().hello.max_datagram_bytes
            )));
        }
        Ok(Volume { sessions, namespace, next: AtomicUsize::new(0) })
    }

    /// The namespace as HELLO described it.
    pub fn namespace(&self) -> &NamespaceInfo {
        &self.namespace
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.namespace.capacity_blocks * u64::from(self.namespace.block_bytes)
    }

    /// Bytes per block: offsets and lengths are multiples of it.
    pub fn block_bytes(&self) -> u32 {
        self.namespace.block_bytes
    }

    /// Bytes one BREAD or BWRITE carries at most: requests are split into pieces of this size.
    pub fn transfer_bytes(&self) -> u32 {
        // At least one: `open` refused a namespace whose blocks no datagram carries.
        let blocks = self.sessions[0].info().blocks_per_transfer(self.namespace.block_bytes).max(1);
        blocks * self.namespace.block_bytes
    }

    /// Sessions requests are spread over.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Closes every session and waits until the target has confirmed (or the short wait for it
    /// ran out): call it before the runtime stops, so the target's slots are freed at once.
    pub async fn close(self) {
        for session in self.sessions {
            session.close().await;
        }
    }

    fn session(&self) -> &AsyncClient {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.sessions.len();
        &self.sessions[index]
    }

    fn check(&self, what: &str, offset: u64, len: u64) -> Result<(), ClientError> {
        check_request(what, offset, len, self.block_bytes(), self.size_bytes())
    }

    /// Reads `out.len()` bytes at `offset`, every piece in flight at once.
    pub async fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), ClientError> {
        self.check("read", offset, out.len() as u64)?;
        let block = u64::from(self.block_bytes());
        let mut pending: Vec<(usize, usize, Pending)> = Vec::new();
        // Every piece submitted is waited for, even after one failed: none is left in flight
        // when this returns, so a caller that makes the request again races no piece of it.
        let mut first_error = None;
        for (at, position, len) in pieces(offset, out.len() as u64, u64::from(self.transfer_bytes())) {
            let op = Op::block_read(self.namespace.id, at / block, (len / block) as u32);
            match self.session().submit(vec![op]).await {
                Ok(answer) => pending.push((position as usize, len as usize, answer)),
                Err(error) => {
                    first_error = Some(error);
                    break;
                }
            }
        }
        for (position, len, answer) in pending {
            let piece = answer.wait().await.and_then(|reply| match reply.data(0) {
                Ok(data) if data.len() == len => {
                    out[position..position + len].copy_from_slice(data);
                    Ok(())
                }
                Ok(_) => Err(ClientError::MissingResult(0)),
                Err(error) => Err(error),
            });
            if let Err(error) = piece {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Writes `data` at `offset`; with `fua` every byte is durable when this returns.
    ///
    /// Not cancel-safe, as a write handed to a device is not: dropping the future (a timeout, a
    /// `select!`) does not call the write off. Its pieces already submitted still reach the
    /// target, each executed at most once, and one may land after a later write to the same
    /// blocks has completed: over another session of the volume, or, over the same session,
    /// when its datagram was lost and sent again. A caller that abandons a write and writes the
    /// range again reads it back before relying on it.
    pub async fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ClientError> {
        self.check("write", offset, data.len() as u64)?;
        let block_bytes = self.block_bytes();
        let block = u64::from(block_bytes);
        let mut pending = Vec::new();
        for (at, position, len) in pieces(offset, data.len() as u64, u64::from(self.transfer_bytes())) {
            let bytes = &data[position as usize..(position + len) as usize];
            let op = Op::block_write(self.namespace.id, at / block, block_bytes, bytes, fua);
            match self.session().submit(vec![op]).await {
                Ok(answer) => pending.push(answer),
                Err(error) => return settle(pending).await.and(Err(error)),
            }
        }
        settle(pending).await
    }

    /// Makes every write answered before it durable, whichever session (or process) sent it:
    /// the target flushes the namespace's whole device.
    pub async fn flush(&self) -> Result<(), ClientError> {
        self.session().call(vec![Op::flush(self.namespace.id)]).await?.data(0).map(|_| ())
    }

    /// Deallocates `len` bytes at `offset`: they read as zeroes afterwards.
    pub async fn trim(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        self.zero_range("trim", offset, len, Op::trim).await
    }

    /// Writes zeroes over `len` bytes at `offset`.
    pub async fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        self.zero_range("write_zeroes", offset, len, Op::write_zeroes).await
    }

    /// Whether [`Volume::block_status`] can tell holes from data (HELLO says so for a file
    /// namespace; on others the target answers `not_supported`).
    pub fn reports_allocation(&self) -> bool {
        self.namespace.reports_allocation
    }

    /// The allocation of `len` bytes at `offset`: consecutive extents `(length in bytes,
    /// flags)` from `offset`, flags bit 0 a hole, bit 1 reads as zeroes (the bits of the ISA
    /// and of NBD's `base:allocation`). They cover at least one block and at most `len` bytes:
    /// one BLOCK_STATUS, which answers at most 64 extents, so a fragmented range may come back
    /// short; ask again from where it ends. An empty range has no extents.
    pub async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<(u64, u32)>, ClientError> {
        self.check("block_status", offset, len)?;
        let block = u64::from(self.block_bytes());
        let num_blocks = u32::try_from(len / block).unwrap_or(u32::MAX);
        if num_blocks == 0 {
            return Ok(Vec::new());
        }
        let reply = self.session().call(vec![Op::block_status(self.namespace.id, offset / block, num_blocks)]).await?;
        let extents = decode_extents(reply.data(0)?, num_blocks)?;
        Ok(extents
            .into_iter()
            .map(|extent| {
                let mut flags = 0;
                if extent.flags & EXTENT_FLAG_HOLE != 0 {
                    flags |= STATE_HOLE;
                }
                if extent.flags & EXTENT_FLAG_ZERO != 0 {
                    flags |= STATE_ZERO;
                }
                (u64::from(extent.num_blocks) * block, flags)
            })
            .collect())
    }

    async fn zero_range(
        &self,
        what: &str,
        offset: u64,
        len: u64,
        op: fn(u16, u64, u32) -> Op,
    ) -> Result<(), ClientError> {
        self.check(what, offset, len)?;
        let block = u64::from(self.block_bytes());
        let mut pending = Vec::new();
        for (at, _, piece) in pieces(offset, len, zeroing_piece_bytes(self.block_bytes())) {
            let request = op(self.namespace.id, at / block, (piece / block) as u32);
            match self.session().submit(vec![request]).await {
                Ok(answer) => pending.push(answer),
                Err(error) => return settle(pending).await.and(Err(error)),
            }
        }
        settle(pending).await
    }
}

/// Waits for every piece of a request, even after one failed, and gives the first failure: none
/// is left in flight when the request returns, so a caller that makes it again (the export after
/// a spaces change, `VolumeByName`) races no piece of it to the same blocks.
async fn settle(pending: Vec<Pending>) -> Result<(), ClientError> {
    let mut first_error = None;
    for answer in pending {
        if let Err(error) = answer.wait().await.and_then(|reply| reply.data(0).map(|_| ())) {
            first_error.get_or_insert(error);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// How the NBD export reports a failed volume request.
pub(crate) fn backend_error(error: ClientError) -> BackendError {
    match error {
        ClientError::Unaligned { .. } | ClientError::BeyondEnd { .. } => BackendError::Invalid(error.to_string()),
        ClientError::Refused { status: netdam_isa::Status::OutOfRange, .. } => BackendError::Invalid(error.to_string()),
        ClientError::Refused { status: netdam_isa::Status::NotSupported, .. } => {
            BackendError::NotSupported(error.to_string())
        }
        ClientError::Refused { status: netdam_isa::Status::NoSpace, .. } => BackendError::NoSpace(error.to_string()),
        ClientError::Refused { status: netdam_isa::Status::PermissionDenied, .. } => {
            BackendError::NotPermitted(error.to_string())
        }
        other => BackendError::Io(other.to_string()),
    }
}

/// Largest NBD request the export takes at once; the volume splits it into transfers.
const NBD_MAX_REQUEST_BYTES: u32 = 32 << 20;

impl NbdBackend for Volume {
    fn size_bytes(&self) -> u64 {
        Volume::size_bytes(self)
    }

    fn block_bytes(&self) -> u32 {
        Volume::block_bytes(self)
    }

    fn preferred_bytes(&self) -> u32 {
        // Whole transfers fill datagrams; a block size above the transfer size is the floor.
        self.transfer_bytes().max(self.block_bytes())
    }

    fn max_request_bytes(&self) -> u32 {
        NBD_MAX_REQUEST_BYTES
    }

    async fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        Volume::read(self, offset, out).await.map_err(backend_error)
    }

    async fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), BackendError> {
        Volume::write(self, offset, data, fua).await.map_err(backend_error)
    }

    async fn flush(&self) -> Result<(), BackendError> {
        Volume::flush(self).await.map_err(backend_error)
    }

    async fn trim(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        Volume::trim(self, offset, len).await.map_err(backend_error)
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        Volume::write_zeroes(self, offset, len).await.map_err(backend_error)
    }

    fn can_report_allocation(&self) -> bool {
        self.reports_allocation()
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<(u64, u32)>, BackendError> {
        Volume::block_status(self, offset, len).await.map_err(backend_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal for want of a grant reaches an NBD client as EPERM, which says what it is; it
    /// was EIO, which a kernel or a file system takes for a failing medium.
    #[test]
    fn refusals_map_to_the_nbd_error_that_says_what_they_are() {
        use netdam_isa::{Opcode, Status};
        let refused = |status| ClientError::Refused { opcode: Opcode::BlockWrite as u8, status };
        assert!(matches!(backend_error(refused(Status::PermissionDenied)), BackendError::NotPermitted(_)));
        assert!(matches!(backend_error(refused(Status::NoSpace)), BackendError::NoSpace(_)));
        assert!(matches!(backend_error(refused(Status::OutOfRange)), BackendError::Invalid(_)));
        assert!(matches!(backend_error(ClientError::SessionLost), BackendError::Io(_)));
    }

    #[test]
    fn requests_must_be_whole_blocks_inside_the_namespace() {
        assert!(misaligned("read", 4096, 8192, 4096, 1 << 20).is_none());
        assert!(matches!(misaligned("read", 100, 4096, 4096, 1 << 20), Some(ClientError::Unaligned { .. })));
        assert!(matches!(misaligned("read", 0, 100, 4096, 1 << 20), Some(ClientError::Unaligned { .. })));
        assert!(matches!(misaligned("read", 1 << 20, 4096, 4096, 1 << 20), Some(ClientError::BeyondEnd { .. })));
        assert!(matches!(misaligned("read", 4096, 4096, 512, 4096), Some(ClientError::BeyondEnd { .. })));
        let wraps = misaligned("read", u64::MAX / 4096 * 4096, 8192, 4096, u64::MAX);
        assert!(matches!(wraps, Some(ClientError::BeyondEnd { .. })), "{wraps:?}");
    }
}
