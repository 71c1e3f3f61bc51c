//! Compute where the data sits, on a real target over loopback: VADD from several clients and
//! workers into the same lanes, VADDs the initiator must split, and the `reduce` extension
//! (enabled by configuration, checked by its declaration, reachable from the `netdam` CLI).

mod common;

use std::process::Command;

use common::{region, start, start_configured};
use netdam_initiator::reduce::ReduceValue;
use netdam_initiator::{AsyncClient, Client, ClientError, Op};
use netdam_isa::extension::reduce::{reduce_aux, ReduceOp, REDUCE_MAX_BYTES, REDUCE_OPCODE};
use netdam_isa::semantics::{bf16_to_f32, f32_to_bf16};
use netdam_isa::{LaneType, Status};

fn lanes_of<T: Copy>(values: &[T], to_bytes: impl Fn(T) -> Vec<u8>) -> Vec<u8> {
    values.iter().flat_map(|value| to_bytes(*value)).collect()
}

/// Four clients (each its own socket, so the kernel spreads them over the two workers) add
/// full 2048-lane VADDs of i32, f32 and bf16 ones into the same lanes at once; every lane ends
/// at exactly the number of adds.
#[test]
fn concurrent_vadds_from_several_clients_and_workers_lose_no_update() {
    const CLIENTS: usize = 4;
    const ROUNDS: usize = 50;
    let test = start(vec![region("mem", 1 << 20, false)], 2, 9000);
    let addr = test.target.local_addr();
    let ones_i32 = lanes_of(&[1i32; 2048], |value| value.to_le_bytes().to_vec());
    let ones_f32 = lanes_of(&[1.0f32; 2048], |value| value.to_le_bytes().to_vec());
    let ones_bf16 = lanes_of(&[f32_to_bf16(1.0); 4096], |value| value.to_le_bytes().to_vec());
    // i32 at 0, f32 at 8 KiB + 4 (not chunk-aligned), bf16 at 20 KiB + 2.
    let (at_i32, at_f32, at_bf16) = (0u64, 8196u64, 20482u64);
    std::thread::scope(|scope| {
        for _ in 0..CLIENTS {
            scope.spawn(|| {
                let mut client = Client::connect(addr).unwrap();
                for _ in 0..ROUNDS {
                    client.vadd(0, at_i32, LaneType::I32, &ones_i32, false).unwrap();
                    client.vadd(0, at_f32, LaneType::F32, &ones_f32, true).unwrap();
                    client.vadd(0, at_bf16, LaneType::Bf16, &ones_bf16, false).unwrap();
                }
            });
        }
    });
    let total = (CLIENTS * ROUNDS) as i32;
    let mut client = Client::connect(addr).unwrap();
    let mut stored = vec![0u8; 8192];
    client.read(0, at_i32, &mut stored).unwrap();
    assert!(stored.chunks_exact(4).all(|lane| i32::from_le_bytes(lane.try_into().unwrap()) == total), "i32 lanes");
    client.read(0, at_f32, &mut stored).unwrap();
    assert!(stored.chunks_exact(4).all(|lane| f32::from_le_bytes(lane.try_into().unwrap()) == total as f32));
    client.read(0, at_bf16, &mut stored).unwrap();
    // 200 is exact in bf16 (8 significant bits), and every partial sum on the way is too.
    assert!(stored.chunks_exact(2).all(|lane| bf16_to_f32(u16::from_le_bytes([lane[0], lane[1]])) == total as f32));
    let stats = client.stat().unwrap();
    let vadds_ok = stats.iter().find(|(name, _)| name == "status_ok").map(|(_, value)| *value).unwrap();
    assert!(vadds_ok >= (3 * CLIENTS * ROUNDS) as u64);
}

/// A target whose datagrams hold fewer lanes than the caller gives: the client splits the VADD
/// (and the returned result comes back whole and in order).
#[test]
fn a_vadd_larger_than_the_negotiated_datagram_is_split_by_the_initiator() {
    let test = start(vec![region("mem", 1 << 20, false)], 1, 4096);
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    assert_eq!(client.info().hello.max_datagram_bytes, 4096);
    let values: Vec<f32> = (0..2048).map(|lane| lane as f32 * 0.25).collect();
    let lanes = lanes_of(&values, |value| value.to_le_bytes().to_vec());
    client.vadd(0, 100, LaneType::F32, &lanes, false).unwrap();
    let result = client.vadd(0, 100, LaneType::F32, &lanes, true).unwrap();
    let sums: Vec<f32> = result.chunks_exact(4).map(|lane| f32::from_le_bytes(lane.try_into().unwrap())).collect();
    assert_eq!(sums, values.iter().map(|value| value * 2.0).collect::<Vec<_>>());
    // More i32 lanes than the ISA allows in one VADD at any datagram size.
    let many = lanes_of(&(0..5000).collect::<Vec<i32>>(), |value| value.to_le_bytes().to_vec());
    client.vadd(0, 200_000, LaneType::I32, &many, false).unwrap();
    let mut stored = vec![0u8; many.len()];
    client.read(0, 200_000, &mut stored).unwrap();
    assert_eq!(stored, many);
    // A VADD reaching past the region is refused, whole: by the client, which knows the
    // region's size, before anything is sent.
    let refused = client.vadd(0, (1 << 20) - 4, LaneType::F32, &[0; 8], false).unwrap_err();
    assert!(matches!(refused, ClientError::OutsideRegion { size_bytes: Some(1048576), .. }), "{refused:?}");
}

/// The same through the async client: its VADD goes as several in-flight pieces, each the size
/// the negotiated datagram allows (counted by the target), and the result comes back whole and in
/// order.
#[test]
fn an_async_vadd_larger_than_the_negotiated_datagram_is_split_by_the_initiator() {
    let test = start(vec![region("mem", 1 << 20, false)], 1, 4096);
    let target = &test.target;
    let executed = || target.stats().get("instructions_executed").unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let client = AsyncClient::connect(target.local_addr()).await.unwrap();
        assert_eq!(client.info().hello.max_datagram_bytes, 4096);
        let values: Vec<f32> = (0..2048).map(|lane| lane as f32 * 0.25).collect();
        let lanes = lanes_of(&values, |value| value.to_le_bytes().to_vec());
        let pieces = |return_result| lanes.len().div_ceil(client.info().vadd_chunk_bytes(LaneType::F32, return_result));
        assert!(pieces(false) >= 2 && pieces(true) >= 2, "more than one datagram holds");
        let before = executed();
        assert!(client.vadd(0, 100, LaneType::F32, &lanes, false).await.unwrap().is_empty());
        assert_eq!(executed() - before, pieces(false) as u64, "one VADD per piece");
        let before = executed();
        let result = client.vadd(0, 100, LaneType::F32, &lanes, true).await.unwrap();
        assert_eq!(executed() - before, pieces(true) as u64, "one VADD per piece");
        let sums: Vec<f32> = result.chunks_exact(4).map(|lane| f32::from_le_bytes(lane.try_into().unwrap())).collect();
        assert_eq!(sums, values.iter().map(|value| value * 2.0).collect::<Vec<_>>());
        assert_eq!(client.read(0, 100, lanes.len()).await.unwrap(), result, "the result is what memory holds");
        // More i32 lanes than the ISA allows in one VADD at any datagram size.
        let many = lanes_of(&(0..5000).collect::<Vec<i32>>(), |value| value.to_le_bytes().to_vec());
        client.vadd(0, 200_000, LaneType::I32, &many, false).await.unwrap();
        assert_eq!(client.read(0, 200_000, many.len()).await.unwrap(), many);
        // A VADD reaching past the region is refused.
        let refused = client.vadd(0, (1 << 20) - 4, LaneType::F32, &[0; 8], false).await.unwrap_err();
        assert!(matches!(refused, ClientError::Refused { status: Status::OutOfRange, .. }), "{refused:?}");
        client.close().await;
    });
}

fn start_with_reduce(session_permissions: &[&str]) -> common::TestTarget {
    let permissions: Vec<String> = session_permissions.iter().map(|name| name.to_string()).collect();
    start_configured(vec![region("mem", 1 << 20, false)], |config| {
        config.extensions = vec!["reduce".to_string()];
        config.session_permissions = permissions;
    })
}

#[test]
fn reduce_is_unknown_until_configuration_enables_it() {
    let test = start(vec![region("mem", 65536, false)], 1, 9000);
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let refused = client.reduce(0, 0, 64, LaneType::I32, ReduceOp::Sum).unwrap_err();
    assert!(matches!(refused, ClientError::Refused { opcode: REDUCE_OPCODE, status: Status::UnknownOpcode }));
}

#[test]
fn reduce_sums_and_bounds_a_range_split_over_several_instructions() {
    let test = start_with_reduce(&["read", "write", "atomic", "compute", "block"]);
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    // 100,000 i32 lanes (400 KB, seven REDUCEs), 1..=100000 with one negative lane.
    let mut values: Vec<i32> = (1..=100_000).collect();
    values[77_777] = -5;
    let bytes = lanes_of(&values, |value| value.to_le_bytes().to_vec());
    assert!(bytes.len() > 6 * REDUCE_MAX_BYTES);
    client.write(0, 4096, &bytes).unwrap();
    let len = bytes.len() as u64;
    let sum: i64 = values.iter().map(|value| i64::from(*value)).sum();
    assert_eq!(client.reduce(0, 4096, len, LaneType::I32, ReduceOp::Sum).unwrap(), ReduceValue::Integer(sum));
    assert_eq!(client.reduce(0, 4096, len, LaneType::I32, ReduceOp::Min).unwrap(), ReduceValue::Integer(-5));
    assert_eq!(client.reduce(0, 4096, len, LaneType::I32, ReduceOp::Max).unwrap(), ReduceValue::Integer(100_000));

    let floats = lanes_of(&[0.5f32, -8.25, 3.0, 1e-3], |value| value.to_le_bytes().to_vec());
    client.write(0, 600_000, &floats).unwrap();
    let mut float = |op| client.reduce(0, 600_000, 16, LaneType::F32, op).unwrap();
    assert_eq!(float(ReduceOp::Sum), ReduceValue::Float(0.5 - 8.25 + 3.0 + f64::from(1e-3f32)));
    assert_eq!(float(ReduceOp::Min), ReduceValue::Float(-8.25));
    let halves = lanes_of(&[f32_to_bf16(1.5), f32_to_bf16(-2.0)], |value| value.to_le_bytes().to_vec());
    client.write(0, 700_000, &halves).unwrap();
    assert_eq!(client.reduce(0, 700_000, 4, LaneType::Bf16, ReduceOp::Max).unwrap(), ReduceValue::Float(1.5));
}

/// Every field the handler declared is checked by the dispatcher, in the protocol's order, and
/// no bad REDUCE panics the worker: it still answers afterwards.
#[test]
fn reduce_fields_are_checked_by_its_declaration() {
    let test = start_with_reduce(&["read"]);
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let i32_sum = reduce_aux(LaneType::I32, ReduceOp::Sum);
    let reduce = |flags, space, offset, length, aux, operand: &[u8]| {
        Op::extension(REDUCE_OPCODE, flags, space, offset, length, aux, operand)
    };
    let cases = [
        (reduce(1, 0, 0, 8, i32_sum, &[]), Status::Malformed),
        (reduce(0, 0, 0, 8, 0x0203, &[]), Status::Malformed),
        (reduce(0, 0, 0, 8, 0x0003, &[]), Status::Malformed),
        (reduce(0, 0, 0, 0, i32_sum, &[]), Status::Malformed),
        (reduce(0, 0, 0, 8, 0x0300, &[]), Status::Malformed),
        (reduce(0, 9, 0, 8, i32_sum, &[]), Status::NoSuchSpace),
        (reduce(0, 0, 2, 8, i32_sum, &[]), Status::Unaligned),
        (reduce(0, 0, 0, 6, i32_sum, &[]), Status::Unaligned),
        (reduce(0, 0, (1 << 20) - 4, 8, i32_sum, &[]), Status::OutOfRange),
        (reduce(0, 0, u64::MAX - 3, 8, i32_sum, &[]), Status::OutOfRange),
        (reduce(0, 0, 0, (REDUCE_MAX_BYTES + 4) as u32, i32_sum, &[]), Status::TooLarge),
        (reduce(0, 0, 0, 8, i32_sum, &[0; 8]), Status::TooLarge),
        (Op::extension(0x81, 0, 0, 0, 8, 0, &[]), Status::UnknownOpcode),
    ];
    for (op, status) in cases {
        let reply = client.call(std::slice::from_ref(&op)).unwrap();
        match reply.data(0) {
            Err(ClientError::Refused { status: got, .. }) => assert_eq!(got, status, "{op:?}"),
            other => panic!("{op:?}: expected {status}, got {other:?}"),
        }
    }
    client.write(0, 0, &lanes_of(&[3i32, 4], |value| value.to_le_bytes().to_vec())).unwrap();
    assert_eq!(client.reduce(0, 0, 8, LaneType::I32, ReduceOp::Sum).unwrap(), ReduceValue::Integer(7));
}

#[test]
fn a_session_without_the_declared_permission_is_denied() {
    let test = start_with_reduce(&["write", "compute"]);
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let refused = client.reduce(0, 0, 64, LaneType::F32, ReduceOp::Sum).unwrap_err();
    assert!(matches!(refused, ClientError::Refused { status: Status::PermissionDenied, .. }), "{refused:?}");
    // The permission check comes after the space check, as PROTOCOL.md orders them.
    let refused = client.reduce(7, 0, 64, LaneType::F32, ReduceOp::Sum).unwrap_err();
    assert!(matches!(refused, ClientError::Refused { status: Status::NoSuchSpace, .. }), "{refused:?}");
}

#[test]
fn an_unknown_extension_or_permission_name_stops_the_start_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = netdam_target::Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: Some(dir.path().to_path_buf()),
        extensions: vec!["histogram".to_string()],
        auth: netdam_target::AuthMode::None,
        ..netdam_target::Config::default()
    };
    let message = config.validate().unwrap_err().to_string();
    assert!(message.contains("extensions") && message.contains("histogram"), "{message}");
    let config =
        netdam_target::Config { extensions: vec![], session_permissions: vec!["superuser".to_string()], ..config };
    let message = config.validate().unwrap_err().to_string();
    assert!(message.contains("session_permissions") && message.contains("superuser"), "{message}");
}

/// `netdam reduce` as a user runs it against a target with the extension enabled.
#[test]
fn the_netdam_cli_reduces_a_range() {
    let netdam = common::netdam_binary();
    let test = start_with_reduce(&["read", "write"]);
    let addr = test.target.local_addr().to_string();
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    client.write(0, 64, &lanes_of(&[2.5f32, -1.0, 7.25], |value| value.to_le_bytes().to_vec())).unwrap();
    let run = |args: &[&str]| {
        let output = Command::new(&netdam).args(["--target", &addr]).args(args).output().unwrap();
        assert!(output.status.success(), "netdam {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    };
    assert_eq!(run(&["reduce", "mem", "64", "12", "--type", "f32", "--op", "max"]).trim(), "max of f32 lanes: 7.25");
    let json: serde_json::Value =
        serde_json::from_str(&run(&["--json", "reduce", "mem", "64", "12", "--op", "sum"])).unwrap();
    assert_eq!(json["value"], serde_json::json!(8.75));
    assert_eq!(json["op"], "sum");
}

mod allreduce {
    use super::*;
    use netdam_initiator::allreduce::{allreduce, prepare, AllreduceError, AllreduceOp, AllreducePlan, HEADER_BYTES};
    use std::time::Duration;

    /// Runs one Allreduce worker per buffer `buffer_of(worker)`, each a thread with its own
    /// client, on `plan`; their results, in worker order.
    fn allreduce_threads(
        addr: std::net::SocketAddr,
        plan: &AllreducePlan,
        buffer_of: impl Fn(u32) -> Vec<u8> + Sync,
    ) -> Vec<Vec<u8>> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..plan.workers)
                .map(|worker| {
                    let buffer_of = &buffer_of;
                    scope.spawn(move || {
                        let buffer = buffer_of(worker);
                        let mut client = Client::connect(addr).unwrap();
                        let mut result = vec![0u8; buffer.len()];
                        allreduce(&mut client, plan, &buffer, &mut result, Duration::from_secs(30)).unwrap();
                        result
                    })
                })
                .collect();
            handles.into_iter().map(|handle| handle.join().unwrap()).collect()
        })
    }

    /// Four workers, each its own client on one of two target workers, sum 1 MB buffers: i32
    /// exactly, f32 within the bound the module states.
    #[test]
    fn four_workers_sum_i32_exactly_and_f32_within_the_stated_bound() {
        const WORKERS: u32 = 4;
        const LANES: usize = 250_000;
        let test = start(vec![region("mem", 8 << 20, false)], 2, 9000);
        let addr = test.target.local_addr();
        for (lane, area) in [(LaneType::I32, 0u64), (LaneType::F32, 4 << 20)] {
            let buffer_of = |worker: u32| -> Vec<u8> {
                (0..LANES)
                    .flat_map(|index| {
                        let value = (index as i64 * 7919 + i64::from(worker) * 104_729) % 2001 - 1000;
                        match lane {
                            LaneType::I32 => (value as i32 * 1_000_003).to_le_bytes(),
                            _ => (value as f32 * 0.37 + worker as f32).to_le_bytes(),
                        }
                    })
                    .collect()
            };
            let mut setup = Client::connect(addr).unwrap();
            let plan = AllreducePlan::new(&setup, 0, area, WORKERS, LANES * 4, lane, AllreduceOp::Sum).unwrap();
            assert!(plan.chunk_count() > 100, "pipelined over many chunks");
            prepare(&mut setup, &plan).unwrap();
            let results: Vec<Vec<u8>> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..WORKERS)
                    .map(|worker| {
                        let buffer = buffer_of(worker);
                        scope.spawn(move || {
                            let mut client = Client::connect(addr).unwrap();
                            let plan =
                                AllreducePlan::new(&client, 0, area, WORKERS, buffer.len(), lane, AllreduceOp::Sum)
                                    .unwrap();
                            let mut result = vec![0u8; buffer.len()];
                            allreduce(&mut client, &plan, &buffer, &mut result, Duration::from_secs(30)).unwrap();
                            result
                        })
                    })
                    .collect();
                handles.into_iter().map(|handle| handle.join().unwrap()).collect()
            });
            let buffers: Vec<Vec<u8>> = (0..WORKERS).map(buffer_of).collect();
            for result in &results {
                assert_eq!(result, &results[0], "every worker reads the same sum");
            }
            for index in 0..LANES {
                let lanes = buffers.iter().map(|buffer| &buffer[index * 4..index * 4 + 4]);
                let got = &results[0][index * 4..index * 4 + 4];
                if lane == LaneType::I32 {
                    let exact =
                        lanes.map(|bytes| i32::from_le_bytes(bytes.try_into().unwrap())).fold(0i32, i32::wrapping_add);
                    assert_eq!(i32::from_le_bytes(got.try_into().unwrap()), exact, "lane {index}");
                } else {
                    let values: Vec<f64> =
                        lanes.map(|bytes| f64::from(f32::from_le_bytes(bytes.try_into().unwrap()))).collect();
                    let exact: f64 = values.iter().sum();
                    let bound =
                        f64::from(WORKERS - 1) * 2f64.powi(-24) * values.iter().map(|value| value.abs()).sum::<f64>();
                    let got = f64::from(f32::from_le_bytes(got.try_into().unwrap()));
                    assert!((got - exact).abs() <= bound, "lane {index}: {got} against {exact} ± {bound}");
                }
            }
        }
    }

    /// Four workers sum bf16 buffers. Every input is k/4 with |k| <= 255, exact in bf16 (8
    /// significant bits), so the only error is the target's: each VADD adds in f32 (exactly, for
    /// these magnitudes) and rounds the running sum to bf16 once, to nearest even. The module
    /// states the bound of recursive summation in any order, |got - exact| <= (N - 1) * 2^-8 *
    /// sum |x_i| (the accumulator starts at zero, so the first add is exact and N - 1 round).
    /// Sums reach 255 and need up to 10 bits: many lanes do round, and the bound is what is checked.
    #[test]
    fn four_workers_sum_bf16_within_the_stated_bound() {
        const WORKERS: u32 = 4;
        const LANES: usize = 250_000;
        let test = start(vec![region("mem", 4 << 20, false)], 2, 9000);
        let addr = test.target.local_addr();
        let value = |worker: u32, index: usize| {
            let quarters = ((index * 7919 + worker as usize * 104_729) % 511) as i32 - 255;
            quarters as f32 * 0.25
        };
        let buffer_of = |worker: u32| -> Vec<u8> {
            (0..LANES)
                .flat_map(|index| {
                    let bits = f32_to_bf16(value(worker, index));
                    assert_eq!(bf16_to_f32(bits), value(worker, index), "inputs are exact in bf16");
                    bits.to_le_bytes()
                })
                .collect()
        };
        let mut setup = Client::connect(addr).unwrap();
        let plan = AllreducePlan::new(&setup, 0, 0, WORKERS, LANES * 2, LaneType::Bf16, AllreduceOp::Sum).unwrap();
        assert!(plan.chunk_count() > 50, "pipelined over many chunks");
        prepare(&mut setup, &plan).unwrap();
        let results = allreduce_threads(addr, &plan, buffer_of);
        for result in &results {
            assert_eq!(result, &results[0], "every worker reads the same sum");
        }
        let mut rounded_lanes = 0;
        for index in 0..LANES {
            let values: Vec<f64> = (0..WORKERS).map(|worker| f64::from(value(worker, index))).collect();
            let exact: f64 = values.iter().sum();
            let bound = f64::from(WORKERS - 1) * 2f64.powi(-8) * values.iter().map(|value| value.abs()).sum::<f64>();
            let got = f64::from(bf16_to_f32(u16::from_le_bytes([results[0][2 * index], results[0][2 * index + 1]])));
            assert!((got - exact).abs() <= bound, "lane {index}: {got} against {exact} ± {bound}");
            rounded_lanes += usize::from(got != exact);
        }
        assert!(rounded_lanes > LANES / 100, "only {rounded_lanes} lanes rounded: the bound was hardly tested");
    }

    /// More chunks than one poll of the counters covers (small datagrams, so small chunks): the
    /// workers poll window after window and read runs of complete chunks, and the sum is exact.
    #[test]
    fn an_allreduce_of_more_chunks_than_one_poll_reads_is_exact() {
        const WORKERS: u32 = 3;
        let test = start(vec![region("mem", 16 << 20, false)], 2, 4096);
        let addr = test.target.local_addr();
        let lanes = 2_600_000usize;
        let value =
            |worker: u32, lane: usize| (lane as i32).wrapping_mul(2_654_435_761u32 as i32) ^ (worker as i32 * 7919);
        let mut setup = Client::connect(addr).unwrap();
        let plan = AllreducePlan::new(&setup, 0, 0, WORKERS, lanes * 4, LaneType::I32, AllreduceOp::Sum).unwrap();
        assert!(plan.chunk_count() > 2 * 1024, "{} chunks: more than two polls' worth", plan.chunk_count());
        prepare(&mut setup, &plan).unwrap();
        let results = allreduce_threads(addr, &plan, |worker| {
            (0..lanes).flat_map(|lane| value(worker, lane).to_le_bytes()).collect()
        });
        let expected: Vec<u8> = (0..lanes)
            .flat_map(|lane| (0..WORKERS).map(|worker| value(worker, lane)).fold(0i32, i32::wrapping_add).to_le_bytes())
            .collect();
        for result in results {
            assert!(result == expected, "a worker's sum differs from the exact one");
        }
    }

    /// A worker refuses an area that would sum what is not its round's, naming why, before it
    /// adds anything: one never prepared (old contents), one prepared for other buffers or
    /// another number of workers, and one that has already served as many workers as it was
    /// prepared for (a second round without a new `prepare`). Prepared again, it serves again.
    #[test]
    fn an_area_not_prepared_for_this_round_is_refused() {
        let test = start(vec![region("mem", 1 << 20, false)], 1, 9000);
        let addr = test.target.local_addr();
        let mut client = Client::connect(addr).unwrap();
        let plan = |client: &Client, workers: u32, len: usize| {
            AllreducePlan::new(client, 0, 4096, workers, len, LaneType::F32, AllreduceOp::Sum).unwrap()
        };
        let run = |client: &mut Client, plan: &AllreducePlan| {
            let buffer: Vec<u8> = (0..plan.len / 4).flat_map(|lane| (lane as f32).to_le_bytes()).collect();
            let mut result = vec![0u8; plan.len];
            allreduce(client, plan, &buffer, &mut result, Duration::from_secs(5)).map(|()| result)
        };
        let refusal = |outcome: Result<Vec<u8>, AllreduceError>| match outcome {
            Err(AllreduceError::Plan(message)) => message,
            other => panic!("expected a refusal of the area, got {other:?}"),
        };
        let one = plan(&client, 1, 8192);
        client.call(&[Op::fill(0, 0, 1 << 16, 0x7f)]).unwrap();
        let message = refusal(run(&mut client, &one));
        assert!(message.contains("not prepared"), "{message}");
        let mut area = vec![0u8; 1 << 16];
        client.read(0, 0, &mut area).unwrap();
        assert!(area.iter().all(|&byte| byte == 0x7f), "a refused worker added nothing");
        prepare(&mut client, &one).unwrap();
        for other in [plan(&client, 1, 4096), plan(&client, 2, 8192)] {
            let message = refusal(run(&mut client, &other));
            assert!(message.contains("was prepared for 1 workers with buffers of 8192 bytes of F32"), "{message}");
        }
        let expected: Vec<u8> = (0..2048).flat_map(|lane| (lane as f32).to_le_bytes()).collect();
        assert_eq!(run(&mut client, &one).unwrap(), expected, "the prepared round");
        let message = refusal(run(&mut client, &one));
        assert!(message.contains("served its Allreduce already") && message.contains("prepare it again"), "{message}");
        prepare(&mut client, &one).unwrap();
        assert_eq!(run(&mut client, &one).unwrap(), expected, "a second round, prepared again");
    }

    /// Three of four workers contribute: they fail with the missing chunk named, in about the
    /// timeout, instead of hanging.
    #[test]
    fn a_worker_that_never_contributes_makes_the_others_fail_not_hang() {
        let test = start(vec![region("mem", 1 << 20, false)], 1, 9000);
        let addr = test.target.local_addr();
        let mut setup = Client::connect(addr).unwrap();
        let plan = AllreducePlan::new(&setup, 0, 0, 4, 40_000, LaneType::I32, AllreduceOp::Sum).unwrap();
        prepare(&mut setup, &plan).unwrap();
        let beyond =
            AllreducePlan::new(&setup, 0, (1 << 20) - 40_000, 4, 40_000, LaneType::I32, AllreduceOp::Sum).unwrap_err();
        assert!(beyond.to_string().contains("does not fit"), "{beyond}");
        std::thread::scope(|scope| {
            for _ in 0..3 {
                scope.spawn(move || {
                    let mut client = Client::connect(addr).unwrap();
                    let buffer = vec![1u8; 40_000];
                    let mut result = vec![0u8; 40_000];
                    let started = std::time::Instant::now();
                    let error =
                        allreduce(&mut client, &plan, &buffer, &mut result, Duration::from_millis(300)).unwrap_err();
                    assert!(started.elapsed() < Duration::from_secs(5), "gave up in about the timeout");
                    match error {
                        AllreduceError::Incomplete { chunk, arrived, workers, .. } => {
                            assert_eq!((chunk, arrived, workers), (0, 3, 4));
                        }
                        other => panic!("expected Incomplete, got {other}"),
                    }
                });
            }
        });
    }

    /// Kills its children on drop, so a failed assertion leaves no `netdam` process behind.
    struct Children(Vec<std::process::Child>);

    impl Drop for Children {
        fn drop(&mut self) {
            for child in &mut self.0 {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    /// Waits for `child` until `deadline`; `None` if it is still running then.
    fn exit_by(child: &mut std::process::Child, deadline: std::time::Instant) -> Option<std::process::ExitStatus> {
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Three `netdam allreduce` processes; the third is SIGKILLed once it has begun contributing
    /// (chunk 0 counted three times) and long before it could finish. The two survivors, already
    /// waiting, exit non-zero in about their `--timeout-seconds`, naming the first chunk the dead
    /// worker never counted, print no result and write no output file. Small (4 KiB) datagrams
    /// make many chunks, so the victim is stopped with most of them still to send.
    #[test]
    fn a_netdam_process_killed_partway_through_an_allreduce_fails_the_others_in_bounded_time() {
        const WORKERS: u64 = 3;
        let netdam = common::netdam_binary();
        // 32 MiB in 4 KiB datagrams: over 8,000 chunks, so that the victim is far from done when
        // the test thread, even descheduled for a while on a loaded machine, gets to kill it.
        let len = 32usize << 20;
        let test = start(vec![region("mem", 33 << 20, false)], 2, 4096);
        let addr = test.target.local_addr().to_string();
        let mut watcher = Client::connect(test.target.local_addr()).unwrap();
        let plan = AllreducePlan::new(&watcher, 0, 0, WORKERS as u32, len, LaneType::I32, AllreduceOp::Sum).unwrap();
        let chunks = plan.chunk_count();
        let counters = |watcher: &mut Client| -> Vec<u64> {
            let mut bytes = vec![0u8; 8 * chunks];
            watcher.read(0, HEADER_BYTES, &mut bytes).unwrap();
            bytes.chunks_exact(8).map(|word| u64::from_le_bytes(word.try_into().unwrap())).collect()
        };
        let dir = tempfile::tempdir().unwrap();
        let common = ["--target", addr.as_str(), "allreduce", "mem", "0", "--workers", "3", "--type", "i32"];
        let prepared =
            Command::new(&netdam).args(common).args(["--json", "--prepare", &len.to_string()]).output().unwrap();
        assert!(prepared.status.success(), "{}", String::from_utf8_lossy(&prepared.stderr));
        let prepared: serde_json::Value = serde_json::from_slice(&prepared.stdout).unwrap();
        assert_eq!(prepared["chunks"], serde_json::json!(chunks), "the CLI plans the chunks this test watches");
        for worker in 0..3i32 {
            std::fs::write(dir.path().join(format!("in{worker}")), (worker + 1).to_le_bytes().repeat(len / 4)).unwrap();
        }
        let spawn = |worker: i32| {
            Command::new(&netdam)
                .args(common)
                .args(["--timeout-seconds", "6", "--file"])
                .arg(dir.path().join(format!("in{worker}")))
                .arg("--out")
                .arg(dir.path().join(format!("out{worker}")))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let mut children = Children(vec![spawn(0), spawn(1)]);
        // The survivors contribute every chunk, then wait for the third worker.
        let started = std::time::Instant::now();
        while counters(&mut watcher).iter().any(|&count| count < WORKERS - 1) {
            assert!(started.elapsed() < Duration::from_secs(60), "the two survivors never finished contributing");
            std::thread::sleep(Duration::from_millis(5));
        }
        children.0.push(spawn(2));
        let started = std::time::Instant::now();
        let mut first = [0u8; 8];
        loop {
            watcher.read(0, HEADER_BYTES, &mut first).unwrap();
            if u64::from_le_bytes(first) == WORKERS {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(20), "the third worker never began contributing");
        }
        children.0[2].kill().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let killed = exit_by(&mut children.0[2], deadline).expect("a SIGKILLed process ends");
        assert!(!killed.success(), "{killed}");
        // Datagrams the victim sent before it died may still wait in the target's sockets: take
        // the counters once two reads 50 ms apart agree.
        let mut at_kill = counters(&mut watcher);
        loop {
            std::thread::sleep(Duration::from_millis(50));
            let again = counters(&mut watcher);
            if again == at_kill {
                break;
            }
            at_kill = again;
        }
        let counted = at_kill.iter().filter(|&&count| count == WORKERS).count();
        println!("the victim was killed after counting {counted} of {chunks} chunks");
        assert!(at_kill.iter().all(|&count| count == WORKERS - 1 || count == WORKERS), "{at_kill:?}");
        let missing = at_kill
            .iter()
            .position(|&count| count < WORKERS)
            .expect("the third worker was killed before counting every chunk");
        assert!(missing > 0, "chunk 0 was counted");

        // Each survivor: non-zero within its 6 s timeout (and some slack), with the chunk named.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        for worker in 0..2 {
            let child = &mut children.0[worker];
            let status = exit_by(child, deadline).unwrap_or_else(|| panic!("worker {worker} hangs"));
            let mut stderr = String::new();
            let mut stdout = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
            std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
            assert!(!status.success(), "worker {worker} succeeded without the third contribution: {stdout}");
            let named = format!("chunk {missing} (bytes {}..) has 2 of 3 contributions", missing * plan.chunk_bytes);
            assert!(stderr.contains(&named) && stderr.contains("incomplete"), "worker {worker}: {stderr}");
            assert!(stdout.is_empty(), "worker {worker} printed a result: {stdout}");
            assert!(!dir.path().join(format!("out{worker}")).exists(), "worker {worker} wrote a result");
        }
        assert_eq!(counters(&mut watcher), at_kill, "nothing was counted after the kill");
    }

    /// The maximum of four workers' f32, i32 and bf16 buffers through the vmax extension is
    /// exact; a target without it is refused before anything is counted.
    #[test]
    fn four_workers_take_the_exact_maximum_through_vmax() {
        const WORKERS: u32 = 4;
        let test = start_configured(vec![region("mem", 4 << 20, false)], |config| {
            config.workers = 2;
            config.extensions = vec!["vmax".to_string()];
        });
        let addr = test.target.local_addr();
        let lanes = 30_000usize;
        let value = |worker: u32, index: usize| ((index * 7919 + worker as usize * 104_729) % 2001) as i32 - 1000;
        for (lane, area) in [(LaneType::I32, 0u64), (LaneType::F32, 1 << 20), (LaneType::Bf16, 2 << 20)] {
            let encode = |value: i32| -> Vec<u8> {
                match lane {
                    LaneType::I32 => value.to_le_bytes().to_vec(),
                    LaneType::F32 => (value as f32 * 0.5).to_le_bytes().to_vec(),
                    LaneType::Bf16 => f32_to_bf16(value as f32).to_le_bytes().to_vec(),
                }
            };
            let buffer_of = |worker| (0..lanes).flat_map(|index| encode(value(worker, index))).collect::<Vec<u8>>();
            let len = lanes * lane.lane_bytes();
            let mut setup = Client::connect(addr).unwrap();
            let plan = AllreducePlan::new(&setup, 0, area, WORKERS, len, lane, AllreduceOp::Max).unwrap();
            prepare(&mut setup, &plan).unwrap();
            let results = allreduce_threads(addr, &plan, buffer_of);
            let expected: Vec<u8> = (0..lanes)
                .flat_map(|index| encode((0..WORKERS).map(|worker| value(worker, index)).max().unwrap()))
                .collect();
            for result in results {
                assert!(result == expected, "{lane:?}: a worker's maximum differs");
            }
        }
        // Without the extension: refused up front, with what to do.
        let plain = start(vec![region("mem", 1 << 20, false)], 1, 9000);
        let mut client = Client::connect(plain.target.local_addr()).unwrap();
        let plan = AllreducePlan::new(&client, 0, 0, 2, 64, LaneType::F32, AllreduceOp::Max).unwrap();
        prepare(&mut client, &plan).unwrap();
        let error = allreduce(&mut client, &plan, &[0; 64], &mut [0; 64], Duration::from_secs(1)).unwrap_err();
        assert!(error.to_string().contains("extensions = [\"vmax\"]"), "{error}");
        let mut counters = [0u8; 8];
        client.read(0, HEADER_BYTES, &mut counters).unwrap();
        assert_eq!(counters, [0; 8], "nothing was counted");
    }

    /// `netdam allreduce` as four processes, after `--prepare`: each writes the same sum.
    #[test]
    fn four_netdam_processes_allreduce_through_the_cli() {
        let netdam = common::netdam_binary();
        let test = start(vec![region("mem", 4 << 20, false)], 2, 9000);
        let addr = test.target.local_addr().to_string();
        let lanes = 100_000usize;
        let dir = tempfile::tempdir().unwrap();
        let common = ["--target", addr.as_str(), "allreduce", "mem", "4096", "--workers", "4", "--type", "i32"];
        let prepare =
            Command::new(&netdam).args(common).args(["--prepare", &(lanes * 4).to_string()]).output().unwrap();
        assert!(prepare.status.success(), "{}", String::from_utf8_lossy(&prepare.stderr));
        let children: Vec<_> = (0..4i32)
            .map(|worker| {
                let input = dir.path().join(format!("in{worker}"));
                let values: Vec<u8> = (0..lanes as i32).flat_map(|lane| (lane * (worker + 1)).to_le_bytes()).collect();
                std::fs::write(&input, values).unwrap();
                let output = dir.path().join(format!("out{worker}"));
                let child = Command::new(&netdam)
                    .args(common)
                    .arg("--file")
                    .arg(&input)
                    .arg("--out")
                    .arg(&output)
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                (child, output)
            })
            .collect();
        for (child, output) in children {
            let finished = child.wait_with_output().unwrap();
            assert!(finished.status.success(), "{}", String::from_utf8_lossy(&finished.stderr));
            let sum = std::fs::read(output).unwrap();
            let expected: Vec<u8> = (0..lanes as i32).flat_map(|lane| (lane * 10).to_le_bytes()).collect();
            assert!(sum == expected, "a worker's result differs from 1+2+3+4 times each lane");
        }
    }
}
