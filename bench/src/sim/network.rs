//! The simulated network: output ports with a rate, a propagation delay and a drop-tail buffer.
//!
//! A port needs no queue structure: it remembers when its line is next free. A datagram
//! arriving at `now` waits `busy_until - now`, which at the port's rate is the backlog in bytes;
//! if backlog plus the datagram exceeds the buffer it is dropped.

use netdam_isa::{Duration, Instant};

/// Bytes a datagram takes on the wire beyond its UDP payload: Ethernet, IPv4 and UDP headers.
pub const WIRE_OVERHEAD_BYTES: usize = 14 + 20 + 8;

/// One output port.
#[derive(Debug, Clone)]
pub struct Port {
    bytes_per_ns: f64,
    propagation: Duration,
    buffer_bytes: usize,
    busy_until: Instant,
    /// Datagrams dropped because the buffer was full.
    pub drops: u64,
    /// Datagrams sent.
    pub sent: u64,
    /// Bytes sent, payload and overhead.
    pub sent_bytes: u64,
}

/// Where a datagram that entered a port will be, and how long it queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Departure {
    /// When it reaches the far end.
    pub arrival: Instant,
    /// How long it waited behind earlier datagrams.
    pub queueing: Duration,
}

impl Port {
    /// A port of `gbps` gigabits per second, `propagation` to the far end, `buffer_bytes` deep.
    pub fn new(gbps: f64, propagation: Duration, buffer_bytes: usize) -> Port {
        Port {
            bytes_per_ns: gbps / 8.0,
            propagation,
            buffer_bytes,
            busy_until: Instant::ZERO,
            drops: 0,
            sent: 0,
            sent_bytes: 0,
        }
    }

    /// Offers a datagram of `payload_bytes` at `now`: its departure, or `None` when dropped.
    pub fn offer(&mut self, now: Instant, payload_bytes: usize) -> Option<Departure> {
        let size = (payload_bytes + WIRE_OVERHEAD_BYTES) as f64;
        let queueing = self.busy_until.saturating_since(now);
        let backlog_bytes = queueing.as_nanos() as f64 * self.bytes_per_ns;
        if backlog_bytes + size > self.buffer_bytes as f64 {
            self.drops += 1;
            return None;
        }
        let start = if self.busy_until > now { self.busy_until } else { now };
        let done = start + Duration::from_nanos((size / self.bytes_per_ns).ceil() as u64);
        self.busy_until = done;
        self.sent += 1;
        self.sent_bytes += size as u64;
        Some(Departure { arrival: done + self.propagation, queueing })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_serializes_queues_and_drops_at_its_buffer() {
        // 8 Gb/s: one byte per ns. 958 + 42 = 1000 bytes per datagram, buffer of 3000 bytes.
        let mut port = Port::new(8.0, Duration::from_micros(1), 3000);
        let first = port.offer(Instant::ZERO, 958).unwrap();
        assert_eq!(first, Departure { arrival: Instant::from_nanos(2000), queueing: Duration::ZERO });
        let second = port.offer(Instant::ZERO, 958).unwrap();
        assert_eq!(second.queueing, Duration::from_nanos(1000));
        assert_eq!(second.arrival, Instant::from_nanos(3000));
        port.offer(Instant::ZERO, 958).unwrap();
        assert_eq!(port.offer(Instant::ZERO, 958), None, "backlog 3000 bytes: full");
        assert_eq!(port.drops, 1);
        assert!(port.offer(Instant::from_nanos(1500), 958).is_some(), "drained a little");
    }
}
