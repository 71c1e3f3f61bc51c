//! A busy-polling worker that serves one request at a time stops reading control messages (the
//! TTL) and bounds each datagram's wait by its last empty poll (`worker::Stamps`): every
//! request is still answered, with the right data and a service time, and the TTL comes back.

mod common;

use std::time::Duration;

use common::{region, start_configured};
use netdam_initiator::{Client, ClientOptions, ClientPoll};
use netdam_target::config::PollMode;

#[test]
fn lone_requests_to_a_busy_worker_are_answered_without_the_ttl_and_it_comes_back() {
    let test = start_configured(vec![region("mem", 1 << 20, false)], |config| config.poll = PollMode::Busy);
    let options = ClientOptions { poll: ClientPoll::Busy, ..ClientOptions::default() };
    let mut client = Client::connect_with(test.target.local_addr(), options).unwrap();
    let mem = client.region("mem").unwrap().id;
    let mut ttls = Vec::new();
    let mut beyond = Vec::new();
    for round in 0..150u64 {
        // Writes of up to a whole datagram, read back: the plain receive moves every byte.
        let data: Vec<u8> = (0..(round as usize * 61) % 8000 + 1).map(|i| (i as u64 * 31 + round) as u8).collect();
        let offset = (round * 4099) % (1 << 19);
        client.write(mem, offset, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        client.read(mem, offset, &mut back).unwrap();
        assert_eq!(back, data, "round {round}");
        let reply = client.ping().unwrap();
        let header = reply.response().header;
        // Unstamped, the wait counts from the empty poll before the datagram: within a poll of
        // the round trip the client saw, never from further back. A worker whose core was taken
        // during that poll (another process, the VM pausing its vCPU) counts the time it was away
        // too, which can exceed the round trip now and then: a few such rounds are allowed, a
        // bound from a stale poll would put most of them beyond.
        let service = u64::from(header.service_time_ns);
        assert!(service > 0, "round {round}: an answer without a service time");
        if service > reply.rtt.as_nanos() + 20_000 {
            beyond.push((round, service, reply.rtt.as_nanos()));
        }
        ttls.push(header.ttl);
    }
    assert!(beyond.len() <= 15, "service times beyond the round trip (round, service ns, round trip ns): {beyond:?}");
    assert!(ttls.iter().all(|&ttl| ttl == 64 || ttl == 0), "TTLs {ttls:?}");
    assert_eq!(ttls[0], 64, "a worker starts out reading TTLs");
    assert!(ttls.contains(&0), "lone requests turn the received TTL off: {ttls:?}");

    // After UNSTAMPED_FOR (100 ms) the next datagram turns it on again, for the one after.
    std::thread::sleep(Duration::from_millis(150));
    client.ping().unwrap();
    assert_eq!(client.ping().unwrap().response().header.ttl, 64, "the TTL is read again after a while");
}

/// A target bound to `[::]` serves IPv4 initiators too, as mapped addresses, and reads their
/// TTL as it reads an IPv6 initiator's hop limit: every IPv4 ping of such a target said
/// "received ttl unknown" (the socket asked for the IPv6 option alone).
#[test]
fn a_dual_stack_target_reads_the_ttl_of_ipv4_and_ipv6_initiators_alike() {
    if let Err(error) = std::net::UdpSocket::bind("[::1]:0") {
        eprintln!(
            "SKIPPED a_dual_stack_target_reads_the_ttl_of_ipv4_and_ipv6_initiators_alike: no IPv6 here ({error})"
        );
        return;
    }
    let test = start_configured(vec![region("mem", 1 << 20, false)], |config| {
        config.listen = "[::]:0".parse().unwrap();
        config.allow_unauthenticated_network = true;
    });
    let port = test.target.local_addr().port();
    for addr in [format!("127.0.0.1:{port}"), format!("[::1]:{port}")] {
        let mut client = Client::connect(addr.parse().unwrap()).unwrap();
        assert_eq!(client.ping().unwrap().response().header.ttl, 64, "the TTL of a ping from {addr}");
    }
}
