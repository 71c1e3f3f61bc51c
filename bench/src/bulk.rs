//! `netdam-bench bulk`: one large WRITE and one large READ of a volatile region through the
//! client's pipeline (what `netdam write` and `netdam read` do: the bytes cut into datagram-sized
//! instructions, the session's window in flight), beside a UDP bulk transfer with the same
//! datagram sizes and the same window on the same machine, the two alternating round by round.
//!
//! The floor is a raw UDP transfer of the same bytes: datagrams of the sizes netdam's requests and
//! answers have, the same window, and at each end the copy netdam makes between memory and the
//! datagram (the sender's bytes from a buffer as large as the transfer, the receiver's into one),
//! with no protocol at all: an index in each datagram in place of netdam's headers, no checksum,
//! no session, no retransmission. An echo of one small buffer, always in cache, would measure
//! the kernel alone and not a transfer of a GiB through memory.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use netdam_initiator::{Client, ClientOptions, ClientPoll};
use netdam_isa::wire::{HEADER_LEN, INSTRUCTION_HEADER_LEN, RESPONSE_INSTRUCTION_HEADER_LEN};
use netdam_target::config::{ByteSize, Config, RegionBackend, RegionConfig};
use netdam_target::Target;
use serde_json::json;

use crate::block::BlockPoll;
use crate::floor;
use crate::report::median;

/// How long the floor's client waits for an answer before sending again what is unanswered.
const FLOOR_SILENCE: Duration = Duration::from_millis(20);
/// How long the floor's client goes on without any answer before it gives up.
const FLOOR_GIVE_UP: Duration = Duration::from_secs(5);

/// Settings of the bulk benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct BulkArgs {
    /// Bytes written and read back per round (the region is as large, rounded up to a page). The
    /// run holds about four times this in memory: the data, what is read back, the target's
    /// region and the UDP floor's.
    #[arg(long, default_value = "1GiB", value_parser = netdam_isa::units::parse_bytes)]
    pub bytes: u64,
    /// Rounds; netdam and the UDP transfer alternate, and the report gives each one's median.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// How the target worker and both clients wait (the floor's echo server and client alike).
    #[arg(long, value_enum, default_value_t = BlockPoll::Adaptive)]
    pub poll: BlockPoll,
    /// Also write bulk.json and bulk.md to this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// One direction's figures over the rounds.
#[derive(Debug, Default, Clone)]
struct Direction {
    /// netdam's rate per round, MiB/s.
    netdam: Vec<f64>,
    /// The UDP transfer's rate per round, MiB/s.
    floor: Vec<f64>,
    /// Datagrams the UDP transfer sent again after a silence, over all rounds.
    floor_resent: u64,
    /// Request and answer sizes on the wire, bytes.
    request_bytes: usize,
    response_bytes: usize,
}

impl Direction {
    fn ratio(&self) -> f64 {
        median(&self.netdam) / median(&self.floor)
    }
}

/// Runs the rounds and prints (and with `--out` writes) the report.
pub fn run(args: &BulkArgs) -> Result<(), String> {
    let bytes = usize::try_from(args.bytes).map_err(|_| "--bytes does not fit this machine's memory".to_string())?;
    if bytes == 0 {
        return Err("--bytes must be more than 0".into());
    }
    let scratch = tempfile::tempdir().map_err(|error| format!("temporary directory: {error}"))?;
    let config = Config {
        listen: "127.0.0.1:0".parse().expect("valid literal"),
        metrics_listen: "127.0.0.1:0".parse().expect("valid literal"),
        data_dir: Some(scratch.path().to_path_buf()),
        workers: 1,
        poll: args.poll.target(),
        // Regions come in whole pages.
        regions: vec![RegionConfig {
            name: "bulk".into(),
            backend: RegionBackend::Mem,
            path: None,
            size: ByteSize(args.bytes.next_multiple_of(4096)),
        }],
        // The region is as large as the transfer: leave the process's memory unlocked.
        lock_memory: false,
        auth: netdam_target::AuthMode::None,
        ..Config::default()
    };
    let target = Target::start(&config).map_err(|error| format!("netdam target: {error}"))?;
    // As the floor's client: spinning with busy polling, sleeping otherwise (the adaptive
    // client's spin would give netdam what the floor does not have).
    let poll = if args.poll == BlockPoll::Busy { ClientPoll::Busy } else { ClientPoll::Blocking };
    let options = ClientOptions { poll, ..ClientOptions::default() };
    let mut client =
        Client::connect_with(target.local_addr(), options).map_err(|error| format!("netdam client: {error}"))?;
    let region = client.region("bulk").map_err(|error| error.to_string())?.id;
    // The floor keeps the session's cap on requests in flight unanswered. netdam's own window is
    // Swift's, at most that cap (less where the socket buffers cannot hold it): the floor is
    // never given less room than netdam.
    let window = netdam_initiator::session::SessionConfig::default().max_in_flight;
    let write_chunk = client.info().write_chunk_bytes();
    let read_chunk = client.info().read_chunk_bytes();
    let mut write = Direction {
        request_bytes: HEADER_LEN + INSTRUCTION_HEADER_LEN + write_chunk,
        response_bytes: HEADER_LEN + RESPONSE_INSTRUCTION_HEADER_LEN,
        ..Direction::default()
    };
    let mut read = Direction {
        request_bytes: HEADER_LEN + INSTRUCTION_HEADER_LEN,
        response_bytes: HEADER_LEN + RESPONSE_INSTRUCTION_HEADER_LEN + read_chunk,
        ..Direction::default()
    };
    let mut data = pattern(bytes);
    let mut back = vec![0u8; bytes];
    let mib = |seconds: f64| args.bytes as f64 / seconds / f64::from(1 << 20);
    let spins = args.poll == BlockPoll::Busy;
    for round in 0..args.rounds.max(1) {
        let started = Instant::now();
        client.write(region, 0, &data).map_err(|error| format!("netdam write, round {round}: {error}"))?;
        write.netdam.push(mib(started.elapsed().as_secs_f64()));
        back.fill(0);
        let started = Instant::now();
        client.read(region, 0, &mut back).map_err(|error| format!("netdam read, round {round}: {error}"))?;
        read.netdam.push(mib(started.elapsed().as_secs_f64()));
        if back != data {
            return Err(format!("round {round}: the bytes read back differ from those written"));
        }
        for (way, direction, chunk, memory) in
            [(Way::Write, &mut write, write_chunk, &mut data), (Way::Read, &mut read, read_chunk, &mut back)]
        {
            let sizes = (direction.request_bytes, direction.response_bytes);
            let sink = Sink::start(way, spins, bytes, chunk, direction.response_bytes);
            let transfer = udp_transfer(way, sink.addr, spins, window, sizes, chunk, memory);
            sink.stop();
            let (seconds, resent) = transfer.map_err(|error| format!("the UDP floor, round {round}: {error}"))?;
            direction.floor.push(mib(seconds));
            direction.floor_resent += resent;
        }
    }
    let stats = client.session_stats();
    drop(client);
    target.stop();
    let text = markdown(args, window, &write, &read, stats.retransmissions);
    print!("{text}");
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).map_err(|error| format!("creating {}: {error}", dir.display()))?;
        let report = json!({
            "machine": crate::report::machine(),
            "bytes": args.bytes,
            "rounds": args.rounds.max(1),
            "poll": format!("{:?}", args.poll).to_lowercase(),
            "window": window,
            "netdam_retransmitted": stats.retransmissions,
            "write": direction_json(&write),
            "read": direction_json(&read),
        });
        let write_file = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|error| format!("writing {}: {error}", path.display()))
        };
        write_file("bulk.json", format!("{report:#}\n"))?;
        write_file("bulk.md", text)?;
        eprintln!("wrote {}/bulk.json and bulk.md", dir.display());
    }
    Ok(())
}

/// `bytes` of a pattern that differs at every offset of a region (so a misplaced chunk shows).
fn pattern(bytes: usize) -> Vec<u8> {
    let mut data = vec![0u8; bytes];
    for (index, word) in data.chunks_mut(8).enumerate() {
        let value = (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes();
        word.copy_from_slice(&value[..word.len()]);
    }
    data
}

/// Which way a UDP transfer moves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// The client sends the bytes; each datagram is acknowledged.
    Write,
    /// The client asks for the bytes; each answer carries them.
    Read,
}

/// The floor's server: one thread on a loopback UDP socket that, as the target does, moves each
/// datagram's bytes between the wire and a memory of its own as large as the transfer. Every
/// datagram starts with its index (8 bytes, little-endian); the bytes of datagram `i` are at
/// `i * chunk` of the memory.
struct Sink {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<u8>>,
}

impl Sink {
    fn start(way: Way, spins: bool, memory_bytes: usize, chunk: usize, response_bytes: usize) -> Sink {
        let socket = floor::server_socket(spins);
        let addr = socket.local_addr().expect("sink address");
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = stop.clone();
        let (ready, is_ready) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            // Written through before the transfer, as the target's region is before it serves:
            // for reads with bytes that differ from chunk to chunk (a read that misplaces one
            // shows), for writes with bytes the writer never sends (a write that is lost shows).
            let mut memory = match way {
                Way::Read => pattern(memory_bytes),
                Way::Write => vec![0xEE; memory_bytes],
            };
            let _ = ready.send(());
            let mut buffer = vec![0u8; 65_536];
            let mut answer = vec![0x5Au8; response_bytes.max(8)];
            let response_bytes = response_bytes.max(8);
            while !stop_flag.load(Ordering::Relaxed) {
                let Ok((len, from)) = socket.recv_from(&mut buffer) else {
                    std::hint::spin_loop();
                    continue;
                };
                let Some(index) = index_of(&buffer[..len]) else {
                    continue;
                };
                let offset = (index as usize).saturating_mul(chunk).min(memory_bytes);
                let moved = chunk.min(memory_bytes - offset);
                // Every answer names its datagram, so the client can tell a late one.
                answer[..8].copy_from_slice(&index.to_le_bytes());
                match way {
                    Way::Write => {
                        let moved = moved.min(len.saturating_sub(8));
                        memory[offset..offset + moved].copy_from_slice(&buffer[8..8 + moved]);
                    }
                    Way::Read => {
                        let moved = moved.min(answer.len() - 8);
                        answer[8..8 + moved].copy_from_slice(&memory[offset..offset + moved]);
                    }
                }
                let _ = socket.send_to(&answer[..response_bytes], from);
            }
            memory
        });
        // The transfer's clock starts once the sink serves.
        is_ready.recv().expect("the sink thread starts");
        Sink { addr, stop, thread }
    }

    /// Stops the thread; its memory.
    fn stop(self) -> Vec<u8> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the sink thread does not panic")
    }
}

/// The index a floor datagram starts with; `None` for one too short to carry it.
fn index_of(datagram: &[u8]) -> Option<u64> {
    datagram.get(..8).map(|bytes| u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
}

/// Moves `memory` (write: from it; read: into it) through the sink at `addr` in datagrams of
/// `request_bytes` answered by ones of `response_bytes`, `chunk` bytes each, keeping `window`
/// unanswered; after a silence of `FLOOR_SILENCE` it sends the unanswered ones again, as any
/// transfer that must arrive whole does, and gives up after `FLOOR_GIVE_UP` without an answer.
/// Returns the seconds taken and the datagrams sent again.
fn udp_transfer(
    way: Way,
    addr: SocketAddr,
    spins: bool,
    window: usize,
    (request_bytes, response_bytes): (usize, usize),
    chunk: usize,
    memory: &mut [u8],
) -> Result<(f64, u64), String> {
    if chunk == 0 || request_bytes < 8 || response_bytes < 8 {
        return Err(format!("no room for a chunk: {request_bytes} B requests, {response_bytes} B answers"));
    }
    let socket = floor::client_socket(addr, spins, FLOOR_SILENCE);
    let count = memory.len().div_ceil(chunk);
    let mut answered = vec![false; count];
    // Sent and not yet answered, oldest first (answered ones leave from the front lazily).
    let mut unanswered = std::collections::VecDeque::with_capacity(window);
    let (mut next, mut done, mut waiting, mut resent) = (0usize, 0usize, 0usize, 0u64);
    let mut request = vec![0xA5u8; request_bytes];
    let mut buffer = vec![0u8; 65_536];
    let started = Instant::now();
    let mut last_answer = started;
    let mut last_send = started;
    while done < count {
        while next < count && waiting < window {
            if !send_chunk(&socket, way, next, chunk, memory, &mut request)? {
                break;
            }
            unanswered.push_back(next);
            next += 1;
            waiting += 1;
            last_send = Instant::now();
        }
        match socket.recv(&mut buffer) {
            Ok(len) => {
                let Some(index) = index_of(&buffer[..len]).map(|index| index as usize).filter(|&index| index < count)
                else {
                    continue;
                };
                last_answer = Instant::now();
                if answered[index] {
                    continue; // an answer to a datagram sent twice
                }
                answered[index] = true;
                done += 1;
                waiting -= 1;
                if way == Way::Read {
                    let offset = index * chunk;
                    let moved = chunk.min(memory.len() - offset).min(len - 8);
                    memory[offset..offset + moved].copy_from_slice(&buffer[8..8 + moved]);
                }
                while unanswered.front().is_some_and(|&index| answered[index]) {
                    unanswered.pop_front();
                }
            }
            Err(_) if last_answer.elapsed() >= FLOOR_GIVE_UP => {
                return Err(format!(
                    "no answer for {} s ({done} of {count} datagrams answered)",
                    FLOOR_GIVE_UP.as_secs()
                ));
            }
            Err(_) if last_answer.max(last_send).elapsed() >= FLOOR_SILENCE => {
                for &index in unanswered.iter().filter(|&&index| !answered[index]) {
                    if send_chunk(&socket, way, index, chunk, memory, &mut request)? {
                        resent += 1;
                    }
                }
                last_send = Instant::now();
            }
            Err(_) => {}
        }
    }
    Ok((started.elapsed().as_secs_f64(), resent))
}

/// Sends datagram `index` (for a write, with its chunk of `memory`); `Ok(false)` when the
/// socket's buffer is full.
fn send_chunk(
    socket: &std::net::UdpSocket,
    way: Way,
    index: usize,
    chunk: usize,
    memory: &[u8],
    request: &mut [u8],
) -> Result<bool, String> {
    request[..8].copy_from_slice(&(index as u64).to_le_bytes());
    if way == Way::Write {
        let offset = index * chunk;
        let moved = chunk.min(memory.len() - offset).min(request.len() - 8);
        request[8..8 + moved].copy_from_slice(&memory[offset..offset + moved]);
    }
    match socket.send(request) {
        Ok(_) => Ok(true),
        // A full socket buffer: try again after the next answer.
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
        Err(error) => Err(format!("send: {error}")),
    }
}

fn rates(values: &[f64]) -> String {
    values.iter().map(|rate| format!("{rate:.0}")).collect::<Vec<_>>().join(", ")
}

fn direction_json(direction: &Direction) -> serde_json::Value {
    json!({
        "request_bytes": direction.request_bytes,
        "response_bytes": direction.response_bytes,
        "netdam_mib_per_s": direction.netdam,
        "udp_mib_per_s": direction.floor,
        "udp_resent_datagrams": direction.floor_resent,
        "ratio_of_medians": direction.ratio(),
    })
}

fn markdown(args: &BulkArgs, window: usize, write: &Direction, read: &Direction, retransmitted: u64) -> String {
    use std::fmt::Write;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "machine: {} (absolute numbers hold for this machine only). {} MiB each way per round, {} rounds \
         alternating netdam and UDP, {:?} polling, at most {} datagrams in flight (the session's cap, the UDP transfer's window); \
         netdam on a volatile (mem) region through one session; the UDP transfer to an echo that answers \
         each datagram with one of the size netdam's answer has.",
        crate::report::machine(),
        args.bytes >> 20,
        args.rounds.max(1),
        args.poll,
        window
    );
    let _ = writeln!(text);
    let _ = writeln!(
        text,
        "| transfer | datagrams (request → answer) | netdam MiB/s | UDP MiB/s | median netdam / UDP | goal |"
    );
    let _ = writeln!(text, "| --- | --- | --- | --- | --- | --- |");
    for (name, direction) in [("write", write), ("read", read)] {
        let ratio = direction.ratio();
        let verdict = if ratio >= 0.7 { "met" } else { "not met" };
        let _ = writeln!(
            text,
            "| {name} | {} B → {} B | {} (median {:.0}) | {} (median {:.0}) | {ratio:.2} | ≥ 0.7: {verdict} |",
            direction.request_bytes,
            direction.response_bytes,
            rates(&direction.netdam),
            median(&direction.netdam),
            rates(&direction.floor),
            median(&direction.floor),
        );
    }
    let _ = writeln!(
        text,
        "\nnetdam retransmitted {retransmitted} datagrams; the UDP transfer sent {} (write) and {} (read) again \
         after {} ms without an answer.",
        write.floor_resent,
        read.floor_resent,
        FLOOR_SILENCE.as_millis()
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The floor moves the real bytes both ways, so that it costs what a transfer costs.
    #[test]
    fn the_udp_floor_moves_every_byte_into_place_both_ways() {
        let (bytes, chunk, window) = (300_001, 8_944, 8);
        let sizes = (HEADER_LEN + INSTRUCTION_HEADER_LEN + chunk, HEADER_LEN + RESPONSE_INSTRUCTION_HEADER_LEN);
        let mut data = pattern(bytes);
        let sink = Sink::start(Way::Write, false, bytes, chunk, sizes.1);
        udp_transfer(Way::Write, sink.addr, false, window, sizes, chunk, &mut data).unwrap();
        let written = sink.stop();
        assert!(written == data, "the sink holds what was sent, each chunk in its place");

        let sizes = (HEADER_LEN + INSTRUCTION_HEADER_LEN, HEADER_LEN + RESPONSE_INSTRUCTION_HEADER_LEN + chunk);
        let mut back = vec![0u8; bytes];
        let sink = Sink::start(Way::Read, false, bytes, chunk, sizes.1);
        udp_transfer(Way::Read, sink.addr, false, window, sizes, chunk, &mut back).unwrap();
        let held = sink.stop();
        assert!(back == held && back == pattern(bytes), "every chunk the sink holds arrived in its place");
    }

    #[test]
    fn the_pattern_differs_from_chunk_to_chunk() {
        let data = pattern(3 * 8_944);
        assert_ne!(data[..8_944], data[8_944..2 * 8_944]);
        assert_eq!(data.len(), 3 * 8_944);
    }
}
