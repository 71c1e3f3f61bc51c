//! Stopping a serving `netdam-target` (the binary) with SIGTERM, SIGINT or SIGHUP: it says which signal
//! it took, stops at once, and exits with success. Until then an idle target's threads sleep:
//! the main thread has nothing to do while the workers serve, and a worker with nothing to
//! receive sleeps in its receive until a datagram comes or the stop wakes it. A thread that woke
//! to look at a flag took, on a host whose cores spin (a busy worker, a polling initiator), one
//! of them for a while each time (docs/DECISIONS.md, "What preempts a spinning worker").

mod common;

use std::time::{Duration, Instant};

use common::daemon::start;

/// Context switches the thread `tid` of process `pid` asked for (it slept) so far.
fn voluntary_switches(pid: u32, tid: u32) -> u64 {
    let (voluntary, _) = netdam_target::stats::thread_context_switches(&pid.to_string(), tid)
        .expect("the thread's context switches in /proc");
    voluntary
}

/// The id of the thread of process `pid` named `name`, waiting up to 5 s for it: a thread takes
/// its name from inside, moments after it starts (after the banner, on a loaded machine).
fn thread_named(pid: u32, name: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let found = std::fs::read_dir(format!("/proc/{pid}/task"))
            .expect("the process's threads")
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .find(|tid| {
                std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).is_ok_and(|comm| comm.trim() == name)
            });
        match found {
            Some(tid) => return tid,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            None => panic!("no thread {name} in process {pid} after 5 s"),
        }
    }
}

#[test]
fn sigterm_and_sigint_stop_a_target_whose_main_thread_sleeps_until_then() {
    for (signal, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGINT, "SIGINT")] {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path();
        write_config(dir);
        let (daemon, _, _) = start(dir, "stop.toml");
        let pid = daemon.pid();
        // The main thread's id is the process id. Over a second of serving nothing it sleeps
        // once, not ten times (the 100 ms flag poll it replaced); a wake-up or two is slack.
        // The worker's receive times out once a second (a backstop), not every 100 ms as it did.
        let worker = thread_named(pid, "netdam-worker-0");
        let before = (voluntary_switches(pid, pid), voluntary_switches(pid, worker));
        std::thread::sleep(Duration::from_secs(1));
        let woke = voluntary_switches(pid, pid) - before.0;
        assert!(woke <= 2, "the main thread woke {woke} times in a second with nothing to do");
        let woke = voluntary_switches(pid, worker) - before.1;
        assert!(woke <= 2, "the idle worker woke {woke} times in a second");
        // The stop wakes the sleeping worker (here ~20 ms, the wait's own polling step) rather than waiting for its
        // receive's backstop. The worker's receive began as it started, just before the banner,
        // and times out a whole number of seconds later: half a second from now, a stop that
        // waited for it would take up to about 500 ms.
        std::thread::sleep(Duration::from_millis(500));
        let stopping = Instant::now();
        let status = daemon.signal_and_wait(signal, Duration::from_secs(60));
        let took = stopping.elapsed();
        assert!(
            took < Duration::from_millis(250),
            "{name}: the stop took {took:?}: it waited for the worker's receive to time out"
        );
        let log = std::fs::read_to_string(dir.join("target.log")).unwrap_or_default();
        assert!(status.success(), "{name}: exit {status:?}, log:\n{log}");
        assert!(log.contains(&format!("netdam-target: stopping ({name})")), "{name}: log:\n{log}");
    }
}

/// A small serving configuration in `dir`, as `stop.toml`.
fn write_config(dir: &std::path::Path) {
    std::fs::write(
        dir.join("stop.toml"),
        "listen = \"127.0.0.1:0\"\nmetrics_listen = \"off\"\ndata_dir = \".\"\nworkers = 1\npoll = \"blocking\"\n\
         pin_workers = false\nlock_memory = false\nauth = \"none\"\n\
         [[region]]\nname = \"scratch\"\nbackend = \"mem\"\nsize = \"1MiB\"\n",
    )
    .unwrap();
}

/// SIGHUP (the terminal closing, an ssh session that ends) stops a target as SIGTERM does, with
/// its line in the log: it used to end the process unannounced.
#[test]
fn sighup_stops_a_target_with_a_word() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path();
    write_config(dir);
    let (daemon, _, _) = start(dir, "stop.toml");
    let status = daemon.signal_and_wait(libc::SIGHUP, Duration::from_secs(60));
    let log = std::fs::read_to_string(dir.join("target.log")).unwrap_or_default();
    assert!(status.success(), "exit {status:?}, log:\n{log}");
    assert!(log.contains("netdam-target: stopping (SIGHUP)"), "log:\n{log}");
}

/// A target started with SIGHUP ignored (`nohup`, a service manager) keeps it ignored: a hangup
/// does not stop it (a blocked signal is queued even when ignored, so the stop must not wait
/// for it then).
#[test]
fn a_target_started_under_nohup_outlives_a_hangup() {
    use std::io::BufRead;
    let home = tempfile::tempdir().unwrap();
    let dir = home.path();
    write_config(dir);
    let log = std::fs::File::create(dir.join("target.log")).unwrap();
    // `trap '' HUP` sets SIGHUP's disposition to ignored, which exec keeps, as nohup does.
    let mut child = std::process::Command::new("sh")
        .args(["-c", "trap '' HUP; exec \"$0\" serve --config stop.toml", env!("CARGO_BIN_EXE_netdam-target")])
        .env_remove("NETDAM_LOG")
        .env_remove("RUST_LOG")
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut banner = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut banner).unwrap();
    assert!(banner.starts_with("netdam-target serving on "), "{banner:?}");
    let pid = child.id() as libc::pid_t;
    // SAFETY: signals to our own child, which has not been reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    std::thread::sleep(Duration::from_millis(500));
    let still_running = child.try_wait().unwrap().is_none();
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let log = std::fs::read_to_string(dir.join("target.log")).unwrap_or_default();
    assert!(still_running, "a hangup stopped a target that ignores SIGHUP; log:\n{log}");
    assert!(status.success() && log.contains("stopping (SIGTERM)"), "exit {status:?}, log:\n{log}");
    assert!(!log.contains("SIGHUP"), "log:\n{log}");
}

/// A stop whose word cannot be written (stderr gone: a terminal that hung up answers EIO, a
/// closed pipe EPIPE) is still a clean stop, not a panic.
#[test]
fn a_target_whose_stderr_is_gone_still_stops_cleanly() {
    use std::io::BufRead;
    let home = tempfile::tempdir().unwrap();
    let dir = home.path();
    write_config(dir);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_netdam-target"))
        .args(["serve", "--config", "stop.toml"])
        .env_remove("NETDAM_LOG")
        .env_remove("RUST_LOG")
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut banner = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut banner).unwrap();
    assert!(banner.starts_with("netdam-target serving on "), "{banner:?}");
    drop(child.stderr.take());
    // SAFETY: a signal to our own child, which has not been reaped.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGHUP) }, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "the target did not stop within 30 s");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "exit {status:?}: a failed write of the stop line ended it");
}
