//! `/metrics` of a live target: requests over loopback, then a scrape over HTTP whose text is
//! parsed and whose values are checked against what was sent.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use netdam_initiator::Client;
use netdam_metrics::http::{get, OPENMETRICS_CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE};
use netdam_metrics::BUCKETS;

/// Samples of a text exposition: `name{labels}` as written, and the value.
fn parse(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("a sample has a value");
            (series.to_string(), value.parse().unwrap_or_else(|_| panic!("value of {line:?}")))
        })
        .collect()
}

fn value(samples: &HashMap<String, f64>, series: &str) -> f64 {
    *samples.get(series).unwrap_or_else(|| panic!("no sample {series}"))
}

/// The cumulative bucket counts of one histogram series, in the order of their bounds.
fn buckets(text: &str, family: &str, opcode: &str) -> Vec<(String, u64)> {
    let prefix = format!("{family}_bucket{{opcode=\"{opcode}\",le=\"");
    text.lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .map(|rest| {
            let (bound, count) = rest.split_once("\"} ").expect("a bucket line");
            (bound.to_string(), count.parse().expect("a count"))
        })
        .collect()
}

#[test]
fn a_scrape_counts_the_requests_sent() {
    let test = common::start(vec![common::region("mem", 1 << 20, false)], 1, 9000);
    let metrics = test.target.metrics_addr().expect("metrics are on in the test settings");
    let url = format!("http://{metrics}/metrics");
    // Exact counts need every request executed once: a retransmitted READ would run again. A
    // long timeout keeps a loaded machine from retransmitting, and the count is checked below.
    let patient = netdam_initiator::session::SessionConfig {
        initial_rto: netdam_isa::Duration::from_millis(1_000),
        min_rto: netdam_isa::Duration::from_millis(1_000),
        ..Default::default()
    };
    let options = netdam_initiator::ClientOptions { session: patient, ..Default::default() };
    let mut client = Client::connect_with(test.target.local_addr(), options).unwrap();
    const READS: u64 = 57;
    const WRITES: u64 = 13;
    let mut out = [0u8; 64];
    for round in 0..READS {
        client.read(0, round * 64, &mut out).unwrap();
    }
    for round in 0..WRITES {
        client.write(0, round * 128, &[7u8; 128]).unwrap();
    }

    assert_eq!(client.session_stats().retransmissions, 0, "every request was sent once");

    let (code, content_type, text) = get(&url, None, Duration::from_secs(5)).unwrap();
    assert_eq!(code, 200);
    assert_eq!(content_type, PROMETHEUS_CONTENT_TYPE);
    let samples = parse(&text);
    assert_eq!(value(&samples, "netdam_instructions_total{opcode=\"read\"}"), READS as f64);
    assert_eq!(value(&samples, "netdam_instructions_total{opcode=\"write\"}"), WRITES as f64);
    assert_eq!(value(&samples, "netdam_instructions_total{opcode=\"cas\"}"), 0.0);
    assert_eq!(value(&samples, "netdam_data_bytes_total{opcode=\"read\",direction=\"sent\"}"), (READS * 64) as f64);
    assert_eq!(
        value(&samples, "netdam_data_bytes_total{opcode=\"write\",direction=\"received\"}"),
        (WRITES * 128) as f64
    );
    assert_eq!(value(&samples, "netdam_service_time_seconds_count{opcode=\"read\"}"), READS as f64);
    assert_eq!(value(&samples, "netdam_queueing_delay_seconds_count{opcode=\"read\"}"), READS as f64);
    assert_eq!(value(&samples, "netdam_service_time_seconds_count{opcode=\"write\"}"), WRITES as f64);
    assert!(value(&samples, "netdam_service_time_seconds_sum{opcode=\"read\"}") > 0.0);
    assert!(
        !samples.contains_key("netdam_service_time_seconds_count{opcode=\"cas\"}"),
        "unused opcodes have no histogram"
    );
    // The HELLO exchange (a retry for the cookie, then the session) came first.
    assert_eq!(value(&samples, "netdam_instructions_total{opcode=\"hello\"}"), 2.0);
    assert_eq!(value(&samples, "netdam_instruction_results_total{status=\"ok\"}"), (READS + WRITES + 1) as f64);
    assert_eq!(value(&samples, "netdam_instruction_results_total{status=\"retry\"}"), 1.0);
    assert_eq!(value(&samples, "netdam_datagrams_received_total{worker=\"0\"}"), (READS + WRITES + 2) as f64);
    assert_eq!(value(&samples, "netdam_sessions_open"), 1.0);
    assert_eq!(value(&samples, "netdam_sessions_opened_total"), 1.0);
    assert_eq!(value(&samples, "netdam_datagrams_dropped_total{reason=\"bad_crc\"}"), 0.0);
    for reason in ["queueing", "block_slots_full", "tenant_rate", "tenant_overload", "tenant_in_flight"] {
        let series = format!("netdam_busy_answers_total{{reason=\"{reason}\"}}");
        assert_eq!(value(&samples, &series), 0.0, "every reason is served from the start");
    }
    assert_eq!(value(&samples, "netdam_workers"), 1.0);
    let build = samples.keys().find(|series| series.starts_with("netdam_build_info{")).expect("build info");
    assert!(build.contains("engine=\"software\"") && build.contains("poll_mode=\"blocking\""), "{build}");

    // The histogram's buckets: cumulative, every bound, +Inf equal to the count.
    let read_buckets = buckets(&text, "netdam_service_time_seconds", "read");
    assert_eq!(read_buckets.len(), BUCKETS);
    assert_eq!(read_buckets[0].0, "1.024e-06");
    assert_eq!(read_buckets[BUCKETS - 1], ("+Inf".to_string(), READS));
    assert!(read_buckets.windows(2).all(|pair| pair[0].1 <= pair[1].1), "cumulative");

    // OpenMetrics on request, with the same values.
    let (code, content_type, open) =
        get(&url, Some("application/openmetrics-text;version=1.0.0"), Duration::from_secs(5)).unwrap();
    assert_eq!(code, 200);
    assert_eq!(content_type, OPENMETRICS_CONTENT_TYPE);
    assert!(open.ends_with("# EOF\n"));
    assert!(open.contains("# UNIT netdam_service_time_seconds seconds\n"));
    let open_samples = parse(&open);
    assert_eq!(value(&open_samples, "netdam_instructions_total{opcode=\"read\"}"), READS as f64);

    client.close().unwrap();
    let (_, _, after) = get(&url, None, Duration::from_secs(5)).unwrap();
    let after = parse(&after);
    assert_eq!(value(&after, "netdam_sessions_open"), 0.0);
    assert_eq!(value(&after, "netdam_sessions_ended_total{reason=\"closed\"}"), 1.0);
}

/// A busy-polling worker made to share the CPUs with as many spinning threads as there are CPUs
/// is taken off its CPU now and then, and `/metrics` says so, from the kernel's own count; an
/// idle moment before that adds none.
#[test]
fn a_preempted_worker_shows_in_its_involuntary_context_switches() {
    let test = common::start_configured(vec![common::region("mem", 1 << 20, false)], |config| {
        config.poll = netdam_target::config::PollMode::Busy;
    });
    let url = format!("http://{}/metrics", test.target.metrics_addr().unwrap());
    // The series appear once the worker's thread has recorded itself, moments after the start.
    let switches = || {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let (_, _, text) = get(&url, None, Duration::from_secs(5)).unwrap();
            let samples = parse(&text);
            let kind = |kind: &str| {
                samples.get(&format!("netdam_worker_context_switches_total{{worker=\"0\",kind=\"{kind}\"}}")).copied()
            };
            match (kind("voluntary"), kind("involuntary")) {
                (Some(voluntary), Some(involuntary)) => return (voluntary, involuntary),
                _ if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                _ => panic!("no netdam_worker_context_switches_total series for worker 0 after 5 s:\n{text}"),
            }
        }
    };
    let (_, before) = switches();
    let spinners = std::thread::available_parallelism().map_or(2, |cpus| cpus.get());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let threads: Vec<_> = (0..spinners)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for thread in threads {
        thread.join().unwrap();
    }
    let (_, after) = switches();
    assert!(
        after > before,
        "a busy worker among {spinners} spinners on {spinners} CPUs was never preempted: involuntary {before} -> {after}"
    );
}

#[test]
fn metrics_off_serves_nothing_and_records_no_histograms() {
    let test = common::start_configured(vec![common::region("mem", 1 << 20, false)], |config| {
        config.metrics_listen = netdam_metrics::MetricsListen::Off;
    });
    assert_eq!(test.target.metrics_addr(), None);
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let mut out = [0u8; 64];
    client.read(0, 0, &mut out).unwrap();
    // STAT still counts: the two HELLOs of the cookie exchange and the READ, each answered once,
    // or again for a datagram the client sent again when a loaded machine held the answer past
    // its timeout (CI saw 4 once).
    let resent = client.session_stats().retransmissions;
    let executed = test.target.stats().get("instructions_executed").unwrap();
    assert!(
        (3..=3 + resent).contains(&executed),
        "instructions_executed {executed}, expected 3 answers and at most {resent} more for the datagrams sent again"
    );
}

/// What `metrics` gives now, as a scrape parses it.
fn scrape(metrics: &std::sync::Arc<netdam_initiator::metrics::InitiatorMetrics>) -> HashMap<String, f64> {
    let registry = netdam_initiator::metrics::InitiatorMetrics::registry(metrics.clone());
    parse(&netdam_metrics::http::encode(&registry, netdam_metrics::http::Format::Prometheus).unwrap())
}

/// `netdam_initiator_sessions` and `netdam_initiator_sessions_configured` in `samples`.
fn sessions(samples: &HashMap<String, f64>) -> (f64, f64) {
    (value(samples, "netdam_initiator_sessions"), value(samples, "netdam_initiator_sessions_configured"))
}

/// The initiator's families, as `netdam nbd --metrics-listen` serves them: a `Volume` over two
/// sessions against a target with a block namespace, then the registry encoded and checked —
/// and the target's block families seen from its side.
#[test]
fn initiator_and_block_families_count_volume_requests() {
    use netdam_initiator::metrics::InitiatorMetrics;
    use netdam_initiator::{Volume, VolumeOptions};
    use netdam_target::config::{ByteSize, NamespaceBackend, NamespaceConfig};

    let test = common::start_configured(vec![common::region("mem", 1 << 20, false)], |config| {
        config.namespaces = vec![NamespaceConfig {
            name: "disk".into(),
            backend: NamespaceBackend::File,
            path: "disk.img".into(),
            size: Some(ByteSize(1 << 20)),
            block_size: 4096,
        }];
    });
    let addr = test.target.local_addr();
    let metrics = std::sync::Arc::new(InitiatorMetrics::default());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let transfer_bytes = runtime.block_on(async {
        let options = VolumeOptions { sessions: 2, ..VolumeOptions::default() };
        let volume = Volume::open_observed(addr, "disk", options, Some(&metrics)).await.unwrap();
        for block in 0..10u64 {
            volume.write(block * 4096, &[block as u8; 4096], false).await.unwrap();
        }
        let mut back = [0u8; 4096];
        for block in 0..6u64 {
            volume.read(block * 4096, &mut back).await.unwrap();
        }
        // 256 KiB written at once: its transfers are ready together and leave in trains.
        volume.write(0, &[7u8; 262144], false).await.unwrap();
        volume.flush().await.unwrap();
        let transfer_bytes = volume.transfer_bytes();
        let open = scrape(&metrics);
        volume.close().await;
        assert_eq!(sessions(&open), (2.0, 2.0), "both sessions open while the volume is");
        assert!(value(&open, "netdam_initiator_window{session=\"0\"}") > 0.0);
        assert!(value(&open, "netdam_initiator_window{session=\"1\"}") > 0.0);
        assert!(open.contains_key("netdam_initiator_target_delay_seconds{session=\"0\"}"));
        let closed = scrape(&metrics);
        assert_eq!(sessions(&closed), (0.0, 0.0), "closed, they are neither open nor kept");
        assert!(!closed.contains_key("netdam_initiator_window{session=\"0\"}"), "nor shown");
        transfer_bytes
    });
    let registry = InitiatorMetrics::registry(metrics);
    let text = netdam_metrics::http::encode(&registry, netdam_metrics::http::Format::Prometheus).unwrap();
    let samples = parse(&text);
    // 10 single blocks, then 256 KiB in transfers of the volume's size.
    let transfers = 262144u64.div_ceil(u64::from(transfer_bytes));
    assert_eq!(value(&samples, "netdam_initiator_requests_total{opcode=\"bwrite\"}"), (10 + transfers) as f64);
    assert_eq!(value(&samples, "netdam_initiator_requests_total{opcode=\"bread\"}"), 6.0);
    assert!(value(&samples, "netdam_initiator_requests_total{opcode=\"flush\"}") >= 1.0);
    assert_eq!(value(&samples, "netdam_initiator_latency_seconds_count{opcode=\"bread\"}"), 6.0);
    assert!(value(&samples, "netdam_initiator_latency_seconds_sum{opcode=\"bread\"}") > 0.0);
    assert_eq!(value(&samples, "netdam_initiator_data_bytes_total{opcode=\"bread\"}"), 6.0 * 4096.0);
    assert_eq!(value(&samples, "netdam_initiator_data_bytes_total{opcode=\"bwrite\"}"), 10.0 * 4096.0 + 262144.0);
    assert!(
        value(&samples, "netdam_initiator_trains_total") >= 1.0,
        "the transfers of one write, ready together, left in trains"
    );
    assert_eq!(value(&samples, "netdam_initiator_errors_total{status=\"timeout\"}"), 0.0);
    assert_eq!(value(&samples, "netdam_nbd_connections"), 0.0);

    let (_, _, target_text) =
        get(&format!("http://{}/metrics", test.target.metrics_addr().unwrap()), None, Duration::from_secs(5)).unwrap();
    let target = parse(&target_text);
    // The target executes a retransmitted block request again (they are idempotent): on a
    // loaded machine it may count a few more than were asked, never fewer, and no more than
    // the initiator resent.
    let resent = value(&samples, "netdam_initiator_retransmissions_total");
    let within = |name: &str, asked: f64, each: f64| {
        let counted = value(&target, name);
        assert!(
            (asked * each..=(asked + resent) * each).contains(&counted),
            "{name}: {counted} for {asked} asked, {resent} resent"
        );
    };
    within("netdam_instructions_total{opcode=\"bwrite\"}", (10 + transfers) as f64, 1.0);
    within("netdam_data_bytes_total{opcode=\"bread\",direction=\"sent\"}", 6.0, 4096.0);
    within("netdam_service_time_seconds_count{opcode=\"bread\"}", 6.0, 1.0);
    assert!(value(&target, "netdam_block_requests_submitted_total{namespace=\"disk\"}") >= (17 + transfers) as f64);
    assert_eq!(value(&target, "netdam_block_requests_in_flight{namespace=\"disk\"}"), 0.0);
}

/// `promtool check metrics` (Debian's `prometheus` package) accepts the Prometheus text answer,
/// histograms, info metric and all. Skipped, with a note, where promtool is not installed.
#[test]
fn promtool_accepts_the_text_format() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let Ok(mut promtool) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        println!("promtool is not installed (apt-get install prometheus): check skipped");
        return;
    };
    let test = common::start(vec![common::region("mem", 1 << 20, false)], 2, 9000);
    let mut client = Client::connect(test.target.local_addr()).unwrap();
    let mut out = [0u8; 64];
    client.read(0, 0, &mut out).unwrap();
    client.fetch_add(0, 8, 1).unwrap();
    let url = format!("http://{}/metrics", test.target.metrics_addr().unwrap());
    let (_, _, text) = get(&url, None, Duration::from_secs(5)).unwrap();
    promtool.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let output = promtool.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Requests failed for want of a listening target (the socket refused: no timeout runs out)
/// are counted like answered ones: an export's metrics missed 23 of the 26 failures of a
/// target outage, and its error-ratio alert with them.
#[test]
fn initiator_metrics_count_requests_failed_when_nothing_listens() {
    use netdam_initiator::metrics::InitiatorMetrics;
    use netdam_initiator::{AsyncClient, ClientError, ClientOptions};

    let test = common::start(vec![common::region("mem", 1 << 16, false)], 1, 9000);
    let addr = test.target.local_addr();
    let metrics = std::sync::Arc::new(InitiatorMetrics::default());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut options = ClientOptions::default();
        options.session.reconnect_patience = netdam_isa::Duration::ZERO;
        let client = AsyncClient::connect_observed(addr, options, Some(metrics.new_session())).await.unwrap();
        client.read(0, 0, 64).await.unwrap();
        drop(test);
        let failed = client.read(0, 0, 64).await.unwrap_err();
        assert!(matches!(failed, ClientError::NotListening(_)), "{failed}");
    });
    let registry = InitiatorMetrics::registry(metrics);
    let text = netdam_metrics::http::encode(&registry, netdam_metrics::http::Format::Prometheus).unwrap();
    let samples = parse(&text);
    assert_eq!(value(&samples, "netdam_initiator_requests_total{opcode=\"read\"}"), 2.0, "{text}");
    assert_eq!(value(&samples, "netdam_initiator_errors_total{status=\"client_error\"}"), 1.0, "{text}");
    assert_eq!(value(&samples, "netdam_initiator_sessions"), 0.0, "nothing listening knows the session: {text}");
    assert_eq!(value(&samples, "netdam_initiator_sessions_configured"), 1.0, "{text}");
    // A session that could not even be set up (a setting refused) is no session kept.
    let mut refused = ClientOptions::default();
    refused.session.max_in_flight = 0;
    let others = std::sync::Arc::new(InitiatorMetrics::default());
    let setup = runtime.block_on(AsyncClient::connect_observed(addr, refused, Some(others.new_session())));
    assert!(matches!(setup, Err(ClientError::Setting(_))), "{setup:?}");
    assert_eq!(sessions(&scrape(&others)), (0.0, 0.0), "the refused one is not counted");
}
