//! The whole suite against the in-memory reference backend.
#![allow(
    clippy::expect_used,
    reason = "test code: a missing case fails the test"
)]

lock_conformance::conformance_tests!(lock_conformance::memory::MemoryHarness::new());

/// Every case of the registry is stamped above: the list and the tests cannot drift.
#[test]
fn registry_matches_the_catalogue() {
    let cases = lock_conformance::cases::CASES;
    assert!(cases.len() >= 45, "{} cases", cases.len());
    let mut ids: Vec<_> = cases.iter().map(|c| c.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), cases.len(), "duplicate case ids");
    for group in ["A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K"] {
        assert!(
            cases.iter().any(|c| c.id.starts_with(group)),
            "no case in group {group}"
        );
    }
}

/// The reference harness with only clients, timing and faults: what a harness gets that
/// cannot look at the server and declares nothing unproven.
struct Bare(lock_conformance::memory::MemoryHarness);

#[lock_conformance::async_trait]
impl lock_conformance::Harness for Bare {
    async fn client(&self) -> Result<lock_conformance::Client, lock_core::LockError> {
        self.0.client().await
    }

    fn timing(&self) -> lock_conformance::Timing {
        self.0.timing()
    }

    fn faults(&self) -> Option<&dyn lock_conformance::Faults> {
        self.0.faults()
    }
}

/// Runs case `id` against `harness`: its result and the checks it could not make.
fn run(
    harness: &dyn lock_conformance::Harness,
    id: &str,
) -> (lock_conformance::CaseResult, Vec<&'static str>) {
    let case = lock_conformance::cases::find(id).expect("the case");
    lock_conformance::runner::block_on(lock_conformance::runner::run_case((case.run)(harness)))
}

/// A residue check that cannot be made is reported, not passed in silence.
#[test]
fn a_check_not_made_is_reported() {
    let (result, not_checked) = run(&Bare(lock_conformance::memory::MemoryHarness::new()), "B4");
    assert!(
        matches!(result, Ok(lock_conformance::Outcome::Passed)),
        "{result:?}"
    );
    assert_eq!(
        not_checked,
        ["what the server records (the harness has no inspector)"]
    );
    // With the inspector, B4 makes every check.
    let (_, not_checked) = run(&lock_conformance::memory::MemoryHarness::new(), "B4");
    assert!(not_checked.is_empty(), "{not_checked:?}");
}

/// A property of a declared capability that no hook proves is a failure under STRICT unless
/// the harness declares it unproven, and then the skip says so and fails nothing.
#[test]
fn an_unproven_property_is_declared_or_fails() {
    use lock_conformance::{Outcome, Property};
    for (id, property) in [
        ("D4", Property::LossOnServerPause),
        ("E4", Property::TokensSurviveRestart),
    ] {
        let (result, _) = run(&Bare(lock_conformance::memory::MemoryHarness::new()), id);
        let Ok(Outcome::Skipped(skip)) = result else {
            panic!("{id} without a hook: {result:?}");
        };
        assert_eq!(
            skip.declared_capability,
            Some(property.capability()),
            "{id}"
        );
        assert_eq!(skip.declared_unproven, None, "{id}");

        let (result, _) = run(&lock_conformance::memory::MemoryHarness::new(), id);
        let Ok(Outcome::Skipped(skip)) = result else {
            panic!("{id} declared unproven: {result:?}");
        };
        assert_eq!(skip.declared_capability, None, "{id}");
        assert_eq!(skip.declared_unproven, Some(property), "{id}");
        assert!(
            skip.reason.contains("as the harness declares"),
            "{}",
            skip.reason
        );
    }
}
