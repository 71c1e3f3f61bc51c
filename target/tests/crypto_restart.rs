//! Key slots and nonce counters across restarts of `netdam-target` (the binary), killed with
//! SIGKILL: keys made by `crypto-key create|rotate` survive in the metadata store, the nonce
//! counter resumes beyond every nonce used before the kill (its reservation file survives), and
//! what an older key version sealed still opens after a rotation. Also `netdam encrypt|decrypt`
//! as a user runs them.

mod common;

use std::collections::HashSet;
use std::path::Path;

use common::daemon::{admin, start, target_command};
use netdam_initiator::{Client, ClientError};
use netdam_isa::crypto::Seal;
use netdam_isa::Status;
use netdam_target::crypto::{read_reservation, reservation_path};

const CONFIG: &str = "crypto.toml";
const SLOT: u32 = 4;
const ENCRYPTIONS: usize = 200;

/// Encrypts `count` 64-byte ranges in place (each its own), from `first`; returns their seals.
fn encrypt_many(client: &mut Client, first: usize, count: usize) -> Vec<(u64, Seal)> {
    (first..first + count)
        .map(|index| {
            let offset = index as u64 * 64;
            (offset, client.encrypt(0, offset, 64, SLOT, None, b"").unwrap())
        })
        .collect()
}

/// `netdam` is built by the initiator crate into the same directory as this crate's binaries.
fn netdam(args: &[&str]) -> std::process::Output {
    let netdam = std::path::PathBuf::from(env!("CARGO_BIN_EXE_netdam-target")).with_file_name("netdam");
    assert!(netdam.exists(), "{} is missing: build the workspace first (cargo build --workspace)", netdam.display());
    std::process::Command::new(netdam).args(args).output().expect("netdam runs")
}

fn write_config(dir: &Path) {
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    std::fs::write(
        dir.join(CONFIG),
        format!(
            "listen = \"127.0.0.1:{port}\"\nmetrics_listen = \"off\"\ndata_dir = \".\"\nworkers = 2\n\
             poll = \"blocking\"\npin_workers = false\nlock_memory = false\nbusy_threshold_us = 60000\nauth = \"none\"\n\
             [[region]]\nname = \"sealed\"\nbackend = \"file\"\npath = \"sealed.region\"\nsize = \"1MiB\"\n"
        ),
    )
    .unwrap();
}

#[test]
fn netdam_encrypt_and_decrypt_from_the_command_line() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path();
    write_config(dir);
    admin(dir, CONFIG, &["crypto-key", "create", "7"]);
    let (_daemon, addr, _) = start(dir, CONFIG);
    let target = addr.to_string();
    let run = |args: &[&str]| {
        let output = netdam(&[&["--target", &target, "--json"], args].concat());
        (output.status.success(), String::from_utf8_lossy(&output.stdout).into_owned(), output.stderr)
    };
    let (ok, _, _) = run(&["write", "sealed", "100", "--data", "a secret worth keeping"]);
    assert!(ok);
    let (ok, out, err) = run(&["encrypt", "sealed", "100", "22", "--slot", "7", "--aad", "record 1"]);
    assert!(ok, "{}", String::from_utf8_lossy(&err));
    let answer: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let seal = answer["seal"].as_str().unwrap().to_string();
    assert_eq!(seal.len(), 56, "the seal is 28 bytes in hex");
    assert_eq!(answer["key_version"], 1);
    let mut tampered = seal.clone().into_bytes();
    tampered[55] = if tampered[55] == b'0' { b'1' } else { b'0' };
    let tampered = String::from_utf8(tampered).unwrap();
    let (ok, out, err) =
        run(&["decrypt", "sealed", "100", "22", "--slot", "7", "--aad", "record 1", "--seal", &tampered]);
    let said = format!("{out}{}", String::from_utf8_lossy(&err));
    assert!(!ok && said.contains("auth_failed"), "a tampered seal must fail authentication: {said}");
    let (ok, _, err) = run(&[
        "decrypt",
        "sealed",
        "100",
        "22",
        "--slot",
        "7",
        "--aad",
        "record 1",
        "--seal",
        &seal,
        "--to-region",
        "sealed",
        "--to-offset",
        "4096",
    ]);
    assert!(ok, "{}", String::from_utf8_lossy(&err));
    let mut client = Client::connect(addr).unwrap();
    let mut back = [0u8; 22];
    client.read(0, 4096, &mut back).unwrap();
    assert_eq!(&back, b"a secret worth keeping");
    let help = netdam(&["encrypt", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--slot") && help.contains("seal"), "{help}");
}

fn admin_output(dir: &Path, args: &[&str]) -> String {
    let output = target_command(dir).args(args).args(["--config", CONFIG]).output().unwrap();
    assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn keys_and_nonce_counters_survive_sigkill_and_rotation() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path();
    write_config(dir);
    let created = admin_output(dir, &["crypto-key", "create", &SLOT.to_string()]);
    assert!(created.contains("created key slot 4: key version 1"), "{created}");
    assert!(created.contains("at its start"), "the command says when a target serves the key: {created}");

    let plain: Vec<u8> = (0..ENCRYPTIONS * 64).map(|at| (at * 7 + 1) as u8).collect();
    let (daemon, addr, _) = start(dir, CONFIG);
    let mut client = Client::connect(addr).unwrap();
    client.write(0, 0, &plain).unwrap();
    let before = encrypt_many(&mut client, 0, ENCRYPTIONS / 2);
    let used_max = before.iter().map(|(_, seal)| seal.nonce.counter).max().unwrap();
    drop(client);
    daemon.kill();

    // The reservation written before those nonces were used is on disk after the kill.
    let reserved = read_reservation(&reservation_path(dir, SLOT)).unwrap();
    assert!(reserved > used_max, "reserved up to {reserved}, but {used_max} was used");

    let (daemon, addr, _) = start(dir, CONFIG);
    let mut client = Client::connect(addr).unwrap();
    let after = encrypt_many(&mut client, ENCRYPTIONS / 2, ENCRYPTIONS / 2);
    for (_, seal) in &after {
        assert!(seal.nonce.counter >= reserved, "after a restart the counter resumes beyond the reservation");
        assert_eq!(seal.nonce.key_version, 1);
    }
    let counters: HashSet<u64> = before.iter().chain(&after).map(|(_, seal)| seal.nonce.counter).collect();
    assert_eq!(counters.len(), ENCRYPTIONS, "no nonce used twice across the restart");
    // The key survived: what the first run sealed opens now.
    let (offset, seal) = before[0];
    client.decrypt(0, offset, 64, SLOT, &seal, None, b"").unwrap();
    drop(client);

    // Rotation while the target runs takes effect at its restart; old versions still open.
    let rotated = admin_output(dir, &["crypto-key", "rotate", &SLOT.to_string()]);
    assert!(rotated.contains("key version 2") && rotated.contains("restart it"), "{rotated}");
    let listed = admin_output(dir, &["crypto-key", "list"]);
    assert!(listed.contains("versions [1, 2]"), "{listed}");
    daemon.kill();
    let (daemon, addr, _) = start(dir, CONFIG);
    let mut client = Client::connect(addr).unwrap();
    let (offset, seal) = encrypt_many(&mut client, 0, 1)[0];
    assert_eq!(seal.nonce.key_version, 2, "ENCRYPT seals with the newest version");
    assert!(!counters.contains(&seal.nonce.counter));
    client.decrypt(0, offset, 64, SLOT, &seal, None, b"").unwrap();
    for (offset, seal) in before.iter().skip(1).chain(&after) {
        client.decrypt(0, *offset, 64, SLOT, seal, None, b"").unwrap();
    }
    let mut back = vec![0u8; plain.len()];
    client.read(0, 0, &mut back).unwrap();
    assert_eq!(back, plain, "every range sealed under version 1 opened under the rotated slot");
    drop(client);
    daemon.kill();

    // Deleted, its sealed data no longer opens: the slot has no key.
    admin(dir, CONFIG, &["crypto-key", "delete", &SLOT.to_string()]);
    let (_daemon, addr, _) = start(dir, CONFIG);
    let mut client = Client::connect(addr).unwrap();
    match client.decrypt(0, 0, 64, SLOT, &before[0].1, None, b"") {
        Err(ClientError::Refused { status, .. }) => assert_eq!(status, Status::NoSuchKey),
        other => panic!("expected no_such_key, got {other:?}"),
    }
}

/// A slot holding a key whose reservation file is gone (a store restored or copied without it)
/// is refused at start, naming the file and the way out; the target started anyway and
/// counted from 0, so the first ENCRYPT after the restart used the first one's nonce again.
/// Rotating the slot gives it a key that used no nonce, and the target starts.
#[test]
fn a_key_slot_whose_nonce_file_is_gone_is_refused_until_it_is_rotated() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path();
    write_config(dir);
    admin(dir, CONFIG, &["crypto-key", "create", &SLOT.to_string()]);
    let file = reservation_path(dir, SLOT);
    assert!(file.exists(), "crypto-key create makes the slot's reservation file");
    let (daemon, addr, _) = start(dir, CONFIG);
    let first = Client::connect(addr).unwrap().encrypt(0, 0, 64, SLOT, None, b"").unwrap();
    daemon.kill();

    std::fs::remove_file(&file).unwrap();
    let refused = target_command(dir).args(["serve", "--config", CONFIG]).output().unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "the target started without the nonce file: {said}");
    assert!(said.contains(&format!("crypto-nonces-{SLOT} of key slot {SLOT} is missing")), "{said}");
    assert!(said.contains(&format!("crypto-key rotate {SLOT}")), "{said}");

    admin(dir, CONFIG, &["crypto-key", "rotate", &SLOT.to_string()]);
    assert!(file.exists(), "the rotation makes the file again");
    let (_daemon, addr, _) = start(dir, CONFIG);
    let after = Client::connect(addr).unwrap().encrypt(0, 0, 64, SLOT, None, b"").unwrap();
    assert_eq!(after.nonce.key_version, first.nonce.key_version + 1, "sealed under the new key");
}
