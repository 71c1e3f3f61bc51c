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
        // Fail on attempts alone, so the tests see exactly three transmissions.
        min_patience: Duration::ZERO,
        // A HELLO refused for want of a slot fails at once (the test below waits).
        session_wait: Duration::ZERO,
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
    assert_eq!(stats.bytes_transmitted, 3 * first.len() as u64, "every transmission's bytes are counted");
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

/// A session under congestion control whose window starts at `initial_window` datagrams.
fn windowed(initial_window: f64) -> Session {
    let swift = SwiftConfig { initial_window, ..SwiftConfig::default() };
    Session::new(SessionConfig { congestion: Some(swift), ..config() }, 9)
}

#[test]
fn the_congestion_window_gates_first_transmissions() {
    let mut session = windowed(2.0);
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

/// What a target sends while `request` still executes: an in-progress notice.
fn notice(request: &[u8], held_ms: u32) -> Vec<u8> {
    let request = Request::parse(request).unwrap();
    let mut buffer = vec![0u8; 64];
    let mut writer = ResponseWriter::new(&mut buffer, request.header.session, request.header.sequence);
    writer.set_status(Status::InProgress);
    let len = writer.finish(64, held_ms * 1_000_000, 0);
    buffer.truncate(len);
    buffer
}

#[test]
fn an_in_progress_notice_restarts_the_timer_and_calls_off_a_queued_resend() {
    let mut session = Session::new(config(), 9);
    session.submit(&[Op::fetch_add(0, 0, 1)], 5).unwrap();
    let sent = session.poll_transmit(at_ms(0)).unwrap().to_vec();
    assert_eq!(session.poll_timeout(), Some(at_ms(10)));
    // Still executing at 8 ms: the timer starts again from there.
    session.handle_datagram(at_ms(8), &notice(&sent, 8));
    assert!(session.poll_completion().is_none(), "a notice is not an answer");
    assert_eq!(session.poll_timeout(), Some(at_ms(18)));
    session.handle_timeout(at_ms(10));
    assert!(session.poll_transmit(at_ms(10)).is_none(), "nothing is resent at the old deadline");
    // A notice that comes after the timeout fired (the resend is queued, not yet sent) calls the
    // resend off.
    session.handle_timeout(at_ms(18));
    session.handle_datagram(at_ms(18), &notice(&sent, 18));
    assert!(session.poll_transmit(at_ms(18)).is_none(), "the queued resend is called off");
    assert_eq!(session.poll_timeout(), Some(at_ms(28)));
    session.handle_datagram(at_ms(20), &answer(&sent));
    let completion = session.poll_completion().unwrap();
    let reply = completion.result.unwrap();
    assert_eq!((completion.token, reply.attempts), (5, 1), "answered after one transmission");
    let stats = session.stats();
    assert_eq!((stats.transmissions, stats.retransmissions, stats.in_progress_notices), (1, 0, 2));
    // Karn's rule holds: the one transmission's round trip is a sample, 20 ms.
    assert_eq!(session.smoothed_rtt(), Some(Duration::from_millis(20)));
}

#[test]
fn notices_hold_a_request_no_longer_than_max_in_progress_wait() {
    let config = SessionConfig { max_in_progress_wait: Duration::from_millis(30), max_attempts: 8, ..config() };
    let mut session = Session::new(config, 9);
    session.submit(&[Op::fetch_add(0, 0, 1)], 5).unwrap();
    let sent = session.poll_transmit(at_ms(0)).unwrap().to_vec();
    for at in [8, 16, 24] {
        session.handle_datagram(at_ms(at), &notice(&sent, at as u32));
        assert_eq!(session.poll_timeout(), Some(at_ms(at + 10)), "heeded at {at} ms");
    }
    // 31 ms after the first transmission: past the wait, the notice is not heeded...
    session.handle_datagram(at_ms(31), &notice(&sent, 31));
    assert_eq!(session.poll_timeout(), Some(at_ms(34)), "the timer runs on");
    // ...and the request fails at its timeout, attempts left or not: the target said it holds
    // it, so a resend would only earn another notice.
    session.handle_timeout(at_ms(34));
    assert!(session.poll_transmit(at_ms(34)).is_none(), "not resent");
    let completion = session.poll_completion().expect("failed");
    assert_eq!(completion.token, 5);
    match completion.result {
        Err(ClientError::OutcomeUnknown { attempts: 1 }) => {}
        other => panic!("expected OutcomeUnknown after one attempt, got {other:?}"),
    }
    assert_eq!(session.stats().in_progress_notices, 4);
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
    let stats = session.stats();
    assert_eq!(stats.bytes_transmitted, (write.len() + read.len()) as u64);
    assert_eq!(stats.datagrams_received, 4, "answers, a duplicate and garbage: all received");
    assert_eq!(stats.bytes_received, (answer(&read).len() + 2 * answer(&write).len() + b"garbage".len()) as u64);
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

/// A scripted target for the HELLO tests: answers a HELLO with `retry` and a cookie when it has
/// none, else with session `session`; anything else as `reply` says.
fn target_answer(request: &[u8], session: u32, reply: Status) -> Vec<u8> {
    use netdam_isa::control::{decode_hello_operand, encode_hello_answer, NO_COOKIE};
    let request = Request::parse(request).unwrap();
    let mut buffer = vec![0u8; 4096];
    let mut writer = ResponseWriter::new(&mut buffer, request.header.session, request.header.sequence);
    let first = request.instructions().next().unwrap();
    if first.opcode == netdam_isa::Opcode::Hello as u8 {
        let hello = decode_hello_operand(first.operand).unwrap();
        if hello.cookie == NO_COOKIE {
            writer.data_area()[..24].fill(0xC0);
            writer.commit(first.opcode, Status::Retry, 24);
        } else {
            assert_eq!(hello.cookie, [0xC0; 24], "the second HELLO echoes the cookie");
            let capacity = writer.data_capacity();
            let no_regions = std::iter::empty::<(u16, &str, u64, bool)>();
            let len = encode_hello_answer(
                &mut writer.data_area()[..capacity],
                session,
                9000,
                64,
                0,
                no_regions,
                std::iter::empty(),
            )
            .unwrap();
            writer.commit(first.opcode, Status::Ok, len);
        }
    } else if reply == Status::Ok {
        for instruction in request.instructions() {
            writer.commit(instruction.opcode, Status::Ok, 0);
        }
    } else {
        writer.set_status(reply);
    }
    let len = writer.finish(64, 1000, 0);
    buffer.truncate(len);
    buffer
}

/// Runs the session's HELLO exchange against the scripted target until it has session `id`.
fn establish(session: &mut Session, now: Instant, id: u32) {
    for _ in 0..2 {
        let hello = session.poll_transmit(now).expect("a HELLO to send").to_vec();
        assert_eq!(Request::parse(&hello).unwrap().header.session, 0, "HELLO goes without a session");
        session.handle_datagram(now, &target_answer(&hello, id, Status::Ok));
    }
    let answer = session.poll_established().expect("the exchange ended").expect("with a session");
    assert_eq!(answer.session, id);
    assert!(!session.is_establishing());
}

#[test]
fn a_lost_session_is_reopened_and_what_cannot_have_run_is_sent_again() {
    let mut session = Session::new(config(), 0);
    session.start_hello(9000);
    // Submitted before the session exists: it waits for it.
    session.submit(&[Op::fetch_add(0, 0, 1)], 1).unwrap();
    establish(&mut session, at_ms(0), 5);
    let add = session.poll_transmit(at_ms(0)).unwrap().to_vec();
    assert_eq!(Request::parse(&add).unwrap().header.session, 5);
    session.submit(&[Op::read(0, 0, 8)], 2).unwrap();
    let read = session.poll_transmit(at_ms(0)).unwrap().to_vec();

    // The target restarted: both answered no_session on their first transmission.
    session.handle_datagram(at_ms(1), &target_answer(&add, 0, Status::NoSession));
    session.handle_datagram(at_ms(1), &target_answer(&read, 0, Status::NoSession));
    assert!(session.poll_completion().is_none(), "neither is failed: neither can have run");
    assert!(session.is_establishing());
    establish(&mut session, at_ms(1), 6);
    let mut resent = Vec::new();
    while let Some(datagram) = session.poll_transmit(at_ms(1)) {
        let parsed = Request::parse(datagram).expect("a valid datagram, CRC included");
        assert_eq!(parsed.header.session, 6, "sent again in the new session");
        resent.push(datagram.to_vec());
    }
    assert_eq!(resent.len(), 2);
    for datagram in &resent {
        session.handle_datagram(at_ms(2), &target_answer(datagram, 6, Status::Ok));
    }
    let mut tokens: Vec<u64> = (0..2).map(|_| session.poll_completion().unwrap()).map(|c| c.token).collect();
    tokens.sort_unstable();
    assert_eq!(tokens, vec![1, 2]);
    assert_eq!(session.stats().sessions_lost, 1);
}

/// A restart as the session sees it: the port refuses for a while (loss, not failure, once a
/// session exists), the requests in flight are retransmitted, the new target answers
/// `no_session`; the READ is sent again in the new session, the FETCH_ADD (sent twice, so it
/// may have run) fails as of unknown outcome.
#[test]
fn a_restart_is_ridden_out_within_the_reconnect_patience() {
    let patient = SessionConfig {
        reconnect_patience: Duration::from_millis(100),
        min_patience: Duration::from_millis(500),
        ..config()
    };
    let mut session = Session::new(patient, 0);
    session.start_hello(9000);
    assert!(!session.handle_refused(at_ms(0)), "before any session, a refusal means nothing listens there");
    establish(&mut session, at_ms(0), 5);
    session.submit(&[Op::read(0, 0, 8)], 1).unwrap();
    session.submit(&[Op::fetch_add(0, 0, 1)], 2).unwrap();
    while session.poll_transmit(at_ms(0)).is_some() {}
    // Down: both refused, for less than the patience.
    assert!(session.handle_refused(at_ms(1)));
    assert!(session.handle_refused(at_ms(100)));
    session.handle_timeout(at_ms(10));
    let mut resent = Vec::new();
    while let Some(datagram) = session.poll_transmit(at_ms(10)) {
        resent.push(datagram.to_vec());
    }
    assert_eq!(resent.len(), 2, "both retransmitted");
    assert!(session.poll_completion().is_none(), "nothing failed while the target was down");
    // Back, knowing no session.
    for datagram in &resent {
        session.handle_datagram(at_ms(101), &target_answer(datagram, 0, Status::NoSession));
    }
    let lost = session.poll_completion().expect("the FETCH_ADD fails");
    assert_eq!(lost.token, 2);
    assert!(matches!(lost.result, Err(ClientError::SessionLost)), "{:?}", lost.result);
    establish(&mut session, at_ms(101), 6);
    let read = session.poll_transmit(at_ms(101)).expect("the READ is sent again").to_vec();
    assert_eq!(Request::parse(&read).unwrap().header.session, 6);
    session.handle_datagram(at_ms(102), &target_answer(&read, 6, Status::Ok));
    assert_eq!(session.poll_completion().map(|completion| completion.token), Some(1));
    // The answer ended the outage: the next one gets a patience of its own, and running it out
    // makes the refusal a failure.
    assert!(session.handle_refused(at_ms(300)));
    assert!(!session.handle_refused(at_ms(400)), "refused for the whole patience");
    let mut sessionless = Session::new(config(), 0);
    assert!(!sessionless.handle_refused(at_ms(0)), "a client without a session never waits for one");
}

/// A restarted target may give the same id again: a FETCH_ADD sent in the lost session must not
/// be retransmitted under it (the new target would execute it in the new session).
#[test]
fn a_reused_session_id_does_not_carry_a_request_that_may_have_run_into_the_new_session() {
    let mut session = Session::new(config(), 0);
    session.start_hello(9000);
    establish(&mut session, at_ms(0), 5);
    session.submit(&[Op::fetch_add(0, 0, 1)], 1).unwrap();
    session.submit(&[Op::read(0, 0, 8)], 2).unwrap();
    session.poll_transmit(at_ms(0)).unwrap();
    let read = session.poll_transmit(at_ms(0)).unwrap().to_vec();
    // The READ's answer says the session is gone; the FETCH_ADD's answer was lost.
    session.handle_datagram(at_ms(1), &target_answer(&read, 0, Status::NoSession));
    establish(&mut session, at_ms(1), 5);
    let lost = session.poll_completion().expect("the FETCH_ADD fails");
    assert_eq!(lost.token, 1);
    assert!(matches!(lost.result, Err(ClientError::SessionLost)), "{:?}", lost.result);
    let resent = session.poll_transmit(at_ms(1)).expect("the READ is sent again").to_vec();
    assert_eq!(Request::parse(&resent).unwrap().instructions().next().unwrap().opcode, netdam_isa::Opcode::Read as u8);
    session.handle_timeout(at_ms(100));
    while let Some(datagram) = session.poll_transmit(at_ms(100)) {
        let opcode = Request::parse(datagram).unwrap().instructions().next().unwrap().opcode;
        assert_ne!(opcode, netdam_isa::Opcode::FetchAdd as u8, "the FETCH_ADD is never sent again");
    }
}

#[test]
fn a_non_idempotent_request_that_may_have_run_fails_as_session_lost() {
    let mut session = Session::new(config(), 0);
    session.start_hello(9000);
    establish(&mut session, at_ms(0), 5);
    session.submit(&[Op::fetch_add(0, 0, 1)], 1).unwrap();
    let add = session.poll_transmit(at_ms(0)).unwrap().to_vec();
    session.handle_timeout(at_ms(10));
    session.poll_transmit(at_ms(10)).unwrap();
    // The first transmission may have run before the target lost the session.
    session.handle_datagram(at_ms(11), &target_answer(&add, 0, Status::NoSession));
    let completion = session.poll_completion().unwrap();
    assert!(matches!(completion.result, Err(ClientError::SessionLost)));
}

#[test]
fn a_failed_hello_fails_the_waiting_requests_and_the_next_request_says_hello_again() {
    let mut session = Session::new(config(), 0);
    session.start_hello(9000);
    session.submit(&[Op::read(0, 0, 8)], 1).unwrap();
    let hello = session.poll_transmit(at_ms(0)).unwrap().to_vec();
    let request = Request::parse(&hello).unwrap();
    let mut buffer = vec![0u8; 256];
    let mut writer = ResponseWriter::new(&mut buffer, 0, request.header.sequence);
    writer.commit(netdam_isa::Opcode::Hello as u8, Status::SessionLimit, 0);
    let len = writer.finish(64, 0, 0);
    session.handle_datagram(at_ms(0), &buffer[..len]);
    let refused = session.poll_established().unwrap().unwrap_err();
    assert!(matches!(refused, ClientError::HelloRefused(Status::SessionLimit)), "{refused:?}");
    let completion = session.poll_completion().unwrap();
    assert!(matches!(completion.result, Err(ClientError::HelloRefused(Status::SessionLimit))));
    // Not stuck without a session: the next request starts a new exchange.
    session.submit(&[Op::read(0, 0, 8)], 2).unwrap();
    establish(&mut session, at_ms(5), 7);
    let read = session.poll_transmit(at_ms(5)).unwrap();
    assert_eq!(Request::parse(read).unwrap().header.session, 7);
}

/// `hello` as if it carried no cookie, so that `target_answer` answers it with a new one.
fn hello_without_cookie(hello: &[u8]) -> Vec<u8> {
    use netdam_isa::control::{encode_hello_operand, NO_COOKIE};
    use netdam_isa::wire::{Instruction, RequestBuilder};
    let request = Request::parse(hello).unwrap();
    let first = request.instructions().next().unwrap();
    let operand =
        encode_hello_operand(&netdam_isa::control::HelloRequest { max_datagram_bytes: 9000, cookie: NO_COOKIE });
    let mut buffer = vec![0u8; 512];
    let mut builder = RequestBuilder::new(&mut buffer, 0, request.header.sequence).unwrap();
    builder.push(&Instruction { operand: &operand, ..first }).unwrap();
    let len = builder.finish();
    buffer.truncate(len);
    buffer
}

/// The answer to `hello` that refuses it with `status`.
fn hello_refusal(hello: &[u8], status: Status) -> Vec<u8> {
    let request = Request::parse(hello).unwrap();
    let mut buffer = vec![0u8; 256];
    let mut writer = ResponseWriter::new(&mut buffer, 0, request.header.sequence);
    writer.commit(netdam_isa::Opcode::Hello as u8, status, 0);
    let len = writer.finish(64, 0, 0);
    buffer.truncate(len);
    buffer
}

/// A session with `config` whose HELLO has had its cookie at 0 ms (the next HELLO is due), with
/// a read (token 1) waiting for the session.
fn past_the_cookie_with_a_read_waiting(config: SessionConfig) -> Session {
    let mut session = Session::new(config, 0);
    session.start_hello(9000);
    session.submit(&[Op::read(0, 0, 8)], 1).unwrap();
    let first = session.poll_transmit(at_ms(0)).unwrap().to_vec();
    session.handle_datagram(at_ms(0), &target_answer(&first, 5, Status::Ok));
    session
}

/// A HELLO refused for want of a slot (other sessions hold them) is asked again at growing
/// intervals while `session_wait` lasts, and the requests waiting for the session go once it
/// opens; past the wait they fail with the refusal. Other refusals fail at once.
#[test]
fn a_hello_refused_for_want_of_a_slot_asks_again_while_the_wait_lasts() {
    let waiting = SessionConfig { session_wait: Duration::from_millis(100), ..config() };
    // Refusals at 0, 10, 30 ms: each asks again 10, 20, 40 ms later.
    let mut session = past_the_cookie_with_a_read_waiting(waiting);
    let mut now = 0;
    for (pause, status) in [(10, Status::SessionLimit), (20, Status::Busy), (40, Status::SessionLimit)] {
        let hello = session.poll_transmit(at_ms(now)).expect("a HELLO").to_vec();
        session.handle_datagram(at_ms(now), &hello_refusal(&hello, status));
        assert!(session.poll_established().is_none() && session.poll_completion().is_none(), "still waiting");
        assert!(session.poll_transmit(at_ms(now)).is_none(), "not before its pause");
        assert_eq!(session.poll_timeout(), Some(at_ms(now + pause)));
        now += pause;
        session.handle_timeout(at_ms(now));
    }
    // A slot is free at 70 ms: the session opens and the read goes in it.
    let hello = session.poll_transmit(at_ms(now)).unwrap().to_vec();
    session.handle_datagram(at_ms(now), &target_answer(&hello, 5, Status::Ok));
    assert_eq!(session.poll_established().unwrap().unwrap().session, 5);
    let read = session.poll_transmit(at_ms(now)).unwrap();
    assert_eq!(Request::parse(read).unwrap().header.session, 5);

    // Refused until the wait is spent: the waiting request fails with the refusal.
    let mut session = past_the_cookie_with_a_read_waiting(waiting);
    let mut now = 0;
    let refused = loop {
        let hello = session.poll_transmit(at_ms(now)).expect("a HELLO").to_vec();
        session.handle_datagram(at_ms(now), &hello_refusal(&hello, Status::SessionLimit));
        if let Some(outcome) = session.poll_established() {
            break outcome.unwrap_err();
        }
        now = session.poll_timeout().unwrap().saturating_since(Instant::ZERO).as_nanos() / 1_000_000;
        session.handle_timeout(at_ms(now));
    };
    assert!(matches!(refused, ClientError::HelloRefused(Status::SessionLimit)), "{refused:?}");
    assert!((100..=420).contains(&now), "gave up at {now} ms: the wait is 100 ms, each pause at most 320");
    assert!(matches!(session.poll_completion().unwrap().result, Err(ClientError::HelloRefused(Status::SessionLimit))));

    // A long wait outlives cookies: each renewal (a `retry` with a new cookie) after a refusal
    // is no round of a changing source address, and the wait goes on.
    let long = SessionConfig { session_wait: Duration::from_millis(60_000), ..config() };
    let mut session = Session::new(long, 0);
    session.start_hello(9000);
    let mut now = 0;
    for _ in 0..6 {
        let hello = session.poll_transmit(at_ms(now)).expect("a HELLO").to_vec();
        // The cookie expired: a new one.
        session.handle_datagram(at_ms(now), &target_answer(&hello_without_cookie(&hello), 5, Status::Ok));
        let hello = session.poll_transmit(at_ms(now)).expect("a HELLO with the new cookie").to_vec();
        session.handle_datagram(at_ms(now), &hello_refusal(&hello, Status::SessionLimit));
        assert!(session.poll_established().is_none(), "still waiting after {now} ms");
        now = session.poll_timeout().unwrap().saturating_since(Instant::ZERO).as_nanos() / 1_000_000;
        session.handle_timeout(at_ms(now));
    }
    let hello = session.poll_transmit(at_ms(now)).unwrap().to_vec();
    session.handle_datagram(at_ms(now), &target_answer(&hello, 5, Status::Ok));
    assert_eq!(session.poll_established().unwrap().unwrap().session, 5);

    // A refusal no free slot can mend fails at once, wait or not.
    let mut session = Session::new(waiting, 0);
    session.start_hello(9000);
    let first = session.poll_transmit(at_ms(0)).unwrap().to_vec();
    session.handle_datagram(at_ms(0), &target_answer(&first, 5, Status::Ok));
    let hello = session.poll_transmit(at_ms(0)).unwrap().to_vec();
    session.handle_datagram(at_ms(0), &hello_refusal(&hello, Status::Unauthenticated));
    assert!(matches!(session.poll_established().unwrap(), Err(ClientError::HelloRefused(Status::Unauthenticated))));
}

#[test]
fn a_request_out_of_attempts_keeps_trying_until_its_patience_is_spent() {
    let patient = SessionConfig { min_patience: Duration::from_millis(100), ..config() };
    let mut session = Session::new(patient, 9);
    session.submit(&[Op::read(0, 0, 8)], 1).unwrap();
    let mut now = at_ms(0);
    let mut transmissions = 0;
    while session.poll_completion().is_none() {
        while session.poll_transmit(now).is_some() {
            transmissions += 1;
        }
        now = session.poll_timeout().expect("a retransmission or the failure is due");
        session.handle_timeout(now);
        assert!(now <= at_ms(200), "no end in sight at {now:?}");
    }
    // Three attempts (0, 10, 30 ms), then every max_rto (25 ms): 55, 80; the timeout at 105 ms,
    // past the patience, fails it.
    assert_eq!(transmissions, 5, "three attempts, then more until 100 ms had passed");
    assert_eq!(now, at_ms(105));
    assert!(now >= at_ms(100), "failed at {now:?}, before its patience was spent");
    // An answer within the patience still completes it.
    let mut session = Session::new(patient, 9);
    session.submit(&[Op::read(0, 0, 8)], 2).unwrap();
    let mut last = Vec::new();
    for at in [0, 10, 30, 55] {
        session.handle_timeout(at_ms(at));
        if let Some(datagram) = session.poll_transmit(at_ms(at)) {
            last = datagram.to_vec();
        }
    }
    session.handle_datagram(at_ms(60), &answer(&last));
    let completion = session.poll_completion().unwrap();
    assert_eq!(completion.token, 2);
    assert!(completion.result.is_ok(), "{:?}", completion.result.err());
}

/// Drives `session` on its own timers from `now`, nothing ever answered, until something
/// completes; returns the completions and the sequences transmitted meanwhile.
fn until_something_fails(
    session: &mut Session,
    mut now: Instant,
) -> (Vec<netdam_initiator::session::Completion>, Vec<u64>) {
    let mut transmissions = Vec::new();
    loop {
        while let Some(datagram) = session.poll_transmit(now) {
            transmissions.push(Request::parse(datagram).unwrap().header.sequence);
        }
        let done: Vec<_> = std::iter::from_fn(|| session.poll_completion()).collect();
        if !done.is_empty() {
            return (done, transmissions);
        }
        now = session.poll_timeout().expect("a retransmission or the failure is due");
        session.handle_timeout(now);
        assert!(now <= at_ms(1_000), "no end in sight at {now:?}");
    }
}

#[test]
fn when_a_request_fails_unanswered_by_a_silent_target_every_request_fails_with_it() {
    // A window of two: two requests on the wire, two waiting unsent behind them, as behind a
    // window that timeouts closed. Without this the waiting ones would each start a patience
    // of their own once sent.
    let mut session = windowed(2.0);
    session.submit(&[Op::read(0, 0, 8)], 1).unwrap();
    session.submit(&[Op::fetch_add(0, 0, 1)], 2).unwrap();
    session.submit(&[Op::fetch_add(0, 8, 1)], 3).unwrap();
    session.submit(&[Op::write(0, 0, &[1; 8])], 4).unwrap();
    let (mut failed, transmissions) = until_something_fails(&mut session, at_ms(0));
    failed.sort_by_key(|completion| completion.token);
    assert_eq!(failed.iter().map(|completion| completion.token).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
    let mut sent = transmissions.clone();
    sent.sort_unstable();
    sent.dedup();
    assert_eq!(sent.len(), 2, "only the first two went: {transmissions:?}");
    assert!(matches!(failed[0].result, Err(ClientError::TimedOut { .. })), "{:?}", failed[0].result);
    // Sent, not idempotent, unanswered: it may have run.
    assert!(matches!(failed[1].result, Err(ClientError::OutcomeUnknown { .. })), "{:?}", failed[1].result);
    // Never sent, so never run: retrying them is safe, whatever they do.
    assert!(matches!(failed[2].result, Err(ClientError::TimedOut { attempts: 0 })));
    assert!(matches!(failed[3].result, Err(ClientError::TimedOut { attempts: 0 })));
    assert_eq!(session.stats().timeouts, 4, "each request failed is counted");
    assert_eq!(session.in_flight(), 0);
    assert!(session.poll_transmit(at_ms(1_000)).is_none(), "nothing left to send");
}

#[test]
fn a_hello_out_of_attempts_is_not_counted_as_a_request_timed_out() {
    // The session's own HELLO is not a request of the caller's: a target down while it says
    // HELLO again and again must not inflate the count of requests that timed out.
    let mut session = Session::new(config(), 0);
    session.start_hello(9000);
    let mut now = at_ms(0);
    let mut hellos = 0;
    let refused = loop {
        while session.poll_transmit(now).is_some() {
            hellos += 1;
        }
        if let Some(outcome) = session.poll_established() {
            break outcome.unwrap_err();
        }
        now = session.poll_timeout().expect("a retransmission or the failure is due");
        session.handle_timeout(now);
        assert!(now <= at_ms(1_000), "no end in sight at {now:?}");
    };
    assert!(matches!(refused, ClientError::TimedOut { .. }), "{refused:?}");
    assert_eq!(hellos, 3, "every attempt went");
    assert_eq!(session.stats().timeouts, 0, "no request of the caller's failed");
}

#[test]
fn a_lone_request_lost_again_and_again_fails_alone() {
    // The only one on the wire (a window of one): its datagram may be what is lost (a path that
    // drops it), not the target; the request behind it gets its own chance.
    let mut session = windowed(1.0);
    session.submit(&[Op::read(0, 0, 8)], 1).unwrap();
    session.submit(&[Op::read(0, 8, 8)], 2).unwrap();
    let (failed, transmissions) = until_something_fails(&mut session, at_ms(0));
    assert_eq!(failed.len(), 1, "{:?}", failed.iter().map(|completion| completion.token).collect::<Vec<_>>());
    assert_eq!(failed[0].token, 1);
    // Until then only request 1 went; once it gave up, request 2 went.
    let first = transmissions[0];
    assert!(transmissions[..transmissions.len() - 1].iter().all(|&sequence| sequence == first), "{transmissions:?}");
    assert_ne!(transmissions.last(), Some(&first));
    assert_eq!(session.in_flight(), 1, "request 2 is on its way");
}

#[test]
fn the_second_request_in_a_row_to_fail_unanswered_fails_every_request_left() {
    // A window of one (as timeouts close it) and four requests: the first fails alone, the one
    // behind it gets its own chance, and when it fails unanswered too the target is silent:
    // the two never sent fail with it, not one patience apart each.
    let mut session = windowed(1.0);
    for token in 1..=4 {
        session.submit(&[Op::read(0, token * 8, 8)], token).unwrap();
    }
    let (first, _) = until_something_fails(&mut session, at_ms(0));
    assert_eq!(first.iter().map(|completion| completion.token).collect::<Vec<_>>(), vec![1]);
    let failed_at = session.poll_timeout().unwrap();
    let (mut rest, transmissions) = until_something_fails(&mut session, failed_at);
    rest.sort_by_key(|completion| completion.token);
    assert_eq!(rest.iter().map(|completion| completion.token).collect::<Vec<_>>(), vec![2, 3, 4]);
    assert!(
        transmissions.iter().all(|&sequence| sequence == transmissions[0]),
        "only request 2 went: {transmissions:?}"
    );
    for never_sent in &rest[1..] {
        let error = never_sent.result.as_ref().unwrap_err();
        assert!(matches!(error, ClientError::TimedOut { attempts: 0 }), "{error:?}");
        assert!(error.to_string().starts_with("not sent: the target stopped answering"), "{error}");
    }
    assert_eq!(session.in_flight(), 0);
}

#[test]
fn a_request_lost_while_the_target_answers_others_fails_alone() {
    let mut session = Session::new(config(), 9);
    session.submit(&[Op::read(0, 0, 8)], 1).unwrap();
    session.poll_transmit(at_ms(0)).unwrap();
    session.submit(&[Op::read(0, 8, 8)], 2).unwrap();
    let answered = session.poll_transmit(at_ms(1)).unwrap().to_vec();
    session.handle_datagram(at_ms(2), &answer(&answered));
    assert_eq!(session.poll_completion().unwrap().token, 2);
    session.submit(&[Op::read(0, 16, 8)], 3).unwrap();
    // Request 1 is lost three times while the target answered request 2 after it left.
    for at in [10, 30] {
        session.handle_timeout(at_ms(at));
        while session.poll_transmit(at_ms(at)).is_some() {}
    }
    session.handle_timeout(at_ms(55));
    let completion = session.poll_completion().unwrap();
    assert_eq!(completion.token, 1);
    assert!(matches!(completion.result, Err(ClientError::TimedOut { attempts: 3 })));
    assert!(session.poll_completion().is_none(), "request 3 keeps its own attempts");
    assert_eq!(session.in_flight(), 1);
}

/// What a target would answer to `request`: each instruction's status from `statuses`, with its
/// index repeated `index + 1` times as data.
fn answer_with_data(request: &[u8], statuses: &[Status]) -> Vec<u8> {
    let request = Request::parse(request).unwrap();
    let mut buffer = vec![0u8; 1024];
    let mut writer = ResponseWriter::new(&mut buffer, request.header.session, request.header.sequence);
    for (index, instruction) in request.instructions().enumerate() {
        let data = vec![index as u8; index + 1];
        writer.data_area()[..data.len()].copy_from_slice(&data);
        writer.commit(instruction.opcode, statuses[index], data.len());
    }
    let len = writer.finish(64, 1000, 0);
    buffer.truncate(len);
    buffer
}

/// A datagram built from borrowed operands answers as one reply; split, each share sees only its
/// own results, in order, and its own failures.
#[test]
fn a_reply_split_among_callers_gives_each_its_own_results() {
    let mut session = Session::new(config(), 9);
    let data = [7u8; 16];
    let ops = [Op::read(0, 0, 1), Op::write(0, 8, &data), Op::read(0, 16, 3)];
    session.submit_with(ops.len(), |index| ops[index].as_instruction(), 1).unwrap();
    let request = session.poll_transmit(at_ms(0)).unwrap().to_vec();
    let parsed = Request::parse(&request).unwrap();
    assert_eq!(parsed.instructions().count(), 3);
    assert_eq!(parsed.instructions().nth(1).unwrap().operand, &data, "the borrowed operand is encoded");
    session.handle_datagram(at_ms(1), &answer_with_data(&request, &[Status::Ok, Status::OutOfRange, Status::Ok]));
    let reply = session.poll_completion().unwrap().result.unwrap();
    // A reply's buffer given back carries a later request (a copy here, to split the original).
    session.recycle(reply.clone());
    let shares = reply.split(&[1, 2]);
    assert_eq!(shares.len(), 2);
    assert_eq!(shares[0].data(0).unwrap(), &[0u8][..]);
    assert!(matches!(shares[0].data(1), Err(ClientError::MissingResult(1))), "the first share has one result");
    assert!(matches!(shares[1].data(0), Err(ClientError::Refused { status: Status::OutOfRange, .. })));
    assert_eq!(shares[1].data(1).unwrap(), &[2u8, 2, 2][..]);
    assert_eq!(shares[1].results().unwrap().len(), 2);
    // The next request, in the recycled buffer, encodes as a fresh one would.
    session.submit(&[Op::read(0, 0, 1)], 2).unwrap();
    let next = session.poll_transmit(at_ms(2)).unwrap().to_vec();
    let parsed = Request::parse(&next).unwrap();
    assert_eq!(parsed.instructions().count(), 1);
    assert_eq!(parsed.header.sequence, Request::parse(&request).unwrap().header.sequence + 1);
}

/// A session with Swift (initial window 4) whose READ, sent at 0, is answered at 5 ms by an
/// answer that waited `waited` for its reader: the session's statistics after it.
fn answered_at_5_ms_having_waited(waited: Duration) -> netdam_initiator::session::SessionStats {
    let swift = SwiftConfig { initial_window: 4.0, ..SwiftConfig::default() };
    let mut session = Session::new(SessionConfig { congestion: Some(swift), ..config() }, 9);
    session.submit(&[Op::read(0, 0, 8)], 1).unwrap();
    let sent = session.poll_transmit(at_ms(0)).unwrap().to_vec();
    session.handle_datagram_waited(at_ms(5), waited, &answer(&sent));
    let completion = session.poll_completion().unwrap();
    // The caller's latency is what it waited, whatever the controller learned.
    assert_eq!(completion.result.unwrap().rtt, Duration::from_millis(5));
    session.stats()
}

#[test]
fn time_an_answer_waited_for_the_reader_is_not_round_trip() {
    // Two sessions get the same answer 5 ms after sending it; for one the kernel stamped it
    // 4.98 ms before the session read it (the reader had no core). Only the other learns a
    // 5 ms round trip and shrinks its window; the first saw 20 µs and grows.
    let read_late = answered_at_5_ms_having_waited(Duration::from_micros(4_980));
    let read_at_once = answered_at_5_ms_having_waited(Duration::ZERO);
    assert_eq!(read_late.smoothed_rtt, Duration::from_micros(20));
    assert_eq!(read_at_once.smoothed_rtt, Duration::from_millis(5));
    assert!(read_late.window > 4.0, "20 µs is below the fabric target: {}", read_late.window);
    assert!(read_at_once.window < 4.0, "5 ms is far above it: {}", read_at_once.window);
}

#[test]
fn an_answer_whose_wait_is_unknown_or_no_shorter_than_the_round_trip_teaches_nothing() {
    for waited in [Duration::MAX, Duration::from_millis(5), Duration::from_millis(6)] {
        let stats = answered_at_5_ms_having_waited(waited);
        assert_eq!(stats.smoothed_rtt, Duration::ZERO, "waited {waited:?}: no sample");
        assert_eq!(stats.window, 4.0, "waited {waited:?}: the window stays");
    }
    assert_eq!(answered_at_5_ms_having_waited(Duration::from_micros(4_999)).smoothed_rtt, Duration::from_micros(1));
}

#[test]
fn a_block_request_times_out_by_block_round_trips_and_a_memory_request_by_memory_ones() {
    let config = SessionConfig { max_rto: Duration::from_millis(100), ..config() };
    let mut session = Session::new(config, 9);
    let at_us = |us: u64| Instant::ZERO + Duration::from_micros(us);
    // A memory READ answered in 20 µs, a BREAD in 8 ms (a loaded disk).
    session.submit(&[Op::read(0, 0, 8)], 1).unwrap();
    let read = session.poll_transmit(at_us(0)).unwrap().to_vec();
    session.handle_datagram(at_us(20), &answer(&read));
    session.submit(&[Op::block_read(0, 0, 1)], 2).unwrap();
    let bread = session.poll_transmit(at_us(1_000)).unwrap().to_vec();
    session.handle_datagram(at_us(9_000), &answer(&bread));
    assert_eq!(session.poll_completion().map(|done| done.token), Some(1));
    assert_eq!(session.poll_completion().map(|done| done.token), Some(2));

    // Each kind's first sample: smoothed = sample, variance = half; timeout = 3x the sample.
    session.submit(&[Op::block_read(0, 1, 1)], 3).unwrap();
    session.poll_transmit(at_us(10_000)).unwrap();
    assert_eq!(session.poll_timeout(), Some(at_us(10_000 + 24_000)), "the disk's 8 ms are allowed for");
    session.submit(&[Op::read(0, 8, 8)], 4).unwrap();
    session.poll_transmit(at_us(10_000)).unwrap();
    assert_eq!(session.poll_timeout(), Some(at_us(10_000 + 500)), "memory keeps its own (the 500 µs floor)");
    assert_eq!(session.stats().rto, Duration::from_millis(24), "the statistics show the longer");
}

#[test]
fn a_block_request_waits_at_least_its_floor_before_it_is_resent() {
    let mut session = Session::new(config(), 9);
    let at_us = |us: u64| Instant::ZERO + Duration::from_micros(us);
    // A fast device: a BREAD answered in 100 µs would allow 300 µs, below both floors.
    session.submit(&[Op::block_read(0, 0, 1)], 1).unwrap();
    let bread = session.poll_transmit(at_us(0)).unwrap().to_vec();
    session.handle_datagram(at_us(100), &answer(&bread));
    session.submit(&[Op::block_read(0, 1, 1)], 2).unwrap();
    session.poll_transmit(at_us(1_000)).unwrap();
    assert_eq!(SessionConfig::default().min_block_rto, Duration::from_millis(20));
    assert_eq!(session.poll_timeout(), Some(at_us(1_000 + 20_000)), "a device's tail is allowed for");
}

#[test]
fn retransmissions_of_block_requests_are_counted_apart() {
    let mut session = Session::new(config(), 9);
    session.submit(&[Op::read(0, 0, 8)], 1).unwrap();
    session.submit(&[Op::block_read(0, 0, 1)], 2).unwrap();
    while session.poll_transmit(at_ms(0)).is_some() {}
    // The memory request's timeout is 10 ms, then 20; the block request's has a floor of 20 ms.
    for ms in [10, 20, 30] {
        session.handle_timeout(at_ms(ms));
        while session.poll_transmit(at_ms(ms)).is_some() {}
    }
    let stats = session.stats();
    assert_eq!((stats.retransmissions, stats.block_retransmissions), (3, 1));
}

#[test]
fn a_hello_waits_at_least_its_floor_before_it_is_resent() {
    let mut session = Session::new(config(), 0);
    session.start_hello(9000);
    let at_us = |us: u64| Instant::ZERO + Duration::from_micros(us);
    // The cookie comes back in 100 µs: the memory timeout it teaches (300 µs) is below the floor.
    let first = session.poll_transmit(at_us(0)).expect("the first HELLO").to_vec();
    session.handle_datagram(at_us(100), &target_answer(&first, 7, Status::Ok));
    let second = session.poll_transmit(at_us(100)).expect("the second HELLO, with the cookie").to_vec();
    assert_eq!(Request::parse(&second).unwrap().instructions().next().unwrap().opcode, netdam_isa::Opcode::Hello as u8);
    assert_eq!(SessionConfig::default().min_hello_rto, Duration::from_millis(20));
    assert_eq!(session.poll_timeout(), Some(at_us(100 + 20_000)), "the target may pause while it opens the session");
    // Not resent before then; resent after.
    session.handle_timeout(at_us(100 + 19_999));
    assert!(session.poll_transmit(at_us(100 + 19_999)).is_none());
    session.handle_timeout(at_us(100 + 20_000));
    let again = session.poll_transmit(at_us(100 + 20_000)).expect("the HELLO again").to_vec();
    assert_eq!(again, second, "the same HELLO, cookie and sequence");
    assert_eq!(session.stats().retransmissions, 1);
}
