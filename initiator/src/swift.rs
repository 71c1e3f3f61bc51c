//! Swift congestion control (Kumar et al., SIGCOMM 2020), adapted to request windows.
//!
//! Sans-IO: it takes `now` and events (answers with their RTT, the target's service time and the
//! hop count; timeouts; BUSY answers) and says how many requests may be in flight and, below one
//! request per RTT, when the next may leave. The window counts requests (datagrams), not bytes.
//!
//! Two windows: the fabric window reacts to `fabric delay = rtt - service time` against a target
//! that grows with hops and shrinks with the window (flow scaling); the endpoint window reacts to
//! how long requests queued at the target before executing, against a fixed target. Execution
//! time itself (an msync of a persistent write takes milliseconds) is neither: it is the price of
//! the operation, not congestion. The effective window is the smaller of the two, so a busy
//! target slows its initiators without being mistaken for a congested network, and the reverse.

use netdam_isa::{Duration, Instant};

/// Controller settings; `docs/DECISIONS.md` says where each default comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwiftConfig {
    /// Additive increase, requests per RTT.
    pub additive_increase: f64,
    /// Multiplicative decrease strength: the window shrinks by `beta * (delay - target) / delay`.
    pub beta: f64,
    /// Largest fraction the window loses in one decrease.
    pub max_decrease: f64,
    /// Fabric target delay with no hops and no flow scaling.
    pub base_target: Duration,
    /// Fabric target added per hop.
    pub per_hop: Duration,
    /// Largest flow-scaling addition (reached at `flow_scaling_min_window`).
    pub flow_scaling_range: Duration,
    /// Window at which flow scaling adds its whole range.
    pub flow_scaling_min_window: f64,
    /// Window at which flow scaling adds nothing.
    pub flow_scaling_max_window: f64,
    /// Endpoint target delay: how long requests may queue at the target before executing.
    pub endpoint_target: Duration,
    /// Smallest window; below 1 the controller paces.
    pub min_window: f64,
    /// Largest window.
    pub max_window: f64,
    /// Window at start.
    pub initial_window: f64,
    /// Consecutive timeouts after which the window drops to the minimum.
    pub timeouts_to_reset: u32,
    /// Longest gap that pacing (below a window of one) puts between two sends. A target that
    /// was silent for seconds (a paused host) answers with round trips of seconds; the smoothed
    /// RTT takes them in while the window sits at its minimum, and RTT / window would then hold
    /// the next request for minutes, though a single answer under the target lifts the window
    /// back above one.
    pub max_pacing_gap: Duration,
}

impl Default for SwiftConfig {
    fn default() -> SwiftConfig {
        SwiftConfig {
            additive_increase: 1.0,
            beta: 0.8,
            max_decrease: 0.5,
            base_target: Duration::from_micros(50),
            per_hop: Duration::from_micros(10),
            flow_scaling_range: Duration::from_micros(100),
            flow_scaling_min_window: 0.1,
            flow_scaling_max_window: 64.0,
            endpoint_target: Duration::from_micros(100),
            min_window: 0.01,
            max_window: 256.0,
            initial_window: 1.0,
            timeouts_to_reset: 5,
            max_pacing_gap: Duration::from_millis(100),
        }
    }
}

/// A plain snapshot of the controller, for metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SwiftMetrics {
    /// Fabric window, requests.
    pub fabric_window: f64,
    /// Endpoint window, requests.
    pub endpoint_window: f64,
    /// Current fabric target delay.
    pub fabric_target: Duration,
    /// Smoothed RTT.
    pub smoothed_rtt: Duration,
    /// Last fabric delay seen.
    pub last_fabric_delay: Duration,
    /// Last endpoint delay seen.
    pub last_endpoint_delay: Duration,
    /// Multiplicative decreases so far (both windows).
    pub decreases: u64,
    /// Timeouts reported so far.
    pub timeouts: u64,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    size: f64,
    last_decrease: Option<Instant>,
}

/// The controller of one session.
#[derive(Debug, Clone)]
pub struct Swift {
    config: SwiftConfig,
    fabric: Window,
    endpoint: Window,
    smoothed_rtt: Option<Duration>,
    consecutive_timeouts: u32,
    last_send: Option<Instant>,
    metrics: SwiftMetrics,
    /// The flow-scaling curve `alpha / sqrt(w) + offset` (see `fabric_target`), from the
    /// config, computed once: three square roots and two divisions fewer per answer.
    flow_scaling: (f64, f64),
}

impl Swift {
    /// A controller with `config`.
    pub fn new(config: SwiftConfig) -> Swift {
        let initial =
            Window { size: config.initial_window.clamp(config.min_window, config.max_window), last_decrease: None };
        Swift {
            config,
            fabric: initial,
            endpoint: initial,
            smoothed_rtt: None,
            consecutive_timeouts: 0,
            last_send: None,
            metrics: SwiftMetrics::default(),
            flow_scaling: flow_scaling(&config),
        }
    }

    /// The effective window: the smaller of fabric and endpoint windows, in requests.
    pub fn window(&self) -> f64 {
        self.fabric.size.min(self.endpoint.size)
    }

    /// A snapshot for metrics.
    pub fn metrics(&self) -> SwiftMetrics {
        SwiftMetrics {
            fabric_window: self.fabric.size,
            endpoint_window: self.endpoint.size,
            fabric_target: self.fabric_target(0),
            smoothed_rtt: self.smoothed_rtt.unwrap_or(Duration::ZERO),
            ..self.metrics
        }
    }

    /// Fabric target delay for `hops` at the current window.
    pub fn fabric_target(&self, hops: u32) -> Duration {
        let config = &self.config;
        let range = config.flow_scaling_range.as_nanos() as f64;
        let (alpha, offset) = self.flow_scaling;
        let scaling = (alpha / self.fabric.size.max(f64::MIN_POSITIVE).sqrt() + offset).clamp(0.0, range);
        config.base_target + Duration::from_nanos(config.per_hop.as_nanos() * u64::from(hops) + scaling as u64)
    }

    /// Whether a request may leave now with `in_flight` already out: `Ok(())`, or `Err(Some(t))`
    /// when pacing holds it until `t`, or `Err(None)` when the window is full.
    pub fn may_send(&self, now: Instant, in_flight: usize) -> Result<(), Option<Instant>> {
        let window = self.window();
        if window >= 1.0 {
            return if (in_flight as f64) < window.floor() { Ok(()) } else { Err(None) };
        }
        // Below one request per RTT: one at a time, spaced by rtt / window.
        if in_flight > 0 {
            return Err(None);
        }
        let (Some(last), Some(rtt)) = (self.last_send, self.smoothed_rtt) else {
            return Ok(());
        };
        let gap = Duration::from_nanos((rtt.as_nanos() as f64 / window) as u64).min(self.config.max_pacing_gap);
        let release = last + gap;
        if now >= release {
            Ok(())
        } else {
            Err(Some(release))
        }
    }

    /// Notes a transmission at `now` (the pacing clock).
    pub fn on_send(&mut self, now: Instant) {
        self.last_send = Some(now);
    }

    /// An answer arrived `rtt` after its request left; the target held it for `service` in all,
    /// of which it queued for `queueing` before executing; it crossed `hops` hops; it
    /// acknowledged `acked` requests.
    pub fn on_answer(
        &mut self,
        now: Instant,
        rtt: Duration,
        service: Duration,
        queueing: Duration,
        hops: u32,
        acked: u32,
    ) {
        self.consecutive_timeouts = 0;
        self.smoothed_rtt = Some(match self.smoothed_rtt {
            None => rtt,
            Some(smoothed) => Duration::from_nanos((smoothed.as_nanos() * 7 + rtt.as_nanos()) / 8),
        });
        let fabric_delay = rtt.saturating_sub(service);
        self.metrics.last_fabric_delay = fabric_delay;
        self.metrics.last_endpoint_delay = queueing;
        let fabric_target = self.fabric_target(hops);
        let decreased_fabric = self.adjust(Which::Fabric, now, fabric_delay, fabric_target, acked);
        let decreased_endpoint = self.adjust(Which::Endpoint, now, queueing, self.config.endpoint_target, acked);
        self.metrics.decreases += u64::from(decreased_fabric) + u64::from(decreased_endpoint);
    }

    /// A request timed out. Timeouts within one smoothed RTT of the last decrease are one loss
    /// event (a burst of requests lost together): the window shrinks once by `max_decrease`, and
    /// after `timeouts_to_reset` such events in a row, without an answer between, to the minimum.
    pub fn on_timeout(&mut self, now: Instant) {
        self.metrics.timeouts += 1;
        if !self.can_decrease(Which::Fabric, now) || !self.can_decrease(Which::Endpoint, now) {
            return;
        }
        self.consecutive_timeouts += 1;
        let reset = self.consecutive_timeouts >= self.config.timeouts_to_reset;
        for which in [Which::Fabric, Which::Endpoint] {
            let (min_window, max_decrease) = (self.config.min_window, self.config.max_decrease);
            let window = self.window_mut(which);
            window.size = if reset { min_window } else { (window.size * (1.0 - max_decrease)).max(min_window) };
            window.last_decrease = Some(now);
        }
        self.metrics.decreases += 2;
    }

    /// The target answered BUSY: an endpoint signal, so only the endpoint window shrinks.
    pub fn on_busy(&mut self, now: Instant) {
        if self.can_decrease(Which::Endpoint, now) {
            let factor = 1.0 - self.config.max_decrease;
            let min_window = self.config.min_window;
            let window = self.window_mut(Which::Endpoint);
            window.size = (window.size * factor).max(min_window);
            window.last_decrease = Some(now);
            self.metrics.decreases += 1;
        }
    }

    fn window_mut(&mut self, which: Which) -> &mut Window {
        match which {
            Which::Fabric => &mut self.fabric,
            Which::Endpoint => &mut self.endpoint,
        }
    }

    /// At most one decrease per smoothed RTT.
    fn can_decrease(&self, which: Which, now: Instant) -> bool {
        let window = match which {
            Which::Fabric => &self.fabric,
            Which::Endpoint => &self.endpoint,
        };
        match (window.last_decrease, self.smoothed_rtt) {
            (Some(last), Some(rtt)) => now.saturating_since(last) >= rtt,
            _ => true,
        }
    }

    /// Additive increase below target, multiplicative decrease above; returns whether it decreased.
    fn adjust(&mut self, which: Which, now: Instant, delay: Duration, target: Duration, acked: u32) -> bool {
        let (additive_increase, beta, max_decrease) =
            (self.config.additive_increase, self.config.beta, self.config.max_decrease);
        let (min_window, max_window) = (self.config.min_window, self.config.max_window);
        let can_decrease = self.can_decrease(which, now);
        let window = self.window_mut(which);
        let mut decreased = false;
        if delay < target {
            let acked = f64::from(acked);
            window.size +=
                if window.size >= 1.0 { additive_increase * acked / window.size } else { additive_increase * acked };
        } else if can_decrease {
            let delay_ns = delay.as_nanos().max(1) as f64;
            let excess = (delay_ns - target.as_nanos() as f64) / delay_ns;
            window.size *= (1.0 - beta * excess).max(1.0 - max_decrease);
            window.last_decrease = Some(now);
            decreased = true;
        }
        window.size = window.size.clamp(min_window, max_window);
        decreased
    }
}

/// `(alpha, offset)` of the flow-scaling curve fs(w) = alpha / sqrt(w) + offset, with
/// fs(`flow_scaling_min_window`) = `flow_scaling_range` and fs(`flow_scaling_max_window`) = 0.
fn flow_scaling(config: &SwiftConfig) -> (f64, f64) {
    let range = config.flow_scaling_range.as_nanos() as f64;
    let alpha = range / (1.0 / config.flow_scaling_min_window.sqrt() - 1.0 / config.flow_scaling_max_window.sqrt());
    (alpha, -alpha / config.flow_scaling_max_window.sqrt())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    Fabric,
    Endpoint,
}

/// Hops a datagram crossed, from the TTL it arrived with: the distance below the nearest usual
/// initial TTL (64, 128 or 255). 0 means the target could not tell; that counts as one hop.
pub fn hops_from_ttl(ttl: u8) -> u32 {
    match ttl {
        0 => 1,
        1..=64 => u32::from(64 - ttl),
        65..=128 => u32::from(128 - ttl),
        _ => u32::from(255 - ttl),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_us(us: u64) -> Instant {
        Instant::ZERO + Duration::from_micros(us)
    }

    #[test]
    fn grows_additively_below_target() {
        let mut swift = Swift::new(SwiftConfig { initial_window: 4.0, ..SwiftConfig::default() });
        for step in 0..4 {
            swift.on_answer(
                at_us(step * 20),
                Duration::from_micros(20),
                Duration::from_micros(5),
                Duration::ZERO,
                0,
                1,
            );
        }
        // Four answers at window ~4 add about one request.
        assert!((swift.window() - 5.0).abs() < 0.1, "window {}", swift.window());
    }

    #[test]
    fn decreases_at_most_once_per_rtt_and_by_at_most_max_decrease() {
        let mut swift = Swift::new(SwiftConfig { initial_window: 32.0, ..SwiftConfig::default() });
        let (service, queueing) = (Duration::from_micros(5), Duration::ZERO);
        swift.on_answer(at_us(0), Duration::from_micros(40), service, queueing, 0, 1);
        let before = swift.window();
        // Fabric delay 10 ms: far above target, capped at max_decrease.
        swift.on_answer(at_us(100), Duration::from_millis(10), service, queueing, 0, 1);
        let once = swift.window();
        assert!((once - before * 0.5).abs() < 1e-9, "{before} -> {once}");
        // Again within one smoothed RTT: no second decrease.
        swift.on_answer(at_us(101), Duration::from_millis(10), service, queueing, 0, 1);
        assert_eq!(swift.window(), once);
        assert_eq!(swift.metrics().decreases, 1);
    }

    #[test]
    fn endpoint_queueing_shrinks_only_the_endpoint_window() {
        let mut swift = Swift::new(SwiftConfig { initial_window: 16.0, ..SwiftConfig::default() });
        // RTT 1 ms of which the target held it 0.99 ms, 0.9 ms of it queued: fabric delay 10 µs is
        // fine, endpoint queueing is not.
        let (service, queueing) = (Duration::from_micros(990), Duration::from_micros(900));
        swift.on_answer(at_us(0), Duration::from_micros(1000), service, queueing, 0, 1);
        let metrics = swift.metrics();
        assert!(metrics.fabric_window > 16.0);
        assert!(metrics.endpoint_window < 16.0);
        assert_eq!(swift.window(), metrics.endpoint_window);
    }

    #[test]
    fn slow_execution_without_queueing_is_not_congestion() {
        // A persistent write: 3 ms at the target, all of it msync, none of it queueing.
        let mut swift = Swift::new(SwiftConfig { initial_window: 16.0, ..SwiftConfig::default() });
        swift.on_answer(at_us(0), Duration::from_micros(3020), Duration::from_micros(3000), Duration::ZERO, 0, 1);
        assert!(swift.window() > 16.0, "window {}", swift.window());
    }

    #[test]
    fn flow_scaling_raises_the_target_for_small_windows_within_its_range() {
        let config = SwiftConfig::default();
        let small = Swift::new(SwiftConfig { initial_window: 0.1, ..config });
        let large = Swift::new(SwiftConfig { initial_window: 64.0, ..config });
        assert_eq!(small.fabric_target(0), config.base_target + config.flow_scaling_range);
        assert_eq!(large.fabric_target(0), config.base_target);
        assert_eq!(large.fabric_target(3), config.base_target + Duration::from_micros(30));
    }

    #[test]
    fn paces_below_one_request_per_rtt_and_resets_after_repeated_timeouts() {
        let mut swift = Swift::new(SwiftConfig { initial_window: 1.0, ..SwiftConfig::default() });
        // Below target: the window grows from 1 to 2; the smoothed RTT is 20 µs.
        swift.on_answer(at_us(0), Duration::from_micros(20), Duration::from_micros(1), Duration::ZERO, 0, 1);
        assert_eq!(swift.window(), 2.0);
        // A burst of timeouts within one RTT is one event: halved once.
        swift.on_timeout(at_us(1000));
        swift.on_timeout(at_us(1001));
        swift.on_timeout(at_us(1002));
        assert_eq!(swift.window(), 1.0);
        for step in 2..=5 {
            swift.on_timeout(at_us(step * 1000));
        }
        assert_eq!(swift.window(), SwiftConfig::default().min_window, "five events in a row reset the window");
        swift.on_send(at_us(10_000));
        assert_eq!(swift.may_send(at_us(10_000), 1), Err(None), "one at a time");
        // rtt 20 µs / window 0.01 = 2 ms between requests.
        assert_eq!(swift.may_send(at_us(10_001), 0), Err(Some(at_us(12_000))));
        assert_eq!(swift.may_send(at_us(12_000), 0), Ok(()));
    }

    /// After a silence of seconds (a paused target), answers with round trips of seconds fill
    /// the smoothed RTT while the window is at its minimum: pacing holds the next request for
    /// `max_pacing_gap`, not RTT / window (minutes), and the first answer under the target lifts
    /// the window above one again.
    #[test]
    fn a_paused_target_does_not_pace_the_next_request_for_minutes() {
        let mut swift = Swift::new(SwiftConfig { initial_window: 1.0, ..SwiftConfig::default() });
        for step in 1..=5 {
            swift.on_timeout(at_us(step * 1000));
        }
        assert_eq!(swift.window(), SwiftConfig::default().min_window);
        // Three answers to requests the paused target held for 8 s.
        for answer in 0..3 {
            swift.on_answer(
                at_us(8_000_000 + answer),
                Duration::from_millis(8_000),
                Duration::ZERO,
                Duration::ZERO,
                0,
                1,
            );
        }
        let last_send = at_us(8_000_100);
        swift.on_send(last_send);
        // 8 s / 0.01 would be 800 s.
        let gap = SwiftConfig::default().max_pacing_gap;
        assert_eq!(swift.may_send(last_send, 0), Err(Some(last_send + gap)));
        assert_eq!(swift.may_send(last_send + gap, 0), Ok(()));
        swift.on_answer(last_send + gap, Duration::from_micros(20), Duration::from_micros(1), Duration::ZERO, 0, 1);
        assert!(swift.window() > 1.0, "one answer under the target: {}", swift.window());
    }

    #[test]
    fn hops_count_down_from_the_usual_initial_ttls() {
        assert_eq!(hops_from_ttl(64), 0);
        assert_eq!(hops_from_ttl(61), 3);
        assert_eq!(hops_from_ttl(127), 1);
        assert_eq!(hops_from_ttl(250), 5);
        assert_eq!(hops_from_ttl(0), 1);
    }
}
