//! The sans-IO session on a virtual clock: retransmission of idempotent requests with back-off,
//! no retransmission of non-idempotent ones, late duplicates ignored, the window bounded.

use netdam_initiator::session::{Session, SessionConfig};
use netdam_initiator::{ClientError, Op};
use netdam_isa::wire::{Request, ResponseWriter};
use netdam_isa::{Duration, Instant, Status};

fn config() -> SessionConfig {
    SessionConfig {
        max_in_flight: 4,
        initial_rto: Duration::from_millis(10),
        max_rto: Duration::from_millis(25),
        max_attempts: 3,
        ..SessionConfig::default()
    }
}

/// What a target would answer to `request`: OK for each instruction, no data.
fn answer(request: &[u8]) -> Vec<u8> {
    let request = Request::parse(request).unwrap();
    let mut buffer = vec![0u8; 1024];
    let mut writer = ResponseWriter::new(&mut buffer, request.header.session, request.header.sequence);
    for instruction in request.instructions() {
        writer.commit(instruction.opcode, Status::Ok, 0);
    }
    let len = writer.finish(64, 1000, 0);
    buffer.truncate(len);
    buffer
}

fn at_ms(ms: u64) -> Instant {
    Instant::ZERO + Duration::from_millis(ms)
}

#[test]
fn idempotent_requests_are_retransmitted_with_back_off_then_fail() {
    let mut session = Session::new(config(), 9);
    session.submit(&[Op::read(0, 0, 8)], 1).unwrap();
    let first = session.poll_transmit(at_ms(0)).unwrap().to_vec();
    assert!(session.poll_transmit(at_ms(0)).is_none());
    assert_eq!(session.poll_timeout(), Some(at_ms(10)));

    session.handle_timeout(at_ms(9));
    assert!(session.poll_transmit(at_ms(9)).is_none(), "not before the deadline");
    session.handle_timeout(at_ms(10));
    let second = session.poll_transmit(at_ms(10)).unwrap().to_vec();
    assert_eq!(first, second, "a retransmission repeats the datagram, sequence and all");
    assert_eq!(session.poll_timeout(), Some(at_ms(30)), "back-off doubles the timeout");

    session.handle_timeout(at_ms(30));
    session.poll_transmit(at_ms(30)).unwrap();
    assert_eq!(session.poll_timeout(), Some(at_ms(55)), "capped at max_rto");
    session.handle_timeout(at_ms(55));
    let completion = session.poll_completion().unwrap();
    assert_eq!(completion.token, 1);
    assert!(matches!(completion.result, Err(ClientError::TimedOut { attempts: 3 })));
    let stats = session.stats();
    assert_eq!((stats.transmissions, stats.retransmissions, stats.timeouts), (3, 2, 1));
    assert_eq!(session.in_flight(), 0);
}

#[test]
fn non_idempotent_requests_are_never_sent_twice() {
    let mut session = Session::new(config(), 9);
    session.submit(&[Op::fetch_add(0, 0, 1)], 7).unwrap();
    session.poll_transmit(at_ms(0)).unwrap();
    session.handle_timeout(at_ms(10));
    assert!(session.poll_transmit(at_ms(10)).is_none());
    let completion = session.poll_completion().unwrap();
    assert!(matches!(completion.result, Err(ClientError::OutcomeUnknown { attempts: 1 })));
    // An overlapping MEMCPY is not idempotent either; a disjoint one is.
    assert!(!Op::memcpy(0, 8, 0, 0, 16).is_idempotent());
    assert!(Op::memcpy(0, 16, 0, 0, 16).is_idempotent());
    assert!(Op::memcpy(1, 8, 0, 0, 16).is_idempotent());
}

#[test]
fn answers_complete_their_request_once_and_late_duplicates_are_ignored() {
    let mut session = Session::new(config(), 9);
    session.submit(&[Op::write(0, 0, b"x")], 1).unwrap();
    session.submit(&[Op::read(0, 0, 1)], 2).unwrap();
    let write = session.poll_transmit(at_ms(0)).unwrap().to_vec();
    let read = session.poll_transmit(at_ms(1)).unwrap().to_vec();
    session.handle_datagram(at_ms(3), &answer(&read));
    session.handle_datagram(at_ms(4), &answer(&write));
    session.handle_datagram(at_ms(5), &answer(&write));
    session.handle_datagram(at_ms(5), b"garbage");
    let first = session.poll_completion().unwrap();
    assert_eq!(first.token, 2);
    assert_eq!(first.result.as_ref().unwrap().rtt, Duration::from_millis(2));
    assert_eq!(first.result.unwrap().response().header.service_time_ns, 1000);
    assert_eq!(session.poll_completion().unwrap().token, 1);
    assert!(session.poll_completion().is_none(), "a duplicate answer completes nothing");
    assert_eq!(session.stats().ignored, 2);
    assert_eq!(session.poll_timeout(), None);
}

#[test]
fn the_window_is_bounded_and_requests_must_fit_a_datagram() {
    let mut session = Session::new(config(), 9);
    for token in 0..4 {
        session.submit(&[Op::ping()], token).unwrap();
    }
    assert!(matches!(session.submit(&[Op::ping()], 4), Err(ClientError::WindowFull(4))));
    let mut small = Session::new(SessionConfig { max_datagram_bytes: 4096, ..config() }, 9);
    assert!(matches!(small.submit(&[Op::write(0, 0, &[0u8; 5000])], 0), Err(ClientError::TooLarge(4096))));
    assert!(matches!(small.submit(&[], 0), Err(ClientError::Empty)));
}
