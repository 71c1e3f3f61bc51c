//! An adaptive client (`ClientPoll::Adaptive`) spins only while an answer is due soon, then
//! sleeps in the kernel: its answers are right, and a request that takes long costs it little
//! CPU. The device here holds every completion for a set time, as a slow disk would.

mod common;

use std::time::{Duration, Instant};

use common::TestTarget;
use netdam_initiator::client::{ADAPTIVE_SPIN_MAX, ADAPTIVE_SPIN_MAX_LOADED, ADAPTIVE_SPIN_MIN};
use netdam_initiator::{Client, ClientOptions, ClientPoll, Op};

const BLOCK: u32 = 4096;
const BLOCKS: u64 = 64;
/// Under the block retransmission timeout's floor (20 ms): on a machine that is not overloaded
/// each request is sent once (a retransmission would only renew the spin, within the bound).
const DEVICE_TIME: Duration = Duration::from_millis(15);

fn start() -> TestTarget {
    common::start_with_devices(vec![common::slow_device::namespace("slow", BLOCK, BLOCKS, DEVICE_TIME)])
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    Duration::from_nanos(netdam_isa::time::clock_ns(libc::CLOCK_THREAD_CPUTIME_ID))
}

#[test]
fn an_adaptive_client_is_answered_rightly_and_sleeps_through_a_slow_request() {
    let test = start();
    let options = ClientOptions { poll: ClientPoll::Adaptive, ..ClientOptions::default() };
    let mut client = Client::connect_with(test.target.local_addr(), options).unwrap();
    let mem = client.region("mem").unwrap().id;
    // Quick answers, which it waits for spinning: every byte comes back.
    for round in 0..200u64 {
        let data: Vec<u8> = (0..(round as usize * 37) % 4000 + 1).map(|i| (i as u64 * 13 + round) as u8).collect();
        let offset = (round * 4093) % (1 << 19);
        client.write(mem, offset, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        client.read(mem, offset, &mut back).unwrap();
        assert_eq!(back, data, "round {round}");
    }
    // A block write and read that each take the device 15 ms: the client spins at most
    // ADAPTIVE_SPIN_MAX after each send and answer, and sleeps the rest (a busy client would
    // burn the whole 15 ms).
    let disk = client.namespace("slow").unwrap().clone();
    let block = vec![0xC3; BLOCK as usize];
    let mut back = vec![0u8; BLOCK as usize];
    let (wall_from, cpu_from) = (Instant::now(), thread_cpu());
    client.block_write(&disk, 7, &block, false).unwrap();
    client.block_read(&disk, 7, &mut back).unwrap();
    let (wall, cpu) = (wall_from.elapsed(), thread_cpu() - cpu_from);
    assert!(back == block, "the block reads back as written");
    assert!(wall >= 2 * DEVICE_TIME, "each request waited for the device: {wall:?}");
    // Two requests: a send and an answer each, a spin after each, and the work itself.
    let bound = 4 * Duration::from_nanos(ADAPTIVE_SPIN_MAX.as_nanos()) + Duration::from_millis(3);
    assert!(cpu < bound, "the client used {cpu:?} of CPU over {wall:?} (bound {bound:?})");
    // The spin follows the round trip: twice the smoothed one, within its bounds.
    let spin = client.adaptive_spin();
    assert!((ADAPTIVE_SPIN_MIN..=ADAPTIVE_SPIN_MAX).contains(&spin), "spin {spin:?}");
    let rtt = client.smoothed_rtt().expect("answers were timed");
    assert_eq!(spin, (rtt + rtt).clamp(ADAPTIVE_SPIN_MIN, ADAPTIVE_SPIN_MAX));

    // Two slow reads on the wire at once: answers are due, so the spin may be longer
    // (ADAPTIVE_SPIN_MAX_LOADED); once they are answered it is bounded as before.
    let reads: Vec<_> = [11, 12]
        .into_iter()
        .map(|block| client.submit(&[Op::block_read(disk.id, block, 1)]).expect("room for two"))
        .collect();
    client.progress().unwrap();
    let loaded = client.adaptive_spin();
    assert_eq!(loaded, (rtt + rtt).clamp(ADAPTIVE_SPIN_MIN, ADAPTIVE_SPIN_MAX_LOADED), "two on the wire");
    assert!(loaded > ADAPTIVE_SPIN_MAX, "a 15 ms round trip spins past the lone bound at depth: {loaded:?}");
    for ticket in reads {
        client.wait(ticket).unwrap();
    }
    let rtt = client.smoothed_rtt().unwrap();
    assert_eq!(client.adaptive_spin(), (rtt + rtt).clamp(ADAPTIVE_SPIN_MIN, ADAPTIVE_SPIN_MAX), "none on the wire");
}
