//! The whole suite against the in-memory reference backend.

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

/// The reference harness without its inspector: what a harness that cannot look at the
/// server gets.
struct WithoutInspector(lock_conformance::memory::MemoryHarness);

#[lock_conformance::async_trait]
impl lock_conformance::Harness for WithoutInspector {
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

/// A residue check that cannot be made is reported, not passed in silence.
#[test]
fn a_check_not_made_is_reported() {
    let harness = WithoutInspector(lock_conformance::memory::MemoryHarness::new());
    let b4 = lock_conformance::cases::find("B4").expect("B4");
    let (result, not_checked) =
        lock_conformance::runner::block_on(lock_conformance::runner::run_case((b4.run)(&harness)));
    assert!(
        matches!(result, Ok(lock_conformance::Outcome::Passed)),
        "{result:?}"
    );
    assert_eq!(
        not_checked,
        ["what the server records (the harness has no inspector)"]
    );
    // With the inspector, B4 makes every check.
    let harness = lock_conformance::memory::MemoryHarness::new();
    let (_, not_checked) =
        lock_conformance::runner::block_on(lock_conformance::runner::run_case((b4.run)(&harness)));
    assert!(not_checked.is_empty(), "{not_checked:?}");
}

/// The reference harness without its declarations of what it cannot prove.
struct WithoutDeclarations(lock_conformance::memory::MemoryHarness);

#[lock_conformance::async_trait]
impl lock_conformance::Harness for WithoutDeclarations {
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

/// A property of a declared capability that no hook proves is a failure under STRICT unless
/// the harness declares it unproven, and then the skip says so and fails nothing.
#[test]
fn an_unproven_property_is_declared_or_fails() {
    use lock_conformance::{Outcome, Property};
    for (id, property) in [
        ("D4", Property::LossOnServerPause),
        ("E4", Property::TokensSurviveRestart),
    ] {
        let case = lock_conformance::cases::find(id).expect("the case");
        let undeclared = WithoutDeclarations(lock_conformance::memory::MemoryHarness::new());
        let (result, _) = lock_conformance::runner::block_on(lock_conformance::runner::run_case(
            (case.run)(&undeclared),
        ));
        let Ok(Outcome::Skipped(skip)) = result else {
            panic!("{id} without a hook: {result:?}");
        };
        assert_eq!(
            skip.declared_capability,
            Some(property.capability()),
            "{id}"
        );
        assert_eq!(skip.declared_unproven, None, "{id}");

        let declared = lock_conformance::memory::MemoryHarness::new();
        let (result, _) = lock_conformance::runner::block_on(lock_conformance::runner::run_case(
            (case.run)(&declared),
        ));
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
