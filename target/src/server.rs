//! Starting and stopping a target: regions, shared state, one thread per worker.

use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use netdam_isa::engine::Engine;
use netdam_isa::limits::NONCE_RESERVATION_BLOCK;
use netdam_isa::time::MonotonicClock;
use netdam_isa::Duration;
use netdam_metrics::MetricsServer;
use netdam_pmem::{Region, RegionError};

use crate::config::{
    blocks_fit_datagrams, check_distinct_backings, validate_spaces, Config, ConfigError, EngineChoice, NamespaceConfig,
    RegionConfig,
};
use crate::configured_files;
use crate::cookies::CookieJar;
use crate::crypto::{CryptoError, KeyRing};
use crate::dispatch::{Dispatcher, Shared};
use crate::engine::SoftwareEngine;
use crate::fpga_engine::{DeviceNamespace, EngineState, FpgaEngine, FpgaSettings};
use crate::metadata::{MetadataError, MetadataStore, Stored};
use crate::metrics::{BuildInfo, TargetCollector};
use crate::namespaces::{Namespace, NamespaceError, NamespaceTable};
use crate::regions::RegionTable;
use crate::socket;
use crate::stats::StatsSnapshot;
use crate::tenant_watch::{self, WatchHandle};
use crate::tenants::TenantCell;
use crate::worker::{self, WorkerSettings};

/// Why a target could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A setting is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A region could not be opened.
    #[error(transparent)]
    Region(#[from] RegionError),
    /// A namespace could not be opened.
    #[error(transparent)]
    Namespace(#[from] NamespaceError),
    /// The metadata store could not be read.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// The data directory could not be created.
    #[error("cannot create data directory {path}: {source}")]
    DataDir { path: PathBuf, source: io::Error },
    /// Another target serves the data directory (holds its lock): two would write the same
    /// regions and reserve the same nonces under the same keys.
    #[error(
        "another target{} serves the data directory {path}: stop it, or give this one a data directory of its own (--data-dir)",
        match pid { Some(pid) => format!(" (pid {pid})"), None => String::new() }
    )]
    DataDirInUse { path: PathBuf, pid: Option<u32> },
    /// The data directory's lock file could not be opened.
    #[error("cannot open the lock file {path}: {source}")]
    Lock { path: PathBuf, source: io::Error },
    /// The listen address is taken or not ours.
    #[error("cannot listen on {addr}: {source}{hint}")]
    Bind { addr: SocketAddr, source: io::Error, hint: &'static str },
    /// A worker thread could not be started.
    #[error("cannot start worker thread: {0}")]
    Thread(io::Error),
    /// A worker's socket could not be duplicated for the handle that wakes it at stop.
    #[error("cannot duplicate a worker's socket (the stop wakes the worker through it): {0}")]
    WakeHandle(io::Error),
    /// The metrics endpoint could not listen.
    #[error("cannot serve /metrics on {addr} (metrics_listen, --metrics-listen): {source}{hint}")]
    Metrics { addr: SocketAddr, source: io::Error, hint: &'static str },
    /// The key slots or their nonce reservations could not be loaded.
    #[error(transparent)]
    Crypto(#[from] CryptoError),
    /// The FPGA engine was asked for and cannot be used.
    #[error("{0}")]
    Engine(String),
    /// The secret for HELLO cookies could not be drawn.
    #[error("cannot draw the HELLO cookie secret: {0}")]
    Random(io::Error),
    /// The tenants could not be read, or their watcher started.
    #[error("cannot apply the tenants of the metadata store: {0}")]
    Tenants(io::Error),
}

/// A running target.
#[derive(Debug)]
pub struct Target {
    local_addr: SocketAddr,
    // Held while the target runs: admin commands see it and say to restart the target.
    _running: RunningMarker,
    shared: Arc<Shared>,
    shutdown: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    // A second handle on each worker's socket: a stop shuts its receive side, which wakes a
    // worker asleep in its receive at once (`stop_workers`).
    wake: Vec<OwnedFd>,
    engine_name: &'static str,
    engine_selection: String,
    metrics: Option<MetricsServer>,
    // Re-reads the tenants when the store changes; stopped with the workers.
    tenant_watch: Option<WatchHandle>,
    data_dir: PathBuf,
}

impl Target {
    /// Validates `config`, opens its regions and namespaces (configured and stored), binds its
    /// workers and starts them.
    /// Reads the tenants from the store now and puts them in force, without waiting for the
    /// watcher's next poll: for a change this process made itself after the start (the default
    /// tenant, created only once the start has succeeded, so that a failed start creates none).
    pub fn reload_tenants(&self) -> Result<(), MetadataError> {
        let (snapshot, warnings) =
            tenant_watch::load_snapshot(&self.data_dir, &self.shared.regions, &self.shared.namespaces)?;
        for warning in warnings {
            tracing::warn!("{warning}");
        }
        self.shared.tenants.publish(snapshot);
        Ok(())
    }

    pub fn start(config: &Config) -> Result<Target, StartError> {
        Target::start_with(config, Vec::new())
    }

    /// Like [`Target::start`], serving `extra` namespaces after the configured and stored ones
    /// (tests use this for devices that exist only in the process, like the crash-test device).
    pub fn start_with(config: &Config, extra: Vec<Namespace>) -> Result<Target, StartError> {
        Target::start_with_spaces(config, Vec::new(), extra)
    }

    /// Like [`Target::start_with`], also serving `extra_regions` after the configured and
    /// stored regions (tests use this for the crash-test region, [`Region::crash_test`]).
    pub fn start_with_spaces(
        config: &Config,
        extra_regions: Vec<Region>,
        extra: Vec<Namespace>,
    ) -> Result<Target, StartError> {
        config.validate()?;
        let data_dir = config.data_dir()?;
        check_addresses_free(config)?;
        create_data_dir(&data_dir).map_err(|source| StartError::DataDir { path: data_dir.clone(), source })?;
        // Before anything in the directory is opened: a second target would write the same
        // regions and, worse, reserve the same nonces of the same keys (GCM nonce reuse).
        let running = RunningMarker::take(&data_dir)?;
        if config.lock_memory {
            lock_process_memory();
        }
        let stored = MetadataStore::load(&data_dir)?;
        check_names_apart(config, &stored)?;
        configured_files::check_and_warn(config, &data_dir, &stored)?;
        let mut region_configs = config.effective_regions();
        region_configs.extend(
            stored
                .regions
                .into_iter()
                .filter(|region| servable_stored("region", &region.name, check_stored_region(region, &data_dir))),
        );
        let mut namespace_configs = config.namespaces.clone();
        namespace_configs.extend(stored.namespaces.into_iter().filter(|namespace| {
            servable_stored("namespace", &namespace.name, check_stored_namespace(config, namespace, &data_dir))
        }));
        validate_spaces(&region_configs, &namespace_configs)?;
        check_distinct_backings(&region_configs, &namespace_configs, &data_dir)?;
        blocks_fit_datagrams(config.max_datagram_bytes, &namespace_configs)?;
        let mut regions = RegionTable::open(&region_configs, &data_dir)?;
        for region in extra_regions {
            regions.push(region);
        }
        let regions = Arc::new(regions);
        let mut namespaces = NamespaceTable::open(&namespace_configs, &data_dir)?;
        for namespace in extra {
            namespaces.push(namespace);
        }
        let namespaces = Arc::new(namespaces);
        // Every worker's devices are opened here, so a failure stops the start with its reason.
        let devices = (0..config.workers)
            .map(|_| namespaces.open_devices(config.max_datagram_bytes, config.block_submission()))
            .collect::<Result<Vec<_>, _>>()?;
        // The start time makes this run's session ids differ from an earlier run's.
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|since| since.as_nanos() as u64)
            .unwrap_or(0);
        let cookies = CookieJar::from_os_random().map_err(StartError::Random)?;
        let extensions = crate::extensions::registry(&config.extensions).map_err(StartError::Config)?;
        // Key slots are read at start, like the spaces; each slot's nonce counter resumes past
        // its reservation file and reserves its first block before any worker starts. The
        // store watcher withdraws a slot deleted while the target runs.
        let stored_keys = MetadataStore::load_crypto_keys(&data_dir)?;
        let keys = Arc::new(KeyRing::load(stored_keys, &data_dir, NONCE_RESERVATION_BLOCK)?);
        let tenants = Arc::new(TenantCell::default());
        let watched =
            tenant_watch::Watched { regions: regions.clone(), namespaces: namespaces.clone(), keys: keys.clone() };
        let tenant_watch = tenant_watch::watch(&data_dir, watched, tenants.clone()).map_err(StartError::Tenants)?;
        let device_namespaces = device_namespaces(config, &namespaces);
        let Selection { engine, state: engine_state, why } =
            select_engine(config, Arc::clone(&regions), &device_namespaces)?;
        let shared = Arc::new(
            Shared::new(regions.clone(), namespaces, config.workers, config.dispatch_settings(), epoch, cookies)
                .with_extensions(extensions)
                .with_tenants(tenants)
                .with_keys(keys)
                .with_engine(Arc::clone(&engine_state)),
        );
        let sockets = bind_workers(config.listen, config.workers)?;
        let local_addr = socket::local_addr(&sockets[0]).map_err(|source| StartError::Bind {
            addr: config.listen,
            source,
            hint: "",
        })?;
        let settings = WorkerSettings {
            poll: config.poll,
            adaptive_spin: Duration::from_micros(config.adaptive_spin_us),
            max_datagram_bytes: config.max_datagram_bytes,
            answer_trains: config.answer_trains,
            // One origin for every worker: a HELLO cookie carries its issue time, and the
            // worker that checks it may not be the one that issued it.
            clock: MonotonicClock::new(),
        };
        let shutdown = Arc::new(AtomicBool::new(false));
        let engine_name = engine.name();
        let mut target = Target {
            local_addr,
            _running: running,
            shared: shared.clone(),
            shutdown: shutdown.clone(),
            threads: Vec::new(),
            wake: Vec::new(),
            engine_name,
            engine_selection: why,
            metrics: None,
            tenant_watch: Some(tenant_watch),
            data_dir: data_dir.clone(),
        };
        if let Some(addr) = config.metrics_listen.addr() {
            let build = BuildInfo {
                version: env!("CARGO_PKG_VERSION"),
                engine: engine_name,
                poll_mode: format!("{:?}", config.poll).to_lowercase(),
            };
            let registry = TargetCollector::new(shared.clone(), build).registry();
            let server =
                MetricsServer::start(addr, registry, "netdam-metrics").map_err(|source| metrics_error(addr, source))?;
            target.metrics = Some(server);
        }
        let cpus = if config.pin_workers { worker::allowed_cpus() } else { Vec::new() };
        for ((index, fd), devices) in sockets.into_iter().enumerate().zip(devices) {
            target.wake.push(fd.try_clone().map_err(StartError::WakeHandle)?);
            let cpu = worker::worker_cpu(&cpus, index);
            let helper_cpus = cpus.clone();
            let dispatcher = Dispatcher::new(engine.clone(), shared.clone(), index, devices);
            let shutdown = shutdown.clone();
            let thread = std::thread::Builder::new()
                .name(format!("netdam-worker-{index}"))
                .spawn(move || {
                    let mut dispatcher = dispatcher;
                    if let Some(cpu) = cpu {
                        worker::pin_to_cpu(index, cpu);
                        let others = worker::cpus_beside_worker(&helper_cpus, index);
                        dispatcher.place_block_helpers(if others.is_empty() { &helper_cpus } else { &others });
                    }
                    worker::run(fd, dispatcher, settings, shutdown)
                })
                .map_err(StartError::Thread)?;
            target.threads.push(thread);
        }
        Ok(target)
    }

    /// The address workers listen on (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The regions served.
    pub fn regions(&self) -> &RegionTable {
        &self.shared.regions
    }

    /// The block namespaces served.
    pub fn namespaces(&self) -> &NamespaceTable {
        &self.shared.namespaces
    }

    /// The key slots of ENCRYPT and DECRYPT, as loaded at start.
    pub fn keys(&self) -> &KeyRing {
        &self.shared.keys
    }

    /// The tenants in force: publishing a snapshot here applies it to every worker within one
    /// datagram (the store watcher does so within a second of a change to the store).
    pub fn tenants(&self) -> &Arc<TenantCell> {
        &self.shared.tenants
    }

    /// Which engine was selected at start-up (`fpga` or `software`).
    pub fn engine_name(&self) -> &'static str {
        self.engine_name
    }

    /// Whether region `id` is served from the FPGA's memory now (its host mapping is then not
    /// where its bytes live).
    pub fn region_on_fpga(&self, id: u16) -> bool {
        self.shared.engine.region_on_device(id)
    }

    /// Why this engine was selected: the device used, or why `auto` found none. The daemon
    /// writes it in its start line.
    pub fn engine_selection(&self) -> &str {
        &self.engine_selection
    }

    /// Which engine executes now, and how many failovers there were.
    pub fn engine_state(&self) -> &EngineState {
        &self.shared.engine
    }

    /// The address `/metrics` is served on, when it is.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(MetricsServer::local_addr)
    }

    /// Every worker's counters, summed.
    pub fn stats(&self) -> StatsSnapshot {
        StatsSnapshot::sum(&self.shared.stats)
    }

    /// Stops the workers and waits for them: at once for a worker asleep in its receive, after
    /// its pass for one at work.
    pub fn stop(mut self) {
        self.stop_workers();
    }

    fn stop_workers(&mut self) {
        drop(self.tenant_watch.take());
        self.shutdown.store(true, Ordering::Relaxed);
        // A sleeping worker would see the flag only when its receive times out (a second, a
        // backstop): shutting the socket's receive side wakes it now. The side stays shut, so a
        // worker that looked at the flag just before and sleeps just after returns at once too.
        for fd in self.wake.drain(..) {
            socket::wake_receiver(&fd);
        }
        for thread in self.threads.drain(..) {
            if thread.join().is_err() {
                tracing::error!("a worker thread panicked");
            }
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.stop_workers();
    }
}

/// The engine a target runs: one type for the workers, so the dispatcher stays monomorphic.
#[derive(Debug, Clone)]
pub enum SelectedEngine {
    /// The CPU.
    Software(SoftwareEngine),
    /// The FPGA, with its software fallback.
    Fpga(FpgaEngine),
}

impl Engine for SelectedEngine {
    fn name(&self) -> &'static str {
        match self {
            SelectedEngine::Software(engine) => engine.name(),
            SelectedEngine::Fpga(engine) => engine.name(),
        }
    }

    fn execute(
        &mut self,
        instruction: &netdam_isa::wire::Instruction<'_>,
        out: &mut [u8],
    ) -> Result<usize, netdam_isa::Status> {
        match self {
            SelectedEngine::Software(engine) => engine.execute(instruction, out),
            SelectedEngine::Fpga(engine) => engine.execute(instruction, out),
        }
    }

    fn execute_block(
        &mut self,
        instruction: &netdam_isa::wire::Instruction<'_>,
        out: &mut [u8],
    ) -> Option<Result<usize, netdam_isa::Status>> {
        match self {
            SelectedEngine::Software(engine) => engine.execute_block(instruction, out),
            SelectedEngine::Fpga(engine) => engine.execute_block(instruction, out),
        }
    }

    fn set_group_commit(&mut self, on: bool) {
        match self {
            SelectedEngine::Software(engine) => engine.set_group_commit(on),
            SelectedEngine::Fpga(engine) => engine.set_group_commit(on),
        }
    }

    fn persist_is_pending(&self) -> bool {
        match self {
            SelectedEngine::Software(engine) => engine.persist_is_pending(),
            SelectedEngine::Fpga(engine) => engine.persist_is_pending(),
        }
    }

    fn persist_pending(&mut self) -> Result<(), netdam_isa::Status> {
        match self {
            SelectedEngine::Software(engine) => engine.persist_pending(),
            SelectedEngine::Fpga(engine) => engine.persist_pending(),
        }
    }
}

/// The engine chosen at start-up.
#[derive(Debug)]
pub struct Selection {
    /// The engine every worker gets a clone of.
    pub engine: SelectedEngine,
    /// What it reports through.
    pub state: Arc<EngineState>,
    /// Why: the device used, or why `auto` executes on software (for the start line).
    pub why: String,
}

/// Chooses the engine as `config.engine` says (docs/FPGA.md §1 for the probe order): `auto`
/// falls back to software and says why in [`Selection::why`]; `fpga` and `fpga=PATH` fail the
/// start with a message naming what was missing or could not be mapped.
pub fn select_engine(
    config: &Config,
    regions: Arc<RegionTable>,
    namespaces: &[DeviceNamespace],
) -> Result<Selection, StartError> {
    let settings = FpgaSettings {
        progress_deadline: Duration::from_millis(config.fpga_progress_deadline_ms),
        // A worker that may sleep does not spin through a slow answer (a block instruction on
        // the device's SSD): past its adaptive spin time, the same it spins on an idle socket,
        // it sleeps on the completion interrupt, where there is one. Memory instructions answer
        // well within it. A shorter spin measured worse: at 20 µs, BREAD 512 B through the
        // model's NVMe had a p90 of 132 µs (the wake-ups), against 10 µs spinning.
        sleep_after: (config.poll != crate::config::PollMode::Busy)
            .then(|| std::time::Duration::from_micros(config.adaptive_spin_us.max(MIN_DEVICE_SPIN_US))),
        ..FpgaSettings::default()
    };
    select_engine_in(config, regions, namespaces, &netdam_fpga::window::ProbeRoots::default(), settings)
}

/// The shortest a non-busy worker spins for the FPGA's answer before it sleeps on the device's
/// completion interrupt (µs): memory instructions answer within it.
const MIN_DEVICE_SPIN_US: u64 = 20;

/// The namespace `fpga_namespace` names (validated to be a configured `file` namespace), as
/// the FPGA engine places it on the device's SSD.
fn device_namespaces(config: &Config, namespaces: &NamespaceTable) -> Vec<DeviceNamespace> {
    let Some(name) = &config.fpga_namespace else { return Vec::new() };
    namespaces
        .iter()
        .filter(|(_, namespace)| namespace.name() == name)
        .map(|(space, namespace)| DeviceNamespace {
            space,
            block_bytes: namespace.block_bytes(),
            blocks: namespace.capacity_blocks(),
        })
        .collect()
}

/// [`select_engine`] probing under `roots` and driving the device with `settings`.
pub fn select_engine_in(
    config: &Config,
    regions: Arc<RegionTable>,
    namespaces: &[DeviceNamespace],
    roots: &netdam_fpga::window::ProbeRoots,
    settings: FpgaSettings,
) -> Result<Selection, StartError> {
    let software = |regions, why: String| Selection {
        engine: SelectedEngine::Software(SoftwareEngine::new(regions)),
        state: Arc::new(EngineState::software()),
        why,
    };
    let (source, window, window_file) = match &config.engine {
        EngineChoice::Software => return Ok(software(regions, "engine = software".to_string())),
        EngineChoice::Fpga(Some(path)) => {
            let window = netdam_fpga::window::WindowSource::File { path: path.clone() }
                .open(&roots.sysfs)
                .map_err(|error| StartError::Engine(format!("engine fpga={}: {error}", path.display())))?;
            (format!("file:{}", path.display()), window, Some(path.clone()))
        }
        EngineChoice::Auto | EngineChoice::Fpga(None) => {
            match netdam_fpga::window::probe(roots, config.fpga_window.as_deref()) {
                Ok(probed) => (probed.source, probed.window, probed.file),
                Err(why) if config.engine == EngineChoice::Auto => {
                    return Ok(software(regions, format!("engine auto found no FPGA: {why}")));
                }
                Err(why) => return Err(StartError::Engine(format!("engine fpga: no FPGA found ({why})"))),
            }
        }
    };
    // A model's window file takes an eventfd for its completion interrupt on the socket beside
    // it (a card's interrupts would come through VFIO, which is not built: FPGA.md §12).
    let interrupt = window_file.filter(|_| settings.sleep_after.is_some()).and_then(|path| {
        let socket = netdam_fpga::interrupt::socket_path(&path);
        match netdam_fpga::interrupt::request(&socket) {
            Ok(link) => Some(link),
            Err(error) => {
                tracing::info!(socket = %socket.display(), %error, "the device model offers no completion interrupt: workers spin for its answers");
                None
            }
        }
    });
    match FpgaEngine::attach(window, Arc::clone(&regions), namespaces, interrupt, settings) {
        Ok((engine, state)) => {
            Ok(Selection { engine: SelectedEngine::Fpga(engine), state, why: format!("FPGA at {source}") })
        }
        Err(error) if config.engine == EngineChoice::Auto => {
            Ok(software(regions, format!("engine auto: the FPGA at {source} cannot be used: {error}")))
        }
        Err(error) => {
            Err(StartError::Engine(format!("engine {}: the device at {source} cannot be used: {error}", config.engine)))
        }
    }
}

/// Creates the data directory `path` where it is missing; a file in its place is named as such
/// (`create_dir_all` says only "File exists").
pub fn create_data_dir(path: &std::path::Path) -> io::Result<()> {
    if path.exists() && !path.is_dir() {
        return Err(io::Error::new(io::ErrorKind::NotADirectory, "it is a file, not a directory (--data-dir)"));
    }
    std::fs::create_dir_all(path)
}

/// Locks every page of the process now and every page it maps later, faulting them in, so the
/// workers' buffers (allocated after this) never fault on the request path. Logs and goes on
/// when the memory-lock limit refuses it.
/// Today's checks of a stored region's own settings: one that fails them is not served
/// ([`servable_stored`]), and takes no id. `region list` applies them too, so that the ids it
/// shows are the ones a target serves.
pub fn check_stored_region(region: &RegionConfig, data_dir: &Path) -> Result<(), ConfigError> {
    region.validate().map_err(|error| refused_today("region", &region.name, error))?;
    backing_present("region", &region.name, region.path.as_deref(), data_dir)
}

/// As [`check_stored_region`], for a stored namespace under `config` (its blocks must fit the
/// datagrams).
pub fn check_stored_namespace(
    config: &Config,
    namespace: &NamespaceConfig,
    data_dir: &Path,
) -> Result<(), ConfigError> {
    namespace
        .validate()
        .and_then(|()| blocks_fit_datagrams(config.max_datagram_bytes, std::slice::from_ref(namespace)))
        .map_err(|error| refused_today("namespace", &namespace.name, error))?;
    backing_present("namespace", &namespace.name, Some(&namespace.path), data_dir)
}

/// A stored space's settings that an older version accepted and today's checks refuse, with
/// the way out.
fn refused_today(kind: &str, name: &str, error: ConfigError) -> ConfigError {
    ConfigError::Invalid(format!(
        "{error}; `netdam-target {kind} delete {name}` removes it (and create it again with settings that fit)"
    ))
}

/// A stored space's file or device was made by `region create` or `namespace create` (or named
/// there, for a device): a start that finds it gone must not make an empty one in its place,
/// which would serve zeroes where the data was (a file system not mounted yet, a file moved or
/// deleted). A configured space's file is created at its first start instead.
fn backing_present(kind: &str, name: &str, path: Option<&Path>, data_dir: &Path) -> Result<(), ConfigError> {
    let Some(path) = path else { return Ok(()) };
    let path = crate::namespaces::resolve(path, data_dir);
    match std::fs::metadata(&path) {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Err(ConfigError::Invalid(format!(
            "its file {} is missing (a file system not mounted yet? a file moved or deleted?); the target does not \
             create it again empty: restore it and restart, or remove the {kind} with `netdam-target {kind} delete {name}`",
            path.display()
        ))),
        Err(error) => Err(ConfigError::Invalid(format!(
            "its file {} cannot be reached: {error}; make it reachable and restart, or remove the {kind} with \
             `netdam-target {kind} delete {name}`",
            path.display()
        ))),
    }
}

/// A configured space and a stored one of the same kind and name would both answer to it: the
/// start is refused saying which is which and how to part them (`validate_spaces` says only that
/// the name is used twice).
fn check_names_apart(config: &Config, stored: &Stored) -> Result<(), ConfigError> {
    let region = config
        .effective_regions()
        .into_iter()
        .map(|region| region.name)
        .find(|name| stored.regions.iter().any(|stored| &stored.name == name));
    let namespace = || {
        config
            .namespaces
            .iter()
            .map(|namespace| namespace.name.clone())
            .find(|name| stored.namespaces.iter().any(|stored| &stored.name == name))
    };
    let (kind, name) = match (region, namespace()) {
        (Some(name), _) => ("region", name),
        (None, Some(name)) => ("namespace", name),
        (None, None) => return Ok(()),
    };
    let (configured, part) = if kind == "region" && config.regions.is_empty() {
        (
            "the embedded default region (served when the settings name no region)",
            "name a region in the settings file (which replaces the default)",
        )
    } else {
        ("in the settings file", "rename the one in the settings file")
    };
    Err(ConfigError::Invalid(format!(
        "{kind} {name:?} is {configured} and also in the metadata store (made by `netdam-target {kind} create`); \
         one name cannot serve both: {part}, or remove the stored one with `netdam-target {kind} delete {name}`"
    )))
}

/// Whether a space from the metadata store passes today's checks of its own settings. One an
/// older version accepted and these refuse (a namespace of 16 KiB blocks, a 0-byte region) is
/// left out with a warning instead of stopping the start, so the other spaces are served.
fn servable_stored(kind: &str, name: &str, checked: Result<(), ConfigError>) -> bool {
    match checked {
        Ok(()) => true,
        Err(error) => {
            // Each refusal says what to do (`refused_today`, `backing_present`).
            tracing::warn!("stored {kind} {name:?} is not served: {error}");
            false
        }
    }
}

fn lock_process_memory() {
    // SAFETY: mlockall has no memory-safety effects.
    if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) } != 0 {
        let error = std::io::Error::last_os_error();
        tracing::warn!(%error, "cannot lock the process's memory (raise RLIMIT_MEMLOCK, e.g. ulimit -l); buffers may page-fault on first use");
    }
}

/// File in the data directory a running target holds locked.
pub const RUNNING_FILE: &str = "target.lock";

/// Tries at taking the data directory's lock, 10 ms apart, before another target is said to
/// hold it.
const LOCK_TRIES: u32 = 10;

/// An exclusive `flock` on the data directory's `target.lock`, holding the target's pid.
#[derive(Debug)]
struct RunningMarker {
    _file: std::fs::File,
}

impl RunningMarker {
    /// Takes the lock of `data_dir`, or says which target holds it.
    fn take(data_dir: &std::path::Path) -> Result<RunningMarker, StartError> {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let path = data_dir.join(RUNNING_FILE);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| StartError::Lock { path: path.clone(), source })?;
        // An admin command looking for a running target holds a shared lock for an instant
        // (`running_target`): a start that meets it tries again before it calls the directory
        // served.
        let mut tries = 0;
        // SAFETY: flock on an open descriptor has no memory effects.
        while unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(StartError::Lock { path, source: error });
            }
            tries += 1;
            if tries == LOCK_TRIES {
                let pid = std::fs::read_to_string(&path).ok().and_then(|text| text.trim().parse().ok());
                return Err(StartError::DataDirInUse { path: data_dir.to_path_buf(), pid });
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = file.set_len(0);
        let _ = writeln!(file, "{}", std::process::id());
        Ok(RunningMarker { _file: file })
    }
}

/// The pid of a target running on `data_dir`, if one holds its lock.
pub fn running_target(data_dir: &std::path::Path) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let path = data_dir.join(RUNNING_FILE);
    let file = std::fs::File::open(&path).ok()?;
    // SAFETY: as above; a shared lock we get is released when `file` closes.
    let free = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0;
    if free {
        return None;
    }
    std::fs::read_to_string(&path).ok().and_then(|text| text.trim().parse().ok()).or(Some(0))
}

/// Refuses a start whose listen address (or metrics address) another socket holds, before the
/// start creates anything: a first start on a taken port would otherwise leave a data directory
/// with its default region and tenant key behind. The sockets bound here are closed again; a
/// port taken between this check and the real bind is still refused there, with the same error.
pub fn check_addresses_free(config: &Config) -> Result<(), StartError> {
    if config.listen.port() != 0 {
        std::net::UdpSocket::bind(config.listen).map_err(|source| listen_error(config.listen, source))?;
    }
    if let Some(addr) = config.metrics_listen.addr().filter(|addr| addr.port() != 0) {
        std::net::TcpListener::bind(addr).map_err(|source| metrics_error(addr, source))?;
    }
    Ok(())
}

fn listen_error(addr: SocketAddr, source: io::Error) -> StartError {
    let hint = if source.kind() == io::ErrorKind::AddrInUse {
        " (is another netdam-target running? stop it or pass --listen with another port)"
    } else {
        ""
    };
    StartError::Bind { addr, source, hint }
}

fn metrics_error(addr: SocketAddr, source: io::Error) -> StartError {
    let hint = if source.kind() == io::ErrorKind::AddrInUse {
        " (another target or exporter holds it: pass another --metrics-listen address, or \"off\")"
    } else {
        ""
    };
    StartError::Metrics { addr, source, hint }
}

fn bind_workers(listen: SocketAddr, workers: usize) -> Result<Vec<std::os::fd::OwnedFd>, StartError> {
    // SO_REUSEPORT would let a second target share the port with a running one and split its
    // traffic; a plain bind first proves the port is free.
    if listen.port() != 0 {
        std::net::UdpSocket::bind(listen).map_err(|source| listen_error(listen, source))?;
    }
    let first = socket::bind_shared(listen).map_err(|source| listen_error(listen, source))?;
    let actual = socket::local_addr(&first).map_err(|source| listen_error(listen, source))?;
    let mut sockets = vec![first];
    for _ in 1..workers {
        sockets.push(socket::bind_shared(actual).map_err(|source| listen_error(actual, source))?);
    }
    Ok(sockets)
}
