//! A namespace reached by its name for as long as a program runs: what the NBD export serves.
//!
//! A [`Volume`] addresses its namespace by the id the first HELLO gave it, and a session that
//! finds the target's spaces listed otherwise after it was lost (a restart that renumbered
//! them, a grant revoked meanwhile) fails every request that names a space with
//! `SpacesChanged`, so that none reaches another space. The export would then answer EIO until
//! restarted. A `VolumeByName` opens the volume again instead: new sessions, a new HELLO, the
//! namespace looked up by name again, and serves on if it has the same geometry (block size and
//! capacity); the request that met the change is made again on the new volume. That is safe:
//! the failed request's pieces were not sent after the change, and every block instruction is
//! idempotent, so the pieces that had executed before it execute again on the same namespace.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::ClientError;
use crate::metrics::InitiatorMetrics;
use crate::nbd::backend::{BackendError, NbdBackend};
use crate::volume::{backend_error, Volume, VolumeOptions};

/// How soon a failed re-open is tried again: the requests that meet the change meanwhile fail at
/// once, instead of each opening sessions against a target that just refused.
const REOPEN_RETRY: Duration = Duration::from_secs(1);

/// Re-opens one request may cause before it fails (targets restarting over and over).
const MAX_REOPENS: usize = 3;

/// One namespace of one target, by name, re-opened when the target's spaces change.
#[derive(Debug)]
pub struct VolumeByName {
    current: Mutex<Arc<Volume>>,
    target: SocketAddr,
    options: VolumeOptions,
    metrics: Option<Arc<InitiatorMetrics>>,
    /// One re-open at a time; what it found is in `current`.
    reopening: tokio::sync::Mutex<Option<Instant>>,
}

impl VolumeByName {
    /// Opens namespace `namespace` (a name, or an id: the name it has then is what is looked for
    /// later) of `target`, each session recording its completions in a shard of `metrics`.
    pub async fn open(
        target: SocketAddr,
        namespace: &str,
        options: VolumeOptions,
        metrics: Option<Arc<InitiatorMetrics>>,
    ) -> Result<VolumeByName, ClientError> {
        let volume = Volume::open_observed(target, namespace, options, metrics.as_deref()).await?;
        Ok(VolumeByName {
            current: Mutex::new(Arc::new(volume)),
            target,
            options,
            metrics,
            reopening: tokio::sync::Mutex::new(None),
        })
    }

    /// The volume requests go to now.
    pub fn current(&self) -> Arc<Volume> {
        Arc::clone(&self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    /// Closes the current volume's sessions (see [`Volume::close`]) if nothing else holds it.
    pub async fn close(self) {
        let volume = self.current.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Ok(volume) = Arc::try_unwrap(volume) {
            volume.close().await;
        }
    }

    /// A volume to make again a request that `failed` answered with `SpacesChanged` (`why`):
    /// the one another request re-opened meanwhile, or a new one on the same namespace, found
    /// by name with the same geometry. An error when it cannot be (the namespace is gone, not
    /// granted, of another size, or a re-open failed less than [`REOPEN_RETRY`] ago).
    async fn reopen(&self, failed: &Arc<Volume>, why: &str) -> Result<Arc<Volume>, ClientError> {
        let mut last_failure = self.reopening.lock().await;
        let current = self.current();
        if !Arc::ptr_eq(&current, failed) {
            return Ok(current);
        }
        let name = failed.namespace().name.clone();
        let refused = |what: String| ClientError::SpacesChanged(format!("{why}; namespace {name:?} {what}"));
        if last_failure.is_some_and(|at| at.elapsed() < REOPEN_RETRY) {
            return Err(refused("could not be opened again a moment ago".into()));
        }
        let opened = Volume::open_observed(self.target, &name, self.options, self.metrics.as_deref()).await;
        let volume = match opened {
            Ok(volume) => volume,
            Err(error) => {
                *last_failure = Some(Instant::now());
                tracing::error!(namespace = %name, %error, "the target's spaces changed ({why}); cannot open the namespace again: its requests fail");
                return Err(refused(format!("could not be opened again: {error}")));
            }
        };
        let (was, now) = (failed.namespace(), volume.namespace());
        if (now.block_bytes, now.capacity_blocks) != (was.block_bytes, was.capacity_blocks) {
            *last_failure = Some(Instant::now());
            let what = format!(
                "is now {} blocks of {} bytes, not {} of {}: restart what serves it",
                now.capacity_blocks, now.block_bytes, was.capacity_blocks, was.block_bytes
            );
            tracing::error!(namespace = %name, "the target's spaces changed ({why}); the namespace {what}");
            return Err(refused(what));
        }
        *last_failure = None;
        tracing::warn!(
            namespace = %name,
            id = now.id,
            "the target's spaces changed ({why}); the namespace was found again by name (id {} before, {} now): serving on",
            was.id,
            now.id
        );
        let volume = Arc::new(volume);
        // The old volume's sessions end when the last request holding it is done.
        *self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::clone(&volume);
        Ok(volume)
    }
}

/// Runs `$call` on the current volume (bound to `$volume`), and again on a re-opened one each
/// time it fails with `SpacesChanged`, at most [`MAX_REOPENS`] times.
macro_rules! on_the_named_volume {
    ($self:ident, $volume:ident => $call:expr) => {{
        let mut $volume = $self.current();
        let mut reopens = 0;
        loop {
            match $call.await {
                Err(ClientError::SpacesChanged(why)) if reopens < MAX_REOPENS => {
                    reopens += 1;
                    $volume = $self.reopen(&$volume, &why).await.map_err(backend_error)?;
                }
                result => break result.map_err(backend_error),
            }
        }
    }};
}

impl NbdBackend for VolumeByName {
    // The geometry is the first volume's: a re-opened one has the same (`reopen`).
    fn size_bytes(&self) -> u64 {
        self.current().size_bytes()
    }

    fn block_bytes(&self) -> u32 {
        self.current().block_bytes()
    }

    fn preferred_bytes(&self) -> u32 {
        NbdBackend::preferred_bytes(&*self.current())
    }

    fn max_request_bytes(&self) -> u32 {
        NbdBackend::max_request_bytes(&*self.current())
    }

    async fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        on_the_named_volume!(self, volume => volume.read(offset, out))
    }

    async fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), BackendError> {
        on_the_named_volume!(self, volume => volume.write(offset, data, fua))
    }

    async fn flush(&self) -> Result<(), BackendError> {
        on_the_named_volume!(self, volume => volume.flush())
    }

    async fn trim(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        on_the_named_volume!(self, volume => volume.trim(offset, len))
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        on_the_named_volume!(self, volume => volume.write_zeroes(offset, len))
    }

    fn can_report_allocation(&self) -> bool {
        self.current().reports_allocation()
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<(u64, u32)>, BackendError> {
        on_the_named_volume!(self, volume => volume.block_status(offset, len))
    }
}
