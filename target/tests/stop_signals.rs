//! Stopping a serving `netdam-target` (the binary) with SIGTERM or SIGINT: it says which signal
//! it took, stops, and exits with success. Until then its main thread sleeps: it has nothing to
//! do while the workers serve, and a thread that woke to look at a flag took, on a host whose
//! cores spin (a busy worker, a polling initiator), one of them for a while each time
//! (docs/DECISIONS.md, "What preempts a spinning worker").

mod common;

use std::time::Duration;

use common::daemon::start;

/// Context switches the thread `tid` of process `pid` asked for (it slept) so far.
fn voluntary_switches(pid: u32, tid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).expect("the thread's status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|count| count.trim().parse().ok())
        .expect("voluntary_ctxt_switches in the status")
}

#[test]
fn sigterm_and_sigint_stop_a_target_whose_main_thread_sleeps_until_then() {
    for (signal, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGINT, "SIGINT")] {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path();
        std::fs::write(
            dir.join("stop.toml"),
            "listen = \"127.0.0.1:0\"\nmetrics_listen = \"off\"\ndata_dir = \".\"\nworkers = 1\npoll = \"blocking\"\n\
             pin_workers = false\nlock_memory = false\nauth = \"none\"\n\
             [[region]]\nname = \"scratch\"\nbackend = \"mem\"\nsize = \"1MiB\"\n",
        )
        .unwrap();
        let (daemon, _, _) = start(dir, "stop.toml");
        let pid = daemon.pid();
        // The main thread's id is the process id. Over a second of serving nothing it sleeps
        // once, not ten times (the 100 ms flag poll it replaced); a wake-up or two is slack.
        let before = voluntary_switches(pid, pid);
        std::thread::sleep(Duration::from_secs(1));
        let woke = voluntary_switches(pid, pid) - before;
        assert!(woke <= 2, "the main thread woke {woke} times in a second with nothing to do");
        let status = daemon.signal_and_wait(signal, Duration::from_secs(60));
        let log = std::fs::read_to_string(dir.join("target.log")).unwrap_or_default();
        assert!(status.success(), "{name}: exit {status:?}, log:\n{log}");
        assert!(log.contains(&format!("netdam-target: stopping ({name})")), "{name}: log:\n{log}");
    }
}
