use super::*;
use crate::register::FencedRegister;

const MS: u64 = 1_000_000;

/// A history written the way clients and the register would write it.
#[derive(Default)]
struct Run {
    events: Vec<Event>,
    register: FencedRegister,
    faults: Vec<Fault>,
}

impl Run {
    fn grant(&mut self, client: u32, token: u64, at_ms: u64) {
        self.events.push(
            Event::new(
                client,
                EventKind::Acquire,
                at_ms * MS,
                at_ms * MS,
                Outcome::Ok,
            )
            .with_token(token),
        );
    }

    /// A write of `value` as the register judges it, acknowledged to the client.
    fn write(&mut self, client: u32, token: u64, value: u64, at_ms: u64) {
        let outcome = match self.register.write(client, token, value) {
            Verdict::Accepted => Outcome::Ok,
            Verdict::Rejected { .. } => Outcome::Rejected,
        };
        self.events.push(
            Event::new(client, EventKind::Write, at_ms * MS, at_ms * MS, outcome)
                .with_token(token)
                .with_value(value),
        );
    }

    fn release(&mut self, client: u32, token: u64, at_ms: u64) {
        self.events.push(
            Event::new(
                client,
                EventKind::Release,
                at_ms * MS,
                at_ms * MS,
                Outcome::Ok,
            )
            .with_token(token),
        );
    }

    fn lost(&mut self, client: u32, token: u64, at_ms: u64) {
        self.events.push(
            Event::new(client, EventKind::Lost, at_ms * MS, at_ms * MS, Outcome::Ok)
                .with_token(token),
        );
    }

    fn fault(&mut self, kind: FaultKind, target: u32, start_ms: u64, duration_ms: u64) {
        self.faults.push(Fault {
            start_ms,
            duration_ms,
            kind,
            target,
        });
    }

    /// A clean turn: grant, write one above `value`, release.
    fn turn(&mut self, client: u32, token: u64, value: u64, at_ms: u64) {
        self.grant(client, token, at_ms);
        self.write(client, token, value + 1, at_ms + 1);
        self.release(client, token, at_ms + 2);
    }

    fn check(&self, ended_ms: u64) -> Report {
        Check {
            events: &self.events,
            writes: self.register.log(),
            final_value: self.register.value(),
            faults: &self.faults,
            began_ns: 0,
            ended_ns: ended_ms * MS,
            progress_bound: Duration::from_secs(5),
            clients: 3,
            residue: 0,
        }
        .run()
    }
}

#[test]
fn a_clean_serial_history_passes_every_target() {
    let mut run = Run::default();
    for turn in 0..10 {
        run.turn(turn % 3, turn as u64 + 1, turn as u64, turn as u64 * 10);
    }
    let report = run.check(200);
    assert_eq!(report.grants, 10);
    assert_eq!((report.writes_accepted, report.final_value), (10, 10));
    assert_eq!((report.lost_updates, report.overlaps), (0, 0));
    assert!(
        report
            .violations(&Targets::consensus(Duration::ZERO))
            .is_empty(),
        "{report:?}"
    );
}

#[test]
fn two_holders_at_once_show_as_an_overlap_and_a_lost_update() {
    let mut run = Run::default();
    run.grant(1, 1, 0);
    run.grant(2, 2, 100);
    // Both read 0; the older holder writes first, so fencing cannot turn it away.
    run.write(1, 1, 1, 150);
    run.write(2, 2, 1, 160);
    run.lost(1, 1, 300);
    run.release(2, 2, 400);
    let report = run.check(500);
    assert_eq!((report.overlaps, report.longest_overlap_ms), (1, 200.0));
    let overlap = report.longest_overlap.unwrap();
    assert_eq!(
        (overlap.earlier, overlap.later, overlap.at_ms),
        (1, 2, 100.0)
    );
    assert_eq!((report.writes_accepted, report.lost_updates), (2, 1));
    assert_eq!(report.stale_writes_accepted, 0);
    let broken = report.violations(&Targets::consensus(Duration::from_millis(100)));
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(report.violations(&Targets::lease()).is_empty());
}

#[test]
fn a_stale_holder_is_turned_away_by_the_register() {
    let mut run = Run::default();
    run.grant(1, 1, 0);
    run.grant(2, 2, 100);
    run.write(2, 2, 1, 110);
    run.write(1, 1, 1, 120);
    run.release(2, 2, 130);
    run.lost(1, 1, 140);
    let report = run.check(200);
    assert_eq!((report.writes_accepted, report.writes_rejected), (1, 1));
    assert_eq!((report.stale_writes_accepted, report.lost_updates), (0, 0));
    assert_eq!(report.longest_overlap_ms, 30.0);
}

#[test]
fn a_broken_register_is_caught_from_its_own_log() {
    let write = |client, token, value, verdict| RegisterWrite {
        client,
        token,
        value,
        verdict,
    };
    let writes = [
        write(1, 5, 1, Verdict::Accepted),
        write(2, 3, 2, Verdict::Accepted),
        write(3, 9, 3, Verdict::Rejected { highest: 5 }),
    ];
    let events = [Event::new(4, EventKind::Write, 0, 0, Outcome::Ok)
        .with_token(9)
        .with_value(9)];
    let report = Check {
        events: &events,
        writes: &writes,
        final_value: 7,
        faults: &[],
        began_ns: 0,
        ended_ns: 0,
        progress_bound: Duration::from_secs(1),
        clients: 4,
        residue: 0,
    }
    .run();
    assert_eq!(report.stale_writes_accepted, 1);
    // The rejected write with a higher token, the final value, the unknown acknowledgement.
    assert_eq!(report.register_faults, 3);
}

#[test]
fn frozen_time_is_not_belief_and_a_kill_ends_it() {
    let mut run = Run::default();
    run.grant(1, 1, 0);
    run.fault(FaultKind::ClientFreeze, 1, 1_000, 8_000);
    run.grant(2, 2, 5_000);
    run.release(2, 2, 9_500);
    run.lost(1, 1, 10_000);
    // Client 1 believed [0, 1 s] and [9 s, 10 s]; client 2 held [5 s, 9.5 s].
    let report = run.check(20_000);
    assert_eq!((report.overlaps, report.longest_overlap_ms), (1, 500.0));

    let mut run = Run::default();
    run.grant(1, 1, 0);
    run.fault(FaultKind::ClientKill, 1, 1_000, 500);
    run.grant(2, 2, 3_000);
    run.release(2, 2, 4_000);
    assert_eq!(run.check(5_000).overlaps, 0);

    // Granted just after the kill began, before the signal landed: it dies all the same.
    let mut run = Run::default();
    run.fault(FaultKind::ClientKill, 1, 1_000, 500);
    run.grant(1, 1, 1_001);
    run.grant(2, 2, 3_000);
    run.release(2, 2, 4_000);
    assert_eq!(run.check(5_000).overlaps, 0);
}

#[test]
fn progress_after_faults_and_per_client() {
    let mut run = Run::default();
    run.turn(1, 1, 0, 0);
    // Healed at 2 s, the next write at 20 s.
    run.fault(FaultKind::ServerPause, 0, 1_000, 1_000);
    run.turn(1, 2, 1, 20_000);
    run.turn(2, 3, 2, 25_000);
    // Healed at 31 s: client 1 writes after it, client 2 only before, client 0 never.
    run.fault(FaultKind::ServerPause, 0, 30_000, 1_000);
    run.turn(1, 4, 3, 34_000);
    let report = run.check(40_000);
    assert_eq!(report.stalls, 0);
    assert_eq!(report.longest_recovery_ms, 18_001.0);
    assert_eq!(report.clients_without_progress, vec![0, 2]);
    assert_eq!(report.violations(&Targets::lease()).len(), 1);
    // Too little time after the last heal to judge the clients.
    assert!(run.check(33_000).clients_without_progress.is_empty());
    // Nobody wrote after a heal: a stall.
    run.fault(FaultKind::ClientKill, 1, 36_000, 500);
    let report = run.check(45_000);
    assert_eq!(report.stalls, 1);
}

#[test]
fn a_token_granted_twice_is_counted_and_each_grant_ends_at_its_own_release() {
    let mut run = Run::default();
    run.grant(1, 7, 0);
    run.release(1, 7, 10);
    run.grant(2, 8, 20);
    // The same token again, to the same client: its belief ends at its own release, and
    // overlaps client 2's.
    run.grant(1, 7, 25);
    run.release(2, 8, 30);
    run.release(1, 7, 40);
    let report = run.check(50);
    assert_eq!(report.tokens_granted_twice, 1);
    assert_eq!(report.token_regressions, 1, "7 granted after 8");
    assert_eq!((report.overlaps, report.longest_overlap_ms), (1, 5.0));
    let broken = report.violations(&Targets::consensus(Duration::from_millis(1)));
    assert_eq!(broken.len(), 2, "{broken:?}");
}

#[test]
fn an_equal_token_from_another_client_is_a_stale_write() {
    let mut run = Run::default();
    run.grant(1, 7, 0);
    run.grant(2, 7, 5);
    run.write(2, 7, 1, 10);
    run.write(1, 7, 1, 12);
    let report = run.check(20);
    assert_eq!(
        (report.writes_accepted, report.stale_writes_accepted),
        (2, 1)
    );
    assert_eq!(report.violations(&Targets::lease()).len(), 1);
    assert!(report.violations(&Targets::best_effort()).is_empty());
}

#[test]
fn a_counter_rolled_back_shows_as_token_regressions() {
    let mut run = Run::default();
    // A failover lost the grants of tokens 3 and 4: the next ones are 3 (below the highest,
    // 4) and 4 (granted twice, not below), then 5 is past the old highest.
    for (turn, token) in [1, 2, 3, 4, 3, 4, 5].into_iter().enumerate() {
        run.turn(turn as u32 % 3, token, turn as u64, turn as u64 * 10);
    }
    let report = run.check(100);
    assert_eq!(report.token_regressions, 1);
    assert_eq!(report.tokens_granted_twice, 2);
    assert_eq!(report.overlaps, 0, "serial grants, no two holders at once");
}
