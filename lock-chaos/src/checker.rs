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
//! - **Progress**: after each fault heals, some client must write again (the longest such
//!   recovery is reported), and every client must write at least once after the last fault
//!   (judged when the run went on for the progress bound after it).
//! - **Tokens**: a grant whose token an earlier grant had is counted, and so is one whose
//!   token is lower than an earlier grant's; a write accepted with a token equal to the
//!   highest but from another client is a stale write too.

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
    /// How soon after a fault heals some client must write again (reported), and how long
    /// after the last heal every client must have written (judged).
    pub progress_bound: Duration,
    /// How many client slots the run had (clients `0..clients`).
    pub clients: u32,
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
    /// Writes accepted with a token lower than one accepted before, or equal to one another
    /// client wrote with (0 with fencing).
    pub stale_writes_accepted: usize,
    /// Grants whose token an earlier grant had (0 where tokens strictly increase).
    pub tokens_granted_twice: usize,
    /// Grants whose token is lower than one granted before them (0 where tokens strictly
    /// increase): a fencing counter rolled back.
    #[serde(default)]
    pub token_regressions: usize,
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
    /// Pairs of belief pieces of different clients that intersect (a belief split by a
    /// freeze counts per piece).
    pub overlaps: usize,
    /// The longest such intersection, in milliseconds.
    pub longest_overlap_ms: f64,
    /// Who overlapped longest, and when.
    #[serde(default)]
    pub longest_overlap: Option<Overlap>,
    /// Faults after whose heal no client wrote again before the end of the run.
    pub stalls: usize,
    /// The longest time from a fault's heal to the next write by any client, in
    /// milliseconds.
    pub longest_recovery_ms: f64,
    /// Clients that never wrote in the time after the last heal (judged when the run went
    /// on for the progress bound after it).
    pub clients_without_progress: Vec<u32>,
    /// Nodes or keys left on the servers.
    pub residue: usize,
}

/// Two clients believing at once: the one whose belief began first, the other, and when
/// the other's began (milliseconds into the run).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Overlap {
    /// The client whose belief began first.
    pub earlier: u32,
    /// The client whose belief began while the other's lasted.
    pub later: u32,
    /// When the later belief began, in milliseconds into the run.
    pub at_ms: f64,
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
    /// Whether every grant must have a token of its own.
    pub unique_tokens: bool,
    /// Whether the register must have turned every stale write away (the backend's tokens
    /// strictly increase).
    pub fenced: bool,
}

impl Targets {
    /// The targets of a consensus backend (ZooKeeper, etcd): no overlap beyond `bound`, no
    /// lost update.
    pub fn consensus(bound: Duration) -> Self {
        Targets {
            max_overlap: Some(bound),
            allow_lost_updates: false,
            unique_tokens: true,
            fenced: true,
        }
    }

    /// The targets of a lease backend with one counter (Redis): fencing must hold; overlaps
    /// and lost updates are measured, not judged.
    pub fn lease() -> Self {
        Targets {
            max_overlap: None,
            allow_lost_updates: true,
            unique_tokens: false,
            fenced: true,
        }
    }

    /// The targets of a backend whose tokens are best effort (say, a counter per server
    /// whose largest count a grant reports, so that two grants can carry one token): stale
    /// writes are measured, not judged.
    pub fn best_effort() -> Self {
        Targets {
            fenced: false,
            ..Targets::lease()
        }
    }
}

impl Report {
    /// What the report breaks of `targets` and of what every backend must keep (no register
    /// fault, progress, no residue); empty when nothing.
    pub fn violations(&self, targets: &Targets) -> Vec<String> {
        let mut broken = Vec::new();
        let mut check = |ok: bool, what: String| {
            if !ok {
                broken.push(what);
            }
        };
        if targets.fenced {
            check(
                self.stale_writes_accepted == 0,
                format!("{} stale writes accepted", self.stale_writes_accepted),
            );
        }
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
        if targets.unique_tokens {
            check(
                self.tokens_granted_twice == 0,
                format!("{} grants reused a token", self.tokens_granted_twice),
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
        let mut grants: Vec<&Event> = self
            .events
            .iter()
            .filter(|event| event.kind == EventKind::Acquire && event.is_ok())
            .collect();
        grants.sort_unstable_by_key(|grant| grant.end_ns);
        let mut granted = BTreeSet::new();
        for grant in grants {
            if granted.last().is_some_and(|highest| grant.token < *highest) {
                report.token_regressions += 1;
            }
            if !granted.insert(grant.token) {
                report.tokens_granted_twice += 1;
            }
        }
        self.replay_register(&mut report);
        self.overlaps(&mut report);
        self.progress(&mut report);
        report
    }

    /// Stale writes accepted, register faults, and increments lost or duplicated.
    fn replay_register(&self, report: &mut Report) {
        // The highest token accepted, and the client that wrote with it.
        let mut highest: Option<(u64, u32)> = None;
        let mut value = 0;
        let mut accepted = BTreeSet::new();
        for write in self.writes {
            match write.verdict {
                Verdict::Accepted => {
                    report.writes_accepted += 1;
                    let stale = highest.is_some_and(|(token, client)| {
                        write.token < token || (write.token == token && write.client != client)
                    });
                    if stale {
                        report.stale_writes_accepted += 1;
                    }
                    if highest.is_none_or(|(token, _)| write.token > token) {
                        highest = Some((write.token, write.client));
                    }
                    value = write.value;
                    accepted.insert((write.client, write.token, write.value));
                }
                Verdict::Rejected { .. } => {
                    report.writes_rejected += 1;
                    if highest.is_none_or(|(token, _)| write.token >= token) {
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
        // Every end of a (client, token)'s belief, in time order: a token one client was
        // granted twice (a backend whose tokens can repeat) ends each grant at its own.
        let mut ends: HashMap<(u32, u64), Vec<u64>> = HashMap::new();
        for event in self.events {
            let Some(token) = event.token else { continue };
            let end = match event.kind {
                EventKind::Release => event.start_ns,
                EventKind::Lost => event.end_ns,
                _ => continue,
            };
            ends.entry((event.client, token)).or_default().push(end);
        }
        for times in ends.values_mut() {
            times.sort_unstable();
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
                .and_then(|token| ends.get(&(grant.client, token)))
                .and_then(|times| times.get(times.partition_point(|&at| at < start)).copied())
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
        let mut longest: Option<(u64, Overlap)> = None;
        for (index, &(client, _, end)) in pieces.iter().enumerate() {
            for &(other, other_start, other_end) in &pieces[index + 1..] {
                if other_start >= end {
                    break;
                }
                if other != client {
                    report.overlaps += 1;
                    let length = end.min(other_end) - other_start;
                    if longest.is_none_or(|(longest, _)| length > longest) {
                        let at_ms = other_start.saturating_sub(self.began_ns) as f64 / 1e6;
                        let overlap = Overlap {
                            earlier: client,
                            later: other,
                            at_ms,
                        };
                        longest = Some((length, overlap));
                    }
                }
            }
        }
        if let Some((length, overlap)) = longest {
            report.longest_overlap_ms = length as f64 / 1e6;
            report.longest_overlap = Some(overlap);
        }
    }

    /// Recovery after each fault, and clients that never wrote after the last one.
    fn progress(&self, report: &mut Report) {
        let mut writes: Vec<&Event> = self
            .events
            .iter()
            .filter(|event| event.kind == EventKind::Write && event.is_ok())
            .collect();
        writes.sort_unstable_by_key(|write| write.end_ns);
        let mut longest = 0;
        for fault in self.faults {
            let healed = self.fault_ns(fault.end_ms());
            let next = writes.partition_point(|write| write.end_ns < healed);
            match writes.get(next) {
                Some(write) => longest = longest.max(write.end_ns - healed),
                None => report.stalls += 1,
            }
        }
        report.longest_recovery_ms = longest as f64 / 1e6;
        let last_heal = self
            .faults
            .iter()
            .map(|fault| self.fault_ns(fault.end_ms()))
            .max()
            .unwrap_or(self.began_ns);
        let bound = u64::try_from(self.progress_bound.as_nanos()).unwrap_or(u64::MAX);
        if self.ended_ns.saturating_sub(last_heal) < bound {
            return;
        }
        report.clients_without_progress = (0..self.clients)
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
