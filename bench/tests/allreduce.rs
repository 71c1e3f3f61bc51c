//! `netdam-bench allreduce` as ops/performance.sh runs it, small: worker processes reduce through
//! the target and host-side, every result is the exact sum (the run fails otherwise), and the
//! bytes each worker's session counted are at least what each method must move. Nothing here
//! depends on timing.

use std::process::Command;

#[test]
fn both_methods_give_the_exact_sum_and_count_the_bytes_each_must_move() {
    const LEN: u64 = 256 << 10;
    let output = Command::new(env!("CARGO_BIN_EXE_netdam-bench"))
        .args(["allreduce", "--workers", "2,3", "--sizes", "256KiB", "--repeats", "1", "--json"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let cases = report["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 2);
    for case in cases {
        let workers = case["workers"].as_u64().unwrap();
        assert_eq!(case["bytes"].as_u64().unwrap(), LEN);
        assert_eq!(case["results_exact_and_equal"], true);
        let bytes = |method: &str, field: &str| case[method][field].as_f64().unwrap();
        // Through the target: VADD every lane out, READ every lane of the sum back.
        assert!(bytes("through_target", "udp_payload_bytes_sent_per_worker") > LEN as f64);
        assert!(bytes("through_target", "udp_payload_bytes_received_per_worker") > LEN as f64);
        // Host-side: WRITE every lane out, READ every other worker's lanes back.
        assert!(bytes("host_side", "udp_payload_bytes_sent_per_worker") > LEN as f64);
        assert!(bytes("host_side", "udp_payload_bytes_received_per_worker") > ((workers - 1) * LEN) as f64);
        // The wire figure is the counted payloads plus each counted datagram's IPv4/UDP header.
        // (No upper bound: polling and retransmissions add bytes as the machine's load decides.)
        for method in ["through_target", "host_side"] {
            let datagrams = bytes(method, "datagrams_sent_per_worker") + bytes(method, "datagrams_received_per_worker");
            let payloads = bytes(method, "udp_payload_bytes_sent_per_worker")
                + bytes(method, "udp_payload_bytes_received_per_worker");
            let wire = bytes(method, "wire_bytes_per_worker");
            assert!((wire - (payloads + 28.0 * datagrams)).abs() < 1.0, "{method}: {wire} bytes on the wire");
            assert!(datagrams >= 2.0 * (LEN / 9000) as f64, "{method}: {datagrams} datagrams per worker");
        }
        assert!(case["through_target"]["time_ms"].as_f64().unwrap() > 0.0);
        assert!(case["speedup"].as_f64().unwrap() > 0.0);
    }
}
