//! A worker: one thread, one socket on the shared port, running every request to completion.
//!
//! Each pass takes at most `RECEIVE_BATCH` datagrams (bounded work per pass), executes each and
//! sends its response before taking the next. All buffers are allocated before the loop starts;
//! inside it there is no allocation, no lock, and no system call but receive and send.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use netdam_isa::engine::Engine;
use netdam_isa::time::MonotonicClock;
use netdam_isa::Duration;

use crate::block::ReplyTo;
use crate::config::PollMode;
use crate::dispatch::{Dispatcher, Handled};
use crate::socket::{self, ReceiveBatch};
use crate::stats::Counter;

/// How one worker runs.
#[derive(Debug, Clone, Copy)]
pub struct WorkerSettings {
    /// How it waits for datagrams.
    pub poll: PollMode,
    /// In adaptive mode, how long it spins after the last datagram before blocking.
    pub adaptive_spin: Duration,
    /// Largest datagram received or sent.
    pub max_datagram_bytes: usize,
    /// The clock every worker of the target reads (one origin for all).
    pub clock: MonotonicClock,
}

/// Runs a worker until `shutdown` is set.
pub fn run<E: Engine>(fd: OwnedFd, mut dispatcher: Dispatcher<E>, settings: WorkerSettings, shutdown: Arc<AtomicBool>) {
    let mut batch = ReceiveBatch::new(settings.max_datagram_bytes);
    let mut out = vec![0u8; settings.max_datagram_bytes];
    let clock = settings.clock;
    // Last datagram received or block answer sent.
    let mut last_datagram = clock.now();
    while !shutdown.load(Ordering::Relaxed) {
        let pass_start = clock.now();
        // Session expiry: a bounded share of the table, at most once per sweep interval.
        dispatcher.tick(pass_start);
        // While block I/O is in flight the worker must come back to reap it: it never sleeps.
        let wait = dispatcher.block_pending() == 0
            && match settings.poll {
                PollMode::Busy => false,
                PollMode::Blocking => true,
                PollMode::Adaptive => pass_start.saturating_since(last_datagram) > settings.adaptive_spin,
            };
        let count = match batch.receive(&fd, wait) {
            Ok(count) => count,
            Err(error) => {
                match error.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EINTR) => {}
                    _ => {
                        dispatcher.count(Counter::ReceiveErrors);
                        tracing::warn!(%error, "receive failed");
                    }
                }
                if poll_block(&fd, &mut dispatcher, &clock) > 0 {
                    last_datagram = clock.now();
                }
                if !wait {
                    if settings.poll == PollMode::Adaptive {
                        // Spinning on a shared core starves whoever would send the next
                        // request (an NBD export, fio, a client on this machine): give the core
                        // to any runnable thread between empty polls. Measured with `netdam nbd`
                        // at depth 32: 30-36k IOPS and 8-10 ms p99.9 without, 96-111k and 1.7 ms
                        // with (docs/DECISIONS.md). Busy polling keeps its core to itself.
                        // SAFETY: sched_yield takes no arguments and cannot fail on Linux.
                        unsafe { libc::sched_yield() };
                    }
                    std::hint::spin_loop();
                }
                continue;
            }
        };
        let received_at = clock.now();
        let received_at_realtime_ns = socket::realtime_ns();
        last_datagram = received_at;
        for index in 0..count {
            let (received, datagram) = batch.get(index);
            if received.truncated {
                dispatcher.count(Counter::DatagramsReceived);
                dispatcher.count(Counter::DroppedOversized);
                continue;
            }
            // Queueing: the wait in the kernel's socket queue, then behind earlier datagrams of
            // this batch.
            let started = clock.now();
            let in_kernel = Duration::from_nanos(received_at_realtime_ns.saturating_sub(received.kernel_realtime_ns));
            let in_kernel = if received.kernel_realtime_ns == 0 { Duration::ZERO } else { in_kernel };
            let queueing = in_kernel + started.saturating_since(received_at);
            let Some(peer) = batch.peer(index) else {
                // recvmmsg fills an IP sender for every datagram of a UDP socket.
                dispatcher.count(Counter::DatagramsReceived);
                dispatcher.count(Counter::ReceiveErrors);
                continue;
            };
            let from = ReplyTo { peer, ttl: received.ttl };
            let len = match dispatcher.handle(started, from, queueing, datagram, &mut out) {
                Handled::Dropped => continue,
                Handled::Replay(len) => len,
                Handled::Deferred(_) => continue,
                Handled::Answer { response, record } => {
                    let held = queueing + clock.now().saturating_since(started);
                    let service_time_ns = u32::try_from(held.as_nanos()).unwrap_or(u32::MAX);
                    // Datagrams of this batch still waiting behind this one: the worker's queue.
                    let queue_depth = (count - 1 - index) as u16;
                    let len = response.finish(received.ttl, service_time_ns, queue_depth);
                    if let Some((ticket, store_answer)) = record {
                        dispatcher.record(ticket, store_answer.then_some(&out[..len]));
                    }
                    len
                }
            };
            // Counted before the send, so whoever has received an answer also sees it counted.
            dispatcher.count(Counter::ResponsesSent);
            if batch.reply(&fd, index, &out[..len]).is_err() {
                dispatcher.count(Counter::SendErrors);
            }
        }
        if poll_block(&fd, &mut dispatcher, &clock) > 0 {
            last_datagram = clock.now();
        }
    }
}

/// Reaps block completions and sends the answers they finish; returns how many it sent. An
/// answer counts as activity for adaptive polling: the initiator's next request usually follows
/// it within the spin time, and a sleeping worker would add a wake-up to it.
fn poll_block<E: Engine>(fd: &OwnedFd, dispatcher: &mut Dispatcher<E>, clock: &MonotonicClock) -> usize {
    if dispatcher.block_pending() == 0 {
        return 0;
    }
    let mut failed = 0;
    let sent = dispatcher.poll_block(clock.now(), &mut |reply_to, answer| {
        if socket::send_to(fd, &reply_to.peer, answer).is_err() {
            failed += 1;
        }
    });
    if failed > 0 {
        dispatcher.stats().add(Counter::SendErrors, failed);
    }
    sent
}

/// The CPUs this process may run on, in order.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is a plain bit set; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize).filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) }).collect()
}

/// Pins the calling thread (worker `index`) to `cpu`; logs and goes on unpinned if refused.
pub fn pin_to_cpu(index: usize, cpu: usize) {
    // SAFETY: as above; the set names one CPU.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(cpu, &mut set) };
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        let error = std::io::Error::last_os_error();
        tracing::warn!(worker = index, cpu, %error, "cannot pin worker to its CPU; it runs unpinned");
    } else {
        tracing::debug!(worker = index, cpu, "worker pinned");
    }
}
