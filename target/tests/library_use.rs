//! The initiator crate as an application drives it, hurried or careless: ranges that run past a
//! region or past 2^64, refusals it matches on by kind, a namespace whose blocks its datagrams
//! cannot carry, and connects it gives up on. (A library user's pass found each of these.)

mod common;

use std::time::Duration;

use common::{region, seed, start_configured, Rng};
use netdam_initiator::{AsyncClient, Client, ClientError, Op, Volume, VolumeOptions};
use netdam_isa::{LaneType, Opcode, Status};
use netdam_target::config::{ByteSize, NamespaceBackend, NamespaceConfig};

const REGION_BYTES: u64 = 1 << 20;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn out_of_range(result: Result<(), ClientError>, opcode: Opcode, what: &str) {
    match result {
        Err(ClientError::Refused { opcode: refused, status: Status::OutOfRange }) if refused == opcode as u8 => {}
        other => panic!("{what}: {other:?}"),
    }
}

/// A write (or read, or VADD) whose range ends past the region, or whose end wraps past 2^64,
/// is refused before anything is sent: its pieces inside the region used to be written while
/// the call failed, and with overflow checks off (release builds) the pieces whose offsets
/// wrapped landed at the region's start. The region is unchanged and the target executed
/// nothing.
#[test]
fn byte_ranges_past_the_region_or_past_2_64_are_refused_before_anything_is_sent() {
    let test = start_configured(vec![region("mem", REGION_BYTES, false)], |_| {});
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let pattern: Vec<u8> = (0..65536u32).map(|index| (index % 251) as u8).collect();
    client.write(0, 0, &pattern).unwrap();
    let executed = || test.target.stats().get("instructions_executed").unwrap();
    let before = executed();
    let ends = [(u64::MAX - 100, "past 2^64"), (REGION_BYTES - 100, "past the region's end")];
    for (offset, what) in ends {
        out_of_range(client.write(0, offset, &[0xEE; 32768]), Opcode::Write, what);
        out_of_range(client.read(0, offset, &mut [0u8; 32768]), Opcode::Read, what);
        out_of_range(client.vadd(0, offset, LaneType::I32, &[1; 32768], false).map(|_| ()), Opcode::Vadd, what);
    }
    runtime().block_on(async {
        let client = AsyncClient::connect(test.target.local_addr()).await.unwrap();
        for (offset, what) in ends {
            out_of_range(client.write(0, offset, &[0xEE; 32768]).await, Opcode::Write, what);
            out_of_range(client.read(0, offset, 32768).await.map(|_| ()), Opcode::Read, what);
            let vadd = client.vadd(0, offset, LaneType::I32, &[1; 32768], false).await;
            out_of_range(vadd.map(|_| ()), Opcode::Vadd, what);
        }
        client.close().await;
    });
    // A session opened (the HELLOs) and closed: no instruction of the refused calls ran.
    let hellos_and_close = executed() - before;
    assert!(hellos_and_close <= 3, "{hellos_and_close} instructions executed for refused calls");
    let mut back = vec![0u8; pattern.len()];
    client.read(0, 0, &mut back).unwrap();
    assert!(back == pattern, "the region's start was written");
    // A range that ends exactly at the region's end is the region's.
    client.write(0, REGION_BYTES - 32768, &[7; 32768]).unwrap();
}

/// A request the session refuses before sending it keeps its kind through the asynchronous
/// client (it came back as "socket error: ..." of kind `Io`).
#[test]
fn a_request_refused_before_it_leaves_keeps_its_kind() {
    let test = start_configured(vec![region("mem", REGION_BYTES, false)], |_| {});
    runtime().block_on(async {
        let client = AsyncClient::connect(test.target.local_addr()).await.unwrap();
        let empty = client.call(Vec::new()).await;
        assert!(matches!(empty, Err(ClientError::Empty)), "{:?}", empty.err());
        let huge = client.call(vec![Op::write(0, 0, &vec![0u8; 16384])]).await;
        assert!(matches!(huge, Err(ClientError::TooLarge(_))), "{:?}", huge.err());
        client.close().await;
    });
}

/// A namespace whose blocks the negotiated datagrams cannot carry is refused when the volume
/// opens, naming both sizes; before, the open succeeded and every write failed.
#[test]
fn a_volume_whose_blocks_no_datagram_carries_is_refused_at_open() {
    let test = start_configured(vec![region("mem", REGION_BYTES, false)], |config| {
        config.namespaces = vec![NamespaceConfig {
            name: "big".into(),
            backend: NamespaceBackend::File,
            path: "big.img".into(),
            size: Some(ByteSize(1 << 20)),
            block_size: 8192,
        }];
    });
    runtime().block_on(async {
        let mut options = VolumeOptions::default();
        options.client.session.max_datagram_bytes = 4096;
        let opened = Volume::open(test.target.local_addr(), "big", options).await;
        match opened {
            Err(ClientError::Setting(message)) => {
                assert!(message.contains("8192-byte blocks") && message.contains("(4096 bytes)"), "{message}")
            }
            other => panic!("{:?}", other.map(|volume| volume.transfer_bytes())),
        }
        let volume = Volume::open(test.target.local_addr(), "big", VolumeOptions::default()).await.unwrap();
        volume.write(0, &[5; 8192], false).await.unwrap();
        volume.close().await;
    });
}

/// Connects the caller gives up on (a timeout at any moment of the HELLO exchange) leave no
/// session on the target: the client's task sees the exchange to its end and closes what it
/// opened. Before, a session the target had made stayed until it expired, and enough of them
/// filled the address's share.
#[test]
fn connects_given_up_on_leave_no_session_open() {
    let test = start_configured(vec![region("mem", REGION_BYTES, false)], |_| {});
    let addr = test.target.local_addr();
    let mut rng = Rng::new(seed());
    let mut given_up = 0;
    runtime().block_on(async {
        for _ in 0..300 {
            let patience = Duration::from_micros(5 + rng.below(700));
            match tokio::time::timeout(patience, AsyncClient::connect(addr)).await {
                Ok(connected) => connected.unwrap().close().await,
                Err(_) => given_up += 1,
            }
        }
    });
    assert!(given_up > 0, "no connect was given up on (SEED={})", seed());
    let settled = std::time::Instant::now();
    loop {
        let stats = test.target.stats();
        let (opened, closed) = (stats.get("sessions_opened").unwrap(), stats.get("sessions_closed").unwrap());
        if opened == closed {
            break;
        }
        assert!(
            settled.elapsed() < Duration::from_secs(20),
            "{} sessions left open by {given_up} connects given up on (SEED={})",
            opened - closed,
            seed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
