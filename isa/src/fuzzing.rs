//! The decoder property that the fuzz target checks and the corpus-replay test re-checks:
//! decoding never panics, and whatever decodes re-encodes to the very same bytes.

use crate::wire::{Request, RequestBuilder, Response, ResponseWriter, FLAG_ENCRYPTED, HEADER_LEN};

/// Decodes `bytes` as a request and as a response; each that decodes must re-encode identically.
pub fn check_decode_round_trip(bytes: &[u8]) {
    if let Ok(request) = Request::parse(bytes) {
        assert_eq!(
            reencode(&request, bytes.len(), |builder| builder.finish()),
            bytes,
            "request re-encoded differently"
        );
    }
    if let Ok(response) = Response::parse(bytes) {
        let mut buf = vec![0u8; bytes.len().max(HEADER_LEN)];
        let header = response.header;
        let mut writer = ResponseWriter::new(&mut buf, header.session, header.sequence);
        for result in response.results() {
            writer.data_area()[..result.data.len()].copy_from_slice(result.data);
            writer.commit(result.opcode, result.status, result.data.len());
        }
        writer.set_status(response.status());
        writer.set_queueing_us(header.queueing_us);
        let len = writer.finish(header.ttl, header.service_time_ns, header.queue_depth);
        assert_eq!(&buf[..len], bytes, "response re-encoded differently");
    }
    // The same bytes as an opened sealed datagram (its trailer already checked and cut): the
    // decoder must refuse or accept them without panicking, and what it accepts re-encodes.
    if let Ok(request) = Request::parse_opened(bytes) {
        let mut again = reencode(&request, bytes.len(), |builder| builder.finish_sealed());
        // The builder knows sealing; whether the body was encrypted (flags, byte 3) is the
        // session's, kept as it was.
        again[3] |= request.header.flags & FLAG_ENCRYPTED;
        assert_eq!(again, bytes, "sealed request re-encoded differently");
    }
    // A HELLO operand's authentication part decodes without panicking, whatever its bytes.
    if bytes.len() >= crate::control::HELLO_OPERAND_LEN && crate::control::decode_hello_operand(bytes).is_ok() {
        let (_method, _area) = crate::control::decode_hello_auth(bytes);
    }
}

/// The bytes `request` (decoded from `len` bytes) encodes to again, its header written by `finish`.
fn reencode(request: &Request<'_>, len: usize, finish: impl FnOnce(RequestBuilder<'_>) -> usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let mut builder = RequestBuilder::new(&mut buf, request.header.session, request.header.sequence)
        .expect("a decoded request is at least a header long");
    for instruction in request.instructions() {
        builder.push(&instruction).expect("a decoded instruction fits where it came from");
    }
    let len = finish(builder);
    buf.truncate(len);
    buf
}
