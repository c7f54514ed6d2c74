//! The checker: what the recorded history says about the lock's safety, recomputed from the
//! logs alone.
//!
//! - **The register**, replayed from its own log: a write accepted with a token lower than
//!   one accepted before it is a stale write accepted; a write turned away without cause, or
//!   a final value that the log does not explain, is a register fault. A client told its
//!   write was accepted must find it in the log.
//! - **Increments**: under mutual exclusion every accepted write sets the value one above the
//!   one before, so the final value equals the accepted writes; each one short is a lost
//!   update (two holders read the same value), each one over a duplicated one.
//! - **Overlaps**: a client believes it holds the lock from its grant until it starts to
//!   release, its lost signal fires, or it is killed. Time it spends frozen is left out: a
//!   frozen process can do nothing with its belief. Every pair of clients whose beliefs
//!   intersect is an overlap; the longest is reported.
//! - **Progress**: after each fault heals, some client must write within the progress bound
//!   (judged when the next fault leaves that much time), and every client must write at
//!   least once after the last fault.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::history::{Event, EventKind, Outcome};
use crate::register::{RegisterWrite, Verdict};
use crate::schedule::{Fault, FaultKind};

/// What the checker is given.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Check<'a> {
    /// Every client's events.
    pub events: &'a [Event],
    /// The register's log, in its order.
    pub writes: &'a [RegisterWrite],
    /// The register's value at the end.
    pub final_value: u64,
    /// The faults injected (their times from `began_ns`).
    pub faults: &'a [Fault],
    /// When the run began, on the events' clock.
    pub began_ns: u64,
    /// When the run ended, on the events' clock.
    pub ended_ns: u64,
    /// How soon after a fault heals some client must write again.
    pub progress_bound: Duration,
    /// Nodes or keys of the run's locks left on the servers at the end.
    pub residue: usize,
}

/// What the checker found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Report {
    /// Operations recorded (lost signals included).
    pub operations: usize,
    /// Grants of the lock.
    pub grants: usize,
    /// Faults injected.
    pub faults: usize,
    /// Writes the register accepted.
    pub writes_accepted: usize,
    /// Writes the register turned away as stale.
    pub writes_rejected: usize,
    /// Writes accepted with a token lower than one accepted before (0 with fencing).
    pub stale_writes_accepted: usize,
    /// Writes the register turned away without cause, or a final value its log does not
    /// explain, or acknowledgements it has no record of (0 unless the register is broken).
    pub register_faults: usize,
    /// Writes whose client saw them accepted.
    pub acknowledged_writes: usize,
    /// Writes whose client never learned their fate.
    pub uncertain_writes: usize,
    /// The register's value at the end.
    pub final_value: u64,
    /// Accepted increments that the final value lacks (two holders at once).
    pub lost_updates: u64,
    /// Increments in the final value beyond those accepted.
    pub duplicated_updates: u64,
    /// Pairs of clients whose beliefs that they held the lock intersect.
    pub overlaps: usize,
    /// The longest such intersection, in milliseconds.
    pub longest_overlap_ms: f64,
    /// Faults after whose heal no client wrote within the progress bound.
    pub stalls: usize,
    /// Faults whose heal the next fault followed too soon to judge progress.
    pub unjudged_faults: usize,
    /// Clients that never wrote after the last fault healed.
    pub clients_without_progress: Vec<u32>,
    /// Nodes or keys left on the servers.
    pub residue: usize,
}

/// What a backend is held to.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Targets {
    /// The longest overlap allowed (the documented lost-signal bound); `None`: any, measured
    /// only (a lease backend under pauses past its lease).
    pub max_overlap: Option<Duration>,
    /// Whether lost updates are tolerated (measured only).
    pub allow_lost_updates: bool,
}

impl Targets {
    /// The targets of a consensus backend (ZooKeeper, etcd): no overlap beyond `bound`, no
    /// lost update.
    pub fn consensus(bound: Duration) -> Self {
        Targets {
            max_overlap: Some(bound),
            allow_lost_updates: false,
        }
    }

    /// The targets of a lease backend (Redis, Redlock): fencing must hold; overlaps and lost
    /// updates are measured, not judged.
    pub fn lease() -> Self {
        Targets {
            max_overlap: None,
            allow_lost_updates: true,
        }
    }
}

impl Report {
    /// What the report breaks of `targets` and of what every backend must keep (no stale
    /// write accepted, no register fault, progress, no residue); empty when nothing.
    pub fn violations(&self, targets: &Targets) -> Vec<String> {
        let mut broken = Vec::new();
        let mut check = |ok: bool, what: String| {
            if !ok {
                broken.push(what);
            }
        };
        check(
            self.stale_writes_accepted == 0,
            format!("{} stale writes accepted", self.stale_writes_accepted),
        );
        check(
            self.register_faults == 0,
            format!("{} register faults", self.register_faults),
        );
        check(
            self.stalls == 0,
            format!("{} faults without progress after", self.stalls),
        );
        check(
            self.clients_without_progress.is_empty(),
            format!(
                "clients {:?} made no progress after the last fault",
                self.clients_without_progress
            ),
        );
        check(
            self.residue == 0,
            format!("{} nodes or keys left", self.residue),
        );
        if let Some(bound) = targets.max_overlap {
            check(
                self.longest_overlap_ms <= bound.as_secs_f64() * 1e3,
                format!(
                    "{} overlaps, the longest {:.1} ms (bound {bound:?})",
                    self.overlaps, self.longest_overlap_ms
                ),
            );
        }
        if !targets.allow_lost_updates {
            check(
                self.lost_updates == 0 && self.duplicated_updates == 0,
                format!(
                    "{} lost and {} duplicated updates",
                    self.lost_updates, self.duplicated_updates
                ),
            );
        }
        broken
    }
}

impl Check<'_> {
    /// Checks the history.
    pub fn run(&self) -> Report {
        let mut report = Report {
            operations: self.events.len(),
            grants: self
                .events
                .iter()
                .filter(|event| event.kind == EventKind::Acquire && event.is_ok())
                .count(),
            faults: self.faults.len(),
            final_value: self.final_value,
            residue: self.residue,
            ..Report::default()
        };
        self.replay_register(&mut report);
        self.overlaps(&mut report);
        self.progress(&mut report);
        report
    }

    /// Stale writes accepted, register faults, and increments lost or duplicated.
    fn replay_register(&self, report: &mut Report) {
        let mut highest: Option<u64> = None;
        let mut value = 0;
        let mut accepted = BTreeSet::new();
        for write in self.writes {
            match write.verdict {
                Verdict::Accepted => {
                    report.writes_accepted += 1;
                    if highest.is_some_and(|highest| write.token < highest) {
                        report.stale_writes_accepted += 1;
                    }
                    highest = Some(highest.map_or(write.token, |h| h.max(write.token)));
                    value = write.value;
                    accepted.insert((write.client, write.token, write.value));
                }
                Verdict::Rejected { .. } => {
                    report.writes_rejected += 1;
                    if highest.is_none_or(|highest| write.token >= highest) {
                        report.register_faults += 1;
                    }
                }
            }
        }
        if value != self.final_value {
            report.register_faults += 1;
        }
        for event in self
            .events
            .iter()
            .filter(|event| event.kind == EventKind::Write)
        {
            match &event.outcome {
                Outcome::Ok => {
                    report.acknowledged_writes += 1;
                    let key = (
                        event.client,
                        event.token.unwrap_or(0),
                        event.value.unwrap_or(0),
                    );
                    if !accepted.contains(&key) {
                        report.register_faults += 1;
                    }
                }
                Outcome::Unknown(_) => report.uncertain_writes += 1,
                Outcome::Rejected | Outcome::Failed(_) => {}
            }
        }
        let accepted = report.writes_accepted as u64;
        report.lost_updates = accepted.saturating_sub(self.final_value);
        report.duplicated_updates = self.final_value.saturating_sub(accepted);
    }

    fn fault_ns(&self, ms: u64) -> u64 {
        self.began_ns + ms * 1_000_000
    }

    /// Each client's belief that it held the lock, frozen time left out, as
    /// `(client, start_ns, end_ns)` pieces.
    pub fn beliefs(&self) -> Vec<(u32, u64, u64)> {
        let mut ends: HashMap<(u32, u64), u64> = HashMap::new();
        for event in self.events {
            let Some(token) = event.token else { continue };
            let end = match event.kind {
                EventKind::Release => event.start_ns,
                EventKind::Lost => event.end_ns,
                _ => continue,
            };
            ends.entry((event.client, token))
                .and_modify(|at| *at = (*at).min(end))
                .or_insert(end);
        }
        let mut pieces = Vec::new();
        for grant in self
            .events
            .iter()
            .filter(|event| event.kind == EventKind::Acquire && event.is_ok())
        {
            let start = grant.end_ns;
            let mut end = grant
                .token
                .and_then(|token| ends.get(&(grant.client, token)).copied())
                .unwrap_or(self.ended_ns);
            let mine = self
                .faults
                .iter()
                .filter(|fault| fault.kind.targets_client() && fault.target == grant.client);
            let mut frozen = Vec::new();
            for fault in mine {
                let (from, to) = (self.fault_ns(fault.start_ms), self.fault_ns(fault.end_ms()));
                match fault.kind {
                    // A grant recorded between the kill's start and the signal's arrival
                    // ends with the process all the same.
                    FaultKind::ClientKill if to >= start => end = end.min(from.max(start)),
                    FaultKind::ClientFreeze => frozen.push((from, to)),
                    _ => {}
                }
            }
            frozen.sort_unstable();
            let mut from = start;
            for (pause, resume) in frozen {
                if pause >= end || resume <= from {
                    continue;
                }
                if pause > from {
                    pieces.push((grant.client, from, pause));
                }
                from = from.max(resume);
            }
            if end > from {
                pieces.push((grant.client, from, end));
            }
        }
        pieces
    }

    /// Pairs of clients believing at once, and the longest such time.
    fn overlaps(&self, report: &mut Report) {
        let mut pieces = self.beliefs();
        pieces.sort_unstable_by_key(|&(_, start, _)| start);
        let mut longest = 0;
        for (index, &(client, _, end)) in pieces.iter().enumerate() {
            for &(other, other_start, other_end) in &pieces[index + 1..] {
                if other_start >= end {
                    break;
                }
                if other != client {
                    report.overlaps += 1;
                    longest = longest.max(end.min(other_end) - other_start);
                }
            }
        }
        report.longest_overlap_ms = longest as f64 / 1e6;
    }

    /// Stalls after faults, and clients that never wrote after the last one.
    fn progress(&self, report: &mut Report) {
        let writes: Vec<&Event> = self
            .events
            .iter()
            .filter(|event| event.kind == EventKind::Write && event.is_ok())
            .collect();
        let bound = u64::try_from(self.progress_bound.as_nanos()).unwrap_or(u64::MAX);
        for (index, fault) in self.faults.iter().enumerate() {
            let healed = self.fault_ns(fault.end_ms());
            let window_end = healed.saturating_add(bound);
            let next = self
                .faults
                .get(index + 1)
                .map_or(self.ended_ns, |next| self.fault_ns(next.start_ms));
            let progressed = writes
                .iter()
                .any(|write| write.end_ns >= healed && write.end_ns <= window_end.min(next));
            if progressed {
                continue;
            }
            if window_end <= next {
                report.stalls += 1;
            } else {
                report.unjudged_faults += 1;
            }
        }
        let last_heal = self
            .faults
            .iter()
            .map(|fault| self.fault_ns(fault.end_ms()))
            .max()
            .unwrap_or(self.began_ns);
        let clients: BTreeSet<u32> = self.events.iter().map(|event| event.client).collect();
        report.clients_without_progress = clients
            .into_iter()
            .filter(|&client| {
                !writes
                    .iter()
                    .any(|write| write.client == client && write.end_ns >= last_heal)
            })
            .collect();
    }
}

#[cfg(test)]
mod tests;
