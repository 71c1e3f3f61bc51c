//! `netdam`: talk to a netdam target from the shell.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};
use netdam_initiator::allreduce::{self, AllreduceOp, AllreducePlan};
use netdam_initiator::metrics::{InitiatorMetrics, ObservedBackend};
use netdam_initiator::nbd::{serve_counting, ExportOptions, Listen, NbdListener};
use netdam_initiator::pieces::{pieces, zeroing_piece_bytes};
use netdam_initiator::reduce::ReduceValue;
use netdam_initiator::top::{Snapshot, View};
use netdam_initiator::volume_by_name::VolumeByName;
use netdam_initiator::{Client, ClientError, ClientOptions, ClientPoll, VolumeOptions};
use netdam_isa::block::{EXTENT_FLAG_HOLE, EXTENT_FLAG_ZERO};
use netdam_isa::control::NamespaceInfo;
use netdam_isa::crypto::{Seal, SEAL_LEN};
use netdam_isa::extension::reduce::ReduceOp;
use netdam_isa::limits::CRYPTO_KEY_SLOTS;
use netdam_isa::units::parse_bytes;
use netdam_isa::wire::Header;
use netdam_isa::LaneType;
use netdam_metrics::{LogFormat, MetricsListen, MetricsServer};
use serde_json::json;

// Beside the binary's root, not in src/bin/ itself, where cargo would take it for a binary.
#[path = "netdam/ranges.rs"]
mod ranges;
#[path = "netdam/streamed.rs"]
mod streamed;

/// What a one-shot command says when Ctrl-C or SIGTERM ends it (`netdam nbd` drains instead).
mod interrupted {
    use std::sync::OnceLock;

    use super::Command;

    static MESSAGE: OnceLock<Vec<u8>> = OnceLock::new();

    /// Installs handlers for SIGINT and SIGTERM that print what `command` may have left behind,
    /// then let the signal end the process as it would have (so that a shell loop stops on
    /// Ctrl-C, as it does for a program killed by it). A transfer is many instructions, each
    /// done when it is answered: an interrupted write is done in part, and nothing is rolled
    /// back; the user must be told, where before the process died silently. A signal ignored
    /// on entry (a background job's SIGINT) stays ignored.
    pub fn say_on_interrupt(command: &Command) {
        let _ = MESSAGE.set(message(command).into_bytes());
        for signal in [libc::SIGINT, libc::SIGTERM] {
            if super::signal_ignored(signal) {
                continue;
            }
            // SAFETY: setting a disposition before any thread of ours starts; the handler does
            // only what a signal handler may (write, signal, sigprocmask, raise).
            unsafe {
                libc::signal(signal, on_signal as *const () as libc::sighandler_t);
            }
        }
    }

    extern "C" fn on_signal(signal: libc::c_int) {
        if let Some(message) = MESSAGE.get() {
            // SAFETY: write(2) of a buffer that lives as long as the process.
            unsafe { libc::write(libc::STDERR_FILENO, message.as_ptr().cast(), message.len()) };
        }
        // SAFETY: async-signal-safe calls only: the default disposition back, the signal
        // unblocked (it is blocked while its handler runs), and raised again, which ends the
        // process by the signal.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, signal);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(signal);
        }
    }

    /// What an interrupted `command` says of what it may have left.
    fn message(command: &Command) -> String {
        const ROLLED_BACK: &str = "nothing is rolled back: read the range back to see what it holds";
        let said = match command {
            Command::Write { .. } => format!("the write may be done in part ({ROLLED_BACK})"),
            Command::Bwrite { .. } => format!("the block write may be done in part ({ROLLED_BACK})"),
            Command::Fill { .. } => format!("the fill may be done in part ({ROLLED_BACK})"),
            Command::Memcpy { .. } => format!("the copy may be done in part ({ROLLED_BACK})"),
            Command::Trim { .. } => format!("the trim may be done in part ({ROLLED_BACK})"),
            Command::WriteZeroes { .. } => format!("the write of zeroes may be done in part ({ROLLED_BACK})"),
            // Sent as several VADDs when the lanes need more than one datagram.
            Command::Vadd { .. } => {
                format!("the addition may be done in part ({ROLLED_BACK}; adding again adds twice)")
            }
            Command::Cas { .. } | Command::FetchAdd { .. } => {
                "the atomic operation may or may not have been applied (read the word to see)".to_string()
            }
            Command::Encrypt { .. } => "the encryption may be done in part, and its seal was not printed: \
                                        the bytes it sealed cannot be decrypted; write them again"
                .to_string(),
            Command::Decrypt { .. } => format!("the decryption may be done in part ({ROLLED_BACK})"),
            Command::Allreduce { .. } => {
                "the Allreduce may be done in part: its area needs --prepare again before the next round".to_string()
            }
            // Written a piece at a time as it is read.
            Command::Bread { out: Some(path), .. } | Command::Read { out: Some(path), .. }
                if path.as_os_str() != "-" =>
            {
                format!("{} may hold only the first part of the range", path.display())
            }
            _ => return "\nnetdam: interrupted\n".to_string(),
        };
        format!("\nnetdam: interrupted: {said}; the target frees this command's session when it expires\n")
    }
}

use ranges::{check_block_range, check_not_empty, check_region_range};
use streamed::{large_regular_file, piece_bytes, stream_read, stream_write_file, Destination, PIECE_BYTES};

/// Client for a netdam storage target: byte-addressable reads, writes, atomics and compute on
/// the target's memory regions. Regions are named as the target lists them (`netdam regions`)
/// or by number (a number is a position in that list, which a deleted region shifts at the
/// target's next start: scripts should use names). Byte offsets and lengths take 0x hex and
/// KiB/MiB/GiB/TiB suffixes (K, M, G, T also: powers of 1024); block numbers and counts take 0x
/// hex and K, M, G, T (1024, 1024², ... blocks), not byte units.
#[derive(Debug, Parser)]
#[command(name = "netdam", version)]
struct Cli {
    /// Target address: HOST:PORT, where HOST is an IP address or a name (resolved once, at start:
    /// its first IPv4 address, or its first address if it has no IPv4 one).
    #[arg(long, global = true, env = "NETDAM_TARGET", default_value = "127.0.0.1:7800", value_parser = parse_target)]
    target: SocketAddr,
    /// The tenant's key file (written by `netdam-target tenant create`). Without it, the key of
    /// the default tenant of a target started here with its embedded default is used if
    /// present ($XDG_DATA_HOME/netdam/tenants/default.key or ~/.local/share/netdam/tenants/default.key).
    /// `none`: present no key (for a target with auth = "none"). An empty NETDAM_KEY counts as unset.
    #[arg(long, global = true, env = "NETDAM_KEY", value_name = "FILE")]
    key: Option<std::path::PathBuf>,
    /// With a key: also encrypt every datagram's instructions and results (the MAC alone
    /// proves who sent them and that nothing changed; this hides them too). NETDAM_ENCRYPT
    /// takes 1/0, true/false, yes/no or on/off, as the fio engine's `encrypt=1` does; an empty
    /// one counts as unset.
    #[arg(long, global = true, env = "NETDAM_ENCRYPT", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    encrypt: bool,
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure round trips; shows the target's service time, its queueing, queue depth and the TTL it received.
    /// Needs no session, so it answers even when the target's session table is full.
    ///
    /// The queueing field stops at 65535 µs: a wait that long or longer shows as `≥ 65535 µs`
    /// (with --json, `queueing_saturated` is true beside `queueing_us`).
    Ping {
        /// Round trips to make (at least 1).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        count: u32,
    },
    /// Show the target's counters (requests, drops by reason, sessions, statuses). Without a
    /// key it needs no session, so a target run with --auth none answers it even when its
    /// session table is full. A target that requires tenants (the default) shows them only to
    /// a tenant that holds `admin` (the default tenant does): pass its key (--key), and STAT
    /// then goes through an authenticated session like any other command (when every slot is
    /// taken, the target's /metrics still answers).
    Stat,
    /// List the target's regions.
    Regions,
    /// List the target's block namespaces.
    Namespaces,
    /// Read BLOCKS whole blocks from block LBA of a namespace; prints a hex dump, or writes them
    /// raw to --out.
    Bread {
        /// The namespace, by name (`netdam namespaces` lists them).
        namespace: String,
        /// First block: a block number (16, 0x10, 4K = 4096).
        #[arg(value_parser = parse_blocks)]
        lba: u64,
        /// Number of blocks, at least 1 (16, 0x10, 4K = 4096).
        #[arg(value_parser = parse_blocks)]
        blocks: u64,
        /// File to write the blocks to ("-" for raw stdout), 16 MiB at a time as they are read: a
        /// read failing midway leaves what came before it, and says how many bytes that is.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Write whole blocks at block LBA of a namespace from --file, --data, or standard input.
    Bwrite {
        /// The namespace, by name (`netdam namespaces` lists them).
        namespace: String,
        /// First block: a block number (16, 0x10, 4K = 4096).
        #[arg(value_parser = parse_blocks)]
        lba: u64,
        /// File whose bytes to write.
        #[arg(long, value_name = "FILE", conflicts_with = "data")]
        file: Option<PathBuf>,
        /// Text whose UTF-8 bytes to write.
        #[arg(long)]
        data: Option<String>,
        /// Force unit access: each block is durable before the target answers.
        #[arg(long)]
        fua: bool,
        /// Zero-fill the last block when the input is not a whole number of blocks (refused
        /// otherwise, so nothing is written short by accident).
        #[arg(long)]
        pad: bool,
    },
    /// Make every block write answered so far durable on a namespace.
    Flush {
        /// The namespace, by name (`netdam namespaces` lists them).
        namespace: String,
    },
    /// Deallocate BLOCKS blocks from block LBA: they read as zeroes afterwards.
    Trim {
        /// The namespace, by name (`netdam namespaces` lists them).
        namespace: String,
        /// First block: a block number (16, 0x10, 4K = 4096).
        #[arg(value_parser = parse_blocks)]
        lba: u64,
        /// Number of blocks, at least 1 (16, 0x10, 4K = 4096).
        #[arg(value_parser = parse_blocks)]
        blocks: u64,
    },
    /// Write zeroes over BLOCKS blocks from block LBA.
    WriteZeroes {
        /// The namespace, by name (`netdam namespaces` lists them).
        namespace: String,
        /// First block: a block number (16, 0x10, 4K = 4096).
        #[arg(value_parser = parse_blocks)]
        lba: u64,
        /// Number of blocks, at least 1 (16, 0x10, 4K = 4096).
        #[arg(value_parser = parse_blocks)]
        blocks: u64,
    },
    /// Show which of BLOCKS blocks from block LBA hold data and which are holes (file
    /// namespaces; others cannot tell).
    BlockStatus {
        /// The namespace, by name (`netdam namespaces` lists them).
        namespace: String,
        /// First block: a block number (16, 0x10, 4K = 4096).
        #[arg(value_parser = parse_blocks)]
        lba: u64,
        /// Number of blocks, at least 1 (16, 0x10, 4K = 4096).
        #[arg(value_parser = parse_blocks)]
        blocks: u64,
    },
    /// Read bytes; prints a hex dump, or writes them raw to --out.
    Read {
        /// The region, by name or number (`netdam regions` lists them).
        region: String,
        /// Byte offset in the region (4096, 0x1000, 4KiB).
        #[arg(value_parser = parse_bytes)]
        offset: u64,
        /// Length in bytes, at least 1 (64, 0x40, 1MiB).
        #[arg(value_parser = parse_bytes)]
        len: u64,
        /// File to write the bytes to ("-" for raw stdout), 16 MiB at a time as they are read: a
        /// read failing midway leaves what came before it, and says how many bytes that is.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Write bytes from --file, --data, or standard input.
    Write {
        /// The region, by name or number (`netdam regions` lists them).
        region: String,
        /// Byte offset in the region (4096, 0x1000, 4KiB).
        #[arg(value_parser = parse_bytes)]
        offset: u64,
        /// File whose bytes to write.
        #[arg(long, value_name = "FILE", conflicts_with = "data")]
        file: Option<PathBuf>,
        /// Text whose UTF-8 bytes to write.
        #[arg(long)]
        data: Option<String>,
    },
    /// Compare-and-swap the aligned 8-byte word at OFFSET; prints the old value.
    Cas {
        /// The region, by name or number (`netdam regions` lists them).
        region: String,
        /// Byte offset in the region (4096, 0x1000, 4KiB).
        #[arg(value_parser = parse_bytes)]
        offset: u64,
        /// The value the word must hold for the swap (0 to 2^64-1, 0x hex, or negative).
        #[arg(value_parser = parse_word)]
        expected: u64,
        /// The value written when it does.
        #[arg(value_parser = parse_word)]
        desired: u64,
    },
    /// Atomically add to the aligned 8-byte word at OFFSET (wrapping); prints the old value.
    FetchAdd {
        /// The region, by name or number (`netdam regions` lists them).
        region: String,
        /// Byte offset in the region (4096, 0x1000, 4KiB).
        #[arg(value_parser = parse_bytes)]
        offset: u64,
        /// Addend; negative values subtract.
        #[arg(value_parser = parse_word, allow_hyphen_values = true)]
        addend: u64,
    },
    /// Add comma-separated lanes element-wise into memory at OFFSET.
    Vadd {
        /// The region, by name or number (`netdam regions` lists them).
        region: String,
        /// Byte offset in the region (4096, 0x1000, 4KiB).
        #[arg(value_parser = parse_bytes)]
        offset: u64,
        /// Lanes, e.g. 1.5,2,-3.
        #[arg(allow_hyphen_values = true)]
        values: String,
        /// Lane type.
        #[arg(long = "type", value_enum, default_value_t = Lane::F32)]
        lane: Lane,
        /// Print the lanes' new values.
        #[arg(long = "return")]
        return_result: bool,
    },
    /// CRC32 of LEN bytes at OFFSET, computed by the target.
    Crc {
        /// The region, by name or number (`netdam regions` lists them).
        region: String,
        /// Byte offset in the region (4096, 0x1000, 4KiB).
        #[arg(value_parser = parse_bytes)]
        offset: u64,
        /// Length in bytes, at least 1 (64, 0x40, 1MiB).
        #[arg(value_parser = parse_bytes)]
        len: u64,
    },
    /// Sum, minimum or maximum of the lanes in LEN bytes at OFFSET, computed by the target (its
    /// `reduce` extension must be enabled: `extensions = ["reduce"]`).
    Reduce {
        /// The region, by name or number (`netdam regions` lists them).
        region: String,
        /// Byte offset in the region (4096, 0x1000, 4KiB).
        #[arg(value_parser = parse_bytes)]
        offset: u64,
        /// Length in bytes, at least 1 (64, 0x40, 1MiB).
        #[arg(value_parser = parse_bytes)]
        len: u64,
        /// Lane type.
        #[arg(long = "type", value_enum, default_value_t = Lane::F32)]
        lane: Lane,
        /// What to compute.
        #[arg(long = "op", value_enum, default_value_t = Reduction::Sum)]
        op: Reduction,
    },
    /// Sum this worker's buffer with those of the other workers through the area at OFFSET
    /// (a header, counters, then the accumulator): run once with --prepare LEN, then once per
    /// worker; prepare again before each later round. A worker refuses an area not prepared,
    /// prepared for other workers or buffers, or already used by every worker of its round.
    Allreduce {
        /// The region, by name or number (`netdam regions` lists them).
        region: String,
        /// Start of the area, a multiple of 8.
        #[arg(value_parser = parse_bytes)]
        offset: u64,
        /// Workers contributing (every worker passes the same number).
        #[arg(long)]
        workers: u32,
        /// Lane type.
        #[arg(long = "type", value_enum, default_value_t = Lane::F32)]
        lane: Lane,
        /// What to compute: the sum (VADD) or the maximum (the target's vmax extension).
        #[arg(long = "op", value_enum, default_value_t = Combine::Sum)]
        op: Combine,
        /// Ready the area for one round with buffers of LEN bytes and exit (before any worker
        /// starts).
        #[arg(long, value_name = "LEN", value_parser = parse_bytes, conflicts_with_all = ["file", "out"])]
        prepare: Option<u64>,
        /// This worker's buffer: little-endian lanes.
        #[arg(long, value_name = "FILE", required_unless_present = "prepare")]
        file: Option<PathBuf>,
        /// Where to write the sum (same length as the buffer).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Give up (and fail) when some worker's contribution is still missing after this long.
        #[arg(long, default_value_t = 30.0)]
        timeout_seconds: f64,
    },
    /// Set LEN bytes at OFFSET to BYTE.
    Fill {
        /// The region, by name or number (`netdam regions` lists them).
        region: String,
        /// Byte offset in the region (4096, 0x1000, 4KiB).
        #[arg(value_parser = parse_bytes)]
        offset: u64,
        /// Length in bytes, at least 1 (64, 0x40, 1MiB).
        #[arg(value_parser = parse_bytes)]
        len: u64,
        /// The byte value to fill with (0 to 255, or 0x00 to 0xff).
        #[arg(value_parser = parse_word)]
        byte: u64,
    },
    /// Serve a namespace as an NBD export to the stock NBD clients: the kernel's nbd-client,
    /// qemu (`-drive file=nbd+unix:///?socket=PATH,format=raw`), nbdfuse, nbdinfo, qemu-img,
    /// fio's nbd engine. Runs until SIGINT, SIGTERM or SIGHUP (one ignored when it started, as
    /// `nohup` ignores SIGHUP, stays ignored), then finishes the requests in flight (new ones
    /// are answered NBD_ESHUTDOWN) for at most 30 s, closes its sessions (5 s at most) and
    /// exits; a second SIGINT or SIGTERM stops it at once.
    Nbd {
        /// The namespace to export (its name, or its id; `netdam namespaces` lists them).
        #[arg(long)]
        namespace: String,
        /// Where clients connect: unix:PATH or tcp:HOST:PORT.
        #[arg(long, value_name = "unix:PATH|tcp:HOST:PORT")]
        listen: Listen,
        /// The export's name (clients that ask for the default export, "", get it too)
        /// [default: the namespace's name].
        #[arg(long)]
        export: Option<String>,
        /// Refuse writes, trims and zeroing (EPERM).
        #[arg(long)]
        read_only: bool,
        /// Sessions to the target, each on its own socket, so that several of its workers
        /// share the load (1 to 64). A target holds at most max_sessions_per_address (default
        /// 32) sessions of one host on each worker, and the kernel picks each socket's worker:
        /// on a default target (one worker), at most 32.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=netdam_initiator::volume::MAX_VOLUME_SESSIONS as i64))]
        sessions: u16,
        /// Most clients connected at once (at least 1). A client beyond it waits, unanswered,
        /// until one disconnects (NBD has no "busy" reply before the greeting); the log says so
        /// when the last slot is taken.
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
        max_connections: u32,
        /// Threads serving the connections and the sessions. One thread (the default) serves
        /// every request without a hand-over between threads, which measured 2.2-2.8x the
        /// requests per second of two threads on a 2-core machine (docs/DECISIONS.md); more
        /// help only where many connections have cores to spare.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
        io_threads: u16,
        /// TCP address to serve Prometheus /metrics on (end-to-end latency per opcode, errors,
        /// retransmissions, windows, NBD connections), or "off". Off by default: several
        /// exports often share a host, and the target's default is 127.0.0.1:9464.
        #[arg(long, value_name = "ADDR|off", default_value = "off")]
        metrics_listen: MetricsListen,
        /// Log lines as text or as JSON objects (filter with NETDAM_LOG or RUST_LOG).
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
        /// Seconds a request waits for a target that stopped answering or refuses (it is
        /// restarting) before it fails with EIO: meanwhile requests are retried, and the
        /// sessions open again when the target is back. A file system on the export rides out
        /// a restart shorter than this. When the oldest request fails so, with nothing heard
        /// from the target since it was sent, the session's other requests fail with it.
        #[arg(long, value_name = "SECONDS", default_value_t = 30.0, value_parser = parse_reconnect_timeout)]
        reconnect_timeout: f64,
        /// How the sessions wait for the target's answers. adaptive: a client that sends one
        /// request at a time (queue depth 1) gets its answer without a wake-up: the export spins
        /// for it, at most twice the round trip (50-200 µs); deeper clients are served from
        /// epoll. blocking: always epoll (no spinning; QD1 latency pays a thread wake-up).
        #[arg(long, value_enum, default_value_t = ExportPoll::Adaptive)]
        poll: ExportPoll,
    },
    /// A live view of a target from its /metrics endpoint, refreshed every interval: requests
    /// per second and p50/p99/p99.9 latency per opcode over the last interval, errors, drops,
    /// BUSY answers, sessions and block I/O in flight (and per-session windows when pointed at
    /// a `netdam nbd --metrics-listen` endpoint). With --once --json, one JSON snapshot.
    Top {
        /// The /metrics URL to read (HOST:PORT alone means http://HOST:PORT/metrics) [default:
        /// port 9464, the target's default, on 127.0.0.1 for a --target on this machine, else on
        /// the --target's host, whose metrics_listen must then name an address reachable from here].
        #[arg(long, value_name = "URL")]
        metrics: Option<String>,
        /// Seconds between refreshes (and the interval the rates and quantiles cover).
        #[arg(long, default_value_t = 1.0, value_parser = parse_interval)]
        interval: f64,
        /// Print one view (over one interval) and exit.
        #[arg(long)]
        once: bool,
    },
    /// Encrypt LEN bytes (at most 16 KiB) at OFFSET with AES-256-GCM under a key slot of the
    /// target (created with `netdam-target crypto-key create SLOT`), in place or into
    /// --to-region at --to-offset. Prints the seal: the 12-byte nonce and 16-byte tag, 56 hex
    /// digits, which `netdam decrypt --seal` needs. The key never leaves the target.
    Encrypt {
        /// The region, by name or number (`netdam regions` lists them).
        region: String,
        /// Byte offset in the region (4096, 0x1000, 4KiB).
        #[arg(value_parser = parse_bytes)]
        offset: u64,
        /// Length in bytes, at most 16 KiB (4096, 0x1000, 4KiB); 0 seals the --aad alone.
        #[arg(value_parser = parse_bytes)]
        len: u64,
        #[command(flatten)]
        crypto: CryptoArgs,
    },
    /// Decrypt LEN bytes at OFFSET that `netdam encrypt` sealed, in place or into --to-region at
    /// --to-offset. A changed byte of the range, the seal or the --aad fails with auth_failed,
    /// and nothing is written.
    Decrypt {
        /// The region, by name or number (`netdam regions` lists them).
        region: String,
        /// Byte offset in the region (4096, 0x1000, 4KiB).
        #[arg(value_parser = parse_bytes)]
        offset: u64,
        /// Length in bytes, as given to `netdam encrypt` (0 where it sealed the --aad alone).
        #[arg(value_parser = parse_bytes)]
        len: u64,
        /// The seal `netdam encrypt` printed (56 hex digits).
        #[arg(long)]
        seal: String,
        #[command(flatten)]
        crypto: CryptoArgs,
    },
    /// Copy LEN bytes from SOURCE_REGION at SOURCE_OFFSET to REGION at OFFSET, within the target.
    Memcpy {
        /// The region, by name or number (`netdam regions` lists them).
        region: String,
        /// Byte offset in the region (4096, 0x1000, 4KiB).
        #[arg(value_parser = parse_bytes)]
        offset: u64,
        /// The region copied from, by name or number (may be REGION itself).
        source_region: String,
        /// Byte offset in the source region.
        #[arg(value_parser = parse_bytes)]
        source_offset: u64,
        /// Length in bytes, at least 1 (64, 0x40, 1MiB).
        #[arg(value_parser = parse_bytes)]
        len: u64,
    },
}

/// Options ENCRYPT and DECRYPT share.
#[derive(Debug, Args)]
struct CryptoArgs {
    /// Key slot, 0 to 255.
    #[arg(long, value_parser = parse_slot)]
    slot: u32,
    /// Write the result into this region instead of in place.
    #[arg(long, value_name = "REGION")]
    to_region: Option<String>,
    /// Offset of the result in --to-region.
    #[arg(long, value_parser = parse_bytes, requires = "to_region", default_value_t = 0)]
    to_offset: u64,
    /// Associated data (UTF-8): authenticated with the range, not stored; decrypt needs the same.
    #[arg(long, default_value = "")]
    aad: String,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Lane {
    F32,
    I32,
    Bf16,
}

impl Lane {
    /// As the command line spells it.
    fn name(self) -> &'static str {
        match self {
            Lane::F32 => "f32",
            Lane::I32 => "i32",
            Lane::Bf16 => "bf16",
        }
    }

    fn lane_type(self) -> LaneType {
        match self {
            Lane::F32 => LaneType::F32,
            Lane::I32 => LaneType::I32,
            Lane::Bf16 => LaneType::Bf16,
        }
    }
}

/// How `netdam nbd`'s sessions wait for answers (`--poll`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ExportPoll {
    Adaptive,
    Blocking,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Combine {
    Sum,
    Max,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Reduction {
    Sum,
    Min,
    Max,
}

fn parse_interval(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(seconds) if (0.05..=3600.0).contains(&seconds) => Ok(seconds),
        _ => Err(format!("{text:?}: give seconds between 0.05 and 3600")),
    }
}

/// `--target`: an IP address and port, or a host name and port resolved now. The system's
/// resolver also reads what Rust's address parser does not: a link-local address scoped by an
/// interface's name (`[fe80::1%eth0]:7800`, brackets optional).
fn parse_target(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let examples = "(examples: 127.0.0.1:7800, [::1]:7800, storage1:7800)";
    let Some((host, port)) = text.rsplit_once(':').filter(|(host, _)| !host.is_empty()) else {
        return Err(format!("{text:?} is not HOST:PORT {examples}"));
    };
    let port = netdam_isa::units::port_number(port).map_err(|problem| format!("{text:?}: {problem}"))?;
    let host = host.strip_prefix('[').and_then(|host| host.strip_suffix(']')).unwrap_or(host);
    use std::net::ToSocketAddrs;
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|error| format!("{text:?}: cannot resolve the host name: {error}"))?
        .collect();
    // A target listens on IPv4 unless told otherwise, and a name with both (`localhost` is
    // ::1 first on many systems) would otherwise send to a port nobody listens on.
    addrs
        .iter()
        .find(|addr| addr.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("{text:?}: the host name has no address"))
}

fn parse_reconnect_timeout(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(seconds) if (0.0..=86_400.0).contains(&seconds) => Ok(seconds),
        _ => Err(format!("{text:?}: give seconds between 0 and 86400")),
    }
}

/// A block number (LBA) or block count, in the syntax of byte offsets and lengths
/// ([`parse_bytes`]: decimal or 0x hex, a K/M/G/T suffix multiplies by a power of 1024), so
/// that the numbers a user copies from one command work in the other. A byte unit (`4KiB`,
/// `512B`) is refused: it would count blocks, 4096 of them, where bytes were meant.
fn parse_blocks(text: &str) -> Result<u64, String> {
    let invalid = || format!("{text:?} is not a block number or count (examples: 16, 0x10, 4K; at most 2^64 - 1)");
    // `0xab` is a hex number, not bytes; `0x1KiB` is still a byte unit.
    let lower = text.trim().to_ascii_lowercase();
    if lower.ends_with("ib") || (lower.ends_with('b') && !lower.starts_with("0x")) {
        return Err(format!("{}: counts blocks, so it takes no byte unit (B, KiB, ...)", invalid()));
    }
    parse_bytes(text).map_err(|_| invalid())
}

/// A key slot of ENCRYPT and DECRYPT, refused here when the target has no such slot: it would
/// answer only `malformed`.
fn parse_slot(text: &str) -> Result<u32, String> {
    let slot: u32 =
        text.parse().map_err(|_| format!("{text:?} is not a slot number (0 to {})", CRYPTO_KEY_SLOTS - 1))?;
    if slot >= CRYPTO_KEY_SLOTS {
        return Err(format!("slot {slot} is beyond the last slot, {}", CRYPTO_KEY_SLOTS - 1));
    }
    Ok(slot)
}

fn parse_word(text: &str) -> Result<u64, String> {
    let parsed = match text.strip_prefix('-') {
        Some(negative) => negative.parse::<u64>().ok().map(u64::wrapping_neg),
        None => parse_bytes(text).ok(),
    };
    parsed.ok_or_else(|| format!("{text:?} is not a 64-bit value (0 to 2^64-1, hex as 0x..., or negative)"))
}

fn main() -> ExitCode {
    // Like other command-line tools, end quietly when the reader of our output goes away
    // (`netdam bread ... | head`) instead of failing on the broken pipe.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    ignore_empty_settings();
    let cli = Cli::parse();
    match run(&cli).map_err(|message| with_key_hint(&cli, message)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            if cli.json {
                println!("{}", json!({ "error": message }));
            } else {
                eprintln!("netdam: {message}");
            }
            ExitCode::FAILURE
        }
    }
}

/// The environment variables that stand for options (`NETDAM_TARGET`, `NETDAM_KEY`,
/// `NETDAM_ENCRYPT`).
const SETTINGS_FROM_ENVIRONMENT: [&str; 3] = ["NETDAM_TARGET", "NETDAM_KEY", "NETDAM_ENCRYPT"];

/// An option's environment variable set to nothing (`export NETDAM_KEY=`, the shell's way to
/// clear a setting) counts as unset, so the option takes its default instead of failing with
/// "a value is required".
fn ignore_empty_settings() {
    for name in SETTINGS_FROM_ENVIRONMENT {
        if std::env::var_os(name).is_some_and(|value| value.is_empty()) {
            // SAFETY: called at the start of main, before any thread exists.
            unsafe { std::env::remove_var(name) };
        }
    }
}

/// A refused key that the user never named is the default tenant's key file, found on its
/// own: says so, since the user may not know a key was presented at all.
fn with_key_hint(cli: &Cli, message: String) -> String {
    if !message.contains("unauthenticated") {
        return message;
    }
    let explicit = cli.key.as_deref().filter(|path| path.as_os_str() != netdam_initiator::keys::NO_KEY);
    let (path, why) = match explicit {
        Some(path) => (path.to_path_buf(), ""),
        None if cli.key.is_some() => return message,
        None => match netdam_initiator::keys::default_key_path().filter(|path| path.exists()) {
            Some(path) => (path, ", used because neither --key nor NETDAM_KEY was given"),
            None => return message,
        },
    };
    // The key file was read for the session, so it reads again; what it says of its tenant
    // tells a wrong file from a rotated or deleted tenant.
    let presented = match netdam_auth::KeyFile::load(&path) {
        Ok(file) => {
            format!("tenant {:?} (id {}), key version {}, from {}", file.tenant, file.id, file.version, path.display())
        }
        Err(_) => path.display().to_string(),
    };
    let default = if why.is_empty() { "" } else { "the default tenant's key, " };
    format!(
        "{message} (the key presented: {default}{presented}{why}; `netdam-target tenant list` on the target shows \
         its tenants and key versions)"
    )
}

/// Bytes CAS and FETCH_ADD address: one aligned 64-bit word.
const WORD_BYTES: u64 = 8;

/// `len` as an instruction's 32-bit length, or a refusal naming the largest one there is.
fn u32_length(len: u64, what: &str) -> Result<u32, String> {
    u32::try_from(len).map_err(|_| {
        format!(
            "{what} of {len} bytes is more than the {} bytes (4 GiB - 1) one instruction can address; nothing was sent",
            u32::MAX
        )
    })
}

fn region_id(client: &Client, name: &str) -> Result<u16, String> {
    client.region(name).map(|region| region.id).map_err(|error| error.to_string())
}

/// The id of region `name`, once `len` bytes at `offset` are known to lie within it
/// ([`check_region_range`]; `command` starts the message).
fn region_in_range(client: &Client, command: &str, name: &str, offset: u64, len: u64) -> Result<u16, String> {
    check_not_empty(command, len, "byte")?;
    crypto_region_in_range(client, command, name, offset, len)
}

/// [`region_in_range`] for ENCRYPT and DECRYPT, which may be 0 bytes long: one then seals (or
/// opens) its --aad alone.
fn crypto_region_in_range(client: &Client, command: &str, name: &str, offset: u64, len: u64) -> Result<u16, String> {
    let region = client.region(name).map_err(|error| error.to_string())?;
    check_region_range(command, region, offset, len)?;
    Ok(region.id)
}

/// The region `name`, once the 8-byte word at `offset` is known to lie within it and to be
/// aligned as atomics need (`command` starts the message; nothing is sent otherwise).
fn word_in_range(client: &Client, command: &str, name: &str, offset: u64) -> Result<u16, String> {
    if !offset.is_multiple_of(WORD_BYTES) {
        return Err(format!(
            "{command} at {offset}: atomics work on 8-byte words, so the offset must be a multiple of 8; \
             nothing was sent"
        ));
    }
    region_in_range(client, command, name, offset, WORD_BYTES)
}

/// Refuses an ENCRYPT or DECRYPT longer than one instruction may be, before anything is sent.
fn crypto_length(command: &str, len: u64) -> Result<(), String> {
    let max = netdam_isa::limits::MAX_CRYPTO_BYTES as u64;
    if len > max {
        return Err(format!("{command} of {len} bytes: at most {max} bytes per {command}; nothing was sent"));
    }
    Ok(())
}

/// The namespace `name`, once `blocks` blocks at block `lba` are known to lie within it
/// ([`check_block_range`]; `command` starts the message).
fn namespace_in_range(
    client: &Client,
    command: &str,
    name: &str,
    lba: u64,
    blocks: u64,
) -> Result<NamespaceInfo, String> {
    check_not_empty(command, blocks, "block")?;
    let namespace = client.namespace(name).map_err(|error| error.to_string())?;
    check_block_range(command, namespace, lba, blocks)?;
    Ok(namespace.clone())
}

/// Where a read's bytes go: raw to standard output (`--out -`) or into a file (`--out FILE`),
/// else as JSON with their hex beside `fields` (`--json`), else as a hex dump whose addresses
/// start at `address`.
fn destination(
    out: Option<&std::path::Path>,
    json_out: bool,
    fields: serde_json::Value,
    address: u64,
) -> Destination<'_> {
    match out {
        Some(path) if path.as_os_str() == "-" => Destination::Stdout,
        Some(path) => Destination::File(path),
        None if json_out => Destination::Json(fields),
        None => Destination::HexDump { address },
    }
}

fn run(cli: &Cli) -> Result<(), String> {
    let text = |error: ClientError| error.to_string();
    if let Command::Nbd {
        namespace,
        listen,
        export,
        read_only,
        sessions,
        max_connections,
        io_threads,
        metrics_listen,
        log_format,
        reconnect_timeout,
        poll,
    } = &cli.command
    {
        let options = ExportOptions {
            name: export.clone().unwrap_or_else(|| namespace.clone()),
            read_only: *read_only,
            max_connections: *max_connections as usize,
            ..ExportOptions::default()
        };
        let observe = Observe { metrics_listen: *metrics_listen, log_format: *log_format };
        let mut client = nbd_client_options(std::time::Duration::from_secs_f64(*reconnect_timeout));
        client.session.credentials = credentials(cli)?;
        client.session.encrypt = cli.encrypt;
        client.poll = match poll {
            ExportPoll::Adaptive => ClientPoll::Adaptive,
            ExportPoll::Blocking => ClientPoll::Blocking,
        };
        let volume = VolumeOptions { sessions: usize::from(*sessions), client };
        return serve_nbd(cli.target, namespace, listen, options, volume, usize::from(*io_threads), observe);
    }
    if let Command::Top { metrics, interval, once } = &cli.command {
        // The target's metrics port is not its UDP port; see `metrics_host` for the host.
        let url = metrics.clone().unwrap_or_else(|| {
            format!("http://{}/metrics", SocketAddr::new(metrics_host(cli.target.ip()), DEFAULT_METRICS_PORT))
        });
        return top(&url, std::time::Duration::from_secs_f64(*interval), *once, cli.json);
    }
    // A one-shot command's warnings (a target that does not answer yet) go to standard error.
    netdam_metrics::logging::init_for_command();
    interrupted::say_on_interrupt(&cli.command);
    // PING and STAT need no session: they work even when the target has no slot to spare.
    // Every other command opens one, and closes it when the client is dropped on the way out.
    // With a key, STAT goes through a session: a target with tenants shows its counters to a
    // tenant holding `admin` only.
    let credentials = credentials(cli)?;
    let sessionless =
        matches!(cli.command, Command::Ping { .. }) || (matches!(cli.command, Command::Stat) && credentials.is_none());
    let mut options = ClientOptions::default();
    options.session.credentials = credentials;
    options.session.encrypt = cli.encrypt;
    // Through a silent target (a paused host) or a restarting one, a command keeps trying for
    // half a minute before it fails, as the export does by default (--reconnect-timeout).
    options.session.min_patience = COMMAND_PATIENCE;
    options.session.reconnect_patience = COMMAND_PATIENCE;
    // Many commands started at once take turns for the address's share of sessions: each holds
    // its own for milliseconds.
    options.session.session_wait = COMMAND_SESSION_WAIT;
    let mut client = if sessionless {
        Client::sessionless_with(cli.target, options)
    } else {
        Client::connect_with(cli.target, options)
    }
    .map_err(text)?;
    match &cli.command {
        Command::Ping { count } => {
            for _ in 0..*count {
                let reply = client.ping().map_err(text)?;
                let rtt_us = reply.rtt.as_nanos() as f64 / 1e3;
                println!("{}", ping_report(cli.target, &reply.response().header, rtt_us, reply.attempts, cli.json));
            }
        }
        Command::Stat => {
            let entries = client.stat().map_err(text)?;
            if cli.json {
                let object: serde_json::Map<String, serde_json::Value> =
                    entries.into_iter().map(|(name, value)| (name, json!(value))).collect();
                println!("{}", serde_json::Value::Object(object));
            } else {
                let width = entries.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
                for (name, value) in entries {
                    println!("{name:<width$}  {value}");
                }
            }
        }
        Command::Regions => {
            let regions = &client.info().hello.regions;
            if cli.json {
                let list: Vec<_> = regions
                    .iter()
                    .map(
                        |r| json!({"id": r.id, "name": r.name, "size_bytes": r.size_bytes, "persistent": r.persistent}),
                    )
                    .collect();
                println!("{}", json!(list));
            } else if regions.is_empty() {
                println!(
                    "no region to list: with tenants, the target grants none to this key's tenant (netdam-target \
                     grant TENANT region:NAME read,write)"
                );
            } else {
                for region in regions {
                    let durability = if region.persistent { "persistent" } else { "volatile" };
                    println!("{:>3}  {:<32} {:>14} bytes  {durability}", region.id, region.name, region.size_bytes);
                }
            }
        }
        Command::Namespaces => {
            let namespaces = &client.info().hello.namespaces;
            if cli.json {
                let list: Vec<_> = namespaces
                    .iter()
                    .map(|n| {
                        json!({"id": n.id, "name": n.name, "block_bytes": n.block_bytes, "blocks": n.capacity_blocks,
                               "reports_allocation": n.reports_allocation})
                    })
                    .collect();
                println!("{}", json!(list));
            } else if namespaces.is_empty() {
                println!(
                    "no namespace to list: the target serves none (create one with: netdam-target namespace create \
                     --help), or, with tenants, grants none to this key's tenant (netdam-target grant TENANT \
                     namespace:NAME block,read,write)"
                );
            } else {
                for namespace in namespaces {
                    let bytes = namespace.capacity_blocks * u64::from(namespace.block_bytes);
                    println!(
                        "{:>3}  {:<32} {:>12} blocks of {:>5} bytes  ({bytes} bytes)",
                        namespace.id, namespace.name, namespace.capacity_blocks, namespace.block_bytes
                    );
                }
            }
        }
        Command::Bread { namespace, lba, blocks, out } => {
            let info = namespace_in_range(&client, "bread", namespace, *lba, *blocks)?;
            let block = u64::from(info.block_bytes);
            let len = blocks.checked_mul(block).ok_or_else(|| {
                format!("bread: {blocks} blocks of {block} bytes are more than 2^64 bytes; read fewer at a time")
            })?;
            let fields = json!({"namespace": info.name, "lba": lba, "blocks": blocks});
            let destination = destination(out.as_deref(), cli.json, fields, lba.saturating_mul(block));
            let started = Instant::now();
            stream_read("bread", &destination, len, piece_bytes(info.block_bytes), |position, piece| {
                // The error names no block: the piece it failed in is what the CLI knows.
                let (at, count) = (lba + position / block, piece.len() as u64 / block);
                client.block_read(&info, at, piece).map_err(|error| format!("{error} (in blocks {at}+{count})"))
            })?;
            if let Destination::File(path) = destination {
                report_blocks(cli.json, "read", &info, *lba, len, started.elapsed(), Some(path));
            }
        }
        Command::Bwrite { namespace, lba, file, data, fua, pad } => {
            let info = client.namespace(namespace).map_err(text)?.clone();
            let block = u64::from(info.block_bytes);
            if let Some((mut opened, len)) = large_regular_file(file.as_deref(), piece_bytes(info.block_bytes))? {
                // Sent a piece at a time, its length checked first (a stream is read whole, below).
                if !len.is_multiple_of(block) && !pad {
                    return Err(not_whole_blocks(len, block));
                }
                let blocks = len.div_ceil(block);
                check_block_range("bwrite", &info, *lba, blocks)?;
                let source = file.as_deref().map(|path| path.display().to_string()).unwrap_or_default();
                let started = Instant::now();
                let pieces = piece_bytes(info.block_bytes);
                stream_write_file("bwrite", &mut opened, &source, len, pieces, block, |position, piece| {
                    client.block_write(&info, *lba + position / block, piece, *fua).map_err(text)
                })?;
                let did = if *fua { "wrote (FUA)" } else { "wrote" };
                report_blocks(cli.json, did, &info, *lba, blocks * block, started.elapsed(), None);
                return Ok(());
            }
            let room = info.capacity_blocks.saturating_sub(*lba).saturating_mul(u64::from(info.block_bytes));
            let past_end = |len: u64| {
                check_block_range("bwrite", &info, *lba, len.div_ceil(u64::from(info.block_bytes)))
                    .err()
                    .unwrap_or_default()
            };
            let mut bytes = input_bytes("bwrite", file.as_deref(), data.as_deref(), room, past_end)?;
            let block_bytes = info.block_bytes as usize;
            let partial = bytes.len() % block_bytes;
            if partial != 0 {
                if !pad {
                    return Err(not_whole_blocks(bytes.len() as u64, block));
                }
                bytes.resize(bytes.len() + block_bytes - partial, 0);
            }
            check_block_range("bwrite", &info, *lba, (bytes.len() / block_bytes) as u64)?;
            let blocks = bytes.len() / block_bytes;
            let per_request = client.info().blocks_per_transfer(info.block_bytes).max(1) as usize;
            let started = Instant::now();
            client.block_write(&info, *lba, &bytes, *fua).map_err(|error| {
                if blocks <= per_request {
                    return text(error);
                }
                // The pieces were in flight together: a refusal of one says nothing of the others.
                format!(
                    "{}; the write went as {} requests, several in flight at a time, so some of its {blocks} blocks from \
                     block {lba} may hold the new data and others not (`netdam block-status` or `bread` shows \
                     which)",
                    text(error),
                    blocks.div_ceil(per_request)
                )
            })?;
            report_blocks(
                cli.json,
                if *fua { "wrote (FUA)" } else { "wrote" },
                &info,
                *lba,
                bytes.len() as u64,
                started.elapsed(),
                None,
            );
        }
        Command::Flush { namespace } => {
            let info = client.namespace(namespace).map_err(text)?.clone();
            let started = Instant::now();
            client.block_flush(&info).map_err(text)?;
            let micros = started.elapsed().as_secs_f64() * 1e6;
            if cli.json {
                println!("{}", json!({"namespace": info.name, "flushed": true, "micros": micros}));
            } else {
                println!("flushed namespace {} in {micros:.0} µs", info.name);
            }
        }
        Command::Trim { namespace, lba, blocks } | Command::WriteZeroes { namespace, lba, blocks } => {
            let trim = matches!(cli.command, Command::Trim { .. });
            let command = if trim { "trim" } else { "write-zeroes" };
            let info = namespace_in_range(&client, command, namespace, *lba, *blocks)?;
            // One instruction zeroes a bounded range (far fewer than 2^32 blocks): larger ones
            // go as several, in turn. Counted in blocks, whose byte offsets could pass 2^64.
            let piece_blocks = zeroing_piece_bytes(info.block_bytes) / u64::from(info.block_bytes);
            for (at, done, piece) in pieces(*lba, *blocks, piece_blocks) {
                let piece = u32::try_from(piece).expect("a zeroing piece is at most 64 MiB of blocks");
                let result = if trim { client.trim(&info, at, piece) } else { client.write_zeroes(&info, at, piece) };
                result.map_err(|error| format!("{command}: {error} at block {at} ({done} of {blocks} blocks done)"))?;
            }
            let verb = if trim { "trimmed" } else { "zeroed" };
            if cli.json {
                println!("{}", json!({"namespace": info.name, verb: blocks, "lba": lba}));
            } else {
                println!("{verb} {blocks} blocks at block {lba} of namespace {}", info.name);
            }
        }
        Command::BlockStatus { namespace, lba, blocks } => {
            let info = namespace_in_range(&client, "block-status", namespace, *lba, *blocks)?;
            // An answer may stop short (at most 64 extents), and one instruction asks for at
            // most 2^32 - 1 blocks: ask again from where the last answer stopped. A run that
            // goes on past where an answer stopped is one extent, as one answer would say.
            let mut extents: Vec<(u64, u64, u32)> = Vec::new();
            let mut at = *lba;
            let end = lba + blocks;
            while at < end {
                let asked = u32::try_from(end - at).unwrap_or(u32::MAX);
                for extent in client.block_status(&info, at, asked).map_err(text)? {
                    match extents.last_mut() {
                        Some((_, run_blocks, flags)) if *flags == extent.flags => {
                            *run_blocks += u64::from(extent.num_blocks)
                        }
                        _ => extents.push((at, u64::from(extent.num_blocks), extent.flags)),
                    }
                    at += u64::from(extent.num_blocks);
                }
            }
            let names = |flags: u32| match (flags & EXTENT_FLAG_HOLE != 0, flags & EXTENT_FLAG_ZERO != 0) {
                (true, true) => "hole, reads as zeroes",
                (true, false) => "hole",
                (false, true) => "data, reads as zeroes",
                (false, false) => "data",
            };
            if cli.json {
                let list: Vec<_> = extents
                    .iter()
                    .map(|(first, run_blocks, flags)| {
                        json!({"lba": first, "blocks": run_blocks,
                               "hole": flags & EXTENT_FLAG_HOLE != 0, "zero": flags & EXTENT_FLAG_ZERO != 0})
                    })
                    .collect();
                println!("{}", json!({"namespace": info.name, "extents": list}));
            } else {
                for (first, run_blocks, flags) in &extents {
                    println!("blocks {first}+{run_blocks}: {}", names(*flags));
                }
            }
        }
        Command::Read { region, offset, len, out } => {
            let space = region_in_range(&client, "read", region, *offset, *len)?;
            let fields = json!({"region": region, "offset": offset, "length": len});
            let destination = destination(out.as_deref(), cli.json, fields, *offset);
            let started = Instant::now();
            stream_read("read", &destination, *len, piece_bytes(1), |position, piece| {
                let at = offset + position;
                client.read(space, at, piece).map_err(|error| format!("{error} (in bytes {at}+{})", piece.len()))
            })?;
            if let Destination::File(path) = destination {
                report_transfer(cli.json, "read", region, *offset, *len, started.elapsed(), Some(path));
            }
        }
        Command::Write { region, offset, file, data } => {
            if let Some((mut opened, len)) = large_regular_file(file.as_deref(), PIECE_BYTES)? {
                // Sent a piece at a time, its length checked first (a stream is read whole, below).
                let space = region_in_range(&client, "write", region, *offset, len)?;
                let source = file.as_deref().map(|path| path.display().to_string()).unwrap_or_default();
                let started = Instant::now();
                stream_write_file("write", &mut opened, &source, len, PIECE_BYTES, 1, |position, piece| {
                    client.write(space, *offset + position, piece).map_err(text)
                })?;
                report_transfer(cli.json, "wrote", region, *offset, len, started.elapsed(), None);
                return Ok(());
            }
            let info = client.region(region).map_err(|error| error.to_string())?;
            let room = info.size_bytes.saturating_sub(*offset);
            let past_end = |len: u64| check_region_range("write", info, *offset, len).err().unwrap_or_default();
            let bytes = input_bytes("write", file.as_deref(), data.as_deref(), room, past_end)?;
            let space = region_in_range(&client, "write", region, *offset, bytes.len() as u64)?;
            let started = Instant::now();
            client.write(space, *offset, &bytes).map_err(text)?;
            report_transfer(cli.json, "wrote", region, *offset, bytes.len() as u64, started.elapsed(), None);
        }
        Command::Cas { region, offset, expected, desired } => {
            let space = word_in_range(&client, "cas", region, *offset)?;
            let old = client.cas(space, *offset, *expected, *desired).map_err(text)?;
            let swapped = old == *expected;
            if cli.json {
                println!("{}", json!({"old": old, "swapped": swapped}));
            } else {
                println!("old value {old} ({old:#x}); {}", if swapped { "swapped" } else { "not swapped" });
            }
        }
        Command::FetchAdd { region, offset, addend } => {
            let space = word_in_range(&client, "fetch-add", region, *offset)?;
            let old = client.fetch_add(space, *offset, *addend).map_err(text)?;
            let new = old.wrapping_add(*addend);
            if cli.json {
                println!("{}", json!({"old": old, "new": new}));
            } else {
                println!("old value {old}, new value {new}");
            }
        }
        Command::Vadd { region, offset, values, lane, return_result } => {
            let (lane_type, lanes) = encode_lanes(values, *lane)?;
            // Many lanes go as several VADDs: one past the end would be refused after the
            // others had added.
            let space = region_in_range(&client, "vadd", region, *offset, lanes.len() as u64)?;
            let result = client.vadd(space, *offset, lane_type, &lanes, *return_result).map_err(text)?;
            let count = lanes.len() / lane_type.lane_bytes();
            let values = decode_lanes(&result, *lane);
            if cli.json {
                let values: Vec<serde_json::Value> = values.into_iter().map(LaneValue::json).collect();
                println!("{}", json!({"lanes": count, "result": values}));
            } else if *return_result {
                println!("{}", values.iter().map(LaneValue::to_string).collect::<Vec<_>>().join(","));
            } else {
                println!("added {count} {} lanes at {offset}", lane.name());
            }
        }
        Command::Crc { region, offset, len } => {
            let space = region_in_range(&client, "crc", region, *offset, *len)?;
            let crc = client.crc32(space, *offset, u32_length(*len, "CRC")?).map_err(text)?;
            if cli.json {
                println!("{}", json!({"crc32": crc}));
            } else {
                println!("crc32 {crc:#010x}");
            }
        }
        Command::Allreduce { region, offset, workers, lane, op, prepare, file, out, timeout_seconds } => {
            let space = region_id(&client, region)?;
            let lane_type = lane.lane_type();
            let op = match op {
                Combine::Sum => AllreduceOp::Sum,
                Combine::Max => AllreduceOp::Max,
            };
            if let Some(len) = prepare {
                let len = usize::try_from(*len).map_err(|_| format!("--prepare {len}: too large"))?;
                let plan = AllreducePlan::new(&client, space, *offset, *workers, len, lane_type, op)
                    .map_err(|error| error.to_string())?;
                allreduce::prepare(&mut client, &plan).map_err(|error| error.to_string())?;
                if cli.json {
                    println!("{}", json!({"prepared_bytes": plan.area_bytes(), "chunks": plan.chunk_count()}));
                } else {
                    println!("prepared {} bytes at {offset} for {workers} workers", plan.area_bytes());
                }
                return Ok(());
            }
            let path = file.as_ref().ok_or("give --file with this worker's buffer")?;
            let buffer = std::fs::read(path).map_err(|error| format!("cannot read {}: {error}", path.display()))?;
            let plan = AllreducePlan::new(&client, space, *offset, *workers, buffer.len(), lane_type, op)
                .map_err(|error| error.to_string())?;
            let timeout = std::time::Duration::try_from_secs_f64(*timeout_seconds)
                .map_err(|_| format!("--timeout-seconds {timeout_seconds}: not a duration"))?;
            let mut result = vec![0u8; buffer.len()];
            let started = Instant::now();
            allreduce::allreduce(&mut client, &plan, &buffer, &mut result, timeout)
                .map_err(|error| error.to_string())?;
            let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
            if let Some(out) = out {
                std::fs::write(out, &result).map_err(|error| format!("cannot write {}: {error}", out.display()))?;
            }
            if cli.json {
                println!(
                    "{}",
                    json!({"bytes": buffer.len(), "workers": workers, "chunks": plan.chunk_count(), "elapsed_ms": elapsed_ms})
                );
            } else {
                println!("reduced {} bytes of {workers} workers in {elapsed_ms:.1} ms", buffer.len());
            }
        }
        Command::Reduce { region, offset, len, lane, op } => {
            let lane_bytes = lane.lane_type().lane_bytes() as u64;
            if *len == 0 || !len.is_multiple_of(lane_bytes) {
                return Err(format!("reduce of {len} bytes: give a whole number of {} lanes ({lane_bytes} bytes each), at least one; nothing was sent", lane.name()));
            }
            let space = region_in_range(&client, "reduce", region, *offset, *len)?;
            let reduce_op = match op {
                Reduction::Sum => ReduceOp::Sum,
                Reduction::Min => ReduceOp::Min,
                Reduction::Max => ReduceOp::Max,
            };
            let value = client.reduce(space, *offset, *len, lane.lane_type(), reduce_op).map_err(text)?;
            if cli.json {
                let value = match value {
                    ReduceValue::Integer(value) => json!(value),
                    ReduceValue::Float(value) => json!(value),
                };
                println!("{}", json!({"op": format!("{op:?}").to_lowercase(), "lane": lane.name(), "value": value}));
            } else {
                println!("{} of {} lanes: {value}", format!("{op:?}").to_lowercase(), lane.name());
            }
        }
        Command::Fill { region, offset, len, byte } => {
            let space = region_in_range(&client, "fill", region, *offset, *len)?;
            let value = u8::try_from(*byte).map_err(|_| format!("fill byte {byte} is over 255"))?;
            client.fill(space, *offset, u32_length(*len, "fill")?, value).map_err(text)?;
            if cli.json {
                println!("{}", json!({"filled": len}));
            } else {
                println!("filled {len} bytes with {value:#04x}");
            }
        }
        Command::Encrypt { region, offset, len, crypto } => {
            let space = crypto_region_in_range(&client, "encrypt", region, *offset, *len)?;
            crypto_length("encrypt", *len)?;
            let destination = crypto_destination(&client, "encrypt", crypto, *len)?;
            let length = u32_length(*len, "encrypt")?;
            let seal = client
                .encrypt(space, *offset, length, crypto.slot, destination, crypto.aad.as_bytes())
                .map_err(text)?;
            let hex = hex_string(&seal.to_bytes());
            if cli.json {
                println!(
                    "{}",
                    json!({"encrypted": len, "seal": hex, "key_version": seal.nonce.key_version, "nonce_counter": seal.nonce.counter})
                );
            } else {
                println!("encrypted {len} bytes with key slot {} version {}", crypto.slot, seal.nonce.key_version);
                println!("seal {hex}");
            }
        }
        Command::Decrypt { region, offset, len, seal, crypto } => {
            let space = crypto_region_in_range(&client, "decrypt", region, *offset, *len)?;
            crypto_length("decrypt", *len)?;
            let destination = crypto_destination(&client, "decrypt", crypto, *len)?;
            let bytes = parse_hex(seal).ok_or_else(|| format!("--seal {seal:?} is not hex"))?;
            let seal = Seal::from_bytes(&bytes)
                .ok_or_else(|| format!("--seal must be {} hex digits, not {}", 2 * SEAL_LEN, seal.len()))?;
            let length = u32_length(*len, "decrypt")?;
            client
                .decrypt(space, *offset, length, crypto.slot, &seal, destination, crypto.aad.as_bytes())
                .map_err(text)?;
            if cli.json {
                println!("{}", json!({"decrypted": len}));
            } else {
                println!("decrypted {len} bytes");
            }
        }
        Command::Memcpy { region, offset, source_region, source_offset, len } => {
            let space = region_in_range(&client, "memcpy", region, *offset, *len)?;
            let source = region_in_range(&client, "memcpy source", source_region, *source_offset, *len)?;
            client.memcpy(space, *offset, source, *source_offset, u32_length(*len, "copy")?).map_err(text)?;
            if cli.json {
                println!("{}", json!({"copied": len}));
            } else {
                println!("copied {len} bytes");
            }
        }
        Command::Nbd { .. } => unreachable!("served above, without a blocking client"),
        Command::Top { .. } => unreachable!("shown above, without a client"),
    }
    Ok(())
}

/// The (region, offset) of --to-region and --to-offset, if given, once the `len` bytes of the
/// result are known to fit there.
fn crypto_destination(
    client: &Client,
    command: &str,
    crypto: &CryptoArgs,
    len: u64,
) -> Result<Option<(u16, u64)>, String> {
    let command = format!("{command} --to-region");
    crypto
        .to_region
        .as_ref()
        .map(|region| Ok((crypto_region_in_range(client, &command, region, crypto.to_offset, len)?, crypto.to_offset)))
        .transpose()
}

fn hex_string(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn parse_hex(text: &str) -> Option<Vec<u8>> {
    let text = text.trim();
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len()).step_by(2).map(|at| u8::from_str_radix(&text[at..at + 2], 16).ok()).collect()
}

/// `--metrics` as a URL: `HOST:PORT` (as `--metrics-listen` takes it) is read as
/// `http://HOST:PORT/metrics`; any other scheme than `http` is refused by name.
fn metrics_url(given: &str) -> Result<String, String> {
    match given.split_once("://") {
        Some(("http", _)) => Ok(given.to_string()),
        Some((scheme, _)) => Err(format!(
            "--metrics {given}: the metrics endpoint speaks plain http, not {scheme} (http://HOST:PORT/metrics)"
        )),
        None if given.contains('/') => Ok(format!("http://{given}")),
        None => Ok(format!("http://{given}/metrics")),
    }
}

/// One scrape of `url`.
fn scrape(url: &str) -> Result<Snapshot, String> {
    let (code, _, body) = netdam_metrics::http::get(url, None, std::time::Duration::from_secs(5)).map_err(|error| {
        format!("cannot read {url}: {error} (is the target running with metrics on? see --metrics)")
    })?;
    if code != 200 {
        return Err(format!("{url} answered HTTP {code}"));
    }
    Snapshot::parse(&body).map_err(|error| format!("{url}: {error}"))
}

/// `netdam top`: scrapes every interval and shows what changed since the last scrape.
fn top(url: &str, interval: std::time::Duration, once: bool, json_out: bool) -> Result<(), String> {
    let url = &metrics_url(url)?;
    let mut earlier = scrape(url)?;
    let mut taken = Instant::now();
    loop {
        std::thread::sleep(interval.saturating_sub(taken.elapsed()));
        let later = scrape(url)?;
        let now = Instant::now();
        let view = View::between(&earlier, &later, now - taken);
        if json_out {
            println!("{}", view.to_json(url));
        } else {
            // Clear the screen and draw from its top, like top(1).
            let clear = if once { "" } else { "\x1b[2J\x1b[H" };
            print!("{clear}{}", view.to_text(url));
        }
        let _ = std::io::stdout().flush();
        if once {
            return Ok(());
        }
        earlier = later;
        taken = now;
    }
}

/// Where `netdam nbd` reports: metrics and logs.
#[derive(Debug, Clone, Copy)]
struct Observe {
    metrics_listen: MetricsListen,
    log_format: LogFormat,
}

/// The tenant key to use (`--key`, `NETDAM_KEY`, or the default tenant's key file), if any.
fn credentials(cli: &Cli) -> Result<Option<netdam_auth::Credentials>, String> {
    netdam_initiator::keys::resolve(cli.key.as_deref()).map_err(|error| format!("--key: {error}"))
}

/// How long a one-shot command's request is retried through a silent or restarting target.
const COMMAND_PATIENCE: netdam_isa::Duration = netdam_isa::Duration::from_millis(30_000);

/// How long a one-shot command refused a session for want of a slot asks again
/// (`SessionConfig::session_wait`): a hundred commands started at once from one host take
/// turns for its share (32 on each worker by default) instead of a third of them failing.
const COMMAND_SESSION_WAIT: netdam_isa::Duration = netdam_isa::Duration::from_millis(5_000);

/// The export's client settings: a request keeps being retried for `reconnect_timeout` after
/// its first transmission, through silence and through refusals, so that a target restart
/// shorter than that stalls the export's clients instead of failing their I/O.
fn nbd_client_options(reconnect_timeout: std::time::Duration) -> ClientOptions {
    let mut client = ClientOptions::default();
    let patience = netdam_isa::Duration::from_nanos(reconnect_timeout.as_nanos().min(u64::MAX as u128) as u64);
    client.session.min_patience = patience;
    client.session.reconnect_patience = patience;
    // A target that keeps saying a request is in progress (a device that never completes) does
    // not hold it longer than that either.
    client.session.max_in_progress_wait = patience;
    client
}

/// How long a stopping export waits for its sessions to close after the drain.
const SESSIONS_CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// `netdam nbd`: opens the volume, listens, serves until SIGINT, SIGTERM or SIGHUP, drains.
fn serve_nbd(
    target: SocketAddr,
    namespace: &str,
    listen: &Listen,
    options: ExportOptions,
    volume_options: VolumeOptions,
    io_threads: usize,
    observe: Observe,
) -> Result<(), String> {
    // A server must outlive clients that hang up: a write to a closed connection is an error
    // for that connection (EPIPE), not a signal that ends the process (main restored SIGPIPE's
    // default for the one-shot commands).
    // SAFETY: changing a signal disposition before any thread of ours starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    netdam_metrics::logging::init(observe.log_format);
    let metrics = Arc::new(InitiatorMetrics::default());
    // Bound before the volume opens, so a taken port is reported before anything else.
    let metrics_server = match observe.metrics_listen.addr() {
        Some(addr) => Some(
            MetricsServer::start(addr, InitiatorMetrics::registry(metrics.clone()), "netdam-metrics")
                .map_err(|error| format!("cannot serve /metrics on {addr} (--metrics-listen): {error}"))?,
        ),
        None => None,
    };
    let metrics_url = metrics_server.as_ref().map_or("off".to_string(), MetricsServer::url);
    let mut builder = match io_threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        threads => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(threads);
            builder
        }
    };
    let runtime = builder.enable_all().build().map_err(|error| format!("cannot start the I/O runtime: {error}"))?;
    runtime.block_on(async {
        let observed = metrics_server.is_some().then(|| metrics.clone());
        // By name: a target restarted with its spaces renumbered is served on (see the type).
        let named =
            VolumeByName::open(target, namespace, volume_options, observed).await.map_err(|error| error.to_string())?;
        let volume = named.current();
        // Taken over before the socket exists: a stop signal from here on drains (and removes
        // the socket) rather than killing the process. Until here nothing needed a drain.
        let mut signals = StopSignals::install();
        // The error already says "cannot listen on" the address (or what it found there).
        let listener = NbdListener::bind(listen).map_err(|error| format!("{error} (--listen)"))?;
        let endpoint = listener.endpoint().unwrap_or_else(|| listen.clone());
        tracing::info!(
            target = %target,
            namespace = %volume.namespace().name,
            export = %options.name,
            listen = %endpoint,
            metrics = %metrics_url,
            sessions = volume.session_count(),
            io_threads,
            read_only = options.read_only,
            max_connections = options.max_connections,
            "exporting namespace {:?} of {target} ({} bytes in {}-byte blocks, {} session(s)) as {:?} on {endpoint}{}",
            volume.namespace().name,
            volume.size_bytes(),
            volume.block_bytes(),
            volume.session_count(),
            options.name,
            if options.read_only { ", read-only" } else { "" }
        );
        let drain_timeout = options.drain_timeout;
        let shutdown = async move {
            let name = signals.first().await;
            tracing::info!(
                "stopping ({name}): finishing the requests in flight for at most {}s (then {}s at most to close \
                 the sessions); another SIGINT or SIGTERM stops at once",
                drain_timeout.as_secs(),
                SESSIONS_CLOSE_WAIT.as_secs()
            );
            // A second SIGINT or SIGTERM ends the drain: whoever sends it has chosen not to wait.
            // Not a second SIGHUP: a closed terminal may send more than one.
            tokio::spawn(async move {
                let name = signals.again().await;
                tracing::warn!("stopped by a second {name} before the requests in flight finished");
                std::process::exit(1);
            });
        };
        drop(volume);
        let volume = Arc::new(named);
        let backend = Arc::new(ObservedBackend::new(volume.clone(), metrics.clone()));
        let report = serve_counting(listener, backend, options, shutdown, &metrics.nbd.connections)
            .await
            .map_err(|error| error.to_string())?;
        // The export is done with it: close the sessions before the runtime goes, but not at
        // any cost. A session closes once what it has in flight is answered, and a request the
        // drain cut (its caller gone) may wait for a target that is away until its patience
        // runs out; the target expires what is left open.
        if let Ok(volume) = Arc::try_unwrap(volume) {
            if tokio::time::timeout(SESSIONS_CLOSE_WAIT, volume.close()).await.is_err() {
                tracing::warn!(
                    "sessions still busy {}s after the export stopped were left open (the target expires them)",
                    SESSIONS_CLOSE_WAIT.as_secs()
                );
            }
        }
        tracing::info!(
            connections = report.connections,
            requests = report.requests,
            request_errors = report.request_errors,
            refused_at_shutdown = report.refused_at_shutdown,
            connection_errors = report.connection_errors,
            "stopped"
        );
        Ok(())
    })
}

/// The signals that stop `netdam nbd`: SIGINT, SIGTERM and SIGHUP (a closed terminal, as the
/// target takes it), each unless it was ignored when the export started (`nohup` ignores SIGHUP;
/// a job started in the background by a non-interactive shell ignores SIGINT): such a signal
/// keeps being ignored. Installed once, so that no signal falls between two waits.
struct StopSignals {
    interrupt: Option<tokio::signal::unix::Signal>,
    terminate: Option<tokio::signal::unix::Signal>,
    hangup: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    fn install() -> StopSignals {
        use tokio::signal::unix::{signal, SignalKind};
        let taken =
            |number: libc::c_int, kind: SignalKind| (!signal_ignored(number)).then(|| signal(kind).ok()).flatten();
        StopSignals {
            interrupt: taken(libc::SIGINT, SignalKind::interrupt()),
            terminate: taken(libc::SIGTERM, SignalKind::terminate()),
            hangup: taken(libc::SIGHUP, SignalKind::hangup()),
        }
    }

    /// Waits for the first stop signal and names it.
    async fn first(&mut self) -> &'static str {
        tokio::select! {
            _ = next(&mut self.interrupt) => "SIGINT",
            _ = next(&mut self.terminate) => "SIGTERM",
            _ = next(&mut self.hangup) => "SIGHUP",
        }
    }

    /// Waits for a SIGINT or SIGTERM after the first signal.
    async fn again(&mut self) -> &'static str {
        tokio::select! {
            _ = next(&mut self.interrupt) => "SIGINT",
            _ = next(&mut self.terminate) => "SIGTERM",
        }
    }
}

/// The next delivery of `signal`; never, for a signal not taken.
async fn next(signal: &mut Option<tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}

/// Whether `signal` was set to be ignored when this process started (by `nohup`, a shell).
fn signal_ignored(signal: libc::c_int) -> bool {
    // SAFETY: a query (null new action) into a zeroed, valid sigaction.
    unsafe {
        let mut old = std::mem::zeroed::<libc::sigaction>();
        libc::sigaction(signal, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// The port a target serves /metrics on unless its `metrics_listen` says otherwise.
const DEFAULT_METRICS_PORT: u16 = 9464;

/// Where `netdam top` looks for the /metrics of a target at `target` by default: a target on
/// this machine (an address of its own) serves them on 127.0.0.1 unless its `metrics_listen`
/// says otherwise; another machine's on its own address, which its `metrics_listen` must name.
fn metrics_host(target: std::net::IpAddr) -> std::net::IpAddr {
    let local = target.is_loopback()
        || target.is_unspecified()
        || std::net::UdpSocket::bind(SocketAddr::new(target, 0)).is_ok();
    if local {
        std::net::IpAddr::from([127, 0, 0, 1])
    } else {
        target
    }
}

/// One `netdam ping` answer as printed: a line of text, or a JSON object (`json_out`). The
/// queueing field saturates at its ceiling (docs/PROTOCOL.md), where the wait was at least that
/// long: the text says `≥`, and the JSON's `queueing_saturated` is true beside the number.
fn ping_report(target: SocketAddr, header: &Header, rtt_us: f64, attempts: u32, json_out: bool) -> String {
    let service_us = f64::from(header.service_time_ns) / 1e3;
    let queueing_us = header.queueing_us;
    let queueing_saturated = queueing_us == u16::MAX;
    if json_out {
        return json!({"target": target.to_string(), "rtt_us": rtt_us, "service_time_us": service_us,
                      "queueing_us": queueing_us, "queueing_saturated": queueing_saturated,
                      "queue_depth": header.queue_depth, "received_ttl": header.ttl, "attempts": attempts})
        .to_string();
    }
    // 0: the target did not read it (a busy worker serving lone requests).
    let ttl = if header.ttl == 0 { "unknown".to_string() } else { header.ttl.to_string() };
    let at_least = if queueing_saturated { "≥ " } else { "" };
    format!(
        "reply from {target}: rtt {rtt_us:.1} µs, target service {service_us:.1} µs (queued {at_least}{queueing_us} µs), \
         queue depth {}, received ttl {ttl}",
        header.queue_depth
    )
}

fn report_transfer(
    json_out: bool,
    verb: &str,
    region: &str,
    offset: u64,
    len: u64,
    elapsed: std::time::Duration,
    path: Option<&std::path::Path>,
) {
    let mib_per_s = len as f64 / (1 << 20) as f64 / elapsed.as_secs_f64().max(1e-9);
    if json_out {
        println!(
            "{}",
            json!({"region": region, "offset": offset, "length": len, "seconds": elapsed.as_secs_f64(), "file": path.map(|p| p.display().to_string())})
        );
    } else {
        let into = path.map(|p| format!(" into {}", p.display())).unwrap_or_default();
        println!(
            "{verb} {len} bytes at {offset} of region {region}{into} in {:.3} s ({mib_per_s:.1} MiB/s)",
            elapsed.as_secs_f64()
        );
    }
}

/// The refusal of a `bwrite` input that is not whole blocks, without --pad.
fn not_whole_blocks(len: u64, block: u64) -> String {
    format!(
        "the input is {len} bytes, not a whole number of {block}-byte blocks: pass --pad to zero-fill the last block"
    )
}

/// The bytes a `write` or `bwrite` sends: FILE, else --data, else stdin. An empty input is
/// refused by its source: a write of nothing is almost always an empty file or a forgotten
/// pipe, and succeeding silently would hide it. At most `room` bytes fit where they go: a
/// regular file longer than that is refused by its length before it is read (`past_end(len)`
/// is the range check's refusal), and a stream (a pipe, a device) is read no further than one
/// byte past `room`; where even that is more than memory holds, the growing buffer is refused
/// with an error instead of aborting.
fn input_bytes(
    command: &str,
    file: Option<&std::path::Path>,
    data: Option<&str>,
    room: u64,
    past_end: impl Fn(u64) -> String,
) -> Result<Vec<u8>, String> {
    // Read in pieces into a buffer grown with `try_reserve`, so that an input larger than this
    // machine's memory (a device, a namespace larger than RAM) is an error, not an abort.
    let bounded = |reader: &mut dyn Read, source: &str, expected: u64| -> Result<Vec<u8>, String> {
        let too_large = |len: usize| {
            format!("{command}: cannot hold {source} in memory here ({len} bytes read); write less at a time")
        };
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(usize::try_from(expected).unwrap_or(usize::MAX)).map_err(|_| too_large(0))?;
        let mut piece = vec![0u8; 1 << 16];
        let mut limited = reader.take(room.saturating_add(1));
        loop {
            let read = match limited.read(&mut piece) {
                Ok(0) => break,
                Ok(read) => read,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(format!("reading {source}: {error}")),
            };
            bytes.try_reserve(read).map_err(|_| too_large(bytes.len()))?;
            bytes.extend_from_slice(&piece[..read]);
        }
        if bytes.len() as u64 > room {
            return Err(format!(
                "{} ({source} holds more still: it was read no further)",
                past_end(bytes.len() as u64)
            ));
        }
        Ok(bytes)
    };
    let (bytes, empty) = match (file, data) {
        (Some(path), _) => {
            let source = path.display().to_string();
            let mut opened = std::fs::File::open(path).map_err(|error| format!("reading {source}: {error}"))?;
            let metadata = opened.metadata().map_err(|error| format!("reading {source}: {error}"))?;
            if metadata.is_file() && metadata.len() > room {
                return Err(past_end(metadata.len()));
            }
            let expected = if metadata.is_file() { metadata.len() } else { 0 };
            (bounded(&mut opened, &source, expected)?, format!("{source} is empty"))
        }
        (None, Some(text)) => {
            if text.len() as u64 > room {
                return Err(past_end(text.len() as u64));
            }
            (text.as_bytes().to_vec(), "--data is empty".to_string())
        }
        (None, None) => (
            bounded(&mut std::io::stdin().lock(), "stdin", 0)?,
            "stdin gave no bytes (pass --file FILE or --data TEXT, or pipe the data in)".to_string(),
        ),
    };
    if bytes.is_empty() {
        return Err(format!("{command} of nothing: {empty}; nothing was written"));
    }
    Ok(bytes)
}

fn report_blocks(
    json_out: bool,
    verb: &str,
    namespace: &NamespaceInfo,
    lba: u64,
    len: u64,
    elapsed: std::time::Duration,
    path: Option<&std::path::Path>,
) {
    let blocks = len / u64::from(namespace.block_bytes);
    let mib_per_s = len as f64 / (1 << 20) as f64 / elapsed.as_secs_f64().max(1e-9);
    if json_out {
        println!(
            "{}",
            json!({"namespace": namespace.name, "lba": lba, "blocks": blocks, "bytes": len, "seconds": elapsed.as_secs_f64(), "file": path.map(|p| p.display().to_string())})
        );
    } else {
        let into = path.map(|p| format!(" into {}", p.display())).unwrap_or_default();
        println!(
            "{verb} {blocks} blocks ({len} bytes) at block {lba} of namespace {}{into} in {:.3} s ({mib_per_s:.1} MiB/s)",
            namespace.name,
            elapsed.as_secs_f64()
        );
    }
}

fn encode_lanes(values: &str, lane: Lane) -> Result<(LaneType, Vec<u8>), String> {
    let mut bytes = Vec::new();
    for (index, value) in values.split(',').map(str::trim).enumerate() {
        if value.is_empty() {
            // Skipping it would shift every later value into the lane before its own.
            return Err(format!("lane {index} is empty in {values:?}: give a value for every lane, e.g. 1.5,0,-3"));
        }
        let bad = |error: &dyn std::fmt::Display| format!("lane {index} ({value:?}): {error}");
        // A finite number too large for the lane parses as infinity: refused rather than added.
        let finite_or_spelled = |parsed: f32| {
            if parsed.is_infinite() && !value.to_ascii_lowercase().contains("inf") {
                Err(bad(&format!("out of the {lane:?} range (largest {:e})", f32::MAX)))
            } else {
                Ok(parsed)
            }
        };
        match lane {
            Lane::F32 => {
                let parsed = finite_or_spelled(value.parse::<f32>().map_err(|e| bad(&e))?)?;
                bytes.extend(parsed.to_le_bytes())
            }
            Lane::I32 => bytes.extend(value.parse::<i32>().map_err(|e| bad(&e))?.to_le_bytes()),
            Lane::Bf16 => {
                let parsed = finite_or_spelled(value.parse::<f32>().map_err(|e| bad(&e))?)?;
                let lane_value = netdam_isa::semantics::f32_to_bf16(parsed);
                finite_or_spelled(netdam_isa::semantics::bf16_to_f32(lane_value))?;
                bytes.extend(lane_value.to_le_bytes());
            }
        }
    }
    Ok((lane.lane_type(), bytes))
}

/// One lane's value as a VADD answer carries it back.
#[derive(Debug, Clone, Copy)]
enum LaneValue {
    Int(i32),
    Float(f32),
}

impl LaneValue {
    /// As JSON, which has no NaN or infinities: those are `null`.
    fn json(self) -> serde_json::Value {
        match self {
            LaneValue::Int(value) => json!(value),
            LaneValue::Float(value) => json!(value),
        }
    }
}

impl std::fmt::Display for LaneValue {
    /// As Rust writes numbers, so NaN and infinities show as such.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LaneValue::Int(value) => write!(f, "{value}"),
            LaneValue::Float(value) => write!(f, "{value}"),
        }
    }
}

fn decode_lanes(bytes: &[u8], lane: Lane) -> Vec<LaneValue> {
    let word = |c: &[u8]| [c[0], c[1], c[2], c[3]];
    match lane {
        Lane::F32 => bytes.chunks_exact(4).map(|c| LaneValue::Float(f32::from_le_bytes(word(c)))).collect(),
        Lane::I32 => bytes.chunks_exact(4).map(|c| LaneValue::Int(i32::from_le_bytes(word(c)))).collect(),
        Lane::Bf16 => bytes
            .chunks_exact(2)
            .map(|c| LaneValue::Float(netdam_isa::semantics::bf16_to_f32(u16::from_le_bytes([c[0], c[1]]))))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `netdam top` looks on 127.0.0.1 for a target on this machine, however it is addressed,
    /// and on the target's host for one elsewhere.
    #[test]
    fn top_looks_for_metrics_where_the_target_serves_them() {
        let loopback = std::net::IpAddr::from([127, 0, 0, 1]);
        for local in ["127.0.0.3", "::1", "0.0.0.0"] {
            assert_eq!(metrics_host(local.parse().unwrap()), loopback, "{local}");
        }
        // TEST-NET-1: an address of no machine here.
        let remote: std::net::IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(metrics_host(remote), remote);
    }

    /// A queueing field at its ceiling (65535 µs) is a wait at least that long: shown as such,
    /// where it read as an exact 65535 µs; below it, as the number it is.
    #[test]
    fn a_ping_queued_past_the_fields_ceiling_says_at_least() {
        let target: SocketAddr = "192.0.2.1:7800".parse().unwrap();
        let answer = |queueing_us| Header {
            ttl: 64,
            service_time_ns: 136_739_300,
            queue_depth: 2,
            queueing_us,
            ..Header::default()
        };
        let text = ping_report(target, &answer(u16::MAX), 137_000.0, 1, false);
        assert_eq!(
            text,
            "reply from 192.0.2.1:7800: rtt 137000.0 µs, target service 136739.3 µs (queued ≥ 65535 µs), queue depth \
             2, received ttl 64"
        );
        assert!(ping_report(target, &answer(65_534), 137_000.0, 1, false).contains("(queued 65534 µs)"));
        let json: serde_json::Value =
            serde_json::from_str(&ping_report(target, &answer(u16::MAX), 137_000.0, 1, true)).unwrap();
        assert_eq!((&json["queueing_us"], &json["queueing_saturated"]), (&json!(65535), &json!(true)), "{json}");
        let json: serde_json::Value =
            serde_json::from_str(&ping_report(target, &answer(120), 137_000.0, 1, true)).unwrap();
        assert_eq!((&json["queueing_us"], &json["queueing_saturated"]), (&json!(120), &json!(false)), "{json}");
    }

    /// The most one instruction addresses is 4294967295 bytes, one short of 4 GiB: a length of
    /// exactly 4 GiB is refused saying so, not as "over the 4 GiB".
    #[test]
    fn an_instruction_length_past_32_bits_is_refused_naming_the_largest() {
        assert_eq!(u32_length(u64::from(u32::MAX), "CRC"), Ok(u32::MAX));
        assert_eq!(
            u32_length(1 << 32, "CRC"),
            Err("CRC of 4294967296 bytes is more than the 4294967295 bytes (4 GiB - 1) one instruction can \
                 address; nothing was sent"
                .to_string())
        );
    }
}
