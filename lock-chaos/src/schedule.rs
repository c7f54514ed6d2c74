//! The nemesis's plan: fault windows drawn from a seed, one after another, with quiet time
//! between them and none at the start or the end of the run, so that every fault has a
//! before and an after. The same options give the same plan.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A kind of fault the nemesis can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum FaultKind {
    /// A server stops answering (SIGSTOP, or a paused container) for the window.
    ServerPause,
    /// A server is killed, and started again at the window's end.
    ServerKill,
    /// Whichever server leads the ensemble when the window opens is killed, and started again
    /// at its end.
    LeaderKill,
    /// A client is frozen (SIGSTOP) for the window, past its session or lease.
    ClientFreeze,
    /// A client is killed; a new client takes its place at the window's end.
    ClientKill,
    /// A client is cut off from every server for the window (its connections closed, new
    /// ones refused), past its session or lease or not.
    Partition,
    /// A server is cut off from the other members of its ensemble for the window (a real
    /// network partition: servers in containers, disconnected from their network), while
    /// its clients still reach it.
    MemberPartition,
    /// The sentinels are told to promote a replica (`SENTINEL FAILOVER`) while the primary
    /// runs; the window lasts until they have demoted the old primary, which takes writes
    /// until then. On a Redis Cluster, the replica of the primary serving the lock takes
    /// over (`CLUSTER FAILOVER`, which first has the primary stop and the replica catch up).
    Failover,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 8] = [
        FaultKind::ServerPause,
        FaultKind::ServerKill,
        FaultKind::LeaderKill,
        FaultKind::ClientFreeze,
        FaultKind::ClientKill,
        FaultKind::Partition,
        FaultKind::MemberPartition,
        FaultKind::Failover,
    ];

    /// Its name: `server-pause`, `client-kill`, …
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::ServerPause => "server-pause",
            FaultKind::ServerKill => "server-kill",
            FaultKind::LeaderKill => "leader-kill",
            FaultKind::ClientFreeze => "client-freeze",
            FaultKind::ClientKill => "client-kill",
            FaultKind::Partition => "partition",
            FaultKind::MemberPartition => "member-partition",
            FaultKind::Failover => "failover",
        }
    }

    /// Whether the fault's target is a client (else a server).
    pub fn targets_client(self) -> bool {
        matches!(
            self,
            FaultKind::ClientFreeze | FaultKind::ClientKill | FaultKind::Partition
        )
    }
}

impl std::str::FromStr for FaultKind {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        FaultKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = FaultKind::ALL.iter().map(|kind| kind.as_str()).collect();
                format!("unknown fault {name:?}; one of {}", names.join(", "))
            })
    }
}

/// One fault window of the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Fault {
    /// When it begins, from the start of the run.
    pub start_ms: u64,
    /// How long it lasts.
    pub duration_ms: u64,
    /// What it does.
    pub kind: FaultKind,
    /// The client or server it hits, by index (drawn as 0 for [`FaultKind::LeaderKill`] and
    /// [`FaultKind::Failover`], whose run names the primary they hit).
    pub target: u32,
}

impl Fault {
    /// When it heals, from the start of the run.
    pub fn end_ms(&self) -> u64 {
        self.start_ms + self.duration_ms
    }
}

/// What a plan is drawn from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PlanOptions {
    /// The seed: the same options give the same plan.
    pub seed: u64,
    /// The length of the run.
    pub duration: Duration,
    /// The kinds to draw from, each as likely as the others.
    pub kinds: Vec<FaultKind>,
    /// How many clients there are to hit.
    pub clients: u32,
    /// How many servers there are to hit.
    pub servers: u32,
    /// The shortest and longest fault.
    pub fault_length: (Duration, Duration),
    /// The shortest and longest quiet time between two faults.
    pub quiet: (Duration, Duration),
    /// How long a client freeze lasts at least: longer than a session or a lease, so that
    /// the frozen client's lock is taken from it.
    pub freeze_at_least: Duration,
    /// How long a member partition lasts at least: longer than the ensemble's failure
    /// detection, so that a cut-off leader is replaced while its clients still reach it.
    pub member_partition_at_least: Duration,
    /// No fault in this much time at the start and at the end of the run.
    pub settle: Duration,
}

impl PlanOptions {
    /// Options with faults of 0.5–2.5 s, 0.2–1 s apart, none in the first and last 5 s:
    /// over 200 faults in ten minutes, client freezes of 5 s included.
    pub fn new(
        seed: u64,
        duration: Duration,
        kinds: Vec<FaultKind>,
        clients: u32,
        servers: u32,
    ) -> Self {
        PlanOptions {
            seed,
            duration,
            kinds,
            clients,
            servers,
            fault_length: (Duration::from_millis(500), Duration::from_millis(2500)),
            quiet: (Duration::from_millis(200), Duration::from_secs(1)),
            freeze_at_least: Duration::ZERO,
            member_partition_at_least: Duration::ZERO,
            settle: Duration::from_secs(5),
        }
    }
}

/// Why no plan could be drawn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// No fault kind to draw from.
    #[error("no fault kinds to draw from")]
    NoKinds,
    /// A kind whose target does not exist (client faults without clients, server faults
    /// without servers).
    #[error("{0:?} needs a {1} to hit, and there is none")]
    NoTarget(FaultKind, &'static str),
    /// A range whose lower end is above its upper end.
    #[error("the {0} range is empty: {1:?} > {2:?}")]
    EmptyRange(&'static str, Duration, Duration),
}

/// The nemesis's plan: its seed and its faults, in time order, none overlapping.
///
/// ```
/// use std::time::Duration;
/// use lock_chaos::{FaultKind, Plan, PlanOptions};
///
/// let options = PlanOptions::new(7, Duration::from_secs(60), vec![FaultKind::ServerPause], 4, 3);
/// let plan = Plan::draw(&options).unwrap();
/// assert_eq!(plan, Plan::draw(&options).unwrap());
/// assert!(plan.faults.len() > 5);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Plan {
    /// The seed it was drawn from.
    pub seed: u64,
    /// The fault windows, in time order.
    pub faults: Vec<Fault>,
}

impl Plan {
    /// Draws the plan `options` describe.
    ///
    /// # Errors
    ///
    /// As [`PlanError`].
    pub fn draw(options: &PlanOptions) -> Result<Plan, PlanError> {
        if options.kinds.is_empty() {
            return Err(PlanError::NoKinds);
        }
        for &kind in &options.kinds {
            if kind.targets_client() && options.clients == 0 {
                return Err(PlanError::NoTarget(kind, "client"));
            }
            if !kind.targets_client() && options.servers == 0 {
                return Err(PlanError::NoTarget(kind, "server"));
            }
        }
        for (what, (low, high)) in [
            ("fault length", options.fault_length),
            ("quiet", options.quiet),
        ] {
            if low > high {
                return Err(PlanError::EmptyRange(what, low, high));
            }
        }
        let mut rng = fastrand::Rng::with_seed(options.seed);
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let between = |rng: &mut fastrand::Rng, (low, high): (Duration, Duration)| {
            rng.u64(millis(low)..=millis(high))
        };
        let last_end = millis(options.duration).saturating_sub(millis(options.settle));
        let mut at = millis(options.settle);
        let mut faults = Vec::new();
        loop {
            let kind = options.kinds[rng.usize(..options.kinds.len())];
            let mut duration_ms = between(&mut rng, options.fault_length);
            match kind {
                FaultKind::ClientFreeze => {
                    duration_ms = duration_ms.max(millis(options.freeze_at_least));
                }
                FaultKind::MemberPartition => {
                    duration_ms = duration_ms.max(millis(options.member_partition_at_least));
                }
                _ => {}
            }
            let target = match kind {
                FaultKind::LeaderKill | FaultKind::Failover => 0,
                kind if kind.targets_client() => rng.u32(..options.clients),
                _ => rng.u32(..options.servers),
            };
            if at + duration_ms > last_end {
                break;
            }
            faults.push(Fault {
                start_ms: at,
                duration_ms,
                kind,
                target,
            });
            at += duration_ms + between(&mut rng, options.quiet);
        }
        Ok(Plan {
            seed: options.seed,
            faults,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_kind() -> Vec<FaultKind> {
        FaultKind::ALL.to_vec()
    }

    #[test]
    fn kinds_parse_from_their_names() {
        for kind in FaultKind::ALL {
            assert_eq!(kind.as_str().parse::<FaultKind>(), Ok(kind));
        }
        let refused = "meteor".parse::<FaultKind>().unwrap_err();
        assert!(refused.contains("server-pause"), "{refused}");
    }

    #[test]
    fn a_seed_gives_one_plan_and_another_seed_another() {
        let options = PlanOptions::new(1, Duration::from_secs(120), every_kind(), 5, 3);
        let plan = Plan::draw(&options).unwrap();
        assert_eq!(plan, Plan::draw(&options).unwrap());
        let other = Plan::draw(&PlanOptions { seed: 2, ..options }).unwrap();
        assert_ne!(plan.faults, other.faults);
    }

    #[test]
    fn windows_keep_their_bounds_and_do_not_overlap() {
        let mut options = PlanOptions::new(9, Duration::from_secs(600), every_kind(), 5, 3);
        options.freeze_at_least = Duration::from_secs(5);
        options.member_partition_at_least = Duration::from_secs(3);
        let plan = Plan::draw(&options).unwrap();
        // Ten minutes, with five-second freezes and three-second member partitions among
        // the faults.
        assert!(plan.faults.len() >= 200, "{} faults", plan.faults.len());
        for fault in &plan.faults {
            assert!(
                fault.start_ms >= 5_000 && fault.end_ms() <= 595_000,
                "{fault:?}"
            );
            if fault.kind == FaultKind::ClientFreeze {
                assert!(fault.duration_ms >= 5_000, "{fault:?}");
            } else if fault.kind == FaultKind::MemberPartition {
                // Every drawn length (at most 2.5 s) is raised to the floor.
                assert_eq!(fault.duration_ms, 3_000, "{fault:?}");
            } else {
                assert!((500..=2_500).contains(&fault.duration_ms), "{fault:?}");
            }
            let bound = if fault.kind.targets_client() { 5 } else { 3 };
            assert!(fault.target < bound, "{fault:?}");
        }
        for pair in plan.faults.windows(2) {
            assert!(pair[0].end_ms() + 200 <= pair[1].start_ms, "{pair:?}");
        }
        for kind in every_kind() {
            assert!(
                plan.faults.iter().any(|fault| fault.kind == kind),
                "no {kind:?}"
            );
        }
    }

    #[test]
    fn impossible_options_are_refused() {
        let options = |kinds, clients, servers| {
            PlanOptions::new(1, Duration::from_secs(60), kinds, clients, servers)
        };
        assert_eq!(Plan::draw(&options(vec![], 1, 1)), Err(PlanError::NoKinds));
        assert!(matches!(
            Plan::draw(&options(vec![FaultKind::ClientKill], 0, 1)),
            Err(PlanError::NoTarget(FaultKind::ClientKill, "client"))
        ));
        assert!(matches!(
            Plan::draw(&options(vec![FaultKind::ServerPause], 1, 0)),
            Err(PlanError::NoTarget(FaultKind::ServerPause, "server"))
        ));
        let mut reversed = options(vec![FaultKind::ServerPause], 1, 1);
        reversed.quiet = (Duration::from_secs(2), Duration::from_secs(1));
        assert!(matches!(
            Plan::draw(&reversed),
            Err(PlanError::EmptyRange("quiet", _, _))
        ));
    }

    #[test]
    fn a_run_too_short_for_a_fault_has_none() {
        let options = PlanOptions::new(
            1,
            Duration::from_secs(10),
            vec![FaultKind::ServerKill],
            1,
            1,
        );
        assert!(Plan::draw(&options).unwrap().faults.is_empty());
    }
}
