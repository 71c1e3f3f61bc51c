//! Starting and stopping a target: regions, shared state, one thread per worker.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use netdam_isa::engine::Engine;
use netdam_isa::Duration;
use netdam_pmem::RegionError;

use crate::config::{Config, ConfigError};
use crate::dispatch::{Dispatcher, Shared};
use crate::engine::SoftwareEngine;
use crate::regions::RegionTable;
use crate::socket;
use crate::stats::StatsSnapshot;
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
    /// The data directory could not be created.
    #[error("cannot create data directory {path}: {source}")]
    DataDir { path: PathBuf, source: io::Error },
    /// The listen address is taken or not ours.
    #[error("cannot listen on {addr}: {source}{hint}")]
    Bind { addr: SocketAddr, source: io::Error, hint: &'static str },
    /// A worker thread could not be started.
    #[error("cannot start worker thread: {0}")]
    Thread(io::Error),
}

/// A running target.
#[derive(Debug)]
pub struct Target {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    engine_name: &'static str,
}

impl Target {
    /// Validates `config`, opens its regions, binds its workers and starts them.
    pub fn start(config: &Config) -> Result<Target, StartError> {
        config.validate()?;
        let data_dir = config.data_dir()?;
        std::fs::create_dir_all(&data_dir).map_err(|source| StartError::DataDir { path: data_dir.clone(), source })?;
        let regions = Arc::new(RegionTable::open(&config.effective_regions(), &data_dir)?);
        // The start time makes this run's session ids differ from an earlier run's.
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|since| since.as_nanos() as u64)
            .unwrap_or(0);
        let busy_threshold = Duration::from_micros(config.busy_threshold_us);
        let shared =
            Arc::new(Shared::new(regions.clone(), config.workers, config.max_datagram_bytes, epoch, busy_threshold));
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
        };
        let shutdown = Arc::new(AtomicBool::new(false));
        let engine = SoftwareEngine::new(regions);
        let engine_name = engine.name();
        let mut target =
            Target { local_addr, shared: shared.clone(), shutdown: shutdown.clone(), threads: Vec::new(), engine_name };
        for (index, fd) in sockets.into_iter().enumerate() {
            let dispatcher = Dispatcher::new(engine.clone(), shared.clone(), index);
            let shutdown = shutdown.clone();
            let thread = std::thread::Builder::new()
                .name(format!("netdam-worker-{index}"))
                .spawn(move || worker::run(fd, dispatcher, settings, shutdown))
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

    /// Which engine executes instructions.
    pub fn engine_name(&self) -> &'static str {
        self.engine_name
    }

    /// Every worker's counters, summed.
    pub fn stats(&self) -> StatsSnapshot {
        StatsSnapshot::sum(&self.shared.stats)
    }

    /// Stops the workers and waits for them (within the blocking wake-up interval).
    pub fn stop(mut self) {
        self.stop_workers();
    }

    fn stop_workers(&mut self) {
        self.shutdown.store(true, Ordering::Relaxed);
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

fn bind_workers(listen: SocketAddr, workers: usize) -> Result<Vec<std::os::fd::OwnedFd>, StartError> {
    let bind_error = |addr, source: io::Error| {
        let hint = if source.kind() == io::ErrorKind::AddrInUse {
            " (is another netdam-target running? stop it or pass --listen with another port)"
        } else {
            ""
        };
        StartError::Bind { addr, source, hint }
    };
    // SO_REUSEPORT would let a second target share the port with a running one and split its
    // traffic; a plain bind first proves the port is free.
    if listen.port() != 0 {
        std::net::UdpSocket::bind(listen).map_err(|source| bind_error(listen, source))?;
    }
    let first = socket::bind_shared(listen).map_err(|source| bind_error(listen, source))?;
    let actual = socket::local_addr(&first).map_err(|source| bind_error(listen, source))?;
    let mut sockets = vec![first];
    for _ in 1..workers {
        sockets.push(socket::bind_shared(actual).map_err(|source| bind_error(actual, source))?);
    }
    Ok(sockets)
}
