//! What checking a datagram costs: the CRC-32C of an unauthenticated datagram against the MAC
//! trailer of an authenticated one (AES-256-GCM's tag over the body as plaintext, sealed by the
//! sender and opened by the receiver), GMAC and HMAC-SHA256 as the alternative MACs, per
//! datagram size, in ns on this CPU.
//! Settles whether a sealed datagram needs its CRC too (docs/DECISIONS.md).

use std::time::Instant;

use netdam_auth::{SessionKeys, TenantKey, TRAILER_BYTES};

/// `netdam-bench integrity`.
#[derive(Debug, Clone, clap::Args)]
pub struct IntegrityArgs {
    /// Datagram sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "64,4096,8960")]
    pub sizes: Vec<usize>,
    /// Repetitions per measurement.
    #[arg(long, default_value_t = 200_000)]
    pub iterations: u32,
}

/// Median of five runs of `iterations` calls of `work`, in ns per call.
fn per_call(iterations: u32, mut work: impl FnMut() -> u64) -> f64 {
    let mut runs: Vec<f64> = (0..5)
        .map(|_| {
            let started = Instant::now();
            let mut sink = 0u64;
            for _ in 0..iterations {
                sink = sink.wrapping_add(work());
            }
            std::hint::black_box(sink);
            started.elapsed().as_nanos() as f64 / f64::from(iterations)
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[2]
}

/// Prints one markdown row per size.
pub fn run(args: &IntegrityArgs) {
    let keys = SessionKeys::derive(&TenantKey::from_bytes([7; 32]), &[1; 24], &[2; 16], 1, 1);
    let hmac = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &[9; 32]);
    println!(
        "| datagram bytes | CRC-32C ns | MAC trailer seal ns | MAC trailer open ns | GMAC (all as associated data) ns | HMAC-SHA256 ns |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for &size in &args.sizes {
        let mut buffer = vec![0x5Au8; size + TRAILER_BYTES];
        let crc = per_call(args.iterations, || {
            u64::from(netdam_isa::wire::datagram_crc(std::hint::black_box(&buffer[..size])))
        });
        let mut counter = 0u64;
        let seal = per_call(args.iterations, || {
            counter += 1;
            netdam_auth::trailer::seal(&keys.request, counter, &mut buffer, size).expect("room") as u64
        });
        let sealed = buffer.clone();
        let open = per_call(args.iterations, || {
            netdam_auth::trailer::open(&keys.request, std::hint::black_box(&sealed)).expect("a sealed datagram") as u64
        });
        let mac = per_call(args.iterations, || {
            u64::from(ring::hmac::sign(&hmac, std::hint::black_box(&buffer[..size])).as_ref()[0])
        });
        // The same key with everything as associated data and no plaintext: GMAC, the
        // construction the trailer does not use (ring takes a slower path for it).
        let mut nonce_counter = 0u64;
        let gmac = per_call(args.iterations, || {
            nonce_counter += 1;
            let mut nonce = [0u8; 12];
            nonce[..8].copy_from_slice(&nonce_counter.to_le_bytes());
            let tag = keys
                .response
                .seal_in_place_separate_tag(
                    ring::aead::Nonce::assume_unique_for_key(nonce),
                    ring::aead::Aad::from(std::hint::black_box(&buffer[..size])),
                    &mut [],
                )
                .expect("a datagram-sized input");
            u64::from(tag.as_ref()[0])
        });
        println!("| {size} | {crc:.0} | {seal:.0} | {open:.0} | {gmac:.0} | {mac:.0} |");
    }
}
