//! The sans-IO session on a virtual clock: retransmission of idempotent requests with back-off,
//! no retransmission of non-idempotent ones, late duplicates ignored, the window bounded.

use netdam_initiator::session::{Session, SessionConfig};
use netdam_initiator::swift::SwiftConfig;
use netdam_initiator::{ClientError, Op};
use netdam_isa::wire::{Request, ResponseWriter};
use netdam_isa::{Duration, Instant, Status};

/// Settings for the transport tests: congestion control off, so only the transport decides what
/// is sent (the window test turns it on).
fn config() -> SessionConfig {
    SessionConfig {
        congestion: None,
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
fn non_idempotent_requests_are_retransmitted_and_fail_as_outcome_unknown() {
    // The target's replay window answers a retransmitted FETCH_ADD from its stored answer, so
    // retransmitting is safe; only when every attempt is lost is the outcome unknown.
    let mut session = Session::new(config(), 9);
    session.submit(&[Op::fetch_add(0, 0, 1)], 7).unwrap();
    let first = session.poll_transmit(at_ms(0)).unwrap().to_vec();
    session.handle_timeout(at_ms(10));
    assert_eq!(session.poll_transmit(at_ms(10)).unwrap(), &first[..], "same sequence: the target can recognise it");
    session.handle_timeout(at_ms(30));
    session.poll_transmit(at_ms(30)).unwrap();
    session.handle_timeout(at_ms(55));
    let completion = session.poll_completion().unwrap();
    assert!(matches!(completion.result, Err(ClientError::OutcomeUnknown { attempts: 3 })));
    // An overlapping MEMCPY is not idempotent; a disjoint one is.
    assert!(!Op::memcpy(0, 8, 0, 0, 16).is_idempotent());
    assert!(Op::memcpy(0, 16, 0, 0, 16).is_idempotent());
    assert!(Op::memcpy(1, 8, 0, 0, 16).is_idempotent());
}

#[test]
fn a_late_answer_completes_a_request_queued_for_retransmission() {
    let mut session = Session::new(config(), 9);
    session.submit(&[Op::read(0, 0, 8)], 1).unwrap();
    let sent = session.poll_transmit(at_ms(0)).unwrap().to_vec();
    session.handle_timeout(at_ms(10));
    session.handle_datagram(at_ms(11), &answer(&sent));
    assert_eq!(session.poll_completion().unwrap().token, 1);
    assert!(session.poll_transmit(at_ms(11)).is_none(), "nothing left to retransmit");
}

#[test]
fn the_congestion_window_gates_first_transmissions() {
    let swift = SwiftConfig { initial_window: 2.0, ..SwiftConfig::default() };
    let mut session = Session::new(SessionConfig { congestion: Some(swift), ..config() }, 9);
    for token in 0..4 {
        session.submit(&[Op::read(0, 0, 8)], token).unwrap();
    }
    let first = session.poll_transmit(at_ms(0)).unwrap().to_vec();
    session.poll_transmit(at_ms(0)).unwrap();
    assert!(session.poll_transmit(at_ms(0)).is_none(), "window of 2");
    // Answered after 20 µs: below the fabric target, so the window grows rather than shrinks.
    let answered = at_ms(0) + Duration::from_micros(20);
    session.handle_datagram(answered, &answer(&first));
    assert!(session.poll_transmit(answered).is_some(), "an answer opens the window");
    let without = SessionConfig { congestion: None, ..config() };
    let mut uncontrolled = Session::new(without, 9);
    for token in 0..4 {
        uncontrolled.submit(&[Op::read(0, 0, 8)], token).unwrap();
    }
    assert_eq!((0..4).filter(|_| uncontrolled.poll_transmit(at_ms(0)).is_some()).count(), 4);
}

#[test]
fn busy_holds_a_request_for_the_hint_without_spending_an_attempt() {
    let mut session = Session::new(config(), 9);
    session.submit(&[Op::fetch_add(0, 0, 1)], 5).unwrap();
    let sent = session.poll_transmit(at_ms(0)).unwrap().to_vec();
    let request = Request::parse(&sent).unwrap();
    let mut buffer = vec![0u8; 64];
    let mut writer = ResponseWriter::new(&mut buffer, request.header.session, request.header.sequence);
    writer.set_status(Status::Busy);
    writer.set_queueing_us(3000);
    let len = writer.finish(64, 0, 9);
    session.handle_datagram(at_ms(1), &buffer[..len]);
    assert!(session.poll_completion().is_none());
    assert_eq!(session.poll_timeout(), Some(at_ms(4)), "held for the 3 ms hint");
    session.handle_timeout(at_ms(4));
    let again = session.poll_transmit(at_ms(4)).unwrap().to_vec();
    assert_eq!(again, sent);
    session.handle_datagram(at_ms(5), &answer(&again));
    let completion = session.poll_completion().unwrap();
    assert_eq!(completion.result.unwrap().attempts, 1, "the BUSY round did not count as an attempt");
    assert_eq!(session.stats().busy, 1);
}

#[test]
fn the_timeout_follows_measured_round_trips() {
    // Without congestion control: 3 ms round trips would (rightly) shrink Swift's window.
    let mut session = Session::new(SessionConfig { congestion: None, ..config() }, 9);
    for step in 0..20u64 {
        session.submit(&[Op::read(0, 0, 8)], step).unwrap();
        let sent = session.poll_transmit(at_ms(step * 10)).unwrap().to_vec();
        session.handle_datagram(at_ms(step * 10) + Duration::from_micros(3000), &answer(&sent));
        session.poll_completion().unwrap();
    }
    let stats = session.stats();
    assert_eq!(stats.smoothed_rtt, Duration::from_micros(3000));
    // Steady 3 ms samples: the variance decays, so the timeout approaches the RTT, above min_rto.
    assert!(stats.rto >= Duration::from_micros(3000) && stats.rto < Duration::from_micros(3300), "{:?}", stats.rto);
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
