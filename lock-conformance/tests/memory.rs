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
