//! `netdam-target`: the storage target daemon.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use netdam_metrics::{LogFormat, MetricsListen};
use netdam_pmem::{Backing, Durability, Region};
use netdam_target::config::{
    blocks_fit_datagrams, check_distinct_backings, validate_spaces, ByteSize, ConfigError, EngineChoice,
    NamespaceBackend, NamespaceConfig, RegionBackend, RegionConfig, DEFAULT_BLOCK_BYTES,
};
use netdam_target::crypto::{generate_key, read_reservation, reservation_path};
use netdam_target::metadata::{
    range_text, read_tenants, space_text, KnownSpaces, MetadataError, MetadataStore, TenantSettings,
};
use netdam_target::namespaces::{open_namespace, resolve};
use netdam_target::server::{check_stored_namespace, check_stored_region, running_target};
use netdam_target::tenant_admin::{self, parse_key_slot, parse_permission_list, parse_range, parse_space};
use netdam_target::tenants::{GrantRecord, GrantSpace, QosClass, TenantRecord, KEY_PERMISSION_NAMES};
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
    /// Create, delete, list or change tenants: who may use this target, with which key, class
    /// and limits. A running target applies every change within a second.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Give a tenant permissions on a region, a namespace, a key slot or every space (added to
    /// what it holds there). A running target applies it within a second.
    Grant(GrantArgs),
    /// Take permissions (all when none are named) on a space back from a tenant. A running
    /// target applies it within a second, to live sessions too.
    Revoke(RevokeArgs),
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
        #[arg(value_parser = parse_key_slot)]
        slot: u32,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Add a new random key version to a slot: ENCRYPT seals with it from the target's next
    /// start; DECRYPT still opens what older versions sealed (the nonce names the version).
    Rotate {
        /// Slot number, 0 to 255, of a key made with `crypto-key create`.
        #[arg(value_parser = parse_key_slot)]
        slot: u32,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Remove a slot and every version of its key (what they sealed can no longer be decrypted),
    /// and every tenant's grant on the slot.
    Delete {
        /// Slot number, 0 to 255, whose every key version is destroyed.
        #[arg(value_parser = parse_key_slot)]
        slot: u32,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List the slots that hold a key, with their key versions, the nonces reserved and the
    /// tenants granted each slot by number (never the keys).
    List {
        /// Print JSON instead of a table: `slots` (each with its versions, nonces reserved and
        /// the tenants granted it by number) and `every_slot_granted` (through `all`).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
}

#[derive(Debug, Subcommand)]
enum TenantCommand {
    /// Create a tenant with a new key (or an imported one) and write its key file, owner-only,
    /// committed durably before this returns. It holds no grant until `grant` gives it one.
    Create {
        /// Unique name: 1 to 64 characters of A-Z a-z 0-9 _ . -, not starting with . (it names
        /// the key file too).
        name: String,
        #[command(flatten)]
        settings: TenantSettingsArgs,
        /// Where to write the key file [default: <data_dir>/tenants/<NAME>.key]; it must not exist.
        #[arg(long, value_name = "PATH")]
        key_file: Option<PathBuf>,
        /// Use the key in FILE (a netdam key file, or 64 hex digits; owner-only) instead of a new one.
        #[arg(long, value_name = "FILE")]
        import_key: Option<PathBuf>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Delete a tenant; its sessions on a running target end within a second. Its key file at
    /// the default place is removed too.
    Delete {
        /// The tenant's name.
        name: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List the tenants with their id, class, limits, key version and grants (never their keys).
    List {
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Give a tenant a new key (its version one more) and rewrite its key file. Sessions opened
    /// under the old key end within a second on a running target.
    RotateKey {
        /// The tenant's name.
        name: String,
        /// Where to write the new key file, replacing what is there [default: <data_dir>/tenants/<NAME>.key].
        #[arg(long, value_name = "PATH")]
        key_file: Option<PathBuf>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Change a tenant's class or limits; settings not given stay as they are.
    Set {
        /// The tenant's name.
        name: String,
        #[command(flatten)]
        settings: TenantSettingsArgs,
        #[command(flatten)]
        store: StoreArgs,
    },
}

/// A tenant's class and limits on the command line.
#[derive(Debug, Args, Clone)]
struct TenantSettingsArgs {
    /// Overload class: latency-critical is served first, best-effort is shed first with BUSY
    /// [default for a new tenant: latency-critical].
    #[arg(long, value_enum)]
    class: Option<ClassArg>,
    /// Sessions the tenant may hold open at once, over every worker [default for a new tenant: 64].
    #[arg(long, value_name = "N")]
    max_sessions: Option<u32>,
    /// Block datagrams the tenant may have waiting for a device (a file or block device; a memory region's namespace answers at once) [default for a new tenant: 256].
    #[arg(long, value_name = "N")]
    max_in_flight: Option<u32>,
    /// Cost units per second the tenant's token bucket refills at; 0 is unlimited [default for a new tenant: 0].
    #[arg(long, value_name = "N")]
    cost_per_second: Option<u64>,
    /// Token bucket depth in cost units, what the tenant may spend in a burst [default: one
    /// second of --cost-per-second, following it until a burst is given].
    #[arg(long, value_name = "N")]
    burst: Option<u64>,
}

impl TenantSettingsArgs {
    fn settings(&self) -> TenantSettings {
        TenantSettings {
            class: self.class.map(|class| match class {
                ClassArg::LatencyCritical => QosClass::LatencyCritical,
                ClassArg::BestEffort => QosClass::BestEffort,
            }),
            max_sessions: self.max_sessions,
            max_in_flight: self.max_in_flight,
            cost_per_second: self.cost_per_second,
            burst: self.burst,
        }
    }
}

/// A tenant's overload class, as the command line spells it.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ClassArg {
    /// Served first; shed only when the worker itself is overloaded.
    LatencyCritical,
    /// Shed with BUSY (and a back-off hint) as soon as requests start queueing.
    BestEffort,
}

#[derive(Debug, Args)]
struct GrantArgs {
    /// The tenant's name.
    tenant: String,
    /// region:NAME, namespace:NAME, key:SLOT (a key slot of ENCRYPT and DECRYPT, 0 to 255) or
    /// all (every region, namespace and key slot, present and future).
    #[arg(value_parser = parse_space)]
    space: GrantSpace,
    /// Comma list of read, write, atomic, compute, block, admin (STAT and management; only on
    /// `all`), or all. On a namespace, block goes with read (BREAD) and write (BWRITE). On a key
    /// slot: encrypt, decrypt or all (ENCRYPT and DECRYPT also need read and write on the region).
    perms: String,
    /// Only the bytes [OFFSET, OFFSET+LEN) of the space, e.g. 0:64MiB (sizes as elsewhere:
    /// 4096, 0x1000, 64KiB); a space granted over one range cannot be granted over another.
    #[arg(long, value_name = "OFFSET:LEN", value_parser = parse_range)]
    range: Option<(u64, u64)>,
    #[command(flatten)]
    store: StoreArgs,
}

#[derive(Debug, Args)]
struct RevokeArgs {
    /// The tenant's name.
    tenant: String,
    /// region:NAME, namespace:NAME, key:SLOT or all, as granted.
    #[arg(value_parser = parse_space)]
    space: GrantSpace,
    /// Comma list of permissions to take back (read, write, atomic, compute, block, encrypt,
    /// decrypt, admin, all) [default: all, removing the grant]. One the tenant does not hold
    /// there refuses the whole revoke; `all` takes whatever it holds.
    perms: Option<String>,
    #[command(flatten)]
    store: StoreArgs,
}

impl Command {
    /// An admin command's name and where its store is; `None` for `serve` and `config`.
    fn admin_store(&mut self) -> Option<(&'static str, &mut StoreArgs)> {
        let named = match self {
            Command::Serve(_) | Command::Config(_) => return None,
            Command::Region(
                RegionCommand::Create { store, .. }
                | RegionCommand::Delete { store, .. }
                | RegionCommand::List { store },
            ) => ("region", store),
            Command::Namespace(
                NamespaceCommand::Create { store, .. }
                | NamespaceCommand::Delete { store, .. }
                | NamespaceCommand::List { store },
            ) => ("namespace", store),
            Command::Tenant(
                TenantCommand::Create { store, .. }
                | TenantCommand::Delete { store, .. }
                | TenantCommand::List { store, .. }
                | TenantCommand::RotateKey { store, .. }
                | TenantCommand::Set { store, .. },
            ) => ("tenant", store),
            Command::Grant(GrantArgs { store, .. }) => ("grant", store),
            Command::Revoke(RevokeArgs { store, .. }) => ("revoke", store),
            Command::CryptoKey(
                CryptoKeyCommand::Create { store, .. }
                | CryptoKeyCommand::Rotate { store, .. }
                | CryptoKeyCommand::Delete { store, .. }
                | CryptoKeyCommand::List { store, .. },
            ) => ("crypto-key", store),
        };
        Some(named)
    }
}

/// Where the metadata store is: the data directory, from flags or the config file. `--config`
/// and `--data-dir` may also come before the subcommand (`netdam-target --config FILE tenant
/// list`), as for `serve`.
#[derive(Debug, Args, Clone)]
struct StoreArgs {
    /// TOML settings file (its data_dir, and its regions and namespaces for name checks).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Data directory holding the metadata store [default: $XDG_DATA_HOME/netdam or ~/.local/share/netdam].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

impl StoreArgs {
    /// Takes `--config` and `--data-dir` given before admin command `command` as if given after
    /// it. Refuses, rather than ignores, what could only be a mistake: one of them given on both
    /// sides with different values, or a setting of the serving target, which an admin command
    /// has no use for.
    fn take_global(&mut self, global: &SettingsArgs, command: &str) -> Result<(), String> {
        let serving: Vec<&str> = [
            ("--listen", global.listen.is_some()),
            ("--metrics-listen", global.metrics_listen.is_some()),
            ("--workers", global.workers.is_some()),
            ("--poll", global.poll.is_some()),
            ("--auth", global.auth.is_some()),
            ("--engine", global.engine.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect();
        if !serving.is_empty() {
            return Err(format!(
                "{} set{} how a target serves; `netdam-target {command}` takes only --config FILE and --data-dir DIR",
                serving.join(", "),
                if serving.len() == 1 { "s" } else { "" }
            ));
        }
        let once = |flag: &str, after: Option<PathBuf>, before: &Option<PathBuf>| match (after, before) {
            (Some(after), Some(before)) if after != *before => Err(format!(
                "{flag} is given twice, {} before `{command}` and {} after it: give it once",
                before.display(),
                after.display()
            )),
            (after, before) => Ok(after.or_else(|| before.clone())),
        };
        self.config = once("--config", self.config.take(), &global.config)?;
        self.data_dir = once("--data-dir", self.data_dir.take(), &global.data_dir)?;
        Ok(())
    }
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
        /// Backing file for file and dax; relative paths are under the data directory. Directories
        /// missing on its path are created; a refused create removes the file it made, not those.
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
        /// The region's name (`region list` lists them).
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
        /// Bytes per block: a power of two from 512 to 8192 (one block fits in one datagram).
        #[arg(long, default_value_t = DEFAULT_BLOCK_BYTES)]
        block_size: u32,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Remove a namespace from the store; its file or device is left as it is.
    Delete {
        /// The namespace's name (`namespace list` lists them).
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
    /// lock_memory, max_datagram_bytes, busy_threshold_us, block_sqpoll_idle_ms, answer_trains, sessions_per_worker,
    /// max_sessions_per_address, session_idle_timeout_ms, engine, fpga_window, fpga_progress_deadline_ms, fpga_namespace,
    /// auth, allow_unauthenticated_network, session_permissions, extensions, [[region]] tables with name, backend =
    /// mem|file|dax, path, size, and [[namespace]] tables with name, backend =
    /// file|blockdev|pmem, path, size, block_size). `netdam-target config` prints them all.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// UDP address to serve on: an IP address and port, [::] or 0.0.0.0 for all [default: 127.0.0.1:7800].
    #[arg(long, value_name = "ADDR", value_parser = netdam_isa::units::parse_listen_addr)]
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
    /// Execution engine: auto (an FPGA if one is found, else software), software, fpga (fail
    /// without one) or fpga=PATH (a netdam-fpga-model window file or a sysfs resource0)
    /// [default: auto].
    #[arg(long, value_name = "auto|software|fpga[=PATH]")]
    engine: Option<EngineChoice>,
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
            engine: self.engine.or(base.engine),
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
        if let Some(engine) = &self.engine {
            config.engine = engine.clone();
        }
        config.validate().map_err(|error| error.to_string())?;
        Ok(config)
    }
}

/// SIGINT, SIGTERM and SIGHUP, the signals that stop a serving target: SIGHUP is its terminal
/// closing (an ssh session that ends), which would otherwise end it unannounced.
fn stop_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set; sigaddset adds valid signal numbers to it.
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        if !hangup_ignored() {
            libc::sigaddset(&mut set, libc::SIGHUP);
        }
        set
    }
}

/// Whether SIGHUP was ignored when the process started (`nohup`): then it stays ignored. A blocked signal is queued even when ignored, so adding it to the set that
/// `sigwait` takes would let a hangup stop a target that was started to outlive its terminal.
fn hangup_ignored() -> bool {
    // SAFETY: a query (null new action) into a zeroed, valid sigaction.
    unsafe {
        let mut old = std::mem::zeroed::<libc::sigaction>();
        libc::sigaction(libc::SIGHUP, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// Blocks the stop signals in this thread before the target starts its threads, which inherit
/// the mask: a signal then stays pending until [`wait_for_stop`] takes it in this thread (one
/// that comes while the target starts is taken once it serves, and stops it then). Child
/// processes do not inherit the mask: the standard library resets it when it spawns one.
fn block_stop_signals() {
    set_stop_signals(libc::SIG_BLOCK);
}

/// Blocks (`SIG_BLOCK`) or unblocks (`SIG_UNBLOCK`) the stop signals in this thread.
fn set_stop_signals(how: libc::c_int) {
    let set = stop_signals();
    // SAFETY: a valid set; the old mask is not wanted.
    unsafe { libc::pthread_sigmask(how, &set, std::ptr::null_mut()) };
}

/// Sleeps until SIGINT, SIGTERM or SIGHUP arrives, and names it. The main thread of a serving target
/// does nothing else, so it must not wake for nothing: it looked at a flag every 100 ms, and on
/// a host whose cores spin (a busy worker, a polling initiator) each such wake-up took one of
/// them for ~15 µs, which a request in flight waited out (docs/DECISIONS.md, "What preempts a
/// spinning worker").
fn wait_for_stop() -> &'static str {
    let set = stop_signals();
    loop {
        let mut signal = 0;
        // SAFETY: a valid set and a valid out pointer; the signals are blocked in every thread.
        match unsafe { libc::sigwait(&set, &mut signal) } {
            0 if signal == libc::SIGINT => return "SIGINT",
            0 if signal == libc::SIGHUP => return "SIGHUP",
            0 => return "SIGTERM",
            // sigwait fails only on an invalid set; nothing to do but wait again.
            _ => continue,
        }
    }
}

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    netdam_metrics::logging::init(cli.log_format);
    if let Some((name, store)) = cli.command.as_mut().and_then(Command::admin_store) {
        if let Err(message) = store.take_global(&cli.settings, name) {
            eprintln!("netdam-target: {message}");
            return ExitCode::from(2);
        }
    }
    if !matches!(cli.command, None | Some(Command::Serve(_))) {
        // An admin command or `config` read through a pipe that closes early (`| head`) ends
        // quietly, as other command-line tools do, instead of panicking on the broken pipe.
        // (A serving target keeps SIGPIPE ignored: a metrics scraper that hangs up is an error
        // of that connection.) Nothing but this thread runs yet.
        // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let (serve, settings) = match cli.command {
        None => (true, cli.settings),
        Some(Command::Serve(args)) => (true, args.merged_over(cli.settings)),
        Some(Command::Config(args)) => (false, args.merged_over(cli.settings)),
        Some(Command::Region(command)) => return admin(|| region_command(command)),
        Some(Command::Namespace(command)) => return admin(|| namespace_command(command)),
        Some(Command::Tenant(command)) => return admin(|| tenant_command(command)),
        Some(Command::Grant(args)) => return admin(|| grant_command(args)),
        Some(Command::Revoke(args)) => return admin(|| revoke_command(args)),
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
    // Secure by default: a target that requires tenants, on a store that has never held one,
    // creates the default tenant (every permission on every space) and its key file, which
    // `netdam` on this machine finds on its own when the data directory is the default one. A
    // store whose tenants were deleted stays closed.
    block_stop_signals();
    let target = match Target::start(&config) {
        Ok(target) => target,
        Err(error) => {
            eprintln!("netdam-target: {error}");
            return ExitCode::FAILURE;
        }
    };
    // Only once the start has succeeded (a taken port, a region that cannot be mapped: no key
    // file is written for a target that never served), and in force before the banner says
    // the target serves.
    let default_key = match default_tenant(&config) {
        Ok(created) => {
            if created.is_some() {
                if let Err(error) = target.reload_tenants() {
                    // The watcher reads the store within a poll anyway.
                    tracing::warn!(%error, "the default tenant is stored; it is put in force at the watcher's next read");
                }
            }
            created
        }
        Err(message) => {
            eprintln!("netdam-target: {message}");
            target.stop();
            return ExitCode::FAILURE;
        }
    };
    if let Err(error) = netdam_target::configured_files::record(&config) {
        tracing::warn!(
            %error,
            "could not record which files the configured spaces are served from; a start that finds one of them gone will create it again empty"
        );
    }
    log_start(&target, &config);
    if config.auth == AuthMode::None {
        tracing::warn!(
            listen = %config.listen,
            "auth = \"none\": no authentication; every initiator that reaches this address may read and write everything"
        );
    }
    print_banner(&target, &config, default_key.as_deref());
    let signal = wait_for_stop();
    // Not eprintln!: after a hangup stderr may be a terminal that is gone (EIO), and a failed
    // write must not turn a clean stop into a panic.
    let _ = writeln!(std::io::stderr(), "netdam-target: stopping ({signal})");
    // A second signal ends a stop that hangs: the main thread no longer blocks them, so the
    // default action (termination) takes it there.
    set_stop_signals(libc::SIG_UNBLOCK);
    target.stop();
    ExitCode::SUCCESS
}

fn admin(command: impl FnOnce() -> Result<(), String>) -> ExitCode {
    // The store's reader (redb) panics on pages it cannot have written; the opens and reads a
    // start makes say so by name (`metadata::guarded`), and a command that meets one in a later
    // read says what it most likely means rather than ending on the panic alone.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(command)).unwrap_or_else(|_| {
        Err(format!(
            "the command stopped on the internal error above; if it came from the metadata store (redb), \
             the store's file ({} in the data directory) is likely damaged: restore it from a backup",
            netdam_target::metadata::METADATA_FILE
        ))
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("netdam-target: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The settings and data directory of a command that adds to the store: the directory is
/// created where missing.
fn store_context(store: &StoreArgs) -> Result<(Config, PathBuf), String> {
    let (config, data_dir) = settings_and_data_dir(store)?;
    netdam_target::server::create_data_dir(&data_dir)
        .map_err(|error| format!("cannot create the data directory {}: {error}", data_dir.display()))?;
    Ok((config, data_dir))
}

/// The settings and data directory of a command that changes what is stored: a missing
/// directory is refused (a mistyped --data-dir), not created.
fn existing_store_context(store: &StoreArgs) -> Result<(Config, PathBuf), String> {
    let (config, data_dir) = settings_and_data_dir(store)?;
    require_data_dir(&data_dir)?;
    Ok((config, data_dir))
}

fn require_data_dir(data_dir: &std::path::Path) -> Result<(), String> {
    match data_dir_kind(data_dir)? {
        true => Ok(()),
        false => Err(format!("{}: nothing is stored there", no_data_dir(data_dir))),
    }
}

/// The settings and data directory of a command that only reads: nothing is created; a
/// missing directory is said once, on stderr, and reads as empty.
fn read_context(store: &StoreArgs) -> Result<(Config, PathBuf), String> {
    let (config, data_dir) = settings_and_data_dir(store)?;
    if !data_dir_kind(&data_dir)? {
        eprintln!("{}: only what the configuration declares is listed", no_data_dir(&data_dir));
    }
    Ok((config, data_dir))
}

/// Whether the data directory exists; one that is a file is refused.
fn data_dir_kind(data_dir: &std::path::Path) -> Result<bool, String> {
    match std::fs::metadata(data_dir) {
        Ok(metadata) if metadata.is_dir() => Ok(true),
        Ok(_) => Err(format!("the data directory {}: it is a file, not a directory (--data-dir)", data_dir.display())),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(format!("the data directory {}: {error}", data_dir.display())),
    }
}

fn no_data_dir(data_dir: &std::path::Path) -> String {
    format!(
        "there is no data directory {} (a mistyped --data-dir? a target creates it at its first start, \
         and so does the first `region create`, `namespace create`, `tenant create` or `crypto-key create`)",
        data_dir.display()
    )
}

/// The settings file's config and the data directory an admin command works on.
fn settings_and_data_dir(store: &StoreArgs) -> Result<(Config, PathBuf), String> {
    let mut config = match &store.config {
        Some(path) => Config::from_file(path).map_err(|error| error.to_string())?,
        None => Config::default(),
    };
    if let Some(dir) = &store.data_dir {
        config.data_dir = Some(dir.clone());
    }
    let data_dir = config.data_dir().map_err(|error| error.to_string())?;
    Ok((config, data_dir))
}

/// The machine's RAM and swap in bytes (`/proc/meminfo`), or `None` where it cannot be read.
fn memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| {
        meminfo.lines().find_map(|line| line.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
    };
    Some((kib("MemTotal:")? + kib("SwapTotal:").unwrap_or(0)).saturating_mul(1024))
}

/// Tells the user which data directory changed and how the change reaches a target.
fn after_change(data_dir: &std::path::Path) {
    let dir = data_dir.display();
    match running_target(data_dir) {
        Some(pid) => println!(
            "A target is running on the data directory {dir} (pid {pid}): it serves what it read at start; restart it to serve this change."
        ),
        None => println!("A target started on the data directory {dir} takes this change at its start."),
    }
}

/// Checks a region or namespace about to be created beside every space the target would serve
/// with it (configured and stored): names unique, counts bounded, no file or device shared.
fn check_beside_the_others(
    config: &Config,
    metadata: &MetadataStore,
    data_dir: &std::path::Path,
    region: Option<&RegionConfig>,
    namespace: Option<&NamespaceConfig>,
) -> Result<(), String> {
    let text = |error: MetadataError| error.to_string();
    let (stored_regions, stored_namespaces) = (metadata.regions().map_err(text)?, metadata.namespaces().map_err(text)?);
    let configured_regions = config.effective_regions();
    // A name taken says so, and where, before the checks of the whole list ("used twice").
    let refuse_taken = |kind: &str, name: &str, configured: Vec<&str>, stored: Vec<&str>| {
        let place = if configured.contains(&name) {
            "in the settings (the settings file, or the built-in default region)"
        } else if stored.contains(&name) {
            "in the metadata store"
        } else {
            return Ok(());
        };
        Err(format!("a {kind} named {name:?} already exists {place}: pick another name (netdam-target {kind} list)"))
    };
    if let Some(region) = region {
        let configured = configured_regions.iter().map(|other| other.name.as_str()).collect();
        let stored = stored_regions.iter().map(|other| other.name.as_str()).collect();
        refuse_taken("region", &region.name, configured, stored)?;
    }
    if let Some(namespace) = namespace {
        let configured = config.namespaces.iter().map(|other| other.name.as_str()).collect();
        let stored = stored_namespaces.iter().map(|other| other.name.as_str()).collect();
        refuse_taken("namespace", &namespace.name, configured, stored)?;
    }
    let mut regions = configured_regions;
    regions.extend(stored_regions);
    regions.extend(region.cloned());
    let mut namespaces = config.namespaces.clone();
    namespaces.extend(stored_namespaces);
    namespaces.extend(namespace.cloned());
    validate_spaces(&regions, &namespaces).map_err(|error| error.to_string())?;
    check_distinct_backings(&regions, &namespaces, data_dir).map_err(|error| error.to_string())
}

fn region_command(command: RegionCommand) -> Result<(), String> {
    match command {
        RegionCommand::Create { name, backend, path, size, store } => {
            let (config, data_dir) = store_context(&store)?;
            let region = RegionConfig { name, backend, path, size };
            // Its own fields first: a refused region leaves no store behind in a new directory.
            region.validate().map_err(|error| error.to_string())?;
            if region.backend == RegionBackend::Mem {
                // The target maps and populates it at start, which fails on a size the machine
                // cannot hold: refused here rather than by the next start.
                if let Some(memory) = memory_bytes().filter(|&memory| region.size.0 > memory) {
                    return Err(format!(
                        "region {:?}: {} bytes of memory asked for, and this machine has {memory} (RAM and swap); \
                         make it smaller, or use backend \"file\"",
                        region.name, region.size.0
                    ));
                }
            }
            let metadata = MetadataStore::open(&data_dir).map_err(|error| error.to_string())?;
            check_beside_the_others(&config, &metadata, &data_dir, Some(&region), None)?;
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
                "created region {:?}: {} bytes, backend {} ({})",
                region.name,
                region.size.0,
                format!("{:?}", region.backend).to_lowercase(),
                metadata.path().display()
            );
            drop(metadata);
            after_change(&data_dir);
        }
        RegionCommand::Delete { name, store } => {
            let (config, data_dir) = settings_and_data_dir(&store)?;
            if config.effective_regions().iter().any(|region| region.name == name) {
                return Err(format!(
                    "region {name:?} comes from the configuration (the settings file, or the embedded default \
                     region when none is declared), not from the metadata store: remove it there"
                ));
            }
            require_data_dir(&data_dir)?;
            let metadata = MetadataStore::open(&data_dir).map_err(|error| error.to_string())?;
            let (region, ungranted) = metadata.delete_region(&name).map_err(|error| error.to_string())?;
            let kept = region.path.map(|path| format!("; its file {} is kept", resolve(&path, &data_dir).display()));
            println!("deleted region {name:?}{}", kept.unwrap_or_default());
            // Closed first: an open store holds off the running target's reading of the grants.
            drop(metadata);
            say_grants_removed(&ungranted, &data_dir, "the space itself at the target's next start");
            after_change(&data_dir);
        }
        RegionCommand::List { store } => {
            let (config, data_dir) = read_context(&store)?;
            let stored = MetadataStore::load(&data_dir).map_err(|error| error.to_string())?;
            let configured = config.effective_regions().into_iter().map(|region| (region, "config", Ok(())));
            let stored = stored.regions.into_iter().map(|region| {
                let checked = check_stored_region(&region, &data_dir);
                (region, "store", checked)
            });
            for (id, region, source, not_served) in numbered_as_served(configured.chain(stored)) {
                let path = region.path.map(|path| resolve(&path, &data_dir).display().to_string()).unwrap_or_default();
                println!(
                    "{id:>3}  {:<32} {:>14} bytes  {:<5} {source:<6} {path}{not_served}",
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
            let namespace = NamespaceConfig { name, backend, path, size, block_size };
            // Its own fields first: a refused namespace leaves no store behind in a new directory.
            namespace.validate().map_err(|error| error.to_string())?;
            blocks_fit_datagrams(config.max_datagram_bytes, std::slice::from_ref(&namespace))
                .map_err(|error| error.to_string())?;
            let metadata = MetadataStore::open(&data_dir).map_err(|error| error.to_string())?;
            check_beside_the_others(&config, &metadata, &data_dir, None, Some(&namespace))?;
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
            let (config, data_dir) = settings_and_data_dir(&store)?;
            if config.namespaces.iter().any(|namespace| namespace.name == name) {
                return Err(format!(
                    "namespace {name:?} comes from the settings file, not from the metadata store: remove it there"
                ));
            }
            require_data_dir(&data_dir)?;
            let metadata = MetadataStore::open(&data_dir).map_err(|error| error.to_string())?;
            let (namespace, ungranted) = metadata.delete_namespace(&name).map_err(|error| error.to_string())?;
            println!("deleted namespace {name:?}; {} is left as it is", resolve(&namespace.path, &data_dir).display());
            drop(metadata);
            say_grants_removed(&ungranted, &data_dir, "the space itself at the target's next start");
            after_change(&data_dir);
        }
        NamespaceCommand::List { store } => {
            let (config, data_dir) = read_context(&store)?;
            let stored = MetadataStore::load(&data_dir).map_err(|error| error.to_string())?;
            let stored: Vec<_> = stored
                .namespaces
                .into_iter()
                .map(|namespace| {
                    let checked = check_stored_namespace(&config, &namespace, &data_dir);
                    (namespace, "store", checked)
                })
                .collect();
            let configured = config.namespaces.into_iter().map(|namespace| (namespace, "config", Ok(())));
            for (id, namespace, source, not_served) in numbered_as_served(configured.chain(stored)) {
                let size =
                    namespace.size.map(|size| format!("{} bytes", size.0)).unwrap_or_else(|| "device size".into());
                println!(
                    "{id:>3}  {:<32} {:<8} {:>6}-byte blocks  {size:<18} {source:<6} {}{not_served}",
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

/// Numbers spaces as a starting target does: a stored space that fails today's checks is not
/// served and takes no id (shown as `-`, with why, after its line), so the others' ids are the
/// ones the target gives them.
fn numbered_as_served<T>(
    spaces: impl Iterator<Item = (T, &'static str, Result<(), ConfigError>)>,
) -> impl Iterator<Item = (String, T, &'static str, String)> {
    let mut next = 0;
    spaces.map(move |(space, source, checked)| match checked {
        Ok(()) => {
            next += 1;
            ((next - 1).to_string(), space, source, String::new())
        }
        Err(error) => ("-".to_string(), space, source, format!("  (not served: {error})")),
    })
}

/// Names the tenants whose grant on a deleted space or key slot went with it (a grant left
/// behind would give its tenant a space created later under the same name, or a key created
/// later in the same slot).
fn say_grants_removed(tenants: &[String], data_dir: &std::path::Path, when_deleted: &str) {
    if !tenants.is_empty() {
        println!(
            "removed the grants on it of {} tenant(s): {} (the grants at once, on a running target too; {when_deleted})",
            tenants.len(),
            tenants.join(", ")
        );
        after_tenant_change(data_dir);
    }
}

/// Tells the user which data directory changed and when the change reaches a target. With a
/// target running there, it first waits (up to `APPLY_WAIT`) until that target says it applied
/// the tenants the store now holds (`tenant_watch::wait_until_applied`): a script that creates
/// a tenant or rotates a key and uses the key at once was refused as unauthenticated 13 times
/// in 15 without the wait.
fn after_tenant_change(data_dir: &std::path::Path) {
    const APPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
    let dir = data_dir.display();
    match running_target(data_dir) {
        Some(pid) => {
            let pid = if pid == 0 { String::new() } else { format!(" (pid {pid})") };
            if netdam_target::tenant_watch::wait_until_applied(data_dir, APPLY_WAIT) {
                println!("The target running on the data directory {dir}{pid} has applied this.")
            } else {
                eprintln!(
                    "warning: the target running on the data directory {dir}{pid} has not applied this after {} s; \
                     it does when it next reads the store (its log says why it cannot)",
                    APPLY_WAIT.as_secs()
                );
            }
        }
        None => println!("A target serving the data directory {dir} applies this within a second (or from its start)."),
    }
}

fn limits_text(record: &TenantRecord) -> String {
    let limits = &record.limits;
    let rate = if limits.cost_per_second == 0 {
        "no rate limit".to_string()
    } else {
        format!("{} cost units/s, burst {}", limits.cost_per_second, limits.burst)
    };
    format!(
        "{}, up to {} sessions, {} requests in flight, {rate}",
        class_text(record.class),
        limits.max_sessions,
        limits.max_in_flight
    )
}

fn class_text(class: QosClass) -> &'static str {
    match class {
        QosClass::LatencyCritical => "latency-critical",
        QosClass::BestEffort => "best-effort",
    }
}

fn grant_text(grant: &GrantRecord) -> String {
    let range = match (&grant.space, grant.range) {
        (GrantSpace::KeySlot(_), _) => String::new(),
        (_, Some(range)) => format!("  (bytes {})", range_text(Some(range))),
        (_, None) => format!("  ({})", range_text(None)),
    };
    format!("{}  {}{range}", space_text(&grant.space), grant.permissions.join(","))
}

fn tenant_command(command: TenantCommand) -> Result<(), String> {
    match command {
        TenantCommand::Create { name, settings, key_file, import_key, store } => {
            let (_, data_dir) = store_context(&store)?;
            let key = import_key.map(|path| tenant_admin::import_key(&path)).transpose().map_err(|e| e.to_string())?;
            let imported = key.is_some();
            let (record, key_file) = tenant_admin::create_tenant(&data_dir, &name, key, &settings.settings(), key_file)
                .map_err(|error| error.to_string())?;
            let key_file = key_file.display();
            println!(
                "created tenant {name:?}: id {}, {}, {} key; it holds no grant yet",
                record.id,
                limits_text(&record),
                if imported { "imported" } else { "new" }
            );
            println!("key file: {key_file} (owner-only: whoever holds it acts as {name:?})");
            println!("Use it with:  netdam --key {key_file} …   or   NETDAM_KEY={key_file} netdam …");
            println!("Give it access with, e.g.:  netdam-target grant {name} region:NAME read,write");
            after_tenant_change(&data_dir);
        }
        TenantCommand::Delete { name, store } => {
            let (_, data_dir) = existing_store_context(&store)?;
            let deleted = tenant_admin::delete_tenant(&data_dir, &name).map_err(|error| error.to_string())?;
            let removed = deleted.key_file_removed.map(|path| format!("; removed its key file {}", path.display()));
            println!("deleted tenant {name:?} (id {}){}", deleted.record.id, removed.unwrap_or_default());
            println!("Its sessions end when a running target applies this.");
            after_tenant_change(&data_dir);
            if deleted.was_last {
                eprintln!(
                    "netdam-target: warning: that was the last tenant of {}: no initiator can open a session there \
                     until you create one (netdam-target tenant create NAME, then grant it), and a target does not \
                     re-create {:?} for a store whose tenants were deleted",
                    data_dir.display(),
                    tenant_admin::DEFAULT_TENANT
                );
            }
        }
        TenantCommand::List { json, store } => {
            let (_, data_dir) = read_context(&store)?;
            // Read-only: listing neither creates a store nor touches the file a target watches.
            let tenants = read_tenants(&data_dir).map_err(|error| error.to_string())?;
            if json {
                let shown: Vec<serde_json::Value> = tenants
                    .iter()
                    .map(|record| {
                        let mut value = serde_json::to_value(record).expect("tenant records always serialize");
                        if let Some(object) = value.as_object_mut() {
                            object.remove("key_hex");
                        }
                        value
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&shown).expect("JSON values always serialize"));
                return Ok(());
            }
            if tenants.is_empty() {
                println!(
                    "no tenants in the data directory {} (create one with: netdam-target tenant create NAME)",
                    data_dir.display()
                );
            }
            for record in &tenants {
                println!("{:>4}  {:<24} key v{}  {}", record.id, record.name, record.key_version, limits_text(record));
                if record.grants.is_empty() {
                    println!("        (no grant)");
                }
                for grant in &record.grants {
                    println!("        {}", grant_text(grant));
                }
            }
        }
        TenantCommand::RotateKey { name, key_file, store } => {
            let (_, data_dir) = existing_store_context(&store)?;
            let (record, key_file) =
                tenant_admin::rotate_key(&data_dir, &name, key_file).map_err(|error| error.to_string())?;
            println!(
                "rotated the key of tenant {name:?}: key version {}, new key file {}",
                record.key_version,
                key_file.display()
            );
            println!(
                "Sessions opened under the old key end within a second on a running target; \
                 hand the new key file to the tenant's initiators."
            );
            after_tenant_change(&data_dir);
        }
        TenantCommand::Set { name, settings, store } => {
            let settings = settings.settings();
            if settings.is_empty() {
                return Err(
                    "tenant set: nothing to change; give --class, --max-sessions, --max-in-flight, --cost-per-second or --burst"
                        .into(),
                );
            }
            let (_, data_dir) = existing_store_context(&store)?;
            let record = MetadataStore::open(&data_dir)
                .and_then(|metadata| metadata.set_tenant(&name, &settings))
                .map_err(|error| error.to_string())?;
            println!("tenant {name:?}: {}", limits_text(&record));
            if settings.burst.is_some() && record.limits.cost_per_second == 0 {
                eprintln!(
                    "netdam-target: warning: tenant {name:?} has no rate limit, so its burst limits nothing; \
                     give --cost-per-second too"
                );
            }
            after_tenant_change(&data_dir);
        }
    }
    Ok(())
}

fn grant_command(args: GrantArgs) -> Result<(), String> {
    let GrantArgs { tenant, space, perms, range, store } = args;
    // The names as given: the store tells an `admin` named on one space (refused) from the one
    // within `all` (every permission on that space).
    let permissions: Vec<String> = perms.split(',').map(|name| name.trim().to_string()).collect();
    let (config, data_dir) = existing_store_context(&store)?;
    let grant = GrantRecord { space: space.clone(), permissions, range };
    let known = KnownSpaces::from_config(&config, store.config.as_deref());
    let metadata = MetadataStore::open(&data_dir).map_err(|error| error.to_string())?;
    let record = metadata.grant(&tenant, &grant, &known).map_err(|error| error.to_string())?;
    let held = record.grants.iter().find(|held| held.space == space).expect("a grant just made is held");
    println!("tenant {tenant:?} now holds {}", grant_text(held));
    if let Some(advice) = tenant_admin::grant_advice(&tenant, held) {
        eprintln!("netdam-target: warning: {advice}");
    }
    if let (GrantSpace::Namespace(name), Some(range)) = (&space, range) {
        let stored = metadata.namespaces().unwrap_or_default();
        let granted = config.namespaces.iter().chain(&stored).find(|namespace| &namespace.name == name);
        if let Some(advice) =
            granted.and_then(|namespace| tenant_admin::range_advice(name, range, u64::from(namespace.block_size)))
        {
            eprintln!("netdam-target: warning: {advice}");
        }
    }
    drop(metadata);
    after_tenant_change(&data_dir);
    Ok(())
}

fn revoke_command(args: RevokeArgs) -> Result<(), String> {
    let RevokeArgs { tenant, space, perms, store } = args;
    // Checked before the store is opened; passed as given, since the store reads `all` as
    // whatever is held and refuses a permission named but not held.
    if let Some(text) = &perms {
        parse_permission_list(text)?;
    }
    let permissions: Option<Vec<String>> =
        perms.map(|text| text.split(',').map(|name| name.trim().to_string()).collect());
    let (_, data_dir) = existing_store_context(&store)?;
    let record = MetadataStore::open(&data_dir)
        .and_then(|metadata| metadata.revoke(&tenant, &space, permissions.as_deref()))
        .map_err(|error| error.to_string())?;
    match record.grants.iter().find(|held| held.space == space) {
        Some(held) => println!("tenant {tenant:?} now holds {}", grant_text(held)),
        None => println!("tenant {tenant:?} holds nothing on {} any more", space_text(&space)),
    }
    after_tenant_change(&data_dir);
    Ok(())
}

fn crypto_key_command(command: CryptoKeyCommand) -> Result<(), String> {
    let text = |error: MetadataError| error.to_string();
    match command {
        CryptoKeyCommand::Create { slot, store } => {
            let (_, data_dir) = store_context(&store)?;
            let metadata = MetadataStore::open(&data_dir).map_err(text)?;
            let key = generate_key().map_err(|error| error.to_string())?;
            let version = metadata.create_crypto_key(slot, &key).map_err(text)?;
            println!("created key slot {slot}: key version {version}, AES-256-GCM ({})", metadata.path().display());
            drop(metadata);
            after_change(&data_dir);
        }
        CryptoKeyCommand::Rotate { slot, store } => {
            let (_, data_dir) = existing_store_context(&store)?;
            let metadata = MetadataStore::open(&data_dir).map_err(text)?;
            let key = generate_key().map_err(|error| error.to_string())?;
            let version = metadata.rotate_crypto_key(slot, &key).map_err(text)?;
            println!(
                "rotated key slot {slot} to key version {version}: ENCRYPT seals with it once the target has (re)started; \
                 DECRYPT still opens older versions"
            );
            drop(metadata);
            after_change(&data_dir);
        }
        CryptoKeyCommand::Delete { slot, store } => {
            let (_, data_dir) = existing_store_context(&store)?;
            let metadata = MetadataStore::open(&data_dir).map_err(text)?;
            let (versions, ungranted) = metadata.delete_crypto_key(slot).map_err(text)?;
            println!(
                "deleted key slot {slot} (key versions {versions:?}): what they sealed can no longer be decrypted"
            );
            drop(metadata);
            say_grants_removed(&ungranted, &data_dir, "the slot, within a second");
            match running_target(&data_dir) {
                Some(pid) => println!(
                    "The target running on the data directory {} (pid {pid}) stops serving slot {slot} within a second.",
                    data_dir.display()
                ),
                None => println!("A target started on the data directory {} serves no slot {slot}.", data_dir.display()),
            }
        }
        CryptoKeyCommand::List { json, store } => {
            let (_, data_dir) = read_context(&store)?;
            let slots = MetadataStore::read_crypto_key_slots(&data_dir).map_err(text)?;
            let tenants = read_tenants(&data_dir).map_err(text)?;
            // Who holds `key:SLOT`; an `all` grant naming a use covers every slot and is shown
            // once, below.
            let every_slot = key_users(&tenants, &GrantSpace::All);
            let mut listed = Vec::new();
            for (slot, versions) in slots {
                let reserved =
                    read_reservation(&reservation_path(&data_dir, slot)).map_err(|error| error.to_string())?;
                listed.push((slot, versions, reserved, key_users(&tenants, &GrantSpace::KeySlot(slot))));
            }
            let named = |grants: &[(String, String)]| -> Vec<serde_json::Value> {
                grants.iter().map(|(tenant, uses)| serde_json::json!({ "tenant": tenant, "uses": uses })).collect()
            };
            if json {
                let shown: Vec<serde_json::Value> = listed
                    .iter()
                    .map(|(slot, versions, reserved, grants)| {
                        serde_json::json!({
                            "slot": slot,
                            "key_version": versions.last(),
                            "versions": versions,
                            "nonces_reserved_up_to": reserved,
                            "granted": named(grants),
                        })
                    })
                    .collect();
                let shown = serde_json::json!({ "slots": shown, "every_slot_granted": named(&every_slot) });
                println!("{}", serde_json::to_string_pretty(&shown).expect("JSON values always serialize"));
                return Ok(());
            }
            if listed.is_empty() {
                println!("no key slot holds a key (netdam-target crypto-key create SLOT makes one)");
            }
            let said = |grants: &[(String, String)]| {
                let said: Vec<String> = grants.iter().map(|(tenant, uses)| format!("{tenant} ({uses})")).collect();
                if said.is_empty() {
                    "nobody by number".to_string()
                } else {
                    said.join(", ")
                }
            };
            for (slot, versions, reserved, grants) in &listed {
                let current = versions.last().copied().unwrap_or_default();
                println!(
                    "{slot:>3}  key version {current:<4} versions {versions:?}  nonces reserved up to {reserved}  \
                     granted to {}",
                    said(grants)
                );
            }
            if !every_slot.is_empty() {
                println!("every slot, through all: {}", said(&every_slot));
            }
        }
    }
    Ok(())
}

/// The tenants holding a grant on `space` that names a use of key slots, with those uses
/// (`encrypt,decrypt`): what `crypto-key list` says of a slot (`key:SLOT`) or of every slot
/// (`all`).
fn key_users(tenants: &[TenantRecord], space: &GrantSpace) -> Vec<(String, String)> {
    tenants
        .iter()
        .flat_map(|tenant| {
            tenant.grants.iter().filter(|grant| &grant.space == space).filter_map(|grant| {
                let uses: Vec<&str> = grant
                    .permissions
                    .iter()
                    .map(String::as_str)
                    .filter(|name| KEY_PERMISSION_NAMES.contains(name))
                    .collect();
                (!uses.is_empty()).then(|| (tenant.name.clone(), uses.join(",")))
            })
        })
        .collect()
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
        block_sqpoll_idle_ms = config.block_sqpoll_idle_ms,
        answer_trains = config.answer_trains,
        sessions_per_worker = config.sessions_per_worker,
        max_sessions_per_address = config.max_sessions_per_address,
        session_idle_timeout_ms = config.session_idle_timeout_ms,
        engine = target.engine_name(),
        engine_selection = target.engine_selection(),
        regions = target.regions().iter().len(),
        namespaces = target.namespaces().iter().len(),
        version = env!("CARGO_PKG_VERSION"),
        "netdam-target started"
    );
}

/// Creates the default tenant and its key file when tenants are required and the store has
/// never held one (see `tenant_admin::ensure_default_tenant`); returns the key file's path when
/// it did.
fn default_tenant(config: &Config) -> Result<Option<PathBuf>, String> {
    if config.auth != AuthMode::Tenants {
        return Ok(None);
    }
    // Called once this process's target holds the data directory (`Target::start` took its
    // lock and made it): no other target serves it.
    let data_dir = config.data_dir().map_err(|error| error.to_string())?;
    tenant_admin::ensure_default_tenant(&data_dir).map_err(|error| error.to_string())
}

/// What `netdam` needs besides --target to reach this target as its default tenant: nothing
/// where it finds the key on its own (no tenants required, or the default data directory), else
/// `--key FILE`, the file's absolute path, quoted for a shell where it needs quoting.
fn reach_key_option(config: &Config) -> String {
    let Ok(data_dir) = config.data_dir() else { return String::new() };
    let Ok(key) = tenant_admin::default_key_file(&data_dir, tenant_admin::DEFAULT_TENANT).canonicalize() else {
        return String::new();
    };
    let default_dir = netdam_target::config::default_data_dir().ok().and_then(|dir| dir.canonicalize().ok());
    if config.auth != AuthMode::Tenants || !key.is_file() || default_dir == data_dir.canonicalize().ok() {
        return String::new();
    }
    let key = key.display().to_string();
    let plain = key.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"/._-+,:@".contains(&byte));
    if plain {
        format!(" --key {key}")
    } else {
        format!(" --key '{}'", key.replace('\'', r"'\''"))
    }
}

/// Prints what is served, in one write: a reader that stops after the first line (a script
/// waiting for "serving on") must not make a later line fail and stop the daemon.
fn print_banner(target: &Target, config: &Config, default_key: Option<&std::path::Path>) {
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
            "  region {id} {:?}: {} bytes, {durability}, {backing}, {locked}{}",
            region.name(),
            region.len(),
            if target.region_on_fpga(id) { "; served from the FPGA's memory" } else { "" }
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
        if target.keys().is_withdrawn(slot) {
            // Deleted from the store between the load and the store watcher's first read.
            let _ = writeln!(
                banner,
                "  key slot {slot}: withdrawn (deleted from the metadata store as the target started)"
            );
            continue;
        }
        let _ = writeln!(banner, "  key slot {slot}: AES-256-GCM, nonces from {}", keys.nonces().peek());
    }
    if let Some(metrics) = target.metrics_addr() {
        let _ =
            writeln!(banner, "  metrics: http://{metrics}/metrics  (netdam top --metrics http://{metrics}/metrics)");
    }
    match (config.auth, default_key) {
        (AuthMode::None, _) => {
            let _ = writeln!(banner, "  auth: NONE: every initiator that reaches {addr} may read and write everything");
        }
        (AuthMode::Tenants, Some(key)) => {
            let _ = writeln!(
                banner,
                "  auth: tenants; created tenant \"default\" (all permissions) with key file {}",
                key.display()
            );
            let _ = writeln!(
                banner,
                "        (netdam finds it on its own if this is the default data directory; else --key FILE)"
            );
        }
        (AuthMode::Tenants, None) => {
            let tenants = target.tenants().load().1.iter().count();
            if tenants == 0 {
                // A store whose tenants were deleted (any other got `default`).
                let _ = writeln!(
                    banner,
                    "  auth: tenants, but none in the store (a store whose tenants were deleted gets no default \
                     tenant): every session is refused until you create one (netdam-target tenant create NAME, \
                     then grant it)"
                );
            } else {
                let _ = writeln!(
                    banner,
                    "  auth: tenants ({tenants} in the store: netdam-target tenant list); initiators pass --key FILE"
                );
                // Also when an earlier start created it and then failed (a port in use): the
                // user was never told where its key is.
                let has_default =
                    target.tenants().load().1.iter().any(|tenant| tenant.name == tenant_admin::DEFAULT_TENANT);
                let key = config
                    .data_dir()
                    .ok()
                    .map(|dir| tenant_admin::default_key_file(&dir, tenant_admin::DEFAULT_TENANT));
                if let Some(key) = key.filter(|key| has_default && key.is_file()) {
                    let _ = writeln!(
                        banner,
                        "        the default tenant's key file: {} (netdam finds it on its own if this is the default \
                         data directory)",
                        key.display()
                    );
                }
            }
        }
    }
    let _ = writeln!(banner, "Reach it with:  netdam --target {addr}{} stat", reach_key_option(config));
    let _ = writeln!(banner, "Stop with Ctrl-C.");
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(banner.as_bytes()).and_then(|()| stdout.flush());
}
