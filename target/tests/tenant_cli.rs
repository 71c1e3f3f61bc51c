//! `netdam-target tenant|grant|revoke` as a user runs them: the real binary on a temporary data
//! directory, its key files, its listing, its refusals; and a running target applying each
//! change within a second while the commands keep coming.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use netdam_auth::{KeyFile, TenantKey};
use netdam_isa::extension::Permissions;

/// Runs `netdam-target ARGS --data-dir DIR`.
fn admin(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_netdam-target"))
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .env("NETDAM_LOG", "warn")
        .output()
        .expect("netdam-target runs")
}

fn text(output: &Output) -> (String, String) {
    (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// Runs the command, asserts it succeeded, returns its standard output.
fn ok(dir: &Path, args: &[&str]) -> String {
    let output = admin(dir, args);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "netdam-target {args:?} failed:\n{stdout}{stderr}");
    stdout
}

/// Runs the command, asserts it failed, returns its standard error.
fn fails(dir: &Path, args: &[&str]) -> String {
    let output = admin(dir, args);
    let (stdout, stderr) = text(&output);
    assert!(!output.status.success(), "netdam-target {args:?} succeeded:\n{stdout}");
    stderr
}

/// Runs `netdam-target ARGS` as given, for a user whose home (and default data directory) is
/// `home`.
fn admin_as_given(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_netdam-target"))
        .args(args)
        .env("HOME", home)
        .env("XDG_DATA_HOME", home.join("xdg"))
        .env("NETDAM_LOG", "warn")
        .output()
        .expect("netdam-target runs")
}

fn list_json(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&ok(dir, &["tenant", "list", "--json"])).expect("tenant list --json prints JSON")
}

#[test]
fn create_grant_list_rotate_revoke_delete() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path();
    assert!(ok(dir, &["tenant", "list"]).contains("no tenants"));
    assert!(!dir.join("metadata.redb").exists(), "listing creates no store");

    let created = ok(dir, &["tenant", "create", "alice", "--class", "best-effort", "--max-sessions", "8"]);
    let key_path = dir.join("tenants/alice.key");
    assert!(created.contains(&key_path.display().to_string()), "{created}");
    assert!(created.contains(&format!("netdam --key {}", key_path.display())), "{created}");
    assert!(created.contains(&format!("NETDAM_KEY={}", key_path.display())), "{created}");
    assert!(created.contains("within a second"), "{created}");
    assert_eq!(std::fs::metadata(&key_path).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(dir.join("tenants")).unwrap().permissions().mode() & 0o777, 0o700);
    let store_mode = std::fs::metadata(dir.join("metadata.redb")).unwrap().permissions().mode();
    assert_eq!(store_mode & 0o077, 0, "the store holds keys: owner-only");
    let first = KeyFile::load(&key_path).expect("the key file loads");
    assert_eq!((first.tenant.as_str(), first.id, first.version), ("alice", 1, 1));

    let granted = ok(dir, &["grant", "alice", "region:default", "read,write", "--range", "0:64KiB"]);
    assert!(granted.contains("region:default  read,write  (bytes 0:65536)"), "{granted}");
    assert!(granted.contains("within a second"), "{granted}");

    let listed = ok(dir, &["tenant", "list"]);
    assert!(
        listed.contains("alice") && listed.contains("best-effort") && listed.contains("up to 8 sessions"),
        "{listed}"
    );
    assert!(listed.contains("region:default  read,write  (bytes 0:65536)"), "{listed}");
    assert!(!listed.contains(&first.key.to_hex()), "the listing shows no key");
    let json = list_json(dir);
    let alice = &json[0];
    assert_eq!(alice["name"], "alice");
    assert_eq!(alice["id"], 1);
    assert_eq!(alice["key_version"], 1);
    assert_eq!(alice["class"], "best-effort");
    assert_eq!(alice["limits"]["max_sessions"], 8);
    assert_eq!(alice["grants"][0]["space"]["region"], "default");
    assert_eq!(alice["grants"][0]["range"], serde_json::json!([0, 65536]));
    assert!(alice.get("key_hex").is_none() && !json.to_string().contains(&first.key.to_hex()), "{json}");

    let rotated = ok(dir, &["tenant", "rotate-key", "alice"]);
    assert!(rotated.contains("key version 2") && rotated.contains("end within a second"), "{rotated}");
    let second = KeyFile::load(&key_path).unwrap();
    assert_eq!((second.id, second.version), (1, 2));
    assert_ne!(second.key, first.key);

    let set = ok(dir, &["tenant", "set", "alice", "--cost-per-second", "5000", "--class", "latency-critical"]);
    assert!(set.contains("latency-critical") && set.contains("5000 cost units/s, burst 5000"), "{set}");

    let revoked = ok(dir, &["revoke", "alice", "region:default", "write"]);
    assert!(revoked.contains("region:default  read  (bytes 0:65536)"), "{revoked}");
    let revoked = ok(dir, &["revoke", "alice", "region:default"]);
    assert!(revoked.contains("holds nothing on region:default"), "{revoked}");
    assert!(ok(dir, &["tenant", "list"]).contains("(no grant)"));

    let deleted = ok(dir, &["tenant", "delete", "alice"]);
    assert!(deleted.contains("deleted tenant \"alice\"") && deleted.contains("removed its key file"), "{deleted}");
    assert!(!key_path.exists());
    assert_eq!(list_json(dir), serde_json::json!([]));
}

#[test]
fn bad_input_names_the_culprit() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path();
    ok(dir, &["tenant", "create", "alice"]);
    for (args, culprit) in [
        (&["tenant", "create", "alice"][..], "\"alice\" already exists"),
        (&["tenant", "create", "bad/name"], "tenant name \"bad/name\""),
        (&["grant", "alice", "region:default", "read,fly"], "unknown permission \"fly\""),
        (&["grant", "alice", "region:default", "read", "--range", "4096"], "range \"4096\""),
        (&["grant", "alice", "region:default", "read", "--range", "0:1GiB"], "past the end of region:default"),
        (&["grant", "bob", "region:default", "read"], "no tenant named \"bob\""),
        (&["grant", "alice", "region:nowhere", "read"], "no region:nowhere"),
        (&["grant", "alice", "disk", "read"], "space \"disk\""),
        (&["revoke", "alice", "region:default"], "holds no grant on region:default"),
        (&["revoke", "bob", "all"], "no tenant named \"bob\""),
        (&["tenant", "delete", "bob"], "no tenant named \"bob\""),
        (&["tenant", "rotate-key", "bob"], "no tenant named \"bob\""),
        (&["tenant", "set", "alice"], "nothing to change"),
        (&["tenant", "set", "alice", "--max-in-flight", "0"], "--max-in-flight 0"),
        (&["tenant", "set", "alice", "--class", "urgent"], "urgent"),
        // `admin` is about the whole target: on one space it would never count.
        (&["grant", "alice", "region:default", "admin"], "not on region:default"),
        (&["grant", "alice", "region:default", "read,admin"], "netdam-target grant alice all admin"),
        // A space of a settings file the command was not given: say how to give it.
        (&["grant", "alice", "namespace:disk", "block,read"], "pass --config FILE"),
    ] {
        let stderr = fails(dir, args);
        assert!(stderr.contains(culprit), "netdam-target {args:?}: expected {culprit:?} in:\n{stderr}");
    }
    // Nothing of that changed alice.
    assert_eq!(list_json(dir)[0]["grants"], serde_json::json!([]));
    // `all` on one space is every permission on it, which `admin` is not.
    let granted = ok(dir, &["grant", "alice", "region:default", "all"]);
    assert!(granted.contains("region:default  read,write,atomic,compute,block  (the whole space)"), "{granted}");
    // A revoke of a permission not held changes nothing and says so, rather than looking done.
    ok(dir, &["revoke", "alice", "region:default", "write,compute"]);
    let unheld = fails(dir, &["revoke", "alice", "region:default", "read,write"]);
    assert!(unheld.contains("holds no write on region:default (it holds read,atomic,block there)"), "{unheld}");
    assert!(ok(dir, &["tenant", "list"]).contains("region:default  read,atomic,block"), "nothing was taken");
    ok(dir, &["revoke", "alice", "region:default", "all"]);
}

#[test]
fn keys_can_be_imported_and_written_elsewhere_and_spaces_come_from_the_settings_file() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("data");
    let key = TenantKey::from_bytes(std::array::from_fn(|index| 0x5A ^ index as u8));
    let hex = home.path().join("imported.hex");
    std::fs::write(&hex, key.to_hex()).unwrap();
    std::fs::set_permissions(&hex, std::fs::Permissions::from_mode(0o644)).unwrap();
    let import = hex.to_str().unwrap();
    let elsewhere = home.path().join("keys/bob.key");
    let args = ["tenant", "create", "bob", "--import-key", import, "--key-file", elsewhere.to_str().unwrap()];
    assert!(fails(&dir, &args).contains("chmod 600"), "an imported key others can read is refused");
    // A key of one repeated byte (64 zeros) is refused, saying why; no tenant is made.
    let zeros = home.path().join("zeros.hex");
    std::fs::write(&zeros, "0".repeat(64)).unwrap();
    std::fs::set_permissions(&zeros, std::fs::Permissions::from_mode(0o600)).unwrap();
    let refused = fails(&dir, &["tenant", "create", "zero", "--import-key", zeros.to_str().unwrap()]);
    assert!(refused.contains("zeros.hex") && refused.contains("all 0x00, a key anyone could guess"), "{refused}");
    assert!(!dir.join("tenants/zero.key").exists(), "a refused key leaves no key file");
    std::fs::set_permissions(&hex, std::fs::Permissions::from_mode(0o600)).unwrap();
    let created = ok(&dir, &args);
    assert!(created.contains("imported key") && created.contains(&elsewhere.display().to_string()), "{created}");
    assert_eq!(KeyFile::load(&elsewhere).unwrap().key, key);
    assert!(!dir.join("tenants/bob.key").exists());
    let again = fails(&dir, &["tenant", "create", "carol", "--import-key", import]);
    assert!(again.contains("\"bob\" holds this key"), "{again}");
    assert!(!dir.join("tenants/carol.key").exists(), "a refused tenant leaves no key file");
}

#[test]
fn a_grant_may_name_a_space_of_the_settings_file() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("data");
    let config = home.path().join("netdam.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n[[region]]\nname = \"fromtoml\"\nbackend = \"mem\"\nsize = \"64KiB\"\n\
             [[namespace]]\nname = \"disk\"\nbackend = \"file\"\npath = \"disk.img\"\nsize = \"1MiB\"\n",
            dir.display().to_string()
        ),
    )
    .unwrap();
    ok(&dir, &["tenant", "create", "dave"]);
    assert!(fails(&dir, &["grant", "dave", "region:fromtoml", "read"]).contains("no region:fromtoml"));
    let config = config.to_str().unwrap();
    let granted = ok(&dir, &["grant", "dave", "region:fromtoml", "read", "--config", config]);
    assert!(granted.contains("region:fromtoml  read"), "{granted}");
    let beyond =
        fails(&dir, &["grant", "dave", "region:fromtoml", "write", "--range", "60KiB:8KiB", "--config", config]);
    assert!(beyond.contains("65536 bytes"), "{beyond}");
    let missing = fails(&dir, &["grant", "dave", "namespace:elsewhere", "read", "--config", config]);
    assert!(missing.contains("or the settings file") && missing.contains("known namespaces: disk"), "{missing}");

    // Block instructions need `block` with `read` or `write` (PROTOCOL.md, Grants): a grant that
    // lacks one is made, with a warning that says what else it needs.
    let only_block = admin(&dir, &["grant", "dave", "namespace:disk", "block", "--config", config]);
    let (stdout, stderr) = text(&only_block);
    assert!(only_block.status.success() && stdout.contains("namespace:disk  block"), "{stdout}{stderr}");
    assert!(stderr.contains("only FLUSH") && stderr.contains("namespace:disk block,read,write"), "{stderr}");
    let completed = admin(&dir, &["grant", "dave", "namespace:disk", "read,write", "--config", config]);
    let (stdout, stderr) = text(&completed);
    assert!(completed.status.success() && stdout.contains("namespace:disk  read,write,block"), "{stdout}");
    assert!(!stderr.contains("warning"), "{stderr}");
}

/// `--config` and `--data-dir` before an admin subcommand apply to it as after it (as they do
/// for `serve`), and each command names the data directory it changed; a serving option before
/// it, or one store option given twice with two values, is refused rather than ignored.
#[test]
fn store_options_before_the_subcommand_apply_to_it() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let dir = home.join("data");
    let config = home.join("t1.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n[[namespace]]\nname = \"disk\"\nbackend = \"file\"\npath = \"disk.img\"\n\
             size = \"1MiB\"\n",
            dir.display().to_string()
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let data = dir.to_str().unwrap();
    let run_ok = |args: &[&str]| {
        let output = admin_as_given(home, args);
        let (stdout, stderr) = text(&output);
        assert!(output.status.success(), "netdam-target {args:?} failed:\n{stdout}{stderr}");
        stdout
    };

    let created = run_ok(&["--config", config, "tenant", "create", "alice"]);
    assert!(dir.join("tenants/alice.key").exists(), "{created}");
    assert!(created.contains(&format!("the data directory {data} applies this")), "{created}");
    let granted = run_ok(&["--config", config, "grant", "alice", "namespace:disk", "block,read,write"]);
    assert!(granted.contains("namespace:disk  read,write,block") && granted.contains(data), "{granted}");
    let listed = run_ok(&["--data-dir", data, "tenant", "list"]);
    assert!(listed.contains("alice") && listed.contains("namespace:disk"), "{listed}");
    let namespaces = run_ok(&["--config", config, "namespace", "list"]);
    assert!(namespaces.contains("disk") && namespaces.contains("config"), "{namespaces}");
    let region = run_ok(&["--data-dir", data, "region", "create", "scratch", "--backend", "mem", "--size", "64KiB"]);
    assert!(region.contains(&format!("the data directory {data}")), "{region}");
    // The same value on both sides is one value.
    run_ok(&["--data-dir", data, "tenant", "list", "--data-dir", data]);
    assert!(!home.join("xdg").exists() && !home.join(".local").exists(), "the default data directory is untouched");

    for (args, culprit) in [
        (&["--data-dir", "elsewhere", "tenant", "list", "--data-dir", data][..], "--data-dir is given twice"),
        (&["--config", "other.toml", "grant", "alice", "all", "read", "--config", config], "--config is given twice"),
        (&["--listen", "127.0.0.1:7950", "tenant", "list"], "--listen sets how a target serves"),
        (&["--workers", "2", "--poll", "busy", "region", "list"], "--workers, --poll set how a target serves"),
    ] {
        let output = admin_as_given(home, args);
        let (stdout, stderr) = text(&output);
        assert_eq!(output.status.code(), Some(2), "netdam-target {args:?}:\n{stdout}{stderr}");
        assert!(stderr.contains(culprit), "netdam-target {args:?}: expected {culprit:?} in:\n{stderr}");
    }
}

/// A burst never given is one second of the rate and follows it; a given one stays.
#[test]
fn a_burst_follows_the_rate_until_one_is_given() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path();
    let created = ok(dir, &["tenant", "create", "q1", "--cost-per-second", "1000"]);
    assert!(created.contains("1000 cost units/s, burst 1000"), "{created}");
    let faster = ok(dir, &["tenant", "set", "q1", "--cost-per-second", "2000"]);
    assert!(faster.contains("2000 cost units/s, burst 2000"), "{faster}");
    let given = ok(dir, &["tenant", "set", "q1", "--burst", "500"]);
    assert!(given.contains("2000 cost units/s, burst 500"), "{given}");
    let kept = ok(dir, &["tenant", "set", "q1", "--cost-per-second", "3000"]);
    assert!(kept.contains("3000 cost units/s, burst 500"), "{kept}");
    ok(dir, &["tenant", "create", "q2", "--burst", "700"]);
    let later = ok(dir, &["tenant", "set", "q2", "--cost-per-second", "100"]);
    assert!(later.contains("100 cost units/s, burst 700"), "a burst given before any rate stays: {later}");
}

/// Kills the target when dropped.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `netdam-target serve` on `dir` (any free port, no metrics) and returns its banner.
fn serve_banner(dir: &Path) -> (Daemon, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_netdam-target"))
        .args(["serve", "--listen", "127.0.0.1:0", "--metrics-listen", "off", "--poll", "blocking", "--data-dir"])
        .arg(dir)
        .env("NETDAM_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("netdam-target starts");
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut banner = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 || line.starts_with("Stop with") {
            break;
        }
        banner.push_str(&line);
    }
    (Daemon(child), banner)
}

/// A fresh store gets the default tenant at the target's start; a store whose last tenant was
/// deleted stays closed across a restart, and the delete says so.
#[test]
fn a_store_whose_tenants_were_deleted_gets_no_default_tenant() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path();
    let (target, banner) = serve_banner(dir);
    assert!(banner.contains("created tenant \"default\""), "{banner}");
    drop(target);
    let key_file = dir.join("tenants/default.key");
    assert!(key_file.exists());

    let deleted = admin(dir, &["tenant", "delete", "default"]);
    let (stdout, stderr) = text(&deleted);
    assert!(deleted.status.success() && stdout.contains("deleted tenant \"default\""), "{stdout}{stderr}");
    assert!(stderr.contains("last tenant") && stderr.contains("tenant create NAME"), "{stderr}");
    assert!(!key_file.exists());

    let (target, banner) = serve_banner(dir);
    drop(target);
    assert!(!banner.contains("created tenant"), "{banner}");
    assert!(banner.contains("none in the store") && banner.contains("every session is refused"), "{banner}");
    assert_eq!(list_json(dir), serde_json::json!([]));
    assert!(!key_file.exists(), "no new all-powerful key");

    // Deleting a tenant that is not the last says nothing of the kind.
    ok(dir, &["tenant", "create", "a"]);
    ok(dir, &["tenant", "create", "b"]);
    let (_, stderr) = text(&admin(dir, &["tenant", "delete", "a"]));
    assert!(!stderr.contains("last tenant"), "{stderr}");
}

#[test]
fn a_running_target_applies_each_change_within_a_second_while_commands_keep_coming() {
    let served = common::start(vec![common::region("scratch", 1 << 20, false)], 1, 9000);
    let dir = served.dir.path();
    let cell = served.target.tenants();
    assert!(cell.load().1.is_empty());
    let created = ok(dir, &["tenant", "create", "erin"]);
    assert!(created.contains(&format!("The target running on the data directory {}", dir.display())), "{created}");
    let id = KeyFile::load(&dir.join("tenants/erin.key")).unwrap().id;

    let wait_until = |what: &str, holds: &dyn Fn(Option<Permissions>) -> bool| {
        let start = Instant::now();
        loop {
            let (_, snapshot) = cell.load();
            let granted = snapshot.tenant(id).and_then(|tenant| tenant.region_grant(0)).map(|grant| grant.permissions);
            if snapshot.tenant(id).is_some() && holds(granted) {
                return start.elapsed();
            }
            assert!(start.elapsed() < Duration::from_secs(1), "{what} not in force after 1 s (holds {granted:?})");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    // Commands run back to back while the target re-reads after each: none may fail.
    for round in 0..12 {
        // The test target's region is not in a settings file the command could read: `all` names it.
        ok(dir, &["grant", "erin", "all", "read,write"]);
        wait_until("the grant", &|held| held == Some(Permissions::READ.union(Permissions::WRITE)));
        ok(dir, &["revoke", "erin", "all", "write"]);
        let took = wait_until("the revoke", &|held| held == Some(Permissions::READ));
        ok(dir, &["revoke", "erin", "all"]);
        wait_until("the whole revoke", &|held| held.is_none());
        if round == 0 {
            eprintln!("a revoke was in force {took:?} after its command returned");
        }
    }
    let generation = cell.generation();
    ok(dir, &["tenant", "rotate-key", "erin"]);
    let start = Instant::now();
    while cell.load().1.tenant(id).unwrap().key_version != 2 {
        assert!(start.elapsed() < Duration::from_secs(1), "the rotated key is not in force after 1 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(cell.generation() > generation);
    assert_eq!(cell.load().1.tenant(id).unwrap().key, KeyFile::load(&dir.join("tenants/erin.key")).unwrap().key);
    ok(dir, &["tenant", "delete", "erin"]);
    let start = Instant::now();
    while cell.load().1.tenant(id).is_some() {
        assert!(start.elapsed() < Duration::from_secs(1), "the deleted tenant is still in force after 1 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A tenant deleted while one of its sessions is open, and another created in its place (the
/// lowest free id is its id again): the old session does not carry on under the new tenant's
/// grants. It did, when the new tenant started at key version 1 as the old one had: a session
/// is bound to the (id, key version) it proved, and the pair was the same.
#[test]
fn a_deleted_tenants_session_does_not_carry_on_under_the_tenant_given_its_id() {
    use netdam_initiator::client::{Client, ClientOptions};
    use netdam_initiator::error::ClientError;
    use netdam_initiator::session::SessionConfig;
    use netdam_isa::Status;

    let served = common::start(vec![common::region("scratch", 1 << 20, false)], 1, 9000);
    let dir = served.dir.path();
    let cell = served.target.tenants();
    ok(dir, &["tenant", "create", "reader"]);
    ok(dir, &["grant", "reader", "all", "read"]);
    let reader = KeyFile::load(&dir.join("tenants/reader.key")).unwrap();
    let in_force = |what: &str, holds: &dyn Fn(&netdam_target::tenants::TenantSnapshot) -> bool| {
        let start = Instant::now();
        while !holds(&cell.load().1) {
            assert!(start.elapsed() < Duration::from_secs(2), "{what} not in force after 2 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    in_force("reader's grant", &|tenants| tenants.tenant(reader.id).is_some_and(|t| t.region_grant(0).is_some()));
    let connect = |credentials| {
        let session = SessionConfig {
            credentials: Some(credentials),
            max_attempts: 3,
            min_patience: netdam_isa::Duration::ZERO,
            session_wait: netdam_isa::Duration::ZERO,
            ..Default::default()
        };
        Client::connect_with(served.target.local_addr(), ClientOptions { session, ..Default::default() }).unwrap()
    };
    let mut old_session = connect(reader.credentials());
    let mut byte = [0u8; 1];
    old_session.read(0, 0, &mut byte).unwrap();
    let refused = old_session.write(0, 0, b"x").unwrap_err();
    assert!(matches!(refused, ClientError::Refused { status: Status::PermissionDenied, .. }), "{refused}");

    ok(dir, &["tenant", "delete", "reader"]);
    ok(dir, &["tenant", "create", "writer"]);
    ok(dir, &["grant", "writer", "all", "all"]);
    let writer = KeyFile::load(&dir.join("tenants/writer.key")).unwrap();
    assert_eq!(writer.id, reader.id, "the lowest free id is the deleted tenant's");
    assert!(writer.version > reader.version, "a version the deleted tenant never had: {}", writer.version);
    in_force("writer's grant", &|tenants| {
        tenants.tenant(writer.id).is_some_and(|t| t.key_version == writer.version && t.region_grant(0).is_some())
    });

    let after = old_session.write(0, 0, b"x").unwrap_err();
    assert!(matches!(after, ClientError::HelloRefused(Status::Unauthenticated)), "the old session wrote: {after}");
    let mut current = connect(writer.credentials());
    current.read(0, 0, &mut byte).unwrap();
    assert_eq!(byte, [0], "nothing written by the old session");
    current.write(0, 0, b"y").unwrap();
    assert!(served.target.stats().get("sessions_ended_by_tenant_change").unwrap() >= 1);
}

/// A script that creates a tenant, grants it and uses its key at once, or rotates the key and
/// uses the new one at once, is served: the commands wait for the running target to have
/// looked at the store. Without the wait, 13 of 15 uses right after a rotation were refused.
#[test]
fn a_key_is_usable_as_soon_as_its_command_returns() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path();
    let (_target, banner) = serve_banner(dir);
    let addr = banner.lines().find_map(|line| line.strip_prefix("netdam-target serving on ")).unwrap();
    let addr = addr.split(' ').next().unwrap().to_string();
    let netdam = std::path::PathBuf::from(env!("CARGO_BIN_EXE_netdam-target")).with_file_name("netdam");
    let read_with = |key: &Path| {
        let output = Command::new(&netdam)
            .args(["--target", &addr, "--key"])
            .arg(key)
            .args(["read", "default", "0", "8"])
            .output()
            .unwrap();
        assert!(output.status.success(), "refused: {}", String::from_utf8_lossy(&output.stderr));
    };
    for round in 0..3 {
        let name = format!("script{round}");
        ok(dir, &["tenant", "create", &name]);
        ok(dir, &["grant", &name, "all", "read"]);
        let key = dir.join(format!("tenants/{name}.key"));
        read_with(&key);
        ok(dir, &["tenant", "rotate-key", &name]);
        read_with(&key);
    }
}

/// A key slot is granted by number, only while it holds a key, for encrypt and decrypt only;
/// deleting the slot takes its grants along (a key created later in the slot is nobody's).
#[test]
fn key_slots_are_granted_and_deleting_one_takes_its_grants_along() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path();
    ok(dir, &["tenant", "create", "alice"]);
    let empty = fails(dir, &["grant", "alice", "key:3", "encrypt"]);
    assert!(empty.contains("key slot 3 holds no key") && empty.contains("crypto-key create 3"), "{empty}");
    ok(dir, &["crypto-key", "create", "3"]);
    let granted = ok(dir, &["grant", "alice", "key:3", "encrypt"]);
    assert!(granted.contains("tenant \"alice\" now holds key:3  encrypt\n"), "{granted}");
    let wrong = fails(dir, &["grant", "alice", "key:3", "write"]);
    assert!(wrong.contains("write is not a permission on a key slot"), "{wrong}");
    let out_of_slots = fails(dir, &["grant", "alice", "key:256", "encrypt"]);
    assert!(out_of_slots.contains("from 0 to 255"), "{out_of_slots}");
    let on_region = fails(dir, &["grant", "alice", "region:default", "decrypt"]);
    assert!(on_region.contains("grant alice key:SLOT encrypt,decrypt"), "{on_region}");
    assert!(ok(dir, &["tenant", "list"]).contains("key:3  encrypt\n"));
    assert_eq!(list_json(dir)[0]["grants"][0]["space"], serde_json::json!({ "key-slot": 3 }));
    ok(dir, &["tenant", "create", "ops"]);
    ok(dir, &["grant", "ops", "all", "all"]);
    let slots: serde_json::Value = serde_json::from_str(&ok(dir, &["crypto-key", "list", "--json"])).unwrap();
    assert_eq!(slots["slots"][0]["slot"], 3, "{slots}");
    assert_eq!(slots["slots"][0]["granted"], serde_json::json!([{ "tenant": "alice", "uses": "encrypt" }]), "{slots}");
    assert_eq!(slots["every_slot_granted"], serde_json::json!([{ "tenant": "ops", "uses": "encrypt,decrypt" }]));
    let table = ok(dir, &["crypto-key", "list"]);
    assert!(
        table.contains("granted to alice (encrypt)") && table.contains("through all: ops (encrypt,decrypt)"),
        "{table}"
    );

    let deleted = ok(dir, &["crypto-key", "delete", "3"]);
    assert!(deleted.contains("removed the grants on it of 1 tenant(s): alice"), "{deleted}");
    assert_eq!(list_json(dir)[0]["grants"], serde_json::json!([]));
    assert!(ok(dir, &["crypto-key", "list"]).contains("no key slot holds a key"));
    ok(dir, &["crypto-key", "create", "3"]);
    assert_eq!(list_json(dir)[0]["grants"], serde_json::json!([]), "a new key in the slot is nobody's");
}

/// Deleting a region or a namespace takes every tenant's grant on it along: a grant names its
/// space, and one left behind gave its tenant a space created later under the same name.
#[test]
fn a_deleted_space_takes_its_grants_along() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path();
    ok(dir, &["region", "create", "scratch", "--backend", "mem", "--size", "1MiB"]);
    ok(dir, &["namespace", "create", "disk", "--backend", "file", "--path", "disk.img", "--size", "1MiB"]);
    for tenant in ["alice", "bob"] {
        ok(dir, &["tenant", "create", tenant]);
        ok(dir, &["grant", tenant, "region:scratch", "read,write"]);
    }
    ok(dir, &["grant", "alice", "namespace:disk", "block,read"]);
    ok(dir, &["grant", "bob", "region:default", "read"]);

    let deleted = ok(dir, &["region", "delete", "scratch"]);
    assert!(deleted.contains("removed the grants on it of 2 tenant(s): alice, bob"), "{deleted}");
    let deleted = ok(dir, &["namespace", "delete", "disk"]);
    assert!(deleted.contains("removed the grants on it of 1 tenant(s): alice"), "{deleted}");
    let tenants = list_json(dir);
    assert_eq!(tenants[0]["grants"], serde_json::json!([]), "alice: {tenants}");
    assert_eq!(tenants[1]["grants"].as_array().unwrap().len(), 1, "bob keeps his grant elsewhere: {tenants}");
    assert_eq!(tenants[1]["grants"][0]["space"]["region"], "default");

    ok(dir, &["region", "create", "scratch", "--backend", "mem", "--size", "1MiB"]);
    assert!(!list_json(dir).to_string().contains("scratch"), "a new region of the old name is nobody's");
    let quiet = ok(dir, &["region", "delete", "scratch"]);
    assert!(!quiet.contains("removed the grants"), "{quiet}");
}
