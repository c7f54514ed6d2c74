//! G. Names: unusual names are distinct locks or clear errors, never a panic or a collision.

use lock_core::{Guard, LockError, MAX_NAME_LEN};

use crate::ensure;
use crate::harness::Harness;
use crate::outcome::{CaseFailure, CaseResult, Outcome, Skip};
use crate::support::{no_residue, take, unique_name};

/// Names that look like paths, keys or internal nodes.
fn unusual_names() -> Vec<String> {
    let mut names: Vec<String> = [
        "ünïcødé ✓ 锁",
        "with spaces",
        " leading and trailing ",
        ".",
        "..",
        "/",
        "/leading/slash",
        "a/b",
        "a/../b",
        "a:b",
        "{braces}",
        "}{",
        "%2F",
        "*",
        "lock-0000000001",
        "_c_00000000-0000-0000-0000-000000000000-lock-0000000001",
        "__lock__0000000001",
        "zookeeper",
        "/zookeeper",
        "lock",
        "owner",
        "queue",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    names.push("x".repeat(MAX_NAME_LEN));
    names.push(format!("{}é", "y".repeat(MAX_NAME_LEN - 2)));
    names
}

/// G1: unusual but valid names either work as distinct locks or are rejected with
/// InvalidName — consistently, never a panic.
pub async fn g1_unusual_names(h: &dyn Harness) -> CaseResult {
    let (a, b) = (h.client().await?, h.client().await?);
    let mut held: Vec<(String, Guard)> = Vec::new();
    for name in unusual_names() {
        let first = a.provider.lock(&name);
        let second = b.provider.lock(&name);
        match (first, second) {
            (Ok(lock), Ok(other)) => {
                let guard = take(lock.as_ref(), &format!("unusual name {name:?}")).await?;
                ensure!(
                    other.try_acquire().await?.is_none(),
                    "{name:?} was free to another client while held"
                );
                held.push((name, guard));
            }
            (Err(LockError::InvalidName { reason, .. }), Err(LockError::InvalidName { .. })) => {
                ensure!(
                    !reason.to_string().is_empty(),
                    "{name:?} rejected without a reason"
                );
            }
            (first, second) => {
                return Err(CaseFailure::new(format!(
                    "{name:?} handled inconsistently or with the wrong error: {:?} / {:?}",
                    first.map(|_| "ok"),
                    second.map(|_| "ok")
                )));
            }
        }
    }
    // All held at once: none of them collided with another.
    for (name, mut guard) in held {
        if let Some(reason) = guard.lost().reason() {
            return Err(CaseFailure::new(format!(
                "holding {name:?} alongside the others lost it ({reason})"
            )));
        }
        guard.release().await?;
        no_residue(h, &name, &format!("after releasing {name:?}")).await?;
    }
    Ok(Outcome::Passed)
}

/// G2: names are case-sensitive.
pub async fn g2_case_sensitive(h: &dyn Harness) -> CaseResult {
    let base = unique_name("g2");
    let (upper, lower) = (format!("{base}-CASE"), format!("{base}-case"));
    let (a, b) = (h.client().await?, h.client().await?);
    let mut one = take(a.provider.lock(&upper)?.as_ref(), "upper-case name").await?;
    let mut two = take(
        b.provider.lock(&lower)?.as_ref(),
        "lower-case name while the upper-case one is held",
    )
    .await?;
    one.release().await?;
    two.release().await?;
    Ok(Outcome::Passed)
}

/// G3: empty, NUL-containing and over-limit names: InvalidName with the reason.
pub async fn g3_invalid_names(h: &dyn Harness) -> CaseResult {
    let a = h.client().await?;
    let over = "z".repeat(MAX_NAME_LEN + 1);
    for (name, expect) in [
        ("", "empty"),
        ("nul\0inside", "NUL"),
        (over.as_str(), "limit"),
    ] {
        match a.provider.lock(name) {
            Err(LockError::InvalidName { reason, .. }) => {
                let text = reason.to_string();
                ensure!(
                    text.contains(expect),
                    "the reason for {:?} does not say {expect:?}: {text}",
                    name.get(..20).unwrap_or(name)
                );
            }
            Err(other) => {
                return Err(CaseFailure::new(format!(
                    "expected InvalidName, got {other}"
                )));
            }
            Ok(_) => {
                return Err(CaseFailure::new(format!(
                    "the invalid name {:?} was accepted",
                    name.get(..20).unwrap_or(name)
                )));
            }
        }
    }
    Ok(Outcome::Passed)
}

/// G4: two providers with different roots/prefixes never interfere.
pub async fn g4_namespaces_are_isolated(h: &dyn Harness) -> CaseResult {
    let Some(other) = h.client_in_other_namespace().await else {
        return Ok(Outcome::Skipped(Skip::missing_hook(
            "client_in_other_namespace",
            None,
        )));
    };
    let other = other?;
    let name = unique_name("g4");
    let a = h.client().await?;
    let mut here = take(
        a.provider.lock(&name)?.as_ref(),
        "holder in the first namespace",
    )
    .await?;
    let mut there = take(
        other.provider.lock(&name)?.as_ref(),
        "the same name in another namespace",
    )
    .await?;
    here.release().await?;
    there.release().await?;
    Ok(Outcome::Passed)
}
