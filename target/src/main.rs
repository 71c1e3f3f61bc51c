//! `netdam-target`: the storage target daemon.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::{Args, Parser, Subcommand};
use netdam_metrics::{LogFormat, MetricsListen};
use netdam_pmem::{Backing, Durability, Region};
use netdam_target::config::{
    validate_spaces, ByteSize, NamespaceBackend, NamespaceConfig, RegionBackend, RegionConfig, DEFAULT_BLOCK_BYTES,
};
use netdam_target::crypto::{generate_key, read_reservation, reservation_path};
use netdam_target::metadata::{MetadataError, MetadataStore};
use netdam_target::namespaces::{open_namespace, resolve};
use netdam_target::server::running_target;
use netdam_target::{AuthMode, Config, PollMode, Target};

/// A disaggregated storage target with low, deterministic latency: memory regions and block
/// namespaces served over UDP with the NetDAM instruction set (read, write, atomics, memcpy,
/// fill, vector add, CRC, AES-256-GCM encrypt and decrypt; block read, write with FUA, flush, trim,
/// write-zeroes).
///
/// With no arguments it serves a persistent 64 MiB region named "default", kept in a file under
/// the user's data directory, on 127.0.0.1:7800.
#[derive(Debug, Parser)]
#[command(name = "netdam-target", version, propagate_version = true)]
struct Cli {
    /// Log lines as text or as JSON objects (filter with NETDAM_LOG or RUST_LOG, e.g. "info" or
    /// "netdam_target=debug").
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    settings: SettingsArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve until interrupted (the default command).
    Serve(SettingsArgs),
    /// Print the settings in force (defaults, file and flags combined) as TOML, and exit.
    Config(SettingsArgs),
    /// Create, delete or list memory regions kept in the metadata store of the data directory.
    #[command(subcommand)]
    Region(RegionCommand),
    /// Create, delete or list block namespaces kept in the metadata store of the data directory.
    #[command(subcommand)]
    Namespace(NamespaceCommand),
    /// Create, rotate, delete or list the AES-256-GCM key slots of ENCRYPT and DECRYPT, kept in
    /// the metadata store of the data directory. Keys are drawn from the OS random source and
    /// never printed nor sent by any instruction.
    #[command(subcommand, name = "crypto-key")]
    CryptoKey(CryptoKeyCommand),
}

#[derive(Debug, Subcommand)]
enum CryptoKeyCommand {
    /// Put a new random key (version 1) in an empty slot, committed durably before this returns.
    Create {
        /// Slot number, 0 to 255: ENCRYPT's and DECRYPT's aux field.
        #[arg(value_parser = parse_slot)]
        slot: u32,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Add a new random key version to a slot: ENCRYPT seals with it from the target's next
    /// start; DECRYPT still opens what older versions sealed (the nonce names the version).
    Rotate {
        #[arg(value_parser = parse_slot)]
        slot: u32,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Remove a slot and every version of its key: what they sealed can no longer be decrypted.
    Delete {
        #[arg(value_parser = parse_slot)]
        slot: u32,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List the slots that hold a key, with their key versions (never the keys).
    List {
        #[command(flatten)]
        store: StoreArgs,
    },
}

fn parse_slot(text: &str) -> Result<u32, String> {
    let slot: u32 = text.parse().map_err(|_| format!("{text:?} is not a slot number"))?;
    if slot >= netdam_isa::limits::CRYPTO_KEY_SLOTS {
        return Err(format!("slot {slot} is beyond the last slot, {}", netdam_isa::limits::CRYPTO_KEY_SLOTS - 1));
    }
    Ok(slot)
}

/// Where the metadata store is: the data directory, from flags or the config file.
#[derive(Debug, Args, Clone)]
struct StoreArgs {
    /// TOML settings file (its data_dir, and its regions and namespaces for name checks).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Data directory holding the metadata store [default: $XDG_DATA_HOME/netdam or ~/.local/share/netdam].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum RegionCommand {
    /// Create a region (and its file), committed durably before this returns.
    Create {
        /// Name initiators address it by.
        name: String,
        /// mem (volatile), file (msync-persisted mapping) or dax (MAP_SYNC mapping on a DAX file system).
        #[arg(long, value_enum)]
        backend: RegionBackend,
        /// Backing file for file and dax; relative paths are under the data directory.
        #[arg(long, value_name = "PATH")]
        path: Option<PathBuf>,
        /// Size, e.g. 64MiB: a whole number of pages.
        #[arg(long, value_parser = parse_size)]
        size: ByteSize,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Remove a region from the store; its file is kept.
    Delete {
        name: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List the regions a target on this data directory serves.
    List {
        #[command(flatten)]
        store: StoreArgs,
    },
}

#[derive(Debug, Subcommand)]
enum NamespaceCommand {
    /// Create a namespace (and its backing file), committed durably before this returns.
    Create {
        /// Name initiators address it by.
        name: String,
        /// file (io_uring, O_DIRECT), blockdev (a block device, io_uring, O_DIRECT) or pmem (a
        /// persistent memory region file).
        #[arg(long, value_enum)]
        backend: NamespaceBackend,
        /// The file, device or region file; relative paths are under the data directory.
        #[arg(long, value_name = "PATH")]
        path: PathBuf,
        /// Size for file and pmem when the file does not exist yet, e.g. 1GiB.
        #[arg(long, value_parser = parse_size)]
        size: Option<ByteSize>,
        /// Bytes per block: a power of two from 512 to 65536.
        #[arg(long, default_value_t = DEFAULT_BLOCK_BYTES)]
        block_size: u32,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Remove a namespace from the store; its file or device is left as it is.
    Delete {
        name: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List the namespaces a target on this data directory serves.
    List {
        #[command(flatten)]
        store: StoreArgs,
    },
}

fn parse_size(text: &str) -> Result<ByteSize, String> {
    netdam_isa::units::parse_bytes(text).map(ByteSize)
}

/// Settings: a TOML file, then flags that override it.
#[derive(Debug, Args, Default, Clone)]
struct SettingsArgs {
    /// TOML file with settings (listen, metrics_listen, data_dir, workers, poll, adaptive_spin_us, pin_workers,
    /// lock_memory, max_datagram_bytes, busy_threshold_us, sessions_per_worker,
    /// max_sessions_per_address, session_idle_timeout_ms, [[region]] tables with name, backend =
    /// mem|file|dax, path, size, and [[namespace]] tables with name, backend =
    /// file|blockdev|pmem, path, size, block_size). `netdam-target config` prints them all.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// UDP address to serve on [default: 127.0.0.1:7800].
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// TCP address of the Prometheus /metrics endpoint, or "off" [default: 127.0.0.1:9464].
    #[arg(long, value_name = "ADDR|off")]
    metrics_listen: Option<MetricsListen>,
    /// Directory for region files [default: $XDG_DATA_HOME/netdam or ~/.local/share/netdam].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Worker threads sharing the port, one socket each [default: 1].
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// How workers wait: busy (lowest latency, burns a core each), adaptive (spin, then block),
    /// blocking (no idle CPU) [default: adaptive].
    #[arg(long, value_enum)]
    poll: Option<PollMode>,
    /// tenants: initiators prove a tenant's key and get what it was granted; none: no
    /// authentication, every initiator may do anything (refused beyond loopback unless the
    /// config sets allow_unauthenticated_network) [default: tenants].
    #[arg(long, value_enum)]
    auth: Option<AuthMode>,
}

impl SettingsArgs {
    fn merged_over(self, base: SettingsArgs) -> SettingsArgs {
        SettingsArgs {
            config: self.config.or(base.config),
            listen: self.listen.or(base.listen),
            metrics_listen: self.metrics_listen.or(base.metrics_listen),
            data_dir: self.data_dir.or(base.data_dir),
            workers: self.workers.or(base.workers),
            poll: self.poll.or(base.poll),
            auth: self.auth.or(base.auth),
        }
    }

    fn to_config(&self) -> Result<Config, String> {
        let mut config = match &self.config {
            Some(path) => Config::from_file(path).map_err(|error| error.to_string())?,
            None => Config::default(),
        };
        if let Some(listen) = self.listen {
            config.listen = listen;
        }
        if let Some(metrics_listen) = self.metrics_listen {
            config.metrics_listen = metrics_listen;
        }
        if let Some(dir) = &self.data_dir {
            config.data_dir = Some(dir.clone());
        }
        if let Some(workers) = self.workers {
            config.workers = workers;
        }
        if let Some(poll) = self.poll {
            config.poll = poll;
        }
        if let Some(auth) = self.auth {
            config.auth = auth;
        }
        config.validate().map_err(|error| error.to_string())?;
        Ok(config)
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn request_stop(_signal: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    netdam_metrics::logging::init(cli.log_format);
    let (serve, settings) = match cli.command {
        None => (true, cli.settings),
        Some(Command::Serve(args)) => (true, args.merged_over(cli.settings)),
        Some(Command::Config(args)) => (false, args.merged_over(cli.settings)),
        Some(Command::Region(command)) => return admin(|| region_command(command)),
        Some(Command::Namespace(command)) => return admin(|| namespace_command(command)),
        Some(Command::CryptoKey(command)) => return admin(|| crypto_key_command(command)),
    };
    let config = match settings.to_config() {
        Ok(config) => config,
        Err(message) => {
            eprintln!("netdam-target: {message}");
            return ExitCode::from(2);
        }
    };
    if !serve {
        print!("{}", config.to_toml());
        return ExitCode::SUCCESS;
    }
    let target = match Target::start(&config) {
        Ok(target) => target,
        Err(error) => {
            eprintln!("netdam-target: {error}");
            return ExitCode::FAILURE;
        }
    };
    log_start(&target, &config);
    print_banner(&target, &config);
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, request_stop as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, request_stop as *const () as libc::sighandler_t);
    }
    while !STOP.load(Ordering::Relaxed) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    eprintln!("netdam-target: stopping");
    target.stop();
    ExitCode::SUCCESS
}

fn admin(command: impl FnOnce() -> Result<(), String>) -> ExitCode {
    match command() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("netdam-target: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The settings file's config and the data directory an admin command works on.
fn store_context(store: &StoreArgs) -> Result<(Config, PathBuf), String> {
    let mut config = match &store.config {
        Some(path) => Config::from_file(path).map_err(|error| error.to_string())?,
        None => Config::default(),
    };
    if let Some(dir) = &store.data_dir {
        config.data_dir = Some(dir.clone());
    }
    let data_dir = config.data_dir().map_err(|error| error.to_string())?;
    std::fs::create_dir_all(&data_dir).map_err(|error| format!("cannot create {}: {error}", data_dir.display()))?;
    Ok((config, data_dir))
}

/// Tells the user how a change reaches a target.
fn after_change(data_dir: &std::path::Path) {
    match running_target(data_dir) {
        Some(pid) => println!(
            "A target is running on this data directory (pid {pid}): it serves what it read at start; restart it to serve this change."
        ),
        None => println!("netdam-target serves it from its next start."),
    }
}

fn region_command(command: RegionCommand) -> Result<(), String> {
    match command {
        RegionCommand::Create { name, backend, path, size, store } => {
            let (config, data_dir) = store_context(&store)?;
            let metadata = MetadataStore::open(&data_dir).map_err(|error| error.to_string())?;
            let region = RegionConfig { name, backend, path, size };
            let mut regions = config.effective_regions();
            regions.extend(metadata.regions().map_err(|error| error.to_string())?);
            regions.push(region.clone());
            let namespaces = metadata.namespaces().map_err(|error| error.to_string())?;
            validate_spaces(&regions, &namespaces).map_err(|error| error.to_string())?;
            // Open it once: creates the file and proves the backing works before it is recorded.
            let backing = match (&region.backend, &region.path) {
                (RegionBackend::File, Some(path)) => Some(Backing::File(resolve(path, &data_dir))),
                (RegionBackend::Dax, Some(path)) => Some(Backing::Dax(resolve(path, &data_dir))),
                _ => None,
            };
            if let Some(backing) = backing {
                Region::open(&region.name, backing, region.size.0).map_err(|error| error.to_string())?;
            }
            metadata.create_region(&region).map_err(|error| error.to_string())?;
            println!(
                "created region {:?}: {} bytes, {:?} ({})",
                region.name,
                region.size.0,
                region.backend,
                metadata.path().display()
            );
            drop(metadata);
            after_change(&data_dir);
        }
        RegionCommand::Delete { name, store } => {
            let (_, data_dir) = store_context(&store)?;
            let metadata = MetadataStore::open(&data_dir).map_err(|error| error.to_string())?;
            let region = metadata.delete_region(&name).map_err(|error| error.to_string())?;
            let kept = region.path.map(|path| format!("; its file {} is kept", resolve(&path, &data_dir).display()));
            println!("deleted region {name:?}{}", kept.unwrap_or_default());
            drop(metadata);
            after_change(&data_dir);
        }
        RegionCommand::List { store } => {
            let (config, data_dir) = store_context(&store)?;
            let stored = MetadataStore::load(&data_dir).map_err(|error| error.to_string())?;
            let configured = config.effective_regions().into_iter().map(|region| (region, "config"));
            for (id, (region, source)) in configured.chain(stored.regions.into_iter().map(|r| (r, "store"))).enumerate()
            {
                let path = region.path.map(|path| resolve(&path, &data_dir).display().to_string()).unwrap_or_default();
                println!(
                    "{id:>3}  {:<32} {:>14} bytes  {:<5} {source:<6} {path}",
                    region.name,
                    region.size.0,
                    format!("{:?}", region.backend).to_lowercase()
                );
            }
        }
    }
    Ok(())
}

fn namespace_command(command: NamespaceCommand) -> Result<(), String> {
    match command {
        NamespaceCommand::Create { name, backend, path, size, block_size, store } => {
            let (config, data_dir) = store_context(&store)?;
            let metadata = MetadataStore::open(&data_dir).map_err(|error| error.to_string())?;
            let namespace = NamespaceConfig { name, backend, path, size, block_size };
            let mut namespaces = config.namespaces.clone();
            namespaces.extend(metadata.namespaces().map_err(|error| error.to_string())?);
            namespaces.push(namespace.clone());
            let mut regions = config.effective_regions();
            regions.extend(metadata.regions().map_err(|error| error.to_string())?);
            validate_spaces(&regions, &namespaces).map_err(|error| error.to_string())?;
            // Open it once: creates a missing file and proves a device opens on it.
            let opened = open_namespace(&namespace, &data_dir).map_err(|error| error.to_string())?;
            metadata.create_namespace(&namespace).map_err(|error| error.to_string())?;
            println!(
                "created namespace {:?}: {} blocks of {} bytes on {} ({})",
                namespace.name,
                opened.capacity_blocks(),
                opened.block_bytes(),
                opened.backing(),
                metadata.path().display()
            );
            drop(metadata);
            after_change(&data_dir);
        }
        NamespaceCommand::Delete { name, store } => {
            let (_, data_dir) = store_context(&store)?;
            let metadata = MetadataStore::open(&data_dir).map_err(|error| error.to_string())?;
            let namespace = metadata.delete_namespace(&name).map_err(|error| error.to_string())?;
            println!("deleted namespace {name:?}; {} is left as it is", resolve(&namespace.path, &data_dir).display());
            drop(metadata);
            after_change(&data_dir);
        }
        NamespaceCommand::List { store } => {
            let (config, data_dir) = store_context(&store)?;
            let stored = MetadataStore::load(&data_dir).map_err(|error| error.to_string())?;
            let configured = config.namespaces.into_iter().map(|namespace| (namespace, "config"));
            let all = configured.chain(stored.namespaces.into_iter().map(|n| (n, "store")));
            for (id, (namespace, source)) in all.enumerate() {
                let size =
                    namespace.size.map(|size| format!("{} bytes", size.0)).unwrap_or_else(|| "device size".into());
                println!(
                    "{id:>3}  {:<32} {:<8} {:>6}-byte blocks  {size:<18} {source:<6} {}",
                    namespace.name,
                    format!("{:?}", namespace.backend).to_lowercase(),
                    namespace.block_size,
                    resolve(&namespace.path, &data_dir).display()
                );
            }
        }
    }
    Ok(())
}

fn crypto_key_command(command: CryptoKeyCommand) -> Result<(), String> {
    let text = |error: MetadataError| error.to_string();
    match command {
        CryptoKeyCommand::Create { slot, store } => {
            let (_, data_dir) = store_context(&store)?;
            let metadata = MetadataStore::open(&data_dir).map_err(text)?;
            let key = generate_key().map_err(|error| error.to_string())?;
            let version = metadata.create_key(slot, &key).map_err(text)?;
            println!("created key slot {slot}: key version {version}, AES-256-GCM ({})", metadata.path().display());
            drop(metadata);
            after_change(&data_dir);
        }
        CryptoKeyCommand::Rotate { slot, store } => {
            let (_, data_dir) = store_context(&store)?;
            let metadata = MetadataStore::open(&data_dir).map_err(text)?;
            let key = generate_key().map_err(|error| error.to_string())?;
            let version = metadata.rotate_key(slot, &key).map_err(text)?;
            println!(
                "rotated key slot {slot}: ENCRYPT seals with key version {version}; DECRYPT still opens older versions"
            );
            drop(metadata);
            after_change(&data_dir);
        }
        CryptoKeyCommand::Delete { slot, store } => {
            let (_, data_dir) = store_context(&store)?;
            let metadata = MetadataStore::open(&data_dir).map_err(text)?;
            let versions = metadata.delete_key(slot).map_err(text)?;
            println!(
                "deleted key slot {slot} (key versions {versions:?}): what they sealed can no longer be decrypted"
            );
            drop(metadata);
            after_change(&data_dir);
        }
        CryptoKeyCommand::List { store } => {
            let (_, data_dir) = store_context(&store)?;
            let slots = if data_dir.join(netdam_target::metadata::METADATA_FILE).exists() {
                MetadataStore::open(&data_dir).and_then(|metadata| metadata.key_slots()).map_err(text)?
            } else {
                Vec::new()
            };
            if slots.is_empty() {
                println!("no key slot holds a key (netdam-target crypto-key create SLOT makes one)");
            }
            for (slot, versions) in slots {
                let current = versions.last().copied().unwrap_or_default();
                let reserved =
                    read_reservation(&reservation_path(&data_dir, slot)).map_err(|error| error.to_string())?;
                println!("{slot:>3}  key version {current:<4} versions {versions:?}  nonces reserved up to {reserved}");
            }
        }
    }
    Ok(())
}

/// The one log line at start: the settings in force and where the metrics are.
fn log_start(target: &Target, config: &Config) {
    let metrics = match target.metrics_addr() {
        Some(addr) => format!("http://{addr}/metrics"),
        None => "off".to_string(),
    };
    tracing::info!(
        listen = %target.local_addr(),
        metrics = %metrics,
        workers = config.workers,
        poll = %format!("{:?}", config.poll).to_lowercase(),
        adaptive_spin_us = config.adaptive_spin_us,
        pin_workers = config.pin_workers,
        lock_memory = config.lock_memory,
        max_datagram_bytes = config.max_datagram_bytes,
        busy_threshold_us = config.busy_threshold_us,
        sessions_per_worker = config.sessions_per_worker,
        max_sessions_per_address = config.max_sessions_per_address,
        session_idle_timeout_ms = config.session_idle_timeout_ms,
        engine = target.engine_name(),
        regions = target.regions().iter().len(),
        namespaces = target.namespaces().iter().len(),
        version = env!("CARGO_PKG_VERSION"),
        "netdam-target started"
    );
}

/// Prints what is served, in one write: a reader that stops after the first line (a script
/// waiting for "serving on") must not make a later line fail and stop the daemon.
fn print_banner(target: &Target, config: &Config) {
    use std::fmt::Write as _;
    use std::io::Write as _;
    let mut banner = String::new();
    let addr = target.local_addr();
    let poll = format!("{:?}", config.poll).to_lowercase();
    let _ = writeln!(
        banner,
        "netdam-target serving on {addr} ({} worker{}, {poll} polling, {} engine, datagrams up to {} bytes)",
        config.workers,
        if config.workers == 1 { "" } else { "s" },
        target.engine_name(),
        config.max_datagram_bytes
    );
    for (id, region) in target.regions().iter() {
        let durability = match region.durability() {
            Durability::Persistent => "persistent",
            Durability::Volatile => "volatile",
        };
        let backing = match region.backing() {
            Backing::Anonymous => "anonymous memory".to_string(),
            Backing::File(path) => format!("file {}", path.display()),
            Backing::Dax(path) => format!("DAX file {}", path.display()),
        };
        let locked = if region.is_locked() { "locked in memory" } else { "NOT locked in memory (see log)" };
        let _ = writeln!(
            banner,
            "  region {id} {:?}: {} bytes, {durability}, {backing}, {locked}",
            region.name(),
            region.len()
        );
    }
    for (id, namespace) in target.namespaces().iter() {
        let _ = writeln!(
            banner,
            "  namespace {id} {:?}: {} blocks of {} bytes, {}",
            namespace.name(),
            namespace.capacity_blocks(),
            namespace.block_bytes(),
            namespace.backing()
        );
    }
    for (slot, keys) in target.keys().loaded() {
        let _ = writeln!(banner, "  key slot {slot}: AES-256-GCM, nonces from {}", keys.nonces().peek());
    }
    if let Some(metrics) = target.metrics_addr() {
        let _ =
            writeln!(banner, "  metrics: http://{metrics}/metrics  (netdam top --metrics http://{metrics}/metrics)");
    }
    let _ = writeln!(banner, "Reach it with:  netdam --target {addr} stat");
    let _ = writeln!(banner, "Stop with Ctrl-C.");
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(banner.as_bytes()).and_then(|()| stdout.flush());
}
