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

use netdam_isa::control::NamespaceInfo;

use crate::async_client::AsyncClient;
use crate::error::ClientError;
use crate::metrics::InitiatorMetrics;
use crate::nbd::backend::{BackendError, NbdBackend};
use crate::volume::{backend_error, Volume, VolumeOptions};

/// How soon a failed re-open is tried again, at first: the requests that meet the change
/// meanwhile fail at once, instead of each opening sessions against a target that just refused.
/// Each failure in a row doubles it, up to [`REOPEN_RETRY_MAX`].
const REOPEN_RETRY: Duration = Duration::from_secs(1);

/// The longest wait between re-opens that keep failing (a namespace gone for good).
const REOPEN_RETRY_MAX: Duration = Duration::from_secs(16);

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
    reopening: tokio::sync::Mutex<Failures>,
}

/// Re-opens that failed in a row, and when the last did.
#[derive(Debug, Default)]
struct Failures {
    last: Option<Instant>,
    in_a_row: u32,
}

impl Failures {
    /// Whether the next re-open must wait still.
    fn backing_off(&self) -> bool {
        let wait = REOPEN_RETRY.saturating_mul(1 << self.in_a_row.saturating_sub(1).min(4)).min(REOPEN_RETRY_MAX);
        self.last.is_some_and(|at| at.elapsed() < wait)
    }

    fn failed(&mut self) {
        self.last = Some(Instant::now());
        self.in_a_row = self.in_a_row.saturating_add(1);
    }
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
            reopening: tokio::sync::Mutex::new(Failures::default()),
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
    /// granted, of another geometry, or a re-open failed a moment ago: see [`Failures`]).
    async fn reopen(&self, failed: &Arc<Volume>, why: &str) -> Result<Arc<Volume>, ClientError> {
        let mut failures = self.reopening.lock().await;
        let current = self.current();
        if !Arc::ptr_eq(&current, failed) {
            return Ok(current);
        }
        let name = failed.namespace().name.clone();
        let refused = |what: String| ClientError::SpacesChanged(format!("{why}; namespace {name:?} {what}"));
        if failures.backing_off() {
            return Err(refused("could not be opened again a moment ago (tried again shortly)".into()));
        }
        // First one unobserved session, to look the namespace up: a re-open that keeps failing
        // then opens no volume's worth of sessions, nor adds their metrics, each time.
        if let Err(what) = self.probe(failed, &name).await {
            failures.failed();
            tracing::error!(namespace = %name, "the target's spaces changed ({why}); the namespace {what}; its requests fail");
            return Err(refused(what));
        }
        let opened = Volume::open_observed(self.target, &name, self.options, self.metrics.as_deref()).await;
        let volume = match opened {
            Ok(volume) if same_geometry(volume.namespace(), failed.namespace()) => volume,
            other => {
                failures.failed();
                let what = match other {
                    Err(error) => error.to_string(),
                    Ok(_) => "its geometry changed again while it was opened".to_string(),
                };
                tracing::error!(namespace = %name, "the target's spaces changed ({why}); cannot open the namespace again: {what}");
                return Err(refused(format!("could not be opened again: {what}")));
            }
        };
        *failures = Failures::default();
        let (was, now) = (failed.namespace(), volume.namespace());
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

/// Whether `now` has the geometry of `was`: what an NBD client negotiated (size, block size,
/// whether holes are reported).
fn same_geometry(now: &NamespaceInfo, was: &NamespaceInfo) -> bool {
    (now.block_bytes, now.capacity_blocks, now.reports_allocation)
        == (was.block_bytes, was.capacity_blocks, was.reports_allocation)
}

impl VolumeByName {
    /// Looks namespace `name` up over one session without metrics: `Err` says why it cannot
    /// be served on (gone, not granted, another geometry, the target unreachable).
    async fn probe(&self, failed: &Volume, name: &str) -> Result<(), String> {
        let client = AsyncClient::connect_with(self.target, self.options.client)
            .await
            .map_err(|error| format!("could not be looked up again: {error}"))?;
        let found = client.info().namespace(name).cloned();
        client.close().await;
        let now = found.map_err(|error| format!("could not be found again: {error}"))?;
        let was = failed.namespace();
        if same_geometry(&now, was) {
            return Ok(());
        }
        let holes = match (now.reports_allocation, was.reports_allocation) {
            (true, false) => ", and now reports holes",
            (false, true) => ", and no longer reports holes",
            _ => "",
        };
        Err(format!(
            "is now {} blocks of {} bytes, not {} of {}{holes}: it is not served on (restart the export to serve it \
             as it is)",
            now.capacity_blocks, now.block_bytes, was.capacity_blocks, was.block_bytes
        ))
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
