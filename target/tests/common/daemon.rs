//! A `netdam-target` process for tests that kill and restart it: run in a directory holding its
//! config file, its log appended to `target.log` there, serving once its banner is on stdout.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a start may take on a loaded machine before a test gives up on it.
pub const START_TIMEOUT: Duration = Duration::from_secs(180);

/// A running `netdam-target`, killed on drop.
pub struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Daemon {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Sends `signal` and waits up to `patience` for the process to exit; its exit status.
    pub fn signal_and_wait(mut self, signal: libc::c_int, patience: Duration) -> std::process::ExitStatus {
        // SAFETY: a signal to our own child, which has not been reaped (we hold it).
        assert_eq!(unsafe { libc::kill(self.0.id() as libc::pid_t, signal) }, 0, "kill({signal})");
        let deadline = Instant::now() + patience;
        loop {
            if let Some(status) = self.0.try_wait().expect("wait for netdam-target") {
                return status;
            }
            assert!(Instant::now() < deadline, "netdam-target still runs {patience:?} after signal {signal}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, and wait until the process is gone.
    pub fn kill(mut self) {
        self.0.kill().expect("SIGKILL netdam-target");
        self.0.wait().expect("reap netdam-target");
    }
}

/// `netdam-target` run in `dir`, with the logging settings of the environment removed.
pub fn target_command(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_netdam-target"));
    command.env_remove("NETDAM_LOG").env_remove("RUST_LOG").current_dir(dir);
    command
}

/// Spawns `netdam-target serve --config CONFIG` in `dir` without waiting for it.
pub fn spawn(dir: &Path, config: &str) -> Child {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("target.log")).unwrap();
    target_command(dir)
        .args(["serve", "--config", config])
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("netdam-target starts")
}

/// Starts the target and waits for its banner: the daemon, the address it serves on, and the
/// time from the spawn to serving.
pub fn start(dir: &Path, config: &str) -> (Daemon, SocketAddr, Duration) {
    let began = Instant::now();
    let mut child = spawn(dir, config);
    let stdout = child.stdout.take().unwrap();
    let daemon = Daemon(child);
    let (lines, banner) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let _ = reader.read_line(&mut line);
        let _ = lines.send(line);
        // Keep reading so that the target never blocks on a full pipe.
        std::io::copy(&mut reader, &mut std::io::sink()).ok();
    });
    let line = banner.recv_timeout(START_TIMEOUT).unwrap_or_default();
    let serving = began.elapsed();
    let Some(addr) = line.strip_prefix("netdam-target serving on ").and_then(|rest| rest.split(' ').next()) else {
        drop(daemon);
        let log = std::fs::read_to_string(dir.join("target.log")).unwrap_or_default();
        panic!("netdam-target did not start within {START_TIMEOUT:?}: stdout {line:?}, log:\n{log}");
    };
    (daemon, addr.parse().expect("the banner names an address"), serving)
}

/// Runs an administrative `netdam-target` command with `--config CONFIG` in `dir`; it must
/// succeed.
pub fn admin(dir: &Path, config: &str, args: &[&str]) {
    let output = target_command(dir).args(args).args(["--config", config]).output().unwrap();
    assert!(
        output.status.success(),
        "netdam-target {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
