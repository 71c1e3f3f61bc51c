//! `netdam-target`: the storage target daemon.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::{Args, Parser, Subcommand};
use netdam_pmem::{Backing, Durability};
use netdam_target::{Config, PollMode, Target};

/// A disaggregated storage target with low, deterministic latency: memory regions served over
/// UDP with the NetDAM instruction set (read, write, atomics, memcpy, fill, vector add, CRC).
///
/// With no arguments it serves a persistent 64 MiB region named "default", kept in a file under
/// the user's data directory, on 127.0.0.1:7800.
#[derive(Debug, Parser)]
#[command(name = "netdam-target", version, propagate_version = true)]
struct Cli {
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
}

/// Settings: a TOML file, then flags that override it.
#[derive(Debug, Args, Default, Clone)]
struct SettingsArgs {
    /// TOML file with settings (listen, data_dir, workers, poll, adaptive_spin_us,
    /// max_datagram_bytes, and [[region]] tables with name, backend = mem|file|dax, path, size).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// UDP address to serve on [default: 127.0.0.1:7800].
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
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
}

impl SettingsArgs {
    fn merged_over(self, base: SettingsArgs) -> SettingsArgs {
        SettingsArgs {
            config: self.config.or(base.config),
            listen: self.listen.or(base.listen),
            data_dir: self.data_dir.or(base.data_dir),
            workers: self.workers.or(base.workers),
            poll: self.poll.or(base.poll),
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
        if let Some(dir) = &self.data_dir {
            config.data_dir = Some(dir.clone());
        }
        if let Some(workers) = self.workers {
            config.workers = workers;
        }
        if let Some(poll) = self.poll {
            config.poll = poll;
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
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("NETDAM_LOG").unwrap_or_else(|_| "info".into()))
        .init();
    let cli = Cli::parse();
    let (serve, settings) = match cli.command {
        None => (true, cli.settings),
        Some(Command::Serve(args)) => (true, args.merged_over(cli.settings)),
        Some(Command::Config(args)) => (false, args.merged_over(cli.settings)),
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

fn print_banner(target: &Target, config: &Config) {
    let addr = target.local_addr();
    let poll = format!("{:?}", config.poll).to_lowercase();
    println!(
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
        println!("  region {id} {:?}: {} bytes, {durability}, {backing}, {locked}", region.name(), region.len());
    }
    println!("Reach it with:  netdam --target {addr} stat");
    println!("Stop with Ctrl-C.");
}
