//! The binaries as a user runs them: `netdam-target` with no arguments serves its embedded
//! default; `netdam write` then `netdam read` of 1 MiB returns the same bytes, before and after
//! the target is killed with SIGKILL and restarted.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use common::{seed, Rng};

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `netdam-target` with no arguments, its data directory under `home`; waits for the banner.
fn start_default_target(home: &Path) -> Daemon {
    let mut child = Command::new(env!("CARGO_BIN_EXE_netdam-target"))
        .env("XDG_DATA_HOME", home.join("data"))
        .env("HOME", home)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("netdam-target starts");
    let mut banner = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut banner).unwrap();
    if !banner.contains("serving on 127.0.0.1:7800") {
        let _ = child.kill();
        let output = child.wait_with_output().unwrap();
        panic!(
            "netdam-target did not start on its default address; stdout {banner:?}, stderr {:?} \
             (is something else using UDP port 7800?)",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Daemon(child)
}

/// Runs `netdam` as a user whose home (and data directory, where a key file may be found) is
/// under `home`.
fn netdam_command(home: &Path) -> Command {
    let mut command = Command::new(common::netdam_binary());
    command.env("XDG_DATA_HOME", home.join("data")).env("HOME", home).env_remove("NETDAM_KEY");
    command
}

fn netdam(home: &Path, args: &[&str]) -> Output {
    let output = netdam_command(home).args(args).output().expect("netdam runs");
    assert!(
        output.status.success(),
        "netdam {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

#[test]
fn default_target_keeps_a_1_mib_write_across_kill_and_restart() {
    let mut rng = Rng::new(seed());
    let home = tempfile::tempdir().unwrap();
    let input = home.path().join("in.bin");
    let output = home.path().join("out.bin");
    let data = rng.bytes(1 << 20);
    std::fs::write(&input, &data).unwrap();

    let mut daemon = start_default_target(home.path());
    assert!(home.path().join("data/netdam/default.region").exists(), "the default region lives in the user's data dir");
    // Secure by default: the target created the default tenant and its key file, which netdam
    // finds on its own; without it, no session.
    let key_file = home.path().join("data/netdam/tenants/default.key");
    let mode = std::fs::metadata(&key_file).expect("the default tenant's key file").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the key file is owner-only");
    let stranger = tempfile::tempdir().unwrap();
    let refused = netdam_command(stranger.path()).args(["read", "default", "0", "8"]).output().unwrap();
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && message.contains("unauthenticated") && message.contains("--key"), "{message}");
    let with_key = netdam_command(stranger.path())
        .args(["--key", key_file.to_str().unwrap(), "read", "default", "0", "8"])
        .output()
        .unwrap();
    assert!(with_key.status.success(), "{}", String::from_utf8_lossy(&with_key.stderr));
    let home = home.path();
    let written = netdam(home, &["write", "default", "0", "--file", input.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&written.stdout).contains("wrote 1048576 bytes"));
    netdam(home, &["read", "default", "0", "1MiB", "--out", output.to_str().unwrap()]);
    assert!(std::fs::read(&output).unwrap() == data, "read returned other bytes than were written");

    // SIGKILL: no chance to flush anything; acknowledged writes were persisted before the answer.
    daemon.0.kill().unwrap();
    daemon.0.wait().unwrap();
    drop(daemon);
    let _daemon = start_default_target(home);
    std::fs::remove_file(&output).unwrap();
    netdam(home, &["read", "default", "0", "1MiB", "--out", output.to_str().unwrap()]);
    assert!(std::fs::read(&output).unwrap() == data, "the default region lost bytes across a restart");

    // JSON output parses, and errors name the culprit.
    let stat = netdam(home, &["--json", "stat"]);
    let stat: serde_json::Value = serde_json::from_slice(&stat.stdout).unwrap();
    // Since the restart: the 1 MiB read in chunks of at most 8960 bytes, plus the HELLOs.
    assert!(stat["status_ok"].as_u64().unwrap() >= 118);
    let missing = netdam_command(home).args(["read", "nope", "0", "1"]).output().unwrap();
    assert!(!missing.status.success());
    let message = String::from_utf8_lossy(&missing.stderr);
    assert!(message.contains("no region \"nope\"") && message.contains("default"), "{message}");
    let crc = netdam(home, &["--json", "crc", "default", "0", "1MiB"]);
    let crc: serde_json::Value = serde_json::from_slice(&crc.stdout).unwrap();
    assert_eq!(crc["crc32"].as_u64().unwrap(), u64::from(crc32fast::hash(&data)));
}

#[test]
fn bad_settings_are_refused_with_the_setting_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "workers = 0\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_netdam-target"))
        .args(["serve", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("workers = 0"));
    std::fs::write(&config, "listen = \"127.0.0.1:0\"\npoling = \"busy\"\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_netdam-target"))
        .args(["config", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && message.contains("poling") && message.contains("bad.toml"), "{message}");
    // The engine: shown by `config`, an unknown one refused with the accepted forms, a window
    // that cannot be mapped refused at start with its path.
    let shown = target_admin(&["config", "--engine", "fpga=run/window"]);
    assert!(String::from_utf8_lossy(&shown.stdout).contains("engine = \"fpga=run/window\""));
    let refused = target_admin(&["config", "--engine", "gpu"]);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && message.contains("auto, software, fpga or fpga=PATH"), "{message}");
    let missing = dir.path().join("no-window");
    let output = Command::new(env!("CARGO_BIN_EXE_netdam-target"))
        .args(["serve", "--listen", "127.0.0.1:0", "--metrics-listen", "off", "--data-dir"])
        .arg(dir.path())
        .arg("--engine")
        .arg(format!("fpga={}", missing.display()))
        .output()
        .unwrap();
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && message.contains("no-window"), "{message}");
    // A file namespace whose path is a directory says so (not that its size is wrong).
    std::fs::create_dir(dir.path().join("a-directory")).unwrap();
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:0\"\nmetrics_listen = \"off\"\ndata_dir = \".\"\n[[namespace]]\nname = \"d\"\n\
         backend = \"file\"\npath = \"a-directory\"\nsize = \"1MiB\"\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_netdam-target"))
        .current_dir(dir.path())
        .args(["serve", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && message.contains("this is a directory"), "{message}");
    // An export that may take no connection is refused before it starts.
    let output = netdam_command(dir.path())
        .args(["--target", "127.0.0.1:9", "nbd", "--namespace", "d", "--listen", "tcp:127.0.0.1:0"])
        .args(["--max-connections", "0"])
        .output()
        .unwrap();
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && message.contains("--max-connections"), "{message}");
    // A listen address is refused saying what is wrong with it, not "invalid socket address syntax".
    for (flag, given, says) in [
        ("--listen", "::1:7800", "takes brackets before its port: [::1]:7800"),
        ("--listen", "localhost:7800", "is not an IP address (host names are not taken here)"),
        ("--metrics-listen", "127.0.0.1:70000", "port 70000 is out of range"),
    ] {
        let refused = target_admin(&["config", flag, given]);
        let message = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && message.contains(says), "{flag} {given}: {message}");
    }
}

/// The banner a started `netdam-target` prints on standard output, up to its "Reach it with" line.
fn read_banner(child: &mut Child) -> String {
    let mut reader = BufReader::new(child.stdout.take().expect("stdout is piped"));
    let mut banner = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 || line.starts_with("Reach it with") {
            return banner;
        }
        banner.push_str(&line);
    }
}

/// `netdam-target` serving on `listen` from the data directory `data`, without metrics and
/// without spinning (these tests look at what it starts with, not at its speed).
fn serving(listen: &str, data: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_netdam-target"));
    command.args(["--listen", listen, "--metrics-listen", "off", "--poll", "blocking", "--data-dir"]).arg(data);
    command
}

/// Spawns `command` (a serving target), waits for its banner, and stops it: the banner and
/// what it logged until then.
fn banner_and_log(command: &mut Command) -> (String, String) {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let banner = read_banner(&mut child);
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    (banner, String::from_utf8_lossy(&output.stderr).into_owned())
}

/// Spawns `command` (a serving target), waits for its banner, and stops it: the banner.
fn banner_of(mut command: Command) -> String {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let banner = read_banner(&mut child);
    let _ = child.kill();
    let _ = child.wait();
    banner
}

/// Runs `command`, a start expected to be refused, and its output; one that serves instead
/// (a regression) is stopped after 30 s rather than waited for without end.
fn refused_start(mut command: Command) -> Output {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!("the start was not refused: it served for 30 s; {}", String::from_utf8_lossy(&output.stderr));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn target_admin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_netdam-target")).args(args).output().expect("netdam-target runs")
}

/// A namespace an older version stored with settings refused today (16 KiB blocks) does not
/// stop the target: it starts, serves the other spaces, and says which one it left out and how
/// to remove it. `namespace list` gives the others the ids the target gives them.
#[test]
fn a_stored_space_refused_today_is_left_out_with_a_warning_not_a_failed_start() {
    use netdam_target::config::{ByteSize, NamespaceBackend, NamespaceConfig};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let store = netdam_target::metadata::MetadataStore::open(dir.path()).unwrap();
    let namespace = |name: &str, block_size| NamespaceConfig {
        name: name.into(),
        backend: NamespaceBackend::File,
        path: format!("{name}.img").into(),
        size: Some(ByteSize(1 << 20)),
        block_size,
    };
    for (name, block_size) in [("old", 16_384), ("disk", 4096), ("after", 4096)] {
        store.create_namespace(&namespace(name, block_size)).unwrap();
        // As `namespace create` does: a stored space's file exists.
        std::fs::File::create(dir.path().join(format!("{name}.img"))).unwrap().set_len(1 << 20).unwrap();
    }
    drop(store);
    // `namespace list` numbers them as the target will: the one left out takes no id.
    let listed = target_admin(&["namespace", "list", "--data-dir", data]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    let id_of = |name: &str| {
        let line = listed.lines().find(|line| line.split_whitespace().nth(1) == Some(name));
        line.and_then(|line| line.split_whitespace().next()).map(str::to_string)
    };
    assert_eq!(id_of("old").as_deref(), Some("-"), "{listed}");
    assert!(listed.contains("(not served: "), "{listed}");
    assert_eq!((id_of("disk").as_deref(), id_of("after").as_deref()), (Some("0"), Some("1")), "{listed}");
    let (banner, log) = banner_and_log(serving("127.0.0.1:0", data).args(["--auth", "none"]));
    assert!(banner.contains("\"disk\""), "the other namespace is served: {banner} {log}");
    // With the ids the list showed.
    assert!(banner.contains("namespace 0 \"disk\"") && banner.contains("namespace 1 \"after\""), "{banner}");
    assert!(!banner.contains("\"old\""), "{banner}");
    assert!(log.contains("\"old\" is not served") && log.contains("namespace delete old"), "{log}");
}

/// A stored namespace or region whose file is gone at start (its file system not mounted yet,
/// the file moved) is not served, and its file is not made again empty: the log names the file
/// and what to do, `namespace list` and `region list` say why it has no id, and once the file
/// is back the next start serves it with its data.
#[test]
fn a_stored_space_whose_file_is_gone_is_not_made_again_empty() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_text = data.to_str().unwrap();
    let created = [
        target_admin(&[
            "namespace",
            "create",
            "disk",
            "--backend",
            "file",
            "--path",
            "disk.img",
            "--size",
            "1MiB",
            "--data-dir",
            data_text,
        ]),
        target_admin(&[
            "region",
            "create",
            "vol",
            "--backend",
            "file",
            "--path",
            "vol.region",
            "--size",
            "1MiB",
            "--data-dir",
            data_text,
        ]),
    ];
    for output in &created {
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    }
    let (disk, vol) = (data.join("disk.img"), data.join("vol.region"));
    let mut kept = std::fs::read(&vol).unwrap();
    kept[..4].copy_from_slice(b"kept");
    std::fs::write(&vol, &kept).unwrap();
    std::fs::rename(&disk, dir.path().join("disk.img")).unwrap();
    std::fs::rename(&vol, dir.path().join("vol.region")).unwrap();

    for (kind, path) in [("namespace", &disk), ("region", &vol)] {
        let listed = target_admin(&[kind, "list", "--data-dir", data_text]);
        let listed = String::from_utf8_lossy(&listed.stdout);
        assert!(
            listed.contains("(not served: ") && listed.contains(&format!("{} is missing", path.display())),
            "{listed}"
        );
    }
    let (banner, log) = banner_and_log(serving("127.0.0.1:0", &data).args(["--auth", "none"]));
    assert!(!banner.contains("\"disk\"") && !banner.contains("\"vol\""), "{banner}");
    for (kind, name, path) in [("namespace", "disk", &disk), ("region", "vol", &vol)] {
        assert!(log.contains(&format!("stored {kind} \"{name}\" is not served")), "{log}");
        assert!(log.contains(&format!("{} is missing", path.display())), "{log}");
        assert!(log.contains(&format!("netdam-target {kind} delete {name}")), "{log}");
        assert!(!path.exists(), "the start made {} again", path.display());
    }

    std::fs::rename(dir.path().join("disk.img"), &disk).unwrap();
    std::fs::rename(dir.path().join("vol.region"), &vol).unwrap();
    let mut again = serving("127.0.0.1:0", &data);
    again.args(["--auth", "none"]);
    let banner = banner_of(again);
    assert!(banner.contains("\"disk\"") && banner.contains("\"vol\""), "served again: {banner}");
    assert_eq!(&std::fs::read(&vol).unwrap()[..4], b"kept");
}

/// A data directory whose metadata store is gone (moved away) or emptied, while the tenants'
/// key files are still there, is refused by name: a new store there would give out a new
/// default tenant with every permission and forget the tenants, stored spaces and crypto keys.
/// The old key file stays as it was, and the directory serves again once the store is back.
#[test]
fn a_data_directory_whose_store_is_gone_is_refused_not_started_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let first = banner_of(serving("127.0.0.1:0", &data));
    assert!(first.contains("created tenant \"default\""), "{first}");
    let (store, key) = (data.join("metadata.redb"), data.join("tenants/default.key"));
    let key_bytes = std::fs::read(&key).unwrap();
    std::fs::rename(&store, dir.path().join("kept.redb")).unwrap();
    for state in ["missing", "empty"] {
        if state == "empty" {
            std::fs::write(&store, b"").unwrap();
        }
        let refused = serving("127.0.0.1:0", &data).output().unwrap();
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{state}: {stderr}");
        assert!(
            stderr.contains(&format!("{}: the file is {state}", store.display())) && stderr.contains("default.key"),
            "{state}: {stderr}"
        );
        let listed = target_admin(&["tenant", "list", "--data-dir", data.to_str().unwrap()]);
        assert!(!listed.status.success(), "{state}: tenant list is refused too");
        assert_eq!(std::fs::read(&key).unwrap(), key_bytes, "{state}: the key file is untouched");
        let size = std::fs::metadata(&store).map(|metadata| metadata.len()).ok();
        assert_eq!(size, (state == "empty").then_some(0), "{state}: no new store was made");
    }
    std::fs::rename(dir.path().join("kept.redb"), &store).unwrap();
    let again = banner_of(serving("127.0.0.1:0", &data));
    assert!(again.contains("the default tenant's key file") && !again.contains("created tenant"), "{again}");
}

/// A namespace or region refused for its own settings leaves a new data directory as it was: no
/// metadata store is created for nothing.
#[test]
fn a_refused_space_leaves_a_new_data_directory_empty() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let namespace = target_admin(&[
        "namespace",
        "create",
        "big",
        "--backend",
        "file",
        "--path",
        "big.img",
        "--size",
        "16MiB",
        "--block-size",
        "65536",
        "--data-dir",
        data,
    ]);
    let message = String::from_utf8_lossy(&namespace.stderr);
    assert!(!namespace.status.success() && message.contains("block_size = 65536"), "{message}");
    let region = target_admin(&["region", "create", "r", "--backend", "mem", "--size", "0", "--data-dir", data]);
    let message = String::from_utf8_lossy(&region.stderr);
    assert!(!region.status.success() && message.contains("size = 0"), "{message}");
    // Sizes the target would refuse at its next start are refused here: not whole pages, more
    // memory than the machine has.
    for (size, says) in [
        ("1000", "whole number of"),
        ("18446744073709551615", "whole number of"),
        ("18446744073709547520", "this machine has"),
    ] {
        let region = target_admin(&["region", "create", "r", "--backend", "mem", "--size", size, "--data-dir", data]);
        let message = String::from_utf8_lossy(&region.stderr);
        assert!(!region.status.success() && message.contains(says), "{size}: {message}");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    // A file region larger than its file system's free space: refused before a block is taken,
    // and its file is gone again.
    let region = target_admin(&[
        "region",
        "create",
        "r",
        "--backend",
        "file",
        "--path",
        "r.region",
        "--size",
        "8388608TiB",
        "--data-dir",
        data,
    ]);
    let message = String::from_utf8_lossy(&region.stderr);
    assert!(!region.status.success() && message.contains("no room"), "{message}");
    assert!(!dir.path().join("r.region").exists(), "the refused region's file was left behind");
}

/// VADD's lane list: an empty lane or a number its lane type cannot hold is refused, naming the
/// lane, before anything is added (an empty one was skipped, shifting the later values down a
/// lane); NaN and infinities read back as such in text (JSON has no such numbers).
#[test]
fn vadd_lanes_are_taken_as_written_and_refusals_say_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("target.toml"),
        "listen = \"127.0.0.1:0\"\nmetrics_listen = \"off\"\ndata_dir = \".\"\npoll = \"blocking\"\nauth = \"none\"\n\
         pin_workers = false\nlock_memory = false\n",
    )
    .unwrap();
    let (_daemon, addr, _) = common::daemon::start(dir.path(), "target.toml");
    let target = addr.to_string();
    let vadd = |lanes: &str, extra: &[&str]| {
        netdam_command(dir.path())
            .args(["--target", &target, "--key", "none", "vadd", "default", "4096", lanes])
            .args(extra)
            .output()
            .unwrap()
    };
    for (lanes, says) in [("1,,2", "lane 1 is empty"), ("1,2,", "lane 2 is empty"), ("1e39", "out of the F32 range")] {
        let refused = vadd(lanes, &[]);
        let message = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && message.contains(says), "{lanes}: {message}");
    }
    let refused = vadd("3.4e38", &["--type", "bf16"]);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && message.contains("out of the Bf16 range"), "3.4e38 in bf16: {message}");
    let added = vadd("nan,inf,-inf,1.5", &["--return"]);
    let text = String::from_utf8_lossy(&added.stdout);
    assert!(added.status.success(), "{}", String::from_utf8_lossy(&added.stderr));
    assert_eq!(text.trim(), "NaN,inf,-inf,1.5", "lanes after adding to zeroes");
    // Other refusals say what to do before anything is sent.
    for (args, says) in [
        (&["fetch-add", "default", "3", "5"][..], "multiple of 8"),
        (&["cas", "default", "12", "0", "1"][..], "multiple of 8"),
        (&["encrypt", "default", "0", "16385", "--slot", "1"][..], "at most 16384 bytes"),
        (&["reduce", "default", "0", "0"][..], "whole number of f32 lanes"),
        (&["fetch-add", "default", "0", "18446744073709551616"][..], "not a 64-bit value"),
        (&["top", "--once", "--metrics", "127.0.0.1:1"][..], "http://127.0.0.1:1/metrics"),
        (&["top", "--once", "--metrics", "https://127.0.0.1:1/metrics"][..], "plain http"),
    ] {
        let refused =
            netdam_command(dir.path()).args(["--target", &target, "--key", "none"]).args(args).output().unwrap();
        let message = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && message.contains(says), "{args:?}: {message}");
    }
}

/// Admin commands name what is wrong and where to change it: the configured default region is
/// not the store's to delete, a data directory that is a file, a key to import that is a
/// directory.
#[test]
fn admin_refusals_say_where_the_fault_is() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let refused = target_admin(&["region", "delete", "default", "--data-dir", data]);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && message.contains("comes from the configuration"), "{message}");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let refused = target_admin(&["region", "list", "--data-dir", file.to_str().unwrap()]);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && message.contains("a file, not a directory"), "{message}");
    let refused =
        target_admin(&["tenant", "create", "imp", "--import-key", dir.path().to_str().unwrap(), "--data-dir", data]);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && message.contains("a directory, not a key file"), "{message}");
}

/// Every argument of the admin commands says what it is in `--help`, and the tenant name's
/// help states every rule its refusal enforces.
#[test]
fn admin_help_describes_every_argument() {
    for command in [
        &["region", "create"][..],
        &["region", "delete"],
        &["namespace", "create"],
        &["namespace", "delete"],
        &["tenant", "create"],
        &["tenant", "delete"],
        &["tenant", "rotate-key"],
        &["tenant", "set"],
        &["grant"],
        &["revoke"],
        &["crypto-key", "create"],
        &["crypto-key", "rotate"],
        &["crypto-key", "delete"],
    ] {
        let help = target_admin(&[command, &["--help"]].concat());
        let help = String::from_utf8_lossy(&help.stdout);
        let arguments = help.split("Arguments:\n").nth(1).and_then(|rest| rest.split("Options:").next()).unwrap_or("");
        let lines: Vec<&str> = arguments.lines().collect();
        for (index, line) in lines.iter().enumerate() {
            if line.starts_with("  <") || line.starts_with("  [") {
                let description = lines.get(index + 1).map_or("", |next| next.trim());
                assert!(
                    !description.is_empty(),
                    "netdam-target {command:?} --help: {} has no description:\n{help}",
                    line.trim()
                );
            }
        }
    }
    let help = target_admin(&["tenant", "create", "--help"]);
    assert!(String::from_utf8_lossy(&help.stdout).contains("not starting with ."));
    let refused = target_admin(&["tenant", "create", ".hidden", "--data-dir", "/nonexistent"]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not starting with ."));
}

/// `netdam-target config` prints every setting the settings file takes (as `--help` says):
/// those unset with no default value as comments.
#[test]
fn config_prints_every_setting() {
    let shown = target_admin(&["config", "--data-dir", "/tmp"]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    let help = target_admin(&["--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    // The list `--config`'s help gives: "TOML file with settings (listen, ..., extensions, [[region]] ...".
    let listed = help.split("TOML file with settings (").nth(1).and_then(|rest| rest.split(", [[region]]").next());
    let listed = listed.expect("--config's help lists the settings");
    for setting in listed.split(", ") {
        let set = format!("{setting} = ");
        let commented = format!("# {setting} = ");
        assert!(
            shown.lines().any(|line| line.starts_with(&set) || line.starts_with(&commented)),
            "netdam-target config omits {setting}:\n{shown}"
        );
    }
    assert!(shown.contains("data_dir = \"/tmp\""), "{shown}");
    assert!(shown.contains("# fpga_window = ") && shown.contains("allow_unauthenticated_network = false"), "{shown}");
}

/// An admin command whose reader has gone (`| head`) ends quietly on SIGPIPE, without a
/// panic and its backtrace.
#[test]
fn an_admin_command_into_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let output = Command::new(env!("CARGO_BIN_EXE_netdam-target"))
        .args(["region", "list", "--data-dir"])
        .arg(dir.path())
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let message = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.signal(), Some(libc::SIGPIPE), "{:?}: {message}", output.status);
    assert!(!message.contains("panicked"), "{message}");
}

/// No two spaces share a backing file: a namespace on the default region's file, a second
/// namespace on an image another uses (spelled `./x`), and a region on a namespace's image are
/// refused by name; a configuration that declares one is refused at start.
#[test]
fn two_spaces_on_one_file_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let namespace = |name: &str, path: &str| {
        target_admin(&[
            "namespace",
            "create",
            name,
            "--backend",
            "file",
            "--path",
            path,
            "--size",
            "1MiB",
            "--data-dir",
            data,
        ])
    };
    let created = namespace("disk", "disk.img");
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    for (name, path, other) in
        [("onreg", "default.region", "region \"default\""), ("again", "./disk.img", "namespace \"disk\"")]
    {
        let refused = namespace(name, path);
        let message = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && message.contains(other) && message.contains(name), "{path}: {message}");
    }
    let region = target_admin(&[
        "region",
        "create",
        "r",
        "--backend",
        "file",
        "--path",
        "disk.img",
        "--size",
        "1MiB",
        "--data-dir",
        data,
    ]);
    let message = String::from_utf8_lossy(&region.stderr);
    assert!(!region.status.success() && message.contains("namespace \"disk\""), "{message}");
    let config = dir.path().join("shared.toml");
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:0\"\nmetrics_listen = \"off\"\n[[namespace]]\nname = \"twin\"\nbackend = \"file\"\n\
         path = \"disk.img\"\nsize = \"1MiB\"\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_netdam-target"))
        .args(["serve", "--config", config.to_str().unwrap(), "--data-dir", data])
        .output()
        .unwrap();
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && message.contains("twin") && message.contains("disk"), "{message}");
}

/// The target's own files in the data directory back no space: a namespace on the metadata
/// store (a bwrite to it left the target unable to start), on the running target's lock, on
/// a nonce reservation or among the tenant keys, or on the store by another spelling or a
/// hard link, is refused naming the file, and nothing is stored.
#[test]
fn the_targets_own_files_back_no_space() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let create = |kind: &str, name: &str, path: &str| {
        let size = if kind == "region" { "1MiB" } else { "4KiB" };
        target_admin(&[kind, "create", name, "--backend", "file", "--path", path, "--size", size, "--data-dir", data])
    };
    let created = create("namespace", "disk", "disk.img");
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    // A hard link is the store under another name.
    std::fs::hard_link(dir.path().join("metadata.redb"), dir.path().join("alias.img")).unwrap();
    for (kind, path, says) in [
        ("namespace", "metadata.redb", "metadata store"),
        ("namespace", "target.lock", "lock of a running target"),
        ("namespace", "crypto-nonces-1", "nonce reservation"),
        ("namespace", "tenants/extra.key", "tenant keys"),
        ("region", "sub/../metadata.redb", "metadata store"),
        ("region", "not-yet/../metadata.redb", "metadata store"),
        ("namespace", "alias.img", "metadata store"),
    ] {
        let refused = create(kind, "mine", path);
        let message = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && message.contains(says), "{kind} on {path}: {message}");
    }
    // A name that only starts like a nonce reservation is a file like any other.
    let created = create("namespace", "other", "crypto-nonces-old.img");
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let listed = target_admin(&["namespace", "list", "--data-dir", data]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success() && text.contains("disk") && !text.contains("mine"), "{text}");
}

/// Commands that change the store refuse a data directory that does not exist (a mistyped
/// --data-dir) instead of creating it; lists create nothing and say the directory is missing.
#[test]
fn a_missing_data_directory_is_named_not_created() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("typo");
    let data = missing.to_str().unwrap();
    for args in [
        vec!["namespace", "delete", "disk"],
        vec!["region", "delete", "r"],
        vec!["tenant", "delete", "t"],
        vec!["tenant", "set", "t", "--class", "best-effort"],
        vec!["crypto-key", "rotate", "1"],
        vec!["revoke", "t", "region:default"],
    ] {
        let refused = target_admin(&[&args[..], &["--data-dir", data]].concat());
        let message = String::from_utf8_lossy(&refused.stderr);
        assert!(
            !refused.status.success() && message.contains("there is no data directory") && message.contains("typo"),
            "{args:?}: {message}"
        );
    }
    for args in [vec!["namespace", "list"], vec!["region", "list"], vec!["tenant", "list"], vec!["crypto-key", "list"]]
    {
        let listed = target_admin(&[&args[..], &["--data-dir", data]].concat());
        let message = String::from_utf8_lossy(&listed.stderr);
        assert!(listed.status.success() && message.contains("there is no data directory"), "{args:?}: {message}");
    }
    assert!(!missing.exists(), "a command created the mistyped data directory");
}

/// Lists read the store read-only: they work on a data directory mounted read-only (where
/// `region list`, `namespace list` and `crypto-key list` failed with "Read-only file system").
#[test]
fn lists_work_on_a_read_only_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_arg = data.to_str().unwrap();
    for args in [
        vec!["namespace", "create", "disk", "--backend", "file", "--path", "disk.img", "--size", "1MiB"],
        vec!["region", "create", "r", "--backend", "mem", "--size", "1MiB"],
        vec!["crypto-key", "create", "1"],
        vec!["tenant", "create", "t"],
    ] {
        let done = target_admin(&[&args[..], &["--data-dir", data_arg]].concat());
        assert!(done.status.success(), "{args:?}: {}", String::from_utf8_lossy(&done.stderr));
    }
    let read_only = dir.path().join("ro");
    std::fs::create_dir(&read_only).unwrap();
    let mount = |args: &[&str]| Command::new("mount").args(args).output().is_ok_and(|output| output.status.success());
    let ro = read_only.to_str().unwrap();
    if !mount(&["--bind", data_arg, ro]) {
        // Straight to stderr: libtest captures println! and eprintln!, and a skip must show.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED lists_work_on_a_read_only_data_directory: a read-only bind mount needs root and mount(8)"
        );
        return;
    }
    struct Unmount<'a>(&'a str);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(ro);
    assert!(mount(&["-o", "remount,ro,bind", ro]), "remounting the bind mount read-only");
    for (args, shows) in [
        (vec!["namespace", "list"], "disk"),
        (vec!["region", "list"], " r "),
        (vec!["crypto-key", "list"], "key version 1"),
        (vec!["tenant", "list"], " t "),
    ] {
        let listed = target_admin(&[&args[..], &["--data-dir", ro]].concat());
        let text = String::from_utf8_lossy(&listed.stdout);
        assert!(
            listed.status.success() && text.contains(shows),
            "{args:?} on a read-only directory: {text}{}",
            String::from_utf8_lossy(&listed.stderr)
        );
    }
}

/// A file namespace whose file cannot take its length ("File too large" on ext4 past 16 TiB;
/// here a length past what a file offset holds, refused on any file system) leaves no file:
/// the corrected retry is created, where an empty file of the wrong size refused it.
#[test]
fn a_namespace_file_that_cannot_be_sized_is_removed_again() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let create = |size: &str| {
        target_admin(&[
            "namespace",
            "create",
            "big",
            "--backend",
            "file",
            "--path",
            "big.img",
            "--size",
            size,
            "--data-dir",
            data,
        ])
    };
    let refused = create("18446744073709547520");
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && message.contains("cannot create it"), "{message}");
    assert!(!dir.path().join("big.img").exists(), "the refused namespace's file was left behind");
    let created = create("1MiB");
    assert!(created.status.success(), "the retry: {}", String::from_utf8_lossy(&created.stderr));
    assert_eq!(std::fs::metadata(dir.path().join("big.img")).unwrap().len(), 1 << 20);
}

/// A file namespace larger than its file system's free space is created (it is sparse; thin
/// provisioning is a choice), with a warning that names the shortfall; one that fits has none.
#[test]
fn a_file_namespace_larger_than_the_free_space_is_created_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let create = |name: &str, size: &str| {
        let path = format!("{name}.img");
        target_admin(&[
            "namespace",
            "create",
            name,
            "--backend",
            "file",
            "--path",
            &path,
            "--size",
            size,
            "--data-dir",
            data,
        ])
    };
    let small = create("small", "4MiB");
    assert!(small.status.success(), "{}", String::from_utf8_lossy(&small.stderr));
    assert!(!String::from_utf8_lossy(&small.stderr).contains("free"), "no warning when it fits");
    let free = String::from_utf8(Command::new("df").args(["--output=avail", "-B1", data]).output().unwrap().stdout)
        .unwrap()
        .lines()
        .nth(1)
        .and_then(|line| line.trim().parse::<u64>().ok())
        .expect("df tells the free bytes");
    let size = free / 4096 * 4096 + (1 << 40);
    let big = create("big", &size.to_string());
    let message = String::from_utf8_lossy(&big.stderr);
    if !big.status.success() && message.contains("File too large") {
        println!("skipped: this file system cannot hold a sparse file of {size} bytes ({message})");
        return;
    }
    assert!(big.status.success(), "{message}");
    assert!(
        message.contains("WARN") && message.contains("not yet written") && message.contains("no_space"),
        "{message}"
    );
}

/// `netdam-target namespace|region create|list|delete` keep spaces in the metadata store; a
/// target started on that data directory serves them, a running one is named in the advice to
/// restart, and `netdam bwrite`/`bread`/`flush`/`trim`/`block-status` work on the namespace.
#[test]
fn admin_commands_store_namespaces_that_the_target_serves() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let created = target_admin(&[
        "namespace",
        "create",
        "disk",
        "--backend",
        "file",
        "--path",
        "disk.img",
        "--size",
        "4MiB",
        "--data-dir",
        data,
    ]);
    let text = String::from_utf8_lossy(&created.stdout);
    assert!(created.status.success() && text.contains("1024 blocks of 4096 bytes"), "{text}");
    assert!(dir.path().join("disk.img").exists(), "create made the backing file");
    let twice = target_admin(&[
        "namespace",
        "create",
        "disk",
        "--backend",
        "pmem",
        "--path",
        "x.region",
        "--size",
        "4MiB",
        "--data-dir",
        data,
    ]);
    let message = String::from_utf8_lossy(&twice.stderr);
    assert!(
        !twice.status.success() && message.contains("a namespace named \"disk\" already exists in the metadata store"),
        "{message}"
    );
    let builtin =
        target_admin(&["region", "create", "default", "--backend", "mem", "--size", "1MiB", "--data-dir", data]);
    let message = String::from_utf8_lossy(&builtin.stderr);
    assert!(
        !builtin.status.success() && message.contains("a region named \"default\" already exists in the settings"),
        "{message}"
    );
    let bad_block = target_admin(&[
        "namespace",
        "create",
        "odd",
        "--backend",
        "file",
        "--path",
        "odd.img",
        "--size",
        "1MiB",
        "--block-size",
        "1000",
        "--data-dir",
        data,
    ]);
    let message = String::from_utf8_lossy(&bad_block.stderr);
    assert!(!bad_block.status.success() && message.contains("block_size = 1000"), "{message}");
    assert!(!dir.path().join("odd.img").exists(), "a refused namespace leaves no file behind");
    let region =
        target_admin(&["region", "create", "scratch", "--backend", "mem", "--size", "1MiB", "--data-dir", data]);
    assert!(region.status.success(), "{}", String::from_utf8_lossy(&region.stderr));
    let list = target_admin(&["namespace", "list", "--data-dir", data]);
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(text.contains("disk") && text.contains("store"), "{text}");

    let mut child = Command::new(env!("CARGO_BIN_EXE_netdam-target"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--data-dir",
            data,
            "--auth",
            "none",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let banner = read_banner(&mut child);
    let _daemon = Daemon(child);
    assert!(
        banner.contains("region 1 \"scratch\"") && banner.contains("namespace 0 \"disk\": 1024 blocks"),
        "{banner}"
    );
    let addr = banner.split_whitespace().nth(3).unwrap().to_string();

    let late = target_admin(&[
        "namespace",
        "create",
        "late",
        "--backend",
        "file",
        "--path",
        "late.img",
        "--size",
        "1MiB",
        "--data-dir",
        data,
    ]);
    let text = String::from_utf8_lossy(&late.stdout);
    assert!(late.status.success() && text.contains("restart it to serve this change"), "{text}");

    let input = dir.path().join("in.bin");
    let output = dir.path().join("out.bin");
    let bytes = Rng::new(seed()).bytes(3 * 4096);
    std::fs::write(&input, &bytes).unwrap();
    let target = ["--target", addr.as_str()];
    let run = |args: &[&str]| netdam(dir.path(), &[&target[..], args].concat());
    run(&["bwrite", "disk", "10", "--file", input.to_str().unwrap(), "--fua"]);
    run(&["flush", "disk"]);
    run(&["bread", "disk", "10", "3", "--out", output.to_str().unwrap()]);
    assert!(std::fs::read(&output).unwrap() == bytes, "bread returned other bytes than bwrite wrote");
    run(&["trim", "disk", "11", "1"]);
    run(&["bread", "disk", "10", "3", "--out", output.to_str().unwrap()]);
    let after_trim = std::fs::read(&output).unwrap();
    assert!(after_trim[4096..8192].iter().all(|&byte| byte == 0) && after_trim[..4096] == bytes[..4096]);
    // Blocks 10 and 12 hold data, 11 was trimmed, the rest was never written.
    let status = run(&["--json", "block-status", "disk", "8", "8"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let extents: Vec<(u64, u64, bool)> = status["extents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|extent| (extent["lba"].as_u64().unwrap(), extent["blocks"].as_u64().unwrap(), extent["hole"] == true))
        .collect();
    assert_eq!(extents, [(8, 2, true), (10, 1, false), (11, 1, true), (12, 1, false), (13, 3, true)], "{status}");
    let namespaces = run(&["--json", "namespaces"]);
    let namespaces: serde_json::Value = serde_json::from_slice(&namespaces.stdout).unwrap();
    assert_eq!(namespaces.as_array().unwrap().len(), 1, "the running target serves what it read at start");
    assert_eq!(namespaces[0]["reports_allocation"], true, "a file namespace reports allocation");
    let partial = netdam_command(dir.path())
        .args([&target[..], &["bwrite", "disk", "0", "--data", "abc"]].concat())
        .output()
        .unwrap();
    let message = String::from_utf8_lossy(&partial.stderr);
    assert!(!partial.status.success() && message.contains("--pad"), "{message}");

    let deleted = target_admin(&["namespace", "delete", "late", "--data-dir", data]);
    let text = String::from_utf8_lossy(&deleted.stdout);
    assert!(deleted.status.success() && text.contains("is left as it is"), "{text}");
    let missing = target_admin(&["namespace", "delete", "late", "--data-dir", data]);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no namespace named \"late\""));
}

/// Starts `netdam-target` on a free UDP port with `extra` arguments and `env`, and returns the first
/// line it logs on standard error (then stops it).
fn first_log_line(extra: &[&str], env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_netdam-target"));
    command
        .args(["--listen", "127.0.0.1:0", "--data-dir", data, "--poll", "blocking", "--auth", "none"])
        .args(extra)
        .env_remove("NETDAM_LOG")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().unwrap();
    // The banner on stdout comes after the start line: once it is there, stderr has that line.
    let mut banner = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut banner).unwrap();
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(banner.contains("serving on"), "netdam-target {extra:?} did not start: {stderr}");
    stderr.lines().next().unwrap_or("").to_string()
}

#[test]
fn the_start_line_names_the_settings_and_metrics_as_text_or_json() {
    let any_port = ["--metrics-listen", "127.0.0.1:0"];
    let json_line = first_log_line(&["--log-format", "json", any_port[0], any_port[1]], &[]);
    let line: serde_json::Value = serde_json::from_str(&json_line).expect("a JSON log line");
    assert_eq!(line["message"], "netdam-target started", "{json_line}");
    assert_eq!(line["level"], "INFO");
    assert_eq!(line["poll"], "blocking");
    let metrics = line["metrics"].as_str().unwrap();
    assert!(metrics.starts_with("http://127.0.0.1:") && metrics.ends_with("/metrics"), "{json_line}");
    let text = first_log_line(&["--metrics-listen", "off"], &[]);
    assert!(text.contains("netdam-target started") && text.contains("metrics") && text.contains("off"), "{text}");
    // Standard error is a pipe here, as it is to a log file or journald: no colour codes.
    assert!(!text.contains('\u{1b}'), "escape codes in a log that is not a terminal: {text:?}");
    // RUST_LOG filters when NETDAM_LOG is unset: at warn, the info start line is not written.
    assert!(!first_log_line(&any_port, &[("RUST_LOG", "warn")]).contains("netdam-target started"));
    let both = [("RUST_LOG", "warn"), ("NETDAM_LOG", "info")];
    assert!(first_log_line(&any_port, &both).contains("netdam-target started"));
}

/// `netdam nbd` and one-shot commands (with a session and without) pointed at an address where
/// nothing answers (a socket that swallows every datagram, so no refusal comes back either)
/// say, within seconds, that they are still trying and what to check, instead of staying
/// silent until their attempts run out; the export does not listen meanwhile.
#[test]
fn commands_whose_target_stays_silent_say_they_are_still_trying() {
    let home = tempfile::tempdir().unwrap();
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    // `regions` says HELLO first; `ping` needs no session, so it waits on its PING.
    let one_shots: Vec<Child> = ["regions", "ping"]
        .iter()
        .map(|command| {
            netdam_command(home.path())
                .args(["--target", &silent.local_addr().unwrap().to_string(), command])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let socket_path = home.path().join("export.sock");
    let mut child = netdam_command(home.path())
        .args(["--target", &silent.local_addr().unwrap().to_string(), "nbd", "--namespace", "disk"])
        .arg("--listen")
        .arg(format!("unix:{}", socket_path.display()))
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let started = std::time::Instant::now();
    // The notice comes after 2 s; the attempts would run out after about half a minute.
    stderr.read_line(&mut line).unwrap();
    let waited = started.elapsed();
    let listening = socket_path.exists();
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.contains("no answer from the target yet"), "first line: {line}");
    assert!(line.contains(&silent.local_addr().unwrap().to_string()), "the line names the target: {line}");
    assert!(waited < std::time::Duration::from_secs(10), "the notice took {waited:?}");
    assert!(!listening, "the export listened before its target answered");
    for (command, mut one_shot) in ["regions", "ping"].into_iter().zip(one_shots) {
        let mut line = String::new();
        BufReader::new(one_shot.stderr.take().unwrap()).read_line(&mut line).unwrap();
        let _ = one_shot.kill();
        let _ = one_shot.wait();
        assert!(line.contains("no answer from the target yet"), "netdam {command}, first line: {line}");
    }
}

/// A command whose target answered its HELLO and then says nothing (stopped, unreachable or
/// stalled since) is told so, not asked whether a target runs there at all. A relay passes the
/// HELLOs and swallows the rest.
#[test]
fn a_command_whose_target_went_quiet_after_its_hello_is_not_told_nothing_runs_there() {
    use netdam_isa::wire::Request;
    let test = start_vol_and_disk();
    let front = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let back = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    back.connect(test.target.local_addr()).unwrap();
    for socket in [&front, &back] {
        socket.set_read_timeout(Some(std::time::Duration::from_millis(20))).unwrap();
    }
    let relay_addr = front.local_addr().unwrap();
    let mut child = netdam_command(test.dir.path())
        .args(["--target", &relay_addr.to_string(), "read", "vol", "0", "8"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let first_line = std::thread::spawn(move || {
        let mut line = String::new();
        BufReader::new(stderr).read_line(&mut line).unwrap();
        line
    });
    let (mut buffer, mut client, mut hellos) = (vec![0u8; 65_536], None, 0);
    let started = std::time::Instant::now();
    while !first_line.is_finished() && started.elapsed() < std::time::Duration::from_secs(10) {
        if let Ok((len, from)) = front.recv_from(&mut buffer) {
            client = Some(from);
            let request = Request::parse(&buffer[..len]).unwrap();
            let opcode = request.instructions().next().unwrap().opcode;
            if opcode == netdam_isa::Opcode::Hello as u8 {
                hellos += 1;
                back.send(&buffer[..len]).unwrap();
            }
        }
        if let (Ok(len), Some(client)) = (back.recv(&mut buffer), client) {
            front.send_to(&buffer[..len], client).unwrap();
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let line = first_line.join().unwrap();
    assert!(hellos >= 1, "the command said no HELLO");
    assert!(line.contains("the target answered this session but has said nothing for 2000 ms"), "first line: {line}");
    assert!(line.contains("stopped or become unreachable, or is it stalled"), "first line: {line}");
}

/// Bytes of region "vol" and blocks of namespace "disk" of [`start_vol_and_disk`].
const VOL_BYTES: u64 = 1 << 20;
const DISK_BLOCKS: u64 = 64;
const DISK_BLOCK_BYTES: u32 = 4096;

/// A target in this process serving region "vol" (memory) and namespace "disk" (a file).
fn start_vol_and_disk() -> common::TestTarget {
    start_vol_and(file_namespace("disk", DISK_BLOCKS))
}

/// A target with region "vol" and `namespace`.
fn start_vol_and(namespace: netdam_target::config::NamespaceConfig) -> common::TestTarget {
    common::start_with_namespaces(vec![common::region("vol", VOL_BYTES, false)], vec![namespace], 1, 9000)
}

/// A file namespace `name` of `blocks` blocks of `DISK_BLOCK_BYTES`, in `name`.img.
fn file_namespace(name: &str, blocks: u64) -> netdam_target::config::NamespaceConfig {
    use netdam_target::config::{ByteSize, NamespaceBackend, NamespaceConfig};
    NamespaceConfig {
        name: name.into(),
        backend: NamespaceBackend::File,
        path: format!("{name}.img").into(),
        size: Some(ByteSize(blocks * u64::from(DISK_BLOCK_BYTES))),
        block_size: DISK_BLOCK_BYTES,
    }
}

/// Runs `netdam` against `test`'s target, whatever the outcome.
fn netdam_at(test: &common::TestTarget, args: &[&str]) -> Output {
    netdam_command(test.dir.path())
        .args(["--target", &test.target.local_addr().to_string()])
        .args(args)
        .output()
        .expect("netdam runs")
}

/// Like [`netdam_at`], for commands that must succeed.
fn netdam_ok(test: &common::TestTarget, args: &[&str]) -> Output {
    let output = netdam_at(test, args);
    assert!(output.status.success(), "netdam {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    output
}

/// A default tenant key left in the user's data directory (from a target started here before)
/// is presented on its own; a target with `auth = "none"` that does not know it refuses it. The
/// error says the key was the default one, found on its own, and `--key none` (or
/// `NETDAM_KEY=none`) connects without a key.
#[test]
fn a_default_key_found_on_its_own_is_named_when_refused_and_none_opts_out() {
    let test = start_vol_and_disk();
    let key_path = test.dir.path().join("data/netdam/tenants/default.key");
    std::fs::create_dir_all(key_path.parent().unwrap()).unwrap();
    let unknown = netdam_auth::KeyFile {
        tenant: "default".into(),
        id: 1,
        version: 1,
        key: netdam_auth::TenantKey::from_bytes([0x42; 32]),
    };
    unknown.write(&key_path, false).unwrap();
    let refused = netdam_at(&test, &["regions"]);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{message}");
    assert!(
        message.contains("unauthenticated")
            && message.contains("--key none")
            && message.contains("default tenant's")
            && message.contains("default.key"),
        "{message}"
    );
    // The key given by name is described too: its tenant and key version.
    let refused = netdam_at(&test, &["--key", key_path.to_str().unwrap(), "regions"]);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && message.contains("tenant \"default\" (id 1), key version 1"), "{message}");
    let listed = netdam_ok(&test, &["--key", "none", "regions"]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("vol"));
    let by_env = netdam_command(test.dir.path())
        .env("NETDAM_KEY", "none")
        .args(["--target", &test.target.local_addr().to_string(), "regions"])
        .output()
        .unwrap();
    assert!(by_env.status.success(), "{}", String::from_utf8_lossy(&by_env.stderr));
}

/// Asserts that `netdam args` was refused with an error (exit status 1, not a crash) that
/// names the range asked for and the space it does not fit, `culprit` (name and size).
fn assert_refused_out_of_range(output: &Output, args: &[&str], range: &str, culprit: &str) {
    let message = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "netdam {args:?} must fail with an error, not crash: {message}");
    assert!(
        message.contains(range) && message.contains(culprit) && message.contains("would run past the end"),
        "netdam {args:?}: the error names neither {range:?} nor {culprit:?}: {message}"
    );
}

/// A length or offset past the end of a region or namespace is refused before the read buffer
/// is allocated (1 TiB used to abort the process, 2^64 - 1 bytes to panic), with the region or
/// namespace, the range and its size named; and so are ranges whose end overflows 64 bits.
#[test]
fn reads_and_ranges_past_the_end_are_refused_up_front_without_a_crash() {
    let test = start_vol_and_disk();
    let out = test.dir.path().join("out.bin");
    let out = out.to_str().unwrap();
    let vol = "region \"vol\" (1048576 bytes";
    let disk = "namespace \"disk\" (64 blocks of 4096 bytes";
    let cases: [(&[&str], &str, &str); 9] = [
        (&["read", "vol", "0", "1TiB", "--out", out], "1099511627776 bytes at offset 0", vol),
        (&["read", "vol", "0", "0xffffffffffffffff", "--out", out], "18446744073709551615 bytes at offset 0", vol),
        (&["read", "vol", "0xffffffffffffffff", "8"], "8 bytes at offset 18446744073709551615", vol),
        (&["crc", "vol", "0xffffffffffffffff", "8"], "8 bytes at offset 18446744073709551615", vol),
        (&["fill", "vol", "1MiB", "1", "0"], "1 byte at offset 1048576", vol),
        (&["bread", "disk", "0", "4294967297"], "4294967297 blocks at block 0", disk),
        (&["bread", "disk", "0xffffffffffffffff", "1"], "1 block at block 18446744073709551615", disk),
        (&["trim", "disk", "0xffffffffffffffff", "1"], "1 block at block 18446744073709551615", disk),
        (&["block-status", "disk", "60", "5"], "5 blocks at block 60", disk),
    ];
    for (args, range, culprit) in cases {
        assert_refused_out_of_range(&netdam_at(&test, args), args, range, culprit);
    }
    assert!(!std::path::Path::new(out).exists(), "a refused read wrote its --out file");
    // The last byte and the last block are in range.
    netdam_ok(&test, &["read", "vol", "0xfffff", "1"]);
    netdam_ok(&test, &["bread", "disk", "63", "1"]);
}

/// A write that would run past the end of its region or namespace is refused before anything
/// is sent: it used to go as several instructions, those in range written before the target
/// refused the rest. The in-range part reads back as it was.
#[test]
fn an_out_of_range_write_changes_nothing() {
    let mut rng = Rng::new(seed());
    let test = start_vol_and_disk();
    let file = |name: &str, bytes: &[u8]| {
        let path = test.dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path.to_str().unwrap().to_string()
    };
    let read_back = |args: &[&str]| {
        let path = test.dir.path().join("read-back.bin");
        netdam_ok(&test, &[args, &["--out", path.to_str().unwrap()]].concat());
        std::fs::read(&path).unwrap()
    };

    // Region "vol": 100,000 bytes at 1,000,000, of which the first 48,576 fit.
    let tail = rng.bytes((VOL_BYTES - 1_000_000) as usize);
    netdam_ok(&test, &["write", "vol", "1000000", "--file", &file("tail.bin", &tail)]);
    let big = file("big.bin", &rng.bytes(100_000));
    let args = ["write", "vol", "1000000", "--file", &big];
    let refused = netdam_at(&test, &args);
    assert!(read_back(&["read", "vol", "1000000", "48576"]) == tail, "a refused write changed region vol");
    assert_refused_out_of_range(&refused, &args, "100000 bytes at offset 1000000", "region \"vol\" (1048576 bytes");

    // Namespace "disk": 10 blocks at block 60, of which the first 4 fit.
    let block_bytes = DISK_BLOCK_BYTES as usize;
    let last_blocks = rng.bytes(4 * block_bytes);
    netdam_ok(&test, &["bwrite", "disk", "60", "--file", &file("last-blocks.bin", &last_blocks)]);
    let ten_blocks = file("ten-blocks.bin", &rng.bytes(10 * block_bytes));
    let args = ["bwrite", "disk", "60", "--file", &ten_blocks];
    let refused = netdam_at(&test, &args);
    assert!(read_back(&["bread", "disk", "60", "4"]) == last_blocks, "a refused bwrite changed namespace disk");
    assert_refused_out_of_range(&refused, &args, "10 blocks at block 60", "namespace \"disk\" (64 blocks");
}

/// A write of nothing (`--data ""`, an empty file, stdin at its end) is refused by `write` and
/// `bwrite` alike, naming where the input came from; what was there stays.
#[test]
fn a_write_of_nothing_is_refused_naming_its_source() {
    let test = start_vol_and_disk();
    let empty = test.dir.path().join("empty.bin");
    std::fs::write(&empty, b"").unwrap();
    let empty = empty.to_str().unwrap();
    netdam_ok(&test, &["write", "vol", "0", "--data", "kept"]);
    for (args, says) in [
        (vec!["write", "vol", "0", "--data", ""], "write of nothing: --data is empty"),
        (vec!["write", "vol", "0", "--file", empty], "write of nothing: "),
        (vec!["write", "vol", "0"], "write of nothing: stdin gave no bytes"),
        (vec!["bwrite", "disk", "0", "--data", ""], "bwrite of nothing: --data is empty"),
        (vec!["bwrite", "disk", "0", "--file", empty], "bwrite of nothing: "),
    ] {
        // Stdin is /dev/null (`Command::output`), so the stdin case reads nothing at once.
        let refused = netdam_at(&test, &args);
        let message = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && message.contains(says), "netdam {args:?}: {message}");
        if args.contains(&"--file") {
            assert!(message.contains("empty.bin is empty"), "netdam {args:?} names the file: {message}");
        }
    }
    assert_eq!(netdam_ok(&test, &["read", "vol", "0", "4", "--out", "-"]).stdout, b"kept");
}

/// A streamed input (stdin here; a device or a pipe alike) is read no further than what fits
/// where it goes, so an endless one is refused instead of filling memory (`--file /dev/zero`
/// ran out of memory); a count of 0 asks for nothing and is refused, where `bread disk 0 0`
/// printed nothing and `--out` emptied its file.
#[test]
fn endless_input_and_zero_counts_are_refused_up_front() {
    use std::io::Write as _;
    let test = start_vol_and_disk();
    let target = test.target.local_addr().to_string();
    for (args, says) in [
        (vec!["write", "vol", "1048000"], "576 bytes from offset 1048000"),
        (vec!["bwrite", "disk", "60"], "at most 4 blocks from block 60"),
    ] {
        let mut child = netdam_command(test.dir.path())
            .args(["--target", &target])
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        // Far more than fits, written until netdam stops reading and closes the pipe.
        let writer = std::thread::spawn(move || {
            let chunk = vec![0x5au8; 1 << 16];
            for _ in 0..(1 << 14) {
                if stdin.write_all(&chunk).is_err() {
                    return true;
                }
            }
            false
        });
        let output = child.wait_with_output().unwrap();
        assert!(writer.join().unwrap(), "netdam {args:?} read 1 GiB of stdin");
        let message = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && message.contains("would run past the end") && message.contains(says),
            "netdam {args:?}: {message}"
        );
    }
    let out = test.dir.path().join("kept.bin");
    std::fs::write(&out, b"kept").unwrap();
    for args in [
        vec!["bread", "disk", "0", "0", "--out", out.to_str().unwrap()],
        vec!["trim", "disk", "0", "0"],
        vec!["block-status", "disk", "0", "0"],
        vec!["read", "vol", "0", "0"],
    ] {
        let refused = netdam_at(&test, &args);
        let message = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && message.contains("asks for nothing"), "netdam {args:?}: {message}");
    }
    assert_eq!(std::fs::read(&out).unwrap(), b"kept", "a refused bread left its --out file alone");
    // ENCRYPT and DECRYPT of 0 bytes seal (or open) the --aad alone: not refused as empty
    // (this target has no key slot, so the target refuses it for that instead).
    let encrypt = netdam_at(&test, &["encrypt", "vol", "0", "0", "--slot", "1", "--aad", "header"]);
    let message = String::from_utf8_lossy(&encrypt.stderr);
    assert!(!message.contains("asks for nothing") && message.contains("ENCRYPT"), "encrypt of 0 bytes: {message}");
}

/// Ctrl-C (or SIGTERM) ends a command with a word on what it may have left behind, where it
/// died silently in the middle of a write; the signal still ends it.
#[test]
fn an_interrupted_command_says_what_it_may_have_left() {
    let home = tempfile::tempdir().unwrap();
    // A target that never answers keeps the command waiting until it is interrupted.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for (args, signal, says) in [
        (vec!["write", "default", "0", "--data", "x"], libc::SIGINT, "the write may be done in part"),
        (vec!["regions"], libc::SIGTERM, "netdam: interrupted"),
    ] {
        let child = netdam_command(home.path())
            .args(["--target", &silent.local_addr().unwrap().to_string()])
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Once the handler is installed (the process's caught-signals mask shows it).
        let caught = || {
            let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
            let mask = status.lines().find_map(|line| line.strip_prefix("SigCgt:")).unwrap_or("0").trim().to_string();
            u64::from_str_radix(&mask, 16).unwrap_or(0) & (1 << (signal - 1)) != 0
        };
        let started = std::time::Instant::now();
        while !caught() {
            assert!(started.elapsed() < std::time::Duration::from_secs(20), "netdam {args:?} never caught the signal");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // SAFETY: signalling the child this test started and has not yet reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        let output = child.wait_with_output().unwrap();
        let message = String::from_utf8_lossy(&output.stderr);
        // Ended by the signal itself, so that a shell loop stops on Ctrl-C as it did.
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(output.status.signal(), Some(signal), "netdam {args:?}: {message}");
        assert!(message.contains(says), "netdam {args:?}: {message}");
    }
}

/// An option's variable set to nothing (`export NETDAM_KEY=`, how a shell clears a setting)
/// counts as unset, as the fio engine already took it: the option's default applies, where
/// clap said "a value is required for '--key <FILE>'".
#[test]
fn empty_environment_settings_count_as_unset() {
    let test = start_vol_and_disk();
    let output = netdam_command(test.dir.path())
        .env("NETDAM_TARGET", test.target.local_addr().to_string())
        .env("NETDAM_KEY", "")
        .env("NETDAM_ENCRYPT", "")
        .args(["write", "vol", "0", "--data", "set"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "empty NETDAM_KEY and NETDAM_ENCRYPT: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(netdam_ok(&test, &["read", "vol", "0", "3", "--out", "-"]).stdout, b"set");
}

/// NETDAM_ENCRYPT takes the boolean words a shell user writes (`NETDAM_ENCRYPT=1`, as the
/// README and the fio engine's `encrypt=1` have it), where clap took only true and false. On
/// a target with `auth = "none"`, without a key, a variable taken as true is refused for want
/// of a key, and one taken as false connects in the clear.
#[test]
fn netdam_encrypt_takes_1_0_yes_no_on_off() {
    let test = start_vol_and_disk();
    let with_encrypt = |value: &str| {
        netdam_command(test.dir.path())
            .env("NETDAM_TARGET", test.target.local_addr().to_string())
            .env("NETDAM_KEY", "none")
            .env("NETDAM_ENCRYPT", value)
            .arg("regions")
            .output()
            .unwrap()
    };
    for value in ["1", "true", "yes", "on", "TRUE"] {
        let output = with_encrypt(value);
        let message = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "NETDAM_ENCRYPT={value}: encryption without a key was not refused");
        assert!(message.contains("--encrypt: encryption needs a tenant key"), "NETDAM_ENCRYPT={value}: {message}");
    }
    for value in ["0", "false", "no", "off"] {
        let output = with_encrypt(value);
        assert!(output.status.success(), "NETDAM_ENCRYPT={value}: {}", String::from_utf8_lossy(&output.stderr));
    }
    let output = with_encrypt("maybe");
    let message = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{message}");
    assert!(message.contains("'maybe'") && message.contains("--encrypt"), "{message}");
}

/// A key slot the target cannot have (256 and up) is refused when the arguments are read, as
/// `netdam-target crypto-key create 256` refuses it, instead of reaching the target and
/// coming back `malformed`.
#[test]
fn a_key_slot_past_the_last_is_refused_before_anything_is_sent() {
    // Nothing listens on the discard port: a command that sent anything would say so.
    for (command, args) in [
        ("encrypt", &["encrypt", "vol", "0", "4", "--slot", "257"][..]),
        ("decrypt", &["decrypt", "vol", "0", "4", "--slot", "256", "--seal", &"0".repeat(56)]),
    ] {
        let home = tempfile::tempdir().unwrap();
        let output =
            netdam_command(home.path()).args(["--key", "none", "--target", "127.0.0.1:9"]).args(args).output().unwrap();
        let message = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{command}: {message}");
        assert!(
            message.contains("--slot")
                && message.contains("is beyond the last slot, 255")
                && !message.contains("target"),
            "{command}: {message}"
        );
    }
    let home = tempfile::tempdir().unwrap();
    let output = netdam_command(home.path()).args(["encrypt", "vol", "0", "4", "--slot", "one"]).output().unwrap();
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.code() == Some(2) && message.contains("\"one\" is not a slot number"), "{message}");
}

/// Block numbers and counts take 0x hex, as byte offsets and lengths do.
#[test]
fn block_numbers_and_counts_take_hex() {
    let test = start_vol_and_disk();
    let input = test.dir.path().join("in.bin");
    let output = test.dir.path().join("out.bin");
    let blocks = Rng::new(seed()).bytes(2 * DISK_BLOCK_BYTES as usize);
    std::fs::write(&input, &blocks).unwrap();
    netdam_ok(&test, &["bwrite", "disk", "0x10", "--file", input.to_str().unwrap()]);
    netdam_ok(&test, &["bread", "disk", "16", "2", "--out", output.to_str().unwrap()]);
    assert!(std::fs::read(&output).unwrap() == blocks, "bwrite at block 0x10 did not write block 16");
    netdam_ok(&test, &["bread", "disk", "0x10", "0x2", "--out", output.to_str().unwrap()]);
    assert!(std::fs::read(&output).unwrap() == blocks, "bread at block 0x10 did not read block 16");
    netdam_ok(&test, &["write-zeroes", "disk", "0x11", "0x1"]);
    netdam_ok(&test, &["trim", "disk", "0x12", "0x1"]);
    let status = netdam_ok(&test, &["--json", "block-status", "disk", "0x10", "0x2"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["extents"][0]["lba"], 16, "{status}");
    let refused = netdam_at(&test, &["bread", "disk", "0x1g", "1"]);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && message.contains("\"0x1g\" is not a block number"), "{message}");
    // A byte unit on a block count would count 4096 blocks where 4 KiB was meant.
    let refused = netdam_at(&test, &["bread", "disk", "0", "4KiB"]);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && message.contains("takes no byte unit"), "{message}");
}

/// `trim` and `write-zeroes` over more than one instruction may zero (MAX_BLOCK_ZERO_BYTES,
/// 64 MiB) go as several instructions, all of the range done.
#[test]
fn trim_and_write_zeroes_cover_ranges_larger_than_one_instruction() {
    const BIG_BLOCKS: u64 = 24_576; // 96 MiB of 4 KiB blocks
    let test = start_vol_and(file_namespace("big", BIG_BLOCKS));
    let input = test.dir.path().join("in.bin");
    let output = test.dir.path().join("out.bin");
    let zeroes = vec![0u8; DISK_BLOCK_BYTES as usize];
    let total = BIG_BLOCKS.to_string();
    for command in ["write-zeroes", "trim"] {
        // Data in the first and the last block, both in the range and past the first 64 MiB.
        let data = Rng::new(seed()).bytes(DISK_BLOCK_BYTES as usize);
        std::fs::write(&input, &data).unwrap();
        for block in ["0", "24575"] {
            netdam_ok(&test, &["bwrite", "big", block, "--file", input.to_str().unwrap()]);
        }
        netdam_ok(&test, &[command, "big", "0", &total]);
        for block in ["0", "24575"] {
            netdam_ok(&test, &["bread", "big", block, "1", "--out", output.to_str().unwrap()]);
            assert!(std::fs::read(&output).unwrap() == zeroes, "{command} over {total} blocks left block {block}");
        }
    }
}

/// On a namespace of more than 2^32 blocks (512-byte blocks, 2 TiB and a bit of sparse file),
/// `trim` and `block-status` take a count past 32 bits, and so does `write-zeroes`, where they
/// were refused as "one command covers at most 4294967295 blocks"; the range goes as several
/// instructions, and a hole longer than one BLOCK_STATUS answer covers shows as one extent.
/// (`write-zeroes` is tried only where nothing is sent, or over a few blocks: zeroed blocks of
/// a file are allocated, and 2 TiB of them would fill the disk.)
#[test]
fn block_counts_past_32_bits_cover_the_whole_range() {
    const BLOCKS: u64 = (1 << 32) + 4096;
    const FAR: u64 = (1 << 32) + 8;
    let test = start_vol_and(netdam_target::config::NamespaceConfig {
        block_size: 512,
        size: Some(netdam_target::config::ByteSize(BLOCKS * 512)),
        ..file_namespace("huge", 1)
    });
    let input = test.dir.path().join("in.bin");
    // One 4 KiB block of the file system: eight of the namespace's, a data extent of its own.
    std::fs::write(&input, Rng::new(seed()).bytes(4096)).unwrap();
    for lba in ["0", &FAR.to_string()] {
        netdam_ok(&test, &["bwrite", "huge", lba, "--file", input.to_str().unwrap()]);
    }
    let total = BLOCKS.to_string();
    let extents = |test: &common::TestTarget| -> Vec<(u64, u64, bool)> {
        let status = netdam_ok(test, &["--json", "block-status", "huge", "0", &total]);
        let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
        let extents = status["extents"].as_array().unwrap_or_else(|| panic!("no extents: {status}"));
        let field = |extent: &serde_json::Value, name: &str| extent[name].as_u64().unwrap();
        extents.iter().map(|e| (field(e, "lba"), field(e, "blocks"), e["hole"].as_bool().unwrap())).collect()
    };
    assert_eq!(
        extents(&test),
        vec![(0, 8, false), (8, FAR - 8, true), (FAR, 8, false), (FAR + 8, BLOCKS - FAR - 8, true)],
        "block-status over {BLOCKS} blocks"
    );
    let trimmed = netdam_ok(&test, &["trim", "huge", "0", &total]);
    assert_eq!(
        String::from_utf8_lossy(&trimmed.stdout),
        format!("trimmed {BLOCKS} blocks at block 0 of namespace huge\n")
    );
    assert_eq!(extents(&test), vec![(0, BLOCKS, true)], "block-status after trimming all {BLOCKS} blocks");
    let output = test.dir.path().join("out.bin");
    netdam_ok(&test, &["bread", "huge", &FAR.to_string(), "8", "--out", output.to_str().unwrap()]);
    assert!(std::fs::read(&output).unwrap() == vec![0u8; 4096], "trim left block {FAR}");
    netdam_ok(&test, &["write-zeroes", "huge", &FAR.to_string(), "8"]);
    // Past the end by a block: refused by the range, not by the count, and nothing sent.
    let args = ["write-zeroes", "huge", "1", &total];
    let refused = netdam_at(&test, &args);
    assert_refused_out_of_range(&refused, &args, &format!("{BLOCKS} blocks at block 1"), "namespace \"huge\"");
}

/// Runs `netdam args` against `test`'s target, which must succeed; returns the most resident
/// memory it was seen to hold, in bytes: its high-water mark (VmHWM) read every few ms while it
/// runs. Not `ru_maxrss` from wait4: the kernel counts into that the memory of this test
/// process, which the child shared between fork and exec.
fn netdam_peak_memory_bytes(test: &common::TestTarget, args: &[&str]) -> u64 {
    let mut child = netdam_command(test.dir.path())
        .args(["--target", &test.target.local_addr().to_string()])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // `spawn` returns once the child has exec'd: from here its status is netdam's own.
    let status_path = format!("/proc/{}/status", child.id());
    let mut peak_bytes = 0u64;
    while child.try_wait().unwrap().is_none() {
        let status = std::fs::read_to_string(&status_path).unwrap_or_default();
        let high_water_kib = status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|value| value.trim().strip_suffix("kB").and_then(|kib| kib.trim().parse::<u64>().ok()));
        peak_bytes = peak_bytes.max(high_water_kib.unwrap_or(0) * 1024);
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "netdam {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    peak_bytes
}

/// Blocks of namespace "big" and bytes of region "vol" for the streaming tests: 96 MiB of 4 KiB
/// blocks and 80 MiB, several of the 16 MiB pieces the command line streams; and the memory a
/// streaming command stays under, less than either.
const STREAM_BLOCKS: u64 = 24_576;
const STREAM_REGION_BYTES: u64 = 80 << 20;
const STREAM_MEMORY_BOUND_BYTES: u64 = 64 << 20;

/// A target in this process serving region "vol" and namespace "big" (a file) of those sizes.
fn start_for_streaming() -> common::TestTarget {
    common::start_with_namespaces(
        vec![common::region("vol", STREAM_REGION_BYTES, false)],
        vec![file_namespace("big", STREAM_BLOCKS)],
        1,
        9000,
    )
}

/// `bread` and `read` of more than the piece they read at a time (16 MiB) stream to their
/// output: the bytes come out whole and in order, into a file and to standard output, across
/// the pieces' boundaries, while the command's memory stays near one piece, not the length (a
/// 1 GiB bread held 1 GiB, and an 8 GiB one was refused).
#[test]
fn long_reads_stream_to_their_output_in_bounded_memory() {
    const PIECE_BYTES: usize = 16 << 20;
    let test = start_for_streaming();
    let block_bytes = DISK_BLOCK_BYTES as usize;
    let mut rng = Rng::new(seed());
    let input = test.dir.path().join("in.bin");
    let output = test.dir.path().join("out.bin");
    let (input, output) = (input.to_str().unwrap(), output.to_str().unwrap());
    // Data across the first pieces' boundary and in the last blocks; holes (zeroes) between.
    let mut disk = vec![0u8; STREAM_BLOCKS as usize * block_bytes];
    let mut region = vec![0u8; STREAM_REGION_BYTES as usize];
    for at in [PIECE_BYTES - 5 * block_bytes, disk.len() - 3 * block_bytes] {
        let data = rng.bytes(disk.len().min(at + 8 * block_bytes) - at);
        std::fs::write(input, &data).unwrap();
        netdam_ok(&test, &["bwrite", "big", &(at / block_bytes).to_string(), "--file", input]);
        disk[at..at + data.len()].copy_from_slice(&data);
    }
    for at in [PIECE_BYTES - 1000, region.len() - 77] {
        let data = rng.bytes(region.len().min(at + 5000) - at);
        std::fs::write(input, &data).unwrap();
        netdam_ok(&test, &["write", "vol", &at.to_string(), "--file", input]);
        region[at..at + data.len()].copy_from_slice(&data);
    }
    let all_blocks = STREAM_BLOCKS.to_string();
    netdam_ok(&test, &["bread", "big", "0", &all_blocks, "--out", output]);
    assert!(std::fs::read(output).unwrap() == disk, "bread of {STREAM_BLOCKS} blocks into a file");
    let from_block_1 = netdam_ok(&test, &["bread", "big", "1", &(STREAM_BLOCKS - 1).to_string(), "--out", "-"]);
    assert!(from_block_1.stdout == disk[block_bytes..], "bread of {} blocks to stdout", STREAM_BLOCKS - 1);
    // From an odd offset, so that no piece starts on a boundary of the region's.
    let (offset, len) = (7, STREAM_REGION_BYTES - 7);
    netdam_ok(&test, &["read", "vol", &offset.to_string(), &len.to_string(), "--out", output]);
    assert!(std::fs::read(output).unwrap() == region[offset..], "read of {len} bytes into a file");
    let to_stdout = netdam_ok(&test, &["read", "vol", &offset.to_string(), &len.to_string(), "--out", "-"]);
    assert!(to_stdout.stdout == region[offset..], "read of {len} bytes to stdout");

    for args in [
        ["bread", "big", "0", &all_blocks, "--out", "/dev/null"],
        ["read", "vol", "0", &STREAM_REGION_BYTES.to_string(), "--out", "/dev/null"],
    ] {
        let peak = netdam_peak_memory_bytes(&test, &args);
        assert!(peak < STREAM_MEMORY_BOUND_BYTES, "netdam {args:?} held {peak} bytes at its peak");
    }
}

/// `bwrite` and `write` from a regular file longer than a piece (16 MiB) send it a piece at a
/// time: the bytes land whole and in order across the pieces' boundaries, a last partial block
/// zero-padded with --pad (refused before anything is sent without it), and the command's
/// memory stays near one piece, not the file's length (the whole input was held, and one
/// larger than memory refused).
#[test]
fn long_writes_from_a_file_stream_in_bounded_memory() {
    let test = start_for_streaming();
    let block_bytes = DISK_BLOCK_BYTES as usize;
    let mut rng = Rng::new(seed());
    let input_path = test.dir.path().join("in.bin");
    let input = input_path.to_str().unwrap();

    // From block 3 to the end, the last block a partial one.
    let data = rng.bytes((STREAM_BLOCKS as usize - 3) * block_bytes - 100);
    std::fs::write(input, &data).unwrap();
    let refused = netdam_at(&test, &["bwrite", "big", "3", "--file", input]);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && message.contains("pass --pad"), "{message}");
    netdam_ok(&test, &["bwrite", "big", "3", "--file", input, "--pad"]);
    let back = netdam_ok(&test, &["bread", "big", "3", &(STREAM_BLOCKS - 3).to_string(), "--out", "-"]).stdout;
    assert_eq!(back.len(), (STREAM_BLOCKS as usize - 3) * block_bytes);
    assert!(back[..data.len()] == data[..], "bwrite of {} bytes from a file", data.len());
    assert!(back[data.len()..].iter().all(|&byte| byte == 0), "the padding is zeroes");
    let peak = netdam_peak_memory_bytes(&test, &["bwrite", "big", "3", "--file", input, "--pad"]);
    assert!(peak < STREAM_MEMORY_BOUND_BYTES, "bwrite of {} bytes held {peak} bytes at its peak", data.len());

    // From an odd offset to the end of the region; one byte more is refused before anything is sent.
    let data = rng.bytes(STREAM_REGION_BYTES as usize - 7);
    std::fs::write(input, &data).unwrap();
    netdam_ok(&test, &["write", "vol", "7", "--file", input]);
    let back = netdam_ok(&test, &["read", "vol", "7", &data.len().to_string(), "--out", "-"]).stdout;
    assert!(back == data, "write of {} bytes from a file", data.len());
    let mut longer = data.clone();
    longer.push(1);
    std::fs::write(input, &longer).unwrap();
    let refused = netdam_at(&test, &["write", "vol", "7", "--file", input]);
    assert!(!refused.status.success(), "a file one byte past the region was written");
    let first = netdam_ok(&test, &["read", "vol", "7", "16", "--out", "-"]).stdout;
    assert!(first == data[..16], "the refused write changed the region");
    std::fs::write(input, &data).unwrap();
    let peak = netdam_peak_memory_bytes(&test, &["write", "vol", "7", "--file", input]);
    assert!(peak < STREAM_MEMORY_BOUND_BYTES, "write of {} bytes held {peak} bytes at its peak", data.len());
}

/// `netdam nbd` whose --listen cannot be bound (a TCP port in use, a unix socket in a missing
/// directory) says "cannot listen on" the address once, not twice.
#[test]
fn an_export_that_cannot_listen_says_so_once() {
    let test = start_vol_and_disk();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp = format!("tcp:{}", taken.local_addr().unwrap());
    let unix = format!("unix:{}", test.dir.path().join("missing/export.sock").display());
    for listen in [tcp, unix] {
        let output = netdam_at(&test, &["nbd", "--namespace", "disk", "--listen", &listen]);
        let message = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "netdam nbd --listen {listen} served: {message}");
        assert_eq!(message.matches("cannot listen on").count(), 1, "{message}");
        assert!(message.contains(&format!("cannot listen on {listen}: ")), "{message}");
    }
}

/// `--target` takes a host name as well as an address; a name that does not resolve, or an
/// address without a port, is refused before anything is sent, naming what was given.
#[test]
fn the_target_may_be_named_by_host_name() {
    let test = start_vol_and_disk();
    let port = test.target.local_addr().port();
    let named =
        netdam_command(test.dir.path()).args(["--target", &format!("localhost:{port}"), "regions"]).output().unwrap();
    assert!(named.status.success(), "netdam --target localhost:{port}: {}", String::from_utf8_lossy(&named.stderr));
    assert!(String::from_utf8_lossy(&named.stdout).contains("vol"), "{}", String::from_utf8_lossy(&named.stdout));
    let refusals = [
        ("no-such-host.invalid:7800", "cannot resolve"),
        ("localhost", "is not HOST:PORT"),
        ("127.0.0.1:99999", "port 99999 is out of range"),
    ];
    for (given, says) in refusals {
        let refused = netdam_command(test.dir.path()).args(["--target", given, "ping"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(2), "{given}: {stderr}");
        assert!(stderr.contains(given) && stderr.contains(says), "{given}: {stderr}");
    }
}

/// A first start refused because its port (or its metrics port) is taken leaves nothing behind:
/// no data directory, so no default region and no tenant key that a later start would find
/// without having made. The refusal names the address; the next start on a free port is the
/// first, and says in its banner that it created the default tenant.
#[test]
fn a_start_refused_for_a_taken_port_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap().to_string();
    let first = serving(&taken_addr, &data).output().unwrap();
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(!first.status.success(), "the port is taken: {stderr}");
    assert!(stderr.contains(&taken_addr) && stderr.contains("another netdam-target"), "{stderr}");
    assert!(!data.exists(), "the refused start created {}", data.display());

    let metrics = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let metrics_addr = metrics.local_addr().unwrap().to_string();
    let second = Command::new(env!("CARGO_BIN_EXE_netdam-target"))
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", &metrics_addr, "--poll", "blocking", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "the metrics port is taken: {stderr}");
    assert!(stderr.contains(&metrics_addr) && stderr.contains("--metrics-listen"), "{stderr}");
    assert!(!data.exists(), "the refused start created {}", data.display());

    let banner = banner_of(serving("127.0.0.1:0", &data));
    let key = data.join("tenants/default.key");
    assert!(key.is_file(), "a start that serves makes the default tenant's key file");
    assert!(
        banner.contains(&format!("created tenant \"default\" (all permissions) with key file {}", key.display())),
        "{banner}"
    );
}

/// A start that fails after it took the data directory (a region it cannot open) writes no
/// default tenant: the key file would name a tenant of a target that never served.
#[test]
fn a_start_that_fails_on_a_region_creates_no_default_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("blocked.region")).unwrap();
    let config = dir.path().join("target.toml");
    std::fs::write(
        &config,
        "[[region]]\nname = \"r\"\nbackend = \"file\"\npath = \"blocked.region\"\nsize = \"1MiB\"\n",
    )
    .unwrap();
    let failed = serving("127.0.0.1:0", &data).arg("--config").arg(&config).output().unwrap();
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success() && stderr.contains("blocked.region"), "{stderr}");
    assert!(!data.join("tenants/default.key").exists(), "a failed start wrote the default tenant's key");
    assert!(!data.join("metadata.redb").exists(), "a failed start made a store");
    std::fs::remove_dir(data.join("blocked.region")).unwrap();
    let banner = banner_of({
        let mut command = serving("127.0.0.1:0", &data);
        command.arg("--config").arg(&config);
        command
    });
    assert!(banner.contains("created tenant \"default\""), "the first start that serves creates it: {banner}");
}

/// The banner's "Reach it with" command works as printed: with tenants required and a data
/// directory other than the default, it names the default tenant's key file, which `netdam`
/// would not find on its own (`stat` then said only "unauthenticated").
#[test]
fn the_banners_reach_command_works_as_printed() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("elsewhere");
    let mut child = serving("127.0.0.1:0", &data)
        .env("XDG_DATA_HOME", dir.path().join("xdg"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let reach = loop {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the banner ended without a Reach line");
        if let Some(command) = line.strip_prefix("Reach it with:") {
            break command.trim().to_string();
        }
    };
    let key = data.join("tenants/default.key");
    assert!(reach.contains(&format!("--key {}", key.display())), "{reach}");
    let args: Vec<&str> = reach.split_whitespace().skip(1).collect();
    let output = netdam_command(dir.path()).args(&args).output().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && text.contains("workers"),
        "{reach}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A second target on a data directory another serves is refused before it writes anything
/// there: with tenants required it would first have created the default tenant and its key
/// file in the other's store.
#[test]
fn a_second_target_on_a_served_directory_writes_nothing_there() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let mut first = serving("127.0.0.1:0", data)
        .args(["--auth", "none"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    read_banner(&mut first);
    let second = serving("127.0.0.1:0", data).args(["--auth", "tenants"]).output().unwrap();
    let _ = first.kill();
    let _ = first.wait();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "a second target started: {stderr}");
    assert!(stderr.contains("another target") && stderr.contains(data) && stderr.contains("--data-dir"), "{stderr}");
    assert!(!dir.path().join("tenants").exists(), "the refused target wrote a tenant into the served directory");
}

/// A region's file cut short under the running target (by someone else, or storage gone)
/// leaves its mapping without bytes, and the next request that touches them is a bus error.
/// The target still stops (it cannot answer with bytes it no longer holds), but it first says
/// which region and which file, and what to do; before, it died with nothing in its log.
#[test]
fn a_region_file_cut_short_under_the_target_is_named_before_it_stops() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("target.toml");
    std::fs::write(&config, "[[region]]\nname = \"vol\"\nbackend = \"file\"\npath = \"vol.region\"\nsize = \"1MiB\"\n")
        .unwrap();
    let start = || {
        let mut command = serving("127.0.0.1:0", &data);
        command.args(["--auth", "none", "--config"]).arg(&config);
        command
    };
    let mut serving_target = start();
    // SAFETY: setrlimit only, between fork and exec: no core file of the bus error below.
    unsafe {
        use std::os::unix::process::CommandExt;
        serving_target.pre_exec(|| {
            let none = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            Ok(())
        });
    }
    let mut target = serving_target.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let banner = read_banner(&mut target);
    let addr = banner.split("serving on ").nth(1).and_then(|rest| rest.split_whitespace().next()).unwrap().to_string();
    let region_file = data.join("vol.region");
    std::fs::OpenOptions::new().write(true).open(&region_file).unwrap().set_len(0).unwrap();

    let mut reader = Command::new(common::netdam_binary())
        .args(["--target", &addr, "--key", "none", "read", "vol", "8192", "64"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = target.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "the target kept running after its region's file was cut short");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let _ = reader.kill();
    let _ = reader.wait();
    let mut log = String::new();
    std::io::Read::read_to_string(&mut target.stderr.take().unwrap(), &mut log).unwrap();
    assert_eq!(status.signal(), Some(libc::SIGBUS), "{status:?}: {log}");
    let named = format!("netdam-target: region \"vol\": its file {} was cut short", region_file.display());
    assert!(log.contains(&named) && log.contains("(1048576 bytes)"), "{log}");

    // Restarted (by a supervisor, say), the target does not size the empty file again and
    // serve zeroes as the region's data.
    let restarted = refused_start(start());
    let stderr = String::from_utf8_lossy(&restarted.stderr);
    assert!(!restarted.status.success(), "{stderr}");
    assert!(stderr.contains("holds no bytes, but an earlier start served it with 1048576 bytes"), "{stderr}");
    assert_eq!(std::fs::metadata(&region_file).unwrap().len(), 0);
}

/// A configured space's file that an earlier start served, gone at a later start (a file system
/// not mounted yet, a file moved), is not made again empty: the start is refused naming the file
/// and nothing is created there. Once the file is back it is served with its data; an empty
/// file of its size, made on purpose as the refusal says, is served as a fresh one.
#[test]
fn a_configured_space_whose_file_is_gone_is_not_made_again_empty() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("target.toml");
    std::fs::write(
        &config,
        "[[region]]\nname = \"vol\"\nbackend = \"file\"\npath = \"vol.region\"\nsize = \"1MiB\"\n\n\
         [[namespace]]\nname = \"disk\"\nbackend = \"file\"\npath = \"disk.img\"\nsize = \"2MiB\"\n",
    )
    .unwrap();
    let start = || {
        let mut command = serving("127.0.0.1:0", &data);
        command.args(["--auth", "none", "--config"]).arg(&config);
        command
    };
    let first = banner_of(start());
    assert!(first.contains("\"vol\"") && first.contains("\"disk\""), "{first}");
    let (vol, disk) = (data.join("vol.region"), data.join("disk.img"));
    let mut kept = std::fs::read(&vol).unwrap();
    kept[..4].copy_from_slice(b"kept");
    std::fs::write(&vol, &kept).unwrap();

    for (kind, name, path, size) in [("region", "vol", &vol, 1 << 20), ("namespace", "disk", &disk, 2 << 20)] {
        let away = dir.path().join(name);
        std::fs::rename(path, &away).unwrap();
        let refused = refused_start(start());
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{stderr}");
        let named =
            format!("{kind} \"{name}\": its file {} is missing, but an earlier start served it", path.display());
        assert!(stderr.contains(&named), "{stderr}");
        assert!(stderr.contains(&format!("truncate -s {size} {}", path.display())), "{stderr}");
        assert!(!path.exists(), "the refused start made {} again", path.display());
        std::fs::rename(&away, path).unwrap();
    }
    let again = banner_of(start());
    assert!(again.contains("\"vol\"") && again.contains("\"disk\""), "{again}");
    assert_eq!(&std::fs::read(&vol).unwrap()[..4], b"kept", "the region's data is served again");

    // Gone for good: the empty file the refusal names starts it afresh.
    std::fs::remove_file(&disk).unwrap();
    assert!(!refused_start(start()).status.success());
    std::fs::File::create(&disk).unwrap().set_len(2 << 20).unwrap();
    let fresh = banner_of(start());
    assert!(fresh.contains("\"disk\""), "{fresh}");

    // Settings that now keep the region in memory: the next start says, once, that the data of
    // the file it was served from is not served, and leaves the file alone.
    std::fs::write(
        &config,
        "[[region]]\nname = \"vol\"\nbackend = \"mem\"\nsize = \"1MiB\"\n\n\
         [[namespace]]\nname = \"disk\"\nbackend = \"file\"\npath = \"disk.img\"\nsize = \"2MiB\"\n",
    )
    .unwrap();
    let (_, log) = banner_and_log(&mut start());
    let left = format!(
        "region \"vol\": an earlier start served it from {}, and the settings now have it kept in memory (volatile)",
        vol.display()
    );
    assert!(log.contains(&left), "{log}");
    let (_, log) = banner_and_log(&mut start());
    assert!(!log.contains("an earlier start served it"), "said again: {log}");
    assert_eq!(&std::fs::read(&vol).unwrap()[..4], b"kept");
}

/// A data directory copied without the embedded default region's file (a store restored from
/// a backup elsewhere, say) is refused rather than served with an empty region under the name:
/// the refusal names the file the region was served from and how to bring it. With the file
/// copied, the region is served with its data.
#[test]
fn a_data_directory_moved_without_its_region_file_is_refused_not_served_empty() {
    let dir = tempfile::tempdir().unwrap();
    if netdam_target::configured_files::on_memory_file_system(dir.path()) {
        // Files on tmpfs are not recorded: they start empty after every reboot by design.
        println!("SKIPPED: the temporary directory is on tmpfs, whose files a target does not record");
        return;
    }
    let (old, new) = (dir.path().join("old"), dir.path().join("new"));
    banner_of(serving("127.0.0.1:0", &old));
    let old = old.canonicalize().unwrap();
    let region = old.join("default.region");
    let mut bytes = std::fs::read(&region).unwrap();
    bytes[..4].copy_from_slice(b"kept");
    std::fs::write(&region, &bytes).unwrap();
    std::fs::create_dir(&new).unwrap();
    let new = new.canonicalize().unwrap();
    for entry in std::fs::read_dir(&old).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() && entry.file_name() != "default.region" {
            std::fs::copy(entry.path(), new.join(entry.file_name())).unwrap();
        }
    }
    let refused = refused_start(serving("127.0.0.1:0", &new));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    let named = format!(
        "region \"default\": its file {} is missing, but an earlier start served it from {} with {} bytes",
        new.join("default.region").display(),
        region.display(),
        bytes.len()
    );
    assert!(stderr.contains(&named), "{stderr}");
    assert!(stderr.contains("cp --sparse=always") && stderr.contains("truncate -s"), "{stderr}");
    assert!(!new.join("default.region").exists(), "the refused start made the region's file anew");

    std::fs::copy(&region, new.join("default.region")).unwrap();
    assert!(banner_of(serving("127.0.0.1:0", &new)).contains("\"default\""));
    assert_eq!(&std::fs::read(new.join("default.region")).unwrap()[..4], b"kept", "served with its data");
}

/// A configured namespace served again in blocks of another size is warned of once, naming
/// both sizes (and, as at every start, the bytes past the last whole block); its bytes stay
/// as they were. (A file
/// system made in the old blocks may no longer mount: the change was taken without a word.)
#[test]
fn a_configured_namespace_served_in_blocks_of_another_size_is_warned_of_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let disk = data.join("disk.img");
    let bytes: Vec<u8> = (0..(1u32 << 20) + 512).map(|index| (index % 253) as u8).collect();
    std::fs::write(&disk, &bytes).unwrap();
    let config = dir.path().join("target.toml");
    let settings = |block_size: u32| {
        let namespace = "[[namespace]]\nname = \"disk\"\nbackend = \"file\"\npath = \"disk.img\"\n";
        std::fs::write(&config, format!("{namespace}block_size = {block_size}\n")).unwrap();
        let mut command = serving("127.0.0.1:0", &data);
        command.args(["--auth", "none", "--config"]).arg(&config);
        command
    };
    let (banner, log) = banner_and_log(&mut settings(512));
    assert!(banner.contains("\"disk\""), "{banner}");
    assert!(!log.contains("block_size"), "{log}");
    let (banner, log) = banner_and_log(&mut settings(4096));
    assert!(banner.contains("\"disk\""), "{banner}");
    let warned = format!(
        "namespace \"disk\": an earlier start served {} in blocks of 512 bytes, and the settings now say block_size = 4096",
        disk.canonicalize().unwrap().display()
    );
    assert!(log.contains(&warned), "{log}");
    assert!(log.contains("512 past its last whole block of 4096 bytes"), "{log}");
    let (_, log) = banner_and_log(&mut settings(4096));
    assert!(!log.contains("an earlier start served"), "said again: {log}");
    assert!(std::fs::read(&disk).unwrap() == bytes, "the namespace's file changed");
}

/// A namespace made on a file whose size is not a multiple of its block size serves whole
/// blocks only; the bytes past the last one are named, not dropped without a word (`size` in
/// the settings must be a multiple, and is refused otherwise).
#[test]
fn a_namespace_file_with_a_partial_last_block_is_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::File::create(dir.path().join("odd.img")).unwrap().set_len((8 << 20) + 512).unwrap();
    let data = dir.path().to_str().unwrap();
    let create = ["namespace", "create", "odd", "--backend", "file", "--path", "odd.img", "--block-size", "4096"];
    let output = target_admin(&[&create[..], &["--data-dir", data]].concat());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("2048 blocks of 4096 bytes"));
    assert!(
        stderr.contains(
            "the file holds 8389120 bytes, 512 past its last whole block of 4096 bytes: those are not served"
        ),
        "{stderr}"
    );
}

/// The record of configured files knows a file however its directory is spelt (here through a
/// symbolic link to the data directory), and leaves out files on tmpfs, whose data a reboot
/// takes by design: such a file gone is made again empty, as before.
#[test]
fn configured_files_are_known_through_links_and_those_on_tmpfs_start_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&data, &link).unwrap();
    let shm = std::path::Path::new("/dev/shm");
    let on_tmpfs = shm.is_dir() && netdam_target::configured_files::on_memory_file_system(shm);
    /// Removes the file on tmpfs however the test ends.
    struct RemovedAtEnd(std::path::PathBuf);
    impl Drop for RemovedAtEnd {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let removed = RemovedAtEnd(shm.join(format!("netdam-cli-test-{}.region", std::process::id())));
    let shm_file = &removed.0;
    let config = dir.path().join("target.toml");
    let mut settings =
        "[[region]]\nname = \"vol\"\nbackend = \"file\"\npath = \"vol.region\"\nsize = \"1MiB\"\n".to_string();
    if on_tmpfs {
        settings += &format!(
            "\n[[region]]\nname = \"scratch\"\nbackend = \"file\"\npath = \"{}\"\nsize = \"1MiB\"\n",
            shm_file.display()
        );
    } else {
        eprintln!("skipped the tmpfs half: /dev/shm is not a tmpfs here");
    }
    std::fs::write(&config, settings).unwrap();
    let start = |data: &Path| {
        let mut command = serving("127.0.0.1:0", data);
        command.args(["--auth", "none", "--config"]).arg(&config);
        command
    };
    let first = banner_of(start(&link));
    assert!(first.contains("\"vol\""), "{first}");

    std::fs::remove_file(data.join("vol.region")).unwrap();
    let refused = refused_start(start(&data));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("is missing, but an earlier start served it"), "{stderr}");
    std::fs::File::create(data.join("vol.region")).unwrap().set_len(1 << 20).unwrap();
    if on_tmpfs {
        std::fs::remove_file(shm_file).unwrap();
        let again = banner_of(start(&data));
        assert!(again.contains("\"scratch\""), "a tmpfs file gone is made again: {again}");
    }
}

/// A region in the settings file named like a stored one: the start is refused saying which is
/// which and how to part them (it said only that the name was used twice).
#[test]
fn a_configured_space_named_like_a_stored_one_is_refused_saying_which_is_which() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_text = data.to_str().unwrap();
    let created =
        target_admin(&["region", "create", "vol", "--backend", "mem", "--size", "1MiB", "--data-dir", data_text]);
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let config = dir.path().join("target.toml");
    std::fs::write(&config, "[[region]]\nname = \"vol\"\nbackend = \"mem\"\nsize = \"1MiB\"\n").unwrap();
    let mut start = serving("127.0.0.1:0", &data);
    start.args(["--auth", "none", "--config"]).arg(&config);
    let refused = refused_start(start);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("region \"vol\" is in the settings file and also in the metadata store")
            && stderr.contains("netdam-target region delete vol"),
        "{stderr}"
    );
}
