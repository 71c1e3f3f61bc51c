//! `netdam-fpga-model`: the software FPGA as a separate process over a shared window file.
//!
//! Creates the window file (beside `--window`, then renamed into place, so a host that sees the
//! file sees a powered-on device), listens on `<window>.irq` for the eventfds of hosts that want
//! its completion interrupt, and runs the device loop until killed or until the window file is
//! removed.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::Parser;
use netdam_fpga::model::{self, Faults, Model, ModelConfig, NamespaceBacking};
use netdam_fpga::window::{FileWindow, Window};

/// The netdam FPGA device model: the ISA engine over its own on-board memory and an NVMe
/// controller in front of an SSD model, over a window file a netdam target maps
/// (`--engine fpga=WINDOW`). Hosts that want its completion interrupt hand it an eventfd on the
/// Unix socket `WINDOW.irq`.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Window file to create (replaced if it exists).
    #[arg(long)]
    window: PathBuf,
    /// Bytes of the host-memory area (rings and data slots).
    #[arg(long, default_value_t = 1 << 20)]
    host_area_bytes: u64,
    /// Bytes of on-board memory.
    #[arg(long, default_value_t = 1 << 20)]
    device_memory_bytes: u64,
    /// Delay of each pipeline stage (fetch, execute, complete), in nanoseconds.
    #[arg(long, default_value_t = 0)]
    stage_latency_ns: u64,
    /// Complete descriptor N (0 = first since power-on) with io_error.
    #[arg(long)]
    error_at: Option<u64>,
    /// Stall before descriptor N.
    #[arg(long)]
    stall_at: Option<u64>,
    /// Reset the device before descriptor N.
    #[arg(long)]
    reset_at: Option<u64>,
    /// The SSD fails NVMe command N (0 = its first) with a media error.
    #[arg(long)]
    media_error_at: Option<u64>,
    /// A file the SSD behind the NVMe controller serves as namespace 1 (its length is the
    /// capacity); without it the device has no NVMe.
    #[arg(long)]
    namespace: Option<PathBuf>,
    /// Block size of that namespace, in bytes.
    #[arg(long, default_value_t = 512)]
    block_bytes: u32,
    /// Poll the rings without ever napping, as a card does: answers come within one polling
    /// pass instead of up to 50 µs after an idle spell, and the model takes a whole core
    /// (for measuring the ring crossing; see `netdam-bench latency --engine`).
    #[arg(long)]
    spin: bool,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let config = ModelConfig {
        host_area_bytes: args.host_area_bytes,
        device_memory_bytes: args.device_memory_bytes,
        stage_latency: std::time::Duration::from_nanos(args.stage_latency_ns),
        faults: Faults {
            error_at: args.error_at,
            stall_at: args.stall_at,
            reset_at: args.reset_at,
            media_error_at: args.media_error_at,
            deaf_to_reset: false,
        },
        namespace: args.namespace.map(|path| NamespaceBacking { path, block_bytes: args.block_bytes }),
        spin: args.spin,
    };
    let mut staging = args.window.clone().into_os_string();
    staging.push(".creating");
    let staging = PathBuf::from(staging);
    let Ok(window_bytes) = usize::try_from(config.window_bytes()) else {
        eprintln!("netdam-fpga-model: a window of {} bytes cannot be mapped here", config.window_bytes());
        return std::process::ExitCode::FAILURE;
    };
    let window = match FileWindow::create(&staging, window_bytes) {
        Ok(window) => Arc::new(window),
        Err(error) => {
            eprintln!("netdam-fpga-model: cannot create window {}: {error}", staging.display());
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut device = match Model::new(Arc::clone(&window) as Arc<dyn Window>, config.clone()) {
        Ok(device) => device,
        Err(error) => {
            let namespace = config.namespace.as_ref().map(|backing| backing.path.display().to_string());
            eprintln!("netdam-fpga-model: cannot open the namespace file {namespace:?}: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    model::power_on(&*window, &config);
    // The completion interrupt: hosts hand their eventfds over a socket beside the window.
    let irq = netdam_fpga::interrupt::socket_path(&args.window);
    match netdam_fpga::interrupt::serve(&irq) {
        Ok(line) => device = device.with_interrupts(line),
        Err(error) => eprintln!("netdam-fpga-model: no interrupts (cannot listen on {}): {error}", irq.display()),
    }
    if let Err(error) = std::fs::rename(&staging, &args.window) {
        eprintln!("netdam-fpga-model: cannot move {} to {}: {error}", staging.display(), args.window.display());
        return std::process::ExitCode::FAILURE;
    }
    eprintln!("netdam-fpga-model: window {} ready ({} bytes)", args.window.display(), window.len());
    // A model whose window file is gone serves no one: it stops, so one left behind by a test
    // run that was killed outright does not spin on forever.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher_stop = Arc::clone(&stop);
    let watched = args.window.clone();
    std::thread::spawn(move || {
        while watched.exists() {
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        eprintln!("netdam-fpga-model: window {} removed: stopping", watched.display());
        watcher_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    device.run(&stop);
    std::process::ExitCode::SUCCESS
}
