//! Target settings: defaults, the TOML file, command-line overrides, and their validation.
//!
//! Everything a user can set is checked here, once, with a message that names the setting; the
//! rest of the target trusts a [`Config`] that passed [`Config::validate`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use netdam_isa::limits::{
    DEFAULT_DATAGRAM_BYTES, DEFAULT_SESSIONS_PER_ADDRESS, DEFAULT_SESSIONS_PER_WORKER, DEFAULT_SESSION_IDLE_TIMEOUT,
    MAX_BLOCK_BYTES, MAX_DATAGRAM_BYTES, MAX_NAMESPACES, MAX_REGIONS, MAX_REGION_NAME_BYTES, MAX_SESSIONS_PER_WORKER,
    MAX_SESSION_IDLE_TIMEOUT, MAX_WORKERS, MIN_DATAGRAM_BYTES, MIN_SESSIONS_PER_WORKER, MIN_SESSION_IDLE_TIMEOUT,
};
use netdam_isa::wire::{HEADER_LEN, INSTRUCTION_HEADER_LEN};
use netdam_isa::Duration;
use netdam_metrics::MetricsListen;
use serde::{Deserialize, Serialize};

use crate::dispatch::DispatchSettings;
use crate::sessions::SessionLimits;

/// Address the target listens on when nothing else is said: loopback, so a target started
/// without thought is not on the network; with tenants (the default) it may listen anywhere.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7800";
/// Address `/metrics` is served on when nothing else is said: loopback, because it tells anyone
/// who can reach it what the target serves and how busy it is. 9464 is clear of the target's
/// UDP port (7800) and of NBD's (10809); `netdam nbd` serves none unless asked.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9464";
/// Size of the embedded default region.
pub const DEFAULT_REGION_BYTES: u64 = 64 << 20;
/// Name of the embedded default region.
pub const DEFAULT_REGION_NAME: &str = "default";

/// Whether initiators must prove a tenant's key (PROTOCOL.md, "Authentication").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// HELLO proves a tenant's key; every datagram of a session carries a MAC; every
    /// instruction is checked against the tenant's grants.
    #[default]
    Tenants,
    /// Every datagram is trusted and every session may do anything `session_permissions`
    /// allows. Only on loopback, unless `allow_unauthenticated_network = true`.
    None,
}

/// How a worker waits for datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PollMode {
    /// Spin on the socket: lowest, flattest latency; burns a core per worker.
    Busy,
    /// Spin for `adaptive_spin_us` after the last datagram, then block.
    Adaptive,
    /// Block in the kernel: no idle CPU, higher latency.
    Blocking,
}

/// Which engine executes instructions: `auto`, `software`, `fpga` or `fpga=PATH`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum EngineChoice {
    /// Probe for a device (VFIO, then a sysfs `resource0`, then `fpga_window`); software if
    /// none is found, with one log line saying why.
    #[default]
    Auto,
    /// The CPU only.
    Software,
    /// The FPGA, found as `auto` probes it (without `PATH`) or through the window file `PATH`
    /// (a model's window, or a PCI function's sysfs `resource0`); a target that cannot map and
    /// attach it does not start.
    Fpga(Option<PathBuf>),
}

impl std::str::FromStr for EngineChoice {
    type Err = String;

    fn from_str(text: &str) -> Result<EngineChoice, String> {
        match text {
            "auto" => Ok(EngineChoice::Auto),
            "software" => Ok(EngineChoice::Software),
            "fpga" => Ok(EngineChoice::Fpga(None)),
            _ => match text.strip_prefix("fpga=") {
                Some(path) if !path.is_empty() => Ok(EngineChoice::Fpga(Some(PathBuf::from(path)))),
                _ => Err(format!("engine {text:?}: use auto, software, fpga or fpga=PATH")),
            },
        }
    }
}

impl std::fmt::Display for EngineChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineChoice::Auto => f.write_str("auto"),
            EngineChoice::Software => f.write_str("software"),
            EngineChoice::Fpga(None) => f.write_str("fpga"),
            EngineChoice::Fpga(Some(path)) => write!(f, "fpga={}", path.display()),
        }
    }
}

/// `engine` in the TOML file: its text form.
mod engine_text {
    use super::EngineChoice;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &EngineChoice, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(value)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<EngineChoice, D::Error> {
        String::deserialize(deserializer)?.parse().map_err(serde::de::Error::custom)
    }
}

/// Where a region's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum RegionBackend {
    /// Anonymous memory: volatile.
    Mem,
    /// A file mapping persisted with msync.
    File,
    /// A DAX file mapping persisted with clwb + sfence.
    Dax,
}

/// Where a block namespace's blocks live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum NamespaceBackend {
    /// A regular file, through io_uring with O_DIRECT; created sparse at `size` when missing.
    File,
    /// A block device (e.g. /dev/nvme0n1), through io_uring with O_DIRECT.
    Blockdev,
    /// A persistent memory region: a file mapping persisted with msync (or a DAX file).
    Pmem,
}

/// Default bytes per block of a namespace.
pub const DEFAULT_BLOCK_BYTES: u32 = 4096;

fn default_block_size() -> u32 {
    DEFAULT_BLOCK_BYTES
}

/// One block namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceConfig {
    /// Name initiators address it by.
    pub name: String,
    /// Where its blocks live.
    pub backend: NamespaceBackend,
    /// The file, device or region file; relative paths are under `data_dir`.
    pub path: PathBuf,
    /// Size for `file` and `pmem`, used to create the backing file when it is missing; a block
    /// device's size is its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<ByteSize>,
    /// Bytes per block: a power of two from 512 to 8192 (one block and its headers fit in one
    /// datagram).
    #[serde(default = "default_block_size")]
    pub block_size: u32,
}

impl NamespaceConfig {
    /// Checks this namespace's own fields; the message names it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let name = &self.name;
        check_name("namespace", name)?;
        let invalid = |message: String| Err(ConfigError::Invalid(format!("namespace {name:?}: {message}")));
        if !self.block_size.is_power_of_two() || !(512..=MAX_BLOCK_BYTES).contains(&self.block_size) {
            return invalid(format!(
                "block_size = {}: use a power of two from 512 to {MAX_BLOCK_BYTES} (a block is never split \
                 between datagrams, so one block and its headers must fit in one)",
                self.block_size
            ));
        }
        match (self.backend, self.size) {
            (NamespaceBackend::Blockdev, Some(_)) => {
                invalid("backend \"blockdev\" takes its size from the device: remove size".into())
            }
            (_, Some(ByteSize(bytes))) if bytes == 0 || bytes % u64::from(self.block_size) != 0 => {
                invalid(format!("size = {bytes}: must be a positive multiple of block_size {}", self.block_size))
            }
            (NamespaceBackend::Pmem, Some(ByteSize(bytes))) if bytes % 4096 != 0 => {
                invalid(format!("size = {bytes}: a pmem namespace is a whole number of 4096-byte pages"))
            }
            _ => Ok(()),
        }
    }
}

fn check_name(kind: &str, name: &str) -> Result<(), ConfigError> {
    let name_ok = !name.is_empty()
        && name.len() <= MAX_REGION_NAME_BYTES
        && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"_.-".contains(&byte));
    if name_ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "{kind} name {name:?}: use 1 to {MAX_REGION_NAME_BYTES} characters of A-Z a-z 0-9 _ . -"
        )))
    }
}

impl RegionConfig {
    /// Checks this region's own fields; the message names it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let name = &self.name;
        check_name("region", name)?;
        let invalid = |message: String| Err(ConfigError::Invalid(message));
        let page = netdam_pmem::page_bytes() as u64;
        if self.size.0 == 0 || !self.size.0.is_multiple_of(page) {
            return invalid(format!(
                "region {name:?}: size = {}: a region is a whole number of {page}-byte pages (at least one)",
                self.size.0
            ));
        }
        match (self.backend, &self.path) {
            (RegionBackend::Mem, Some(_)) => invalid(format!("region {name:?}: backend \"mem\" takes no path")),
            (RegionBackend::File | RegionBackend::Dax, None) => {
                invalid(format!("region {name:?}: backend {:?} needs a path", self.backend))
            }
            _ => Ok(()),
        }
    }
}

/// Checks a whole set of regions and namespaces: each valid, names unique, counts bounded.
pub fn validate_spaces(regions: &[RegionConfig], namespaces: &[NamespaceConfig]) -> Result<(), ConfigError> {
    let invalid = |message: String| Err(ConfigError::Invalid(message));
    if regions.len() > MAX_REGIONS {
        return invalid(format!("{} regions configured: at most {MAX_REGIONS}", regions.len()));
    }
    if namespaces.len() > MAX_NAMESPACES {
        return invalid(format!("{} namespaces configured: at most {MAX_NAMESPACES}", namespaces.len()));
    }
    for (index, region) in regions.iter().enumerate() {
        region.validate()?;
        if regions[..index].iter().any(|other| other.name == region.name) {
            return invalid(format!("region name {:?} is used twice", region.name));
        }
    }
    for (index, namespace) in namespaces.iter().enumerate() {
        namespace.validate()?;
        if namespaces[..index].iter().any(|other| other.name == namespace.name) {
            return invalid(format!("namespace name {:?} is used twice", namespace.name));
        }
    }
    Ok(())
}

/// Checks that no two spaces are backed by one file or device: a namespace on a region's file
/// (or two on one disk image) would write each other's bytes under different names. Relative
/// paths are under `data_dir`; a file that exists is known by its device and inode (so `./x`
/// and a link to `x` are `x`), one that does not yet by its path.
pub fn check_distinct_backings(
    regions: &[RegionConfig],
    namespaces: &[NamespaceConfig],
    data_dir: &Path,
) -> Result<(), ConfigError> {
    use std::os::unix::fs::MetadataExt;
    #[derive(PartialEq)]
    enum Identity {
        Inode(u64, u64),
        Path(PathBuf),
    }
    let backings =
        regions.iter().filter_map(|region| Some((format!("region {:?}", region.name), region.path.as_deref()?))).chain(
            namespaces.iter().map(|namespace| (format!("namespace {:?}", namespace.name), namespace.path.as_path())),
        );
    let mut seen: Vec<(String, Identity)> = Vec::new();
    for (space, path) in backings {
        let path = crate::namespaces::resolve(path, data_dir);
        if let Some(what) = target_file(&path, data_dir) {
            return Err(ConfigError::Invalid(format!(
                "{space} would be backed by {}, {what}: give it a file of its own (writing to it would destroy it)",
                path.display()
            )));
        }
        let identity = match std::fs::metadata(&path) {
            Ok(metadata) => Identity::Inode(metadata.dev(), metadata.ino()),
            Err(_) => Identity::Path(path.components().collect()),
        };
        if let Some((other, _)) = seen.iter().find(|(_, known)| *known == identity) {
            return Err(ConfigError::Invalid(format!(
                "{space} and {other} are both backed by {}: each region and namespace needs a file or device \
                 of its own (one would overwrite the other's bytes)",
                path.display()
            )));
        }
        seen.push((space, identity));
    }
    Ok(())
}

/// What `path` is, if it is one of the files the target keeps for itself in `data_dir` (its
/// metadata store, the lock of a running target, a nonce reservation, a tenant's key): no
/// space may be backed by one. Symbolic links and `..` are resolved, and an existing file is
/// also compared by device and inode, so that neither another spelling nor a hard link of
/// one gets past.
fn target_file(path: &Path, data_dir: &Path) -> Option<&'static str> {
    use std::os::unix::fs::MetadataExt;
    const TENANT_KEYS: &str = "the data directory's tenant keys";
    let real = real_path(path)?;
    let data_dir = real_path(data_dir)?;
    if real_path(&data_dir.join(crate::tenant_admin::TENANTS_DIR)).is_some_and(|tenants| real.starts_with(tenants)) {
        return Some(TENANT_KEYS);
    }
    if real.parent() == Some(data_dir.as_path()) {
        if let Some(what) = real.file_name().and_then(|name| name.to_str()).and_then(target_file_name) {
            return Some(what);
        }
    }
    // A hard link to one of them, under any name.
    let identity = std::fs::metadata(&real).ok().map(|metadata| (metadata.dev(), metadata.ino()))?;
    let same = |candidate: &Path| {
        std::fs::metadata(candidate).is_ok_and(|metadata| (metadata.dev(), metadata.ino()) == identity)
    };
    let entries = std::fs::read_dir(&data_dir).ok()?.flatten();
    let in_data_dir = entries.filter_map(|entry| Some((target_file_name(entry.file_name().to_str()?)?, entry.path())));
    let keys = std::fs::read_dir(data_dir.join(crate::tenant_admin::TENANTS_DIR)).into_iter().flatten().flatten();
    in_data_dir
        .chain(keys.map(|entry| (TENANT_KEYS, entry.path())))
        .find(|(_, candidate)| same(candidate))
        .map(|(what, _)| what)
}

/// What a file of the data directory named `name` is to the target, if it is one of its own.
fn target_file_name(name: &str) -> Option<&'static str> {
    let nonce_slot = name.strip_prefix(crate::crypto::NONCE_FILE_PREFIX);
    if name == crate::metadata::METADATA_FILE {
        Some("the data directory's metadata store (spaces, tenants and their keys)")
    } else if name == crate::server::RUNNING_FILE {
        Some("the data directory's lock of a running target")
    } else if nonce_slot.is_some_and(|slot| !slot.is_empty() && slot.bytes().all(|byte| byte.is_ascii_digit())) {
        Some("a nonce reservation of the data directory's crypto keys")
    } else {
        None
    }
}

/// `path` with links and `..` resolved as far as it exists, and the rest of it (names still to
/// be created) appended with its own `.` and `..` resolved by name.
fn real_path(path: &Path) -> Option<PathBuf> {
    use std::path::Component;
    let mut existing = path;
    let mut missing = Vec::new();
    loop {
        if let Ok(real) = std::fs::canonicalize(existing) {
            let mut resolved = real;
            for name in missing.iter().rev() {
                match name {
                    Component::ParentDir => {
                        resolved.pop();
                    }
                    Component::CurDir => {}
                    other => resolved.push(other),
                }
            }
            return Some(resolved);
        }
        missing.push(existing.components().next_back()?);
        existing = existing.parent()?;
    }
}

/// Bytes a datagram carrying one block adds to it: a BWRITE's header and instruction header,
/// and an authenticated session's trailer (a BREAD's answer adds less).
pub const BLOCK_DATAGRAM_OVERHEAD: usize = HEADER_LEN + INSTRUCTION_HEADER_LEN + netdam_auth::TRAILER_BYTES;

/// Checks that one block of every namespace, with its headers, fits in a datagram of
/// `max_datagram_bytes`: otherwise no client could read or write it.
pub fn blocks_fit_datagrams(max_datagram_bytes: usize, namespaces: &[NamespaceConfig]) -> Result<(), ConfigError> {
    for namespace in namespaces {
        let needed = namespace.block_size as usize + BLOCK_DATAGRAM_OVERHEAD;
        if needed > max_datagram_bytes {
            return Err(ConfigError::Invalid(format!(
                "namespace {:?}: a block of {} bytes needs datagrams of {needed} bytes with its headers, but \
                 max_datagram_bytes = {max_datagram_bytes}: raise max_datagram_bytes or lower block_size",
                namespace.name, namespace.block_size
            )));
        }
    }
    Ok(())
}

/// A byte count written as a number or a string with a unit ("64MiB").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "SizeText", into = "SizeText")]
pub struct ByteSize(pub u64);

#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
enum SizeText {
    Number(u64),
    Text(String),
}

/// By hand rather than `untagged`, whose refusal of `-5` or `1e9` was "data did not match any
/// variant of untagged enum SizeText".
impl<'de> Deserialize<'de> for SizeText {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<SizeText, D::Error> {
        struct Size;
        impl serde::de::Visitor<'_> for Size {
            type Value = SizeText;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a size: a whole number of bytes, or a string with a unit such as \"64MiB\" or \"1GiB\"")
            }
            fn visit_u64<E: serde::de::Error>(self, bytes: u64) -> Result<SizeText, E> {
                Ok(SizeText::Number(bytes))
            }
            fn visit_i64<E: serde::de::Error>(self, bytes: i64) -> Result<SizeText, E> {
                u64::try_from(bytes)
                    .map(SizeText::Number)
                    .map_err(|_| E::custom(format!("size {bytes}: a size cannot be negative")))
            }
            fn visit_f64<E: serde::de::Error>(self, bytes: f64) -> Result<SizeText, E> {
                Err(E::custom(format!(
                    "size {bytes}: a TOML float is not taken; write a whole number of bytes as an integer, or a \
                     string with a unit such as \"1GiB\""
                )))
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<SizeText, E> {
                Ok(SizeText::Text(text.to_string()))
            }
        }
        deserializer.deserialize_any(Size)
    }
}

impl TryFrom<SizeText> for ByteSize {
    type Error = String;
    fn try_from(value: SizeText) -> Result<ByteSize, String> {
        match value {
            SizeText::Number(bytes) => Ok(ByteSize(bytes)),
            SizeText::Text(text) => netdam_isa::units::parse_bytes(&text).map(ByteSize),
        }
    }
}

impl From<ByteSize> for SizeText {
    fn from(value: ByteSize) -> SizeText {
        SizeText::Number(value.0)
    }
}

/// One region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionConfig {
    /// Name initiators address it by.
    pub name: String,
    /// Where its bytes live.
    pub backend: RegionBackend,
    /// Backing file for `file` and `dax`; relative paths are under `data_dir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Size: a whole number of pages.
    pub size: ByteSize,
}

/// All target settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// UDP address the workers share.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// TCP address of the `/metrics` endpoint (Prometheus text or OpenMetrics), or `"off"`.
    #[serde(default = "default_metrics_listen", with = "metrics_listen_text")]
    pub metrics_listen: MetricsListen,
    /// Where region files live; default: `$XDG_DATA_HOME/netdam` or `~/.local/share/netdam`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Worker threads (each owns a socket on the shared port).
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// How workers wait for datagrams.
    #[serde(default = "default_poll")]
    pub poll: PollMode,
    /// Spin time before blocking, in adaptive mode.
    #[serde(default = "default_adaptive_spin_us")]
    pub adaptive_spin_us: u64,
    /// Pin worker i to the i-th CPU this process may run on, counted from the last (wrapping:
    /// `worker::worker_cpu`), so its caches, its socket's receive path and its timing stay on
    /// one core.
    #[serde(default = "default_pin_workers")]
    pub pin_workers: bool,
    /// Lock the process's memory, present and future (`mlockall`), so that no buffer a request
    /// touches (receive batches, the replay ring, session tables) pays a page fault or is paged
    /// out. Affects the whole process: an application embedding a target may turn it off.
    /// Regions are locked on their own (`mlock` of each mapping) whatever this says; the start
    /// banner says whether each one is.
    #[serde(default = "default_lock_memory")]
    pub lock_memory: bool,
    /// Largest datagram the target receives or sends.
    #[serde(default = "default_max_datagram_bytes")]
    pub max_datagram_bytes: usize,
    /// A request that queued longer than this (µs) is answered BUSY instead of executed, once
    /// requests have kept queuing that long for as long again and 64 of them (four receive
    /// batches) have executed late (a standing queue: the backlog a pause of the worker leaves
    /// is executed).
    #[serde(default = "default_busy_threshold_us")]
    pub busy_threshold_us: u64,
    /// Block namespaces on files and devices: 0 (the default) submits each worker's I/O in its
    /// own `io_uring_enter`; N > 0 gives each worker's ring a kernel thread that submits it
    /// (`IORING_SETUP_SQPOLL`) and sleeps after N ms without work. The thread needs a core of
    /// its own: it keeps a worker's memory requests from waiting behind O_DIRECT submissions,
    /// but on a machine whose cores are taken it starves the block path (docs/DECISIONS.md).
    #[serde(default)]
    pub block_sqpoll_idle_ms: u32,
    /// Answers a worker gives in one pass to the same initiator leave in one `sendmsg` with UDP
    /// segmentation offload (`UDP_SEGMENT`), which the kernel cuts into the separate datagrams
    /// (docs/DECISIONS.md, "Answers leave in trains"). Where the kernel refuses, answers go one
    /// by one; `false` always sends them one by one.
    #[serde(default = "default_answer_trains")]
    pub answer_trains: bool,
    /// Sessions each worker holds at once (each keeps a replay window of answers).
    #[serde(default = "default_sessions_per_worker")]
    pub sessions_per_worker: usize,
    /// Sessions one sender address (an IPv4 address or an IPv6 /64) may hold per worker, so
    /// that no host can take every slot.
    #[serde(default = "default_max_sessions_per_address")]
    pub max_sessions_per_address: usize,
    /// A session silent this long (ms) expires; its initiator says HELLO again when it returns.
    #[serde(default = "default_session_idle_timeout_ms")]
    pub session_idle_timeout_ms: u64,
    /// Which engine executes instructions: `auto` (probe for an FPGA, else software),
    /// `software`, `fpga` (probe, and fail to start without one) or `fpga=PATH` (the window
    /// file of `netdam-fpga-model`, or a sysfs `resource0`).
    #[serde(default, with = "engine_text")]
    pub engine: EngineChoice,
    /// A device model's window file that `auto` (and `fpga`) use when no card is found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fpga_window: Option<PathBuf>,
    /// An FPGA with an instruction in flight that makes no progress for this long (ms) is
    /// declared wedged, and the target fails over to software. A worker waits this long once.
    #[serde(default = "default_fpga_progress_deadline_ms")]
    pub fpga_progress_deadline_ms: u64,
    /// A `file` namespace whose file is also the namespace of the FPGA's NVMe SSD (the model's
    /// `--namespace`): with the FPGA engine, its block instructions go to the device's NVMe
    /// controller, and to the target's own file after a failover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fpga_namespace: Option<String>,
    /// Regions; none configured means the embedded default region. Regions created with
    /// `netdam-target region create` are served as well.
    #[serde(default, rename = "region", skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<RegionConfig>,
    /// Block namespaces, besides those created with `netdam-target namespace create`.
    #[serde(default, rename = "namespace", skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<NamespaceConfig>,
    /// Extension instructions to serve, by name (`reduce`); none by default, so an extension
    /// opcode is `unknown_opcode` until it is enabled here.
    #[serde(default)]
    pub extensions: Vec<String>,
    /// Permissions every session holds on every region until tenants exist: `read`, `write`,
    /// `atomic`, `compute`, `block`. Extension instructions are checked against them (a handler
    /// declares what it needs); default all.
    #[serde(default = "default_session_permissions")]
    pub session_permissions: Vec<String>,
    /// `tenants` (the default): initiators prove a tenant's key and get what it was granted;
    /// `none`: no authentication (loopback only unless `allow_unauthenticated_network`).
    #[serde(default)]
    pub auth: AuthMode,
    /// With `auth = "none"`, listen on a non-loopback address anyway: anyone who can reach the
    /// port can then read and write everything.
    #[serde(default)]
    pub allow_unauthenticated_network: bool,
}

fn default_session_permissions() -> Vec<String> {
    netdam_isa::extension::Permissions::NAMED.iter().map(|(name, _)| name.to_string()).collect()
}

fn default_listen() -> SocketAddr {
    DEFAULT_LISTEN.parse().expect("the default listen address is valid")
}
fn default_metrics_listen() -> MetricsListen {
    DEFAULT_METRICS_LISTEN.parse().expect("the default metrics address is valid")
}

/// `metrics_listen` in the TOML file: `"off"` or an address with a port.
mod metrics_listen_text {
    use netdam_metrics::MetricsListen;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &MetricsListen, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(value)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<MetricsListen, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(|message| serde::de::Error::custom(format!("metrics_listen: {message}")))
    }
}

fn default_fpga_progress_deadline_ms() -> u64 {
    // Far above a device's microseconds, far below an initiator's patience (5 s).
    1_000
}
fn default_workers() -> usize {
    1
}
fn default_poll() -> PollMode {
    PollMode::Adaptive
}
fn default_pin_workers() -> bool {
    true
}
fn default_lock_memory() -> bool {
    true
}
fn default_answer_trains() -> bool {
    true
}

fn default_adaptive_spin_us() -> u64 {
    50
}
fn default_max_datagram_bytes() -> usize {
    DEFAULT_DATAGRAM_BYTES
}
fn default_sessions_per_worker() -> usize {
    DEFAULT_SESSIONS_PER_WORKER
}
fn default_max_sessions_per_address() -> usize {
    DEFAULT_SESSIONS_PER_ADDRESS
}
fn default_session_idle_timeout_ms() -> u64 {
    DEFAULT_SESSION_IDLE_TIMEOUT.as_nanos() / 1_000_000
}
fn default_busy_threshold_us() -> u64 {
    // Past this a request has queued longer than any healthy answer takes; an initiator would
    // soon retransmit it (its minimum timeout is 2 ms) and add to the queue.
    1_000
}

impl Default for Config {
    fn default() -> Config {
        Config {
            listen: default_listen(),
            metrics_listen: default_metrics_listen(),
            data_dir: None,
            workers: default_workers(),
            poll: default_poll(),
            adaptive_spin_us: default_adaptive_spin_us(),
            pin_workers: default_pin_workers(),
            lock_memory: default_lock_memory(),
            max_datagram_bytes: default_max_datagram_bytes(),
            busy_threshold_us: default_busy_threshold_us(),
            block_sqpoll_idle_ms: 0,
            answer_trains: default_answer_trains(),
            sessions_per_worker: default_sessions_per_worker(),
            max_sessions_per_address: default_max_sessions_per_address(),
            session_idle_timeout_ms: default_session_idle_timeout_ms(),
            engine: EngineChoice::Auto,
            fpga_window: None,
            fpga_progress_deadline_ms: default_fpga_progress_deadline_ms(),
            fpga_namespace: None,
            regions: Vec::new(),
            namespaces: Vec::new(),
            extensions: Vec::new(),
            session_permissions: default_session_permissions(),
            auth: AuthMode::default(),
            allow_unauthenticated_network: false,
        }
    }
}

/// A setting that cannot work, named with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    /// The file is not valid TOML for these settings.
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// A value is out of its range or contradicts another.
    #[error("{0}")]
    Invalid(String),
}

/// The user's data directory for netdam: `$XDG_DATA_HOME/netdam`, else `$HOME/.local/share/netdam`.
pub fn default_data_dir() -> Result<PathBuf, ConfigError> {
    if let Some(xdg) = std::env::var_os("XDG_DATA_HOME").filter(|value| !value.is_empty()) {
        return Ok(PathBuf::from(xdg).join("netdam"));
    }
    match std::env::var_os("HOME").filter(|value| !value.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".local/share/netdam")),
        None => Err(ConfigError::Invalid(
            "neither XDG_DATA_HOME nor HOME is set: pass --data-dir to say where region files live".to_string(),
        )),
    }
}

impl Config {
    /// How block namespaces' rings submit, from `block_sqpoll_idle_ms`.
    pub fn block_submission(&self) -> netdam_nvme::Submission {
        match self.block_sqpoll_idle_ms {
            0 => netdam_nvme::Submission::Inline,
            idle_ms => netdam_nvme::Submission::KernelThread { idle_ms },
        }
    }

    /// Reads settings from a TOML file.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        toml::from_str(&text)
            .map_err(|error| ConfigError::Parse { path: path.to_path_buf(), message: error.to_string() })
    }

    /// The data directory in force.
    pub fn data_dir(&self) -> Result<PathBuf, ConfigError> {
        match &self.data_dir {
            Some(dir) => Ok(dir.clone()),
            None => default_data_dir(),
        }
    }

    /// The regions to serve: the configured ones, or the embedded default.
    pub fn effective_regions(&self) -> Vec<RegionConfig> {
        if !self.regions.is_empty() {
            return self.regions.clone();
        }
        vec![RegionConfig {
            name: DEFAULT_REGION_NAME.to_string(),
            backend: RegionBackend::File,
            path: Some(PathBuf::from("default.region")),
            size: ByteSize(DEFAULT_REGION_BYTES),
        }]
    }

    /// Checks every setting; the message names the one at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |message: String| Err(ConfigError::Invalid(message));
        if !(1..=MAX_WORKERS).contains(&self.workers) {
            return invalid(format!("workers = {}: must be between 1 and {MAX_WORKERS}", self.workers));
        }
        if !(MIN_DATAGRAM_BYTES..=MAX_DATAGRAM_BYTES).contains(&self.max_datagram_bytes) {
            return invalid(format!(
                "max_datagram_bytes = {}: must be between {MIN_DATAGRAM_BYTES} and {MAX_DATAGRAM_BYTES}",
                self.max_datagram_bytes
            ));
        }
        if !(10..=60_000).contains(&self.busy_threshold_us) {
            return invalid(format!("busy_threshold_us = {}: must be between 10 and 60000", self.busy_threshold_us));
        }
        if self.block_sqpoll_idle_ms > 10_000 {
            return invalid(format!(
                "block_sqpoll_idle_ms = {}: at most 10000 (ten seconds); 0 submits inline",
                self.block_sqpoll_idle_ms
            ));
        }
        if self.adaptive_spin_us > 1_000_000 {
            return invalid(format!("adaptive_spin_us = {}: at most 1000000 (one second)", self.adaptive_spin_us));
        }
        if !(MIN_SESSIONS_PER_WORKER..=MAX_SESSIONS_PER_WORKER).contains(&self.sessions_per_worker) {
            return invalid(format!(
                "sessions_per_worker = {}: must be between {MIN_SESSIONS_PER_WORKER} and {MAX_SESSIONS_PER_WORKER}",
                self.sessions_per_worker
            ));
        }
        if !(1..=self.sessions_per_worker).contains(&self.max_sessions_per_address) {
            return invalid(format!(
                "max_sessions_per_address = {}: must be between 1 and sessions_per_worker ({})",
                self.max_sessions_per_address, self.sessions_per_worker
            ));
        }
        let (min_ms, max_ms) =
            (MIN_SESSION_IDLE_TIMEOUT.as_nanos() / 1_000_000, MAX_SESSION_IDLE_TIMEOUT.as_nanos() / 1_000_000);
        if !(min_ms..=max_ms).contains(&self.session_idle_timeout_ms) {
            return invalid(format!(
                "session_idle_timeout_ms = {}: must be between {min_ms} and {max_ms}",
                self.session_idle_timeout_ms
            ));
        }
        if self.auth == AuthMode::None && !self.listen.ip().is_loopback() && !self.allow_unauthenticated_network {
            return invalid(format!(
                "listen = {}: with auth = \"none\" anyone who reaches this address can read and write everything; \
                 listen on a loopback address, use auth = \"tenants\" (the default), or set \
                 allow_unauthenticated_network = true to accept that",
                self.listen
            ));
        }
        if !(10..=60_000).contains(&self.fpga_progress_deadline_ms) {
            return invalid(format!(
                "fpga_progress_deadline_ms = {}: must be between 10 and 60000",
                self.fpga_progress_deadline_ms
            ));
        }
        validate_spaces(&self.effective_regions(), &self.namespaces)?;
        blocks_fit_datagrams(self.max_datagram_bytes, &self.namespaces)?;
        if let Some(name) = &self.fpga_namespace {
            match self.namespaces.iter().find(|namespace| &namespace.name == name) {
                None => {
                    return invalid(format!(
                        "fpga_namespace = {name:?}: no [[namespace]] of that name is configured here"
                    ))
                }
                Some(namespace) if namespace.backend != NamespaceBackend::File => {
                    return invalid(format!(
                        "fpga_namespace = {name:?}: the namespace must be backend = \"file\" (the file the FPGA's SSD \
                         serves, and the target's own after a failover)"
                    ))
                }
                Some(_) if self.max_datagram_bytes > netdam_fpga::SLOT_BYTES_MAX as usize => {
                    return invalid(format!(
                        "fpga_namespace = {name:?} with max_datagram_bytes = {}: the device moves at most {} bytes \
                         per instruction, so a larger BREAD or BWRITE would be refused on it but not on the \
                         target's file; lower max_datagram_bytes",
                        self.max_datagram_bytes,
                        netdam_fpga::SLOT_BYTES_MAX
                    ))
                }
                Some(_) => {}
            }
        }
        crate::extensions::registry(&self.extensions)?;
        crate::extensions::permissions(&self.session_permissions)?;
        Ok(())
    }

    /// What every worker's dispatcher applies.
    pub fn dispatch_settings(&self) -> DispatchSettings {
        DispatchSettings {
            max_datagram_bytes: self.max_datagram_bytes,
            busy_threshold: Duration::from_micros(self.busy_threshold_us),
            sessions: SessionLimits {
                slots: self.sessions_per_worker,
                per_address: self.max_sessions_per_address,
                idle_timeout: Duration::from_millis(self.session_idle_timeout_ms),
            },
            metrics: self.metrics_listen != MetricsListen::Off,
            // Validated before a target starts; an unreadable set grants nothing (fails closed).
            session_permissions: crate::extensions::permissions(&self.session_permissions)
                .unwrap_or(netdam_isa::extension::Permissions::NONE),
            auth_required: self.auth == AuthMode::Tenants,
        }
    }

    /// The effective settings as TOML, for `netdam-target config`: every one, those that are
    /// unset and have no default value as comments (TOML has no null), so that the output
    /// names every setting a file may hold.
    pub fn to_toml(&self) -> String {
        let mut shown = self.clone();
        shown.regions = self.effective_regions();
        let text = toml::to_string_pretty(&shown).expect("settings always serialize");
        let unset: Vec<&str> = [
            (
                self.data_dir.is_none(),
                "# data_dir = \"PATH\"          # unset: $XDG_DATA_HOME/netdam or ~/.local/share/netdam",
            ),
            (
                self.fpga_window.is_none(),
                "# fpga_window = \"PATH\"       # unset: engine = \"auto\" looks for cards only",
            ),
            (
                self.fpga_namespace.is_none(),
                "# fpga_namespace = \"NAME\"    # unset: no namespace is served by the FPGA's SSD",
            ),
            (self.namespaces.is_empty(), "# [[namespace]] tables: none configured"),
        ]
        .into_iter()
        .filter_map(|(is_unset, line)| is_unset.then_some(line))
        .collect();
        if unset.is_empty() {
            return text;
        }
        // Top-level keys, even commented, belong before the first table.
        let tables = text.find("\n[").unwrap_or(text.len());
        let (keys, tables) = text.split_at(tables);
        format!("{keys}{}\n{tables}", unset.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_settings_parse_with_units_and_defaults() {
        let config: Config = toml::from_str(
            r#"
            listen = "127.0.0.1:9000"
            poll = "busy"
            [[region]]
            name = "scratch"
            backend = "mem"
            size = "2MiB"
            "#,
        )
        .unwrap();
        assert_eq!(config.workers, 1);
        assert_eq!(config.poll, PollMode::Busy);
        assert_eq!(config.regions[0].size, ByteSize(2 << 20));
        assert_eq!(config.metrics_listen.to_string(), DEFAULT_METRICS_LISTEN);
        config.validate().unwrap();
        let back: Config = toml::from_str(&config.to_toml()).unwrap();
        assert_eq!(back, config);
    }

    #[test]
    fn a_size_that_is_not_one_says_why() {
        let refusal = |size: &str| {
            let text = format!("[[region]]\nname = \"r\"\nbackend = \"mem\"\nsize = {size}");
            toml::from_str::<Config>(&text).unwrap_err().to_string()
        };
        assert!(refusal("-5").contains("size -5: a size cannot be negative"), "{}", refusal("-5"));
        assert!(refusal("1e9").contains("a TOML float is not taken"), "{}", refusal("1e9"));
        assert!(refusal("true").contains("expected a size"), "{}", refusal("true"));
        assert!(refusal("\"1GB\"").contains("1GB"), "{}", refusal("\"1GB\""));
        for size in ["4096", "\"4KiB\""] {
            let text = format!("[[region]]\nname = \"r\"\nbackend = \"mem\"\nsize = {size}");
            assert_eq!(toml::from_str::<Config>(&text).unwrap().regions[0].size, ByteSize(4096));
        }
    }

    #[test]
    fn unknown_and_invalid_settings_are_named() {
        let unknown = toml::from_str::<Config>("listen = \"127.0.0.1:1\"\nworkerz = 2").unwrap_err().to_string();
        assert!(unknown.contains("workerz"), "{unknown}");
        let config = Config { workers: 0, ..Config::default() };
        assert!(config.validate().unwrap_err().to_string().contains("workers"));
        for (config, named) in [
            (Config { sessions_per_worker: 2000, ..Config::default() }, "sessions_per_worker"),
            (Config { max_sessions_per_address: 0, ..Config::default() }, "max_sessions_per_address"),
            (Config { sessions_per_worker: 16, max_sessions_per_address: 17, ..Config::default() }, "between 1 and"),
            (Config { session_idle_timeout_ms: 10, ..Config::default() }, "session_idle_timeout_ms"),
            (Config { block_sqpoll_idle_ms: 20_000, ..Config::default() }, "block_sqpoll_idle_ms"),
        ] {
            let message = config.validate().unwrap_err().to_string();
            assert!(message.contains(named), "{message}");
        }
        let twice = RegionConfig { name: "a".into(), backend: RegionBackend::Mem, path: None, size: ByteSize(4096) };
        let config = Config { regions: vec![twice.clone(), twice], ..Config::default() };
        assert!(config.validate().unwrap_err().to_string().contains("used twice"));
        let pathless =
            RegionConfig { name: "f".into(), backend: RegionBackend::File, path: None, size: ByteSize(4096) };
        let config = Config { regions: vec![pathless], ..Config::default() };
        assert!(config.validate().unwrap_err().to_string().contains("needs a path"));
    }

    #[test]
    fn a_block_must_fit_in_one_datagram_with_its_headers() {
        let namespace = |block_size| NamespaceConfig {
            name: "disk".into(),
            backend: NamespaceBackend::File,
            path: "disk.img".into(),
            size: Some(ByteSize(1 << 20)),
            block_size,
        };
        for too_large in [16_384, 65_536] {
            let message = namespace(too_large).validate().unwrap_err().to_string();
            assert!(message.contains("from 512 to 8192") && message.contains("fit in one"), "{message}");
        }
        for fits in [512, 4096, MAX_BLOCK_BYTES] {
            let config = Config { namespaces: vec![namespace(fits)], ..Config::default() };
            config.validate().unwrap();
        }
        // The largest block fits the default datagram, authentication trailer included.
        assert!(MAX_BLOCK_BYTES as usize + BLOCK_DATAGRAM_OVERHEAD <= DEFAULT_DATAGRAM_BYTES);
        // A smaller datagram may not hold a block: refused, naming both settings.
        let config = Config { max_datagram_bytes: 4096, namespaces: vec![namespace(4096)], ..Config::default() };
        let message = config.validate().unwrap_err().to_string();
        assert!(message.contains("max_datagram_bytes = 4096") && message.contains("block_size"), "{message}");
        let config = Config { max_datagram_bytes: 4096, namespaces: vec![namespace(2048)], ..Config::default() };
        config.validate().unwrap();
    }

    #[test]
    fn answer_trains_are_on_unless_turned_off() {
        assert!(Config::default().answer_trains);
        assert!(toml::from_str::<Config>("workers = 1").unwrap().answer_trains);
        let config: Config = toml::from_str("answer_trains = false").unwrap();
        assert!(!config.answer_trains);
        assert!(config.to_toml().contains("answer_trains = false"), "{}", config.to_toml());
    }

    #[test]
    fn block_submission_is_inline_unless_a_kernel_thread_idle_time_is_set() {
        assert_eq!(Config::default().block_submission(), netdam_nvme::Submission::Inline);
        let config: Config = toml::from_str("block_sqpoll_idle_ms = 5").unwrap();
        assert_eq!(config.block_submission(), netdam_nvme::Submission::KernelThread { idle_ms: 5 });
        assert!(config.validate().is_ok());
        assert!(config.to_toml().contains("block_sqpoll_idle_ms = 5"), "{}", config.to_toml());
    }

    #[test]
    fn engine_is_auto_software_fpga_or_a_window_path() {
        assert_eq!(Config::default().engine, EngineChoice::Auto);
        for (text, choice) in [
            ("auto", EngineChoice::Auto),
            ("software", EngineChoice::Software),
            ("fpga", EngineChoice::Fpga(None)),
            ("fpga=run/window", EngineChoice::Fpga(Some("run/window".into()))),
        ] {
            let config: Config = toml::from_str(&format!("engine = \"{text}\"")).unwrap();
            assert_eq!(config.engine, choice);
            assert!(config.to_toml().contains(&format!("engine = \"{text}\"")), "{}", config.to_toml());
            assert_eq!(toml::from_str::<Config>(&config.to_toml()).unwrap().engine, config.engine);
        }
        for bad in ["fpga=", "gpu", "FPGA"] {
            let message = toml::from_str::<Config>(&format!("engine = \"{bad}\"")).unwrap_err().to_string();
            assert!(message.contains("auto, software, fpga or fpga=PATH"), "{message}");
        }
    }

    #[test]
    fn fpga_namespace_names_a_configured_file_namespace() {
        let namespace = |name: &str, backend| NamespaceConfig {
            name: name.into(),
            backend,
            path: format!("{name}.img").into(),
            size: Some(ByteSize(1 << 20)),
            block_size: 4096,
        };
        let with = |namespaces: Vec<NamespaceConfig>, fpga_namespace: &str| Config {
            namespaces,
            fpga_namespace: Some(fpga_namespace.into()),
            ..Config::default()
        };
        with(vec![namespace("disk", NamespaceBackend::File)], "disk").validate().unwrap();
        let missing = with(vec![namespace("disk", NamespaceBackend::File)], "dsik").validate().unwrap_err().to_string();
        assert!(missing.contains("fpga_namespace = \"dsik\"") && missing.contains("no [[namespace]]"), "{missing}");
        let pmem = with(vec![namespace("mem", NamespaceBackend::Pmem)], "mem").validate().unwrap_err().to_string();
        assert!(pmem.contains("fpga_namespace = \"mem\"") && pmem.contains("backend = \"file\""), "{pmem}");
        let large =
            Config { max_datagram_bytes: 32 * 1024, ..with(vec![namespace("disk", NamespaceBackend::File)], "disk") };
        let large = large.validate().unwrap_err().to_string();
        assert!(large.contains("fpga_namespace = \"disk\" with max_datagram_bytes = 32768"), "{large}");
        let config: Config = toml::from_str("fpga_namespace = \"disk\"").unwrap();
        assert_eq!(config.fpga_namespace.as_deref(), Some("disk"));
        assert!(config.to_toml().contains("fpga_namespace = \"disk\""), "{}", config.to_toml());
    }

    /// `netdam-target config` names every setting: the defaults' values, and those unset without
    /// a default as comments; the output reads back as the same settings.
    #[test]
    fn the_printed_settings_name_every_setting_and_read_back() {
        let config = Config::default();
        let text = config.to_toml();
        for setting in [
            "listen",
            "metrics_listen",
            "workers",
            "poll",
            "adaptive_spin_us",
            "pin_workers",
            "lock_memory",
            "max_datagram_bytes",
            "busy_threshold_us",
            "block_sqpoll_idle_ms",
            "answer_trains",
            "sessions_per_worker",
            "max_sessions_per_address",
            "session_idle_timeout_ms",
            "engine",
            "fpga_progress_deadline_ms",
            "extensions",
            "session_permissions",
            "auth",
            "allow_unauthenticated_network",
        ] {
            assert!(text.lines().any(|line| line.starts_with(&format!("{setting} = "))), "{setting} missing:\n{text}");
        }
        for unset in ["data_dir", "fpga_window", "fpga_namespace"] {
            assert!(text.lines().any(|line| line.starts_with(&format!("# {unset} = "))), "{unset} missing:\n{text}");
        }
        assert!(text.contains("# [[namespace]]"), "{text}");
        // The comments stand before the first table, where their keys would belong.
        assert!(text.find("# fpga_window").unwrap() < text.find("[[region]]").unwrap(), "{text}");
        let back: Config = toml::from_str(&text).unwrap();
        assert_eq!(back, Config { regions: config.effective_regions(), ..config });
        // Set ones are shown as set, and not as comments.
        let set = Config {
            data_dir: Some("/var/lib/netdam".into()),
            fpga_window: Some("/run/netdam/window".into()),
            extensions: vec!["reduce".into()],
            allow_unauthenticated_network: true,
            ..Config::default()
        };
        let text = set.to_toml();
        assert!(text.contains("data_dir = \"/var/lib/netdam\"") && !text.contains("# data_dir"), "{text}");
        assert!(text.contains("fpga_window = \"/run/netdam/window\"") && !text.contains("# fpga_window"), "{text}");
        assert!(text.contains("allow_unauthenticated_network = true") && text.contains("\"reduce\""), "{text}");
        let back: Config = toml::from_str(&text).unwrap();
        assert_eq!(back, Config { regions: set.effective_regions(), ..set });
    }

    #[test]
    fn metrics_listen_is_an_address_or_off() {
        let off: Config = toml::from_str("metrics_listen = \"off\"").unwrap();
        assert_eq!(off.metrics_listen, MetricsListen::Off);
        assert!(!off.dispatch_settings().metrics);
        let on: Config = toml::from_str("metrics_listen = \"[::1]:9500\"").unwrap();
        assert_eq!(on.metrics_listen, MetricsListen::On("[::1]:9500".parse().unwrap()));
        assert!(on.dispatch_settings().metrics);
        let back: Config = toml::from_str(&on.to_toml()).unwrap();
        assert_eq!(back.metrics_listen, on.metrics_listen);
        let bad = toml::from_str::<Config>("metrics_listen = \"9464\"").unwrap_err().to_string();
        assert!(bad.contains("metrics_listen") && bad.contains("\"off\""), "{bad}");
    }

    #[test]
    fn no_regions_means_the_persistent_default() {
        let regions = Config::default().effective_regions();
        assert_eq!(regions.len(), 1);
        assert_eq!(regions[0].name, DEFAULT_REGION_NAME);
        assert_eq!(regions[0].backend, RegionBackend::File);
    }
}
