//! How a stamped test runs a case and reports its outcome.

use std::future::Future;

use crate::outcome::{CaseResult, Outcome};

/// The environment variable that turns a skip of a declared capability into a failure.
pub const STRICT_ENV: &str = "LOCK_CONFORMANCE_STRICT";

/// Whether `LOCK_CONFORMANCE_STRICT` is set to a true value.
pub fn strict() -> bool {
    std::env::var(STRICT_ENV).is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes" | "on"))
}

/// Runs `future` on a fresh multi-threaded runtime, as `#[tokio::test]` would.
#[doc(hidden)]
pub fn block_on<F: Future>(future: F) -> F::Output {
    #[allow(clippy::expect_used, reason = "a test cannot run without its runtime")]
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("the conformance suite needs a tokio runtime");
    runtime.block_on(future)
}

/// Turns a case's result into the test's result: prints skips, panics on failures and, in
/// strict mode, on skips of declared capabilities.
#[doc(hidden)]
#[allow(
    clippy::panic,
    clippy::print_stderr,
    reason = "this is the test runner: a failed case must fail the test, a skip must be seen"
)]
pub fn conclude(id: &str, name: &str, result: CaseResult) {
    match result {
        Ok(Outcome::Passed) => {}
        Ok(Outcome::Skipped(skip)) => {
            if let Some(capability) = skip.declared_capability
                && strict()
            {
                panic!(
                    "{id} {name}: skipped under {STRICT_ENV}=1 although the backend declares {capability}: {}",
                    skip.reason
                );
            }
            eprintln!("lock-conformance: {id} {name} skipped: {}", skip.reason);
        }
        Err(failure) => panic!("{id} {name} failed: {failure}"),
    }
}

/// Stamps one test per case of the suite for a harness.
///
/// The argument is an expression, evaluated inside each test's async body (so it may
/// `.await`), that yields a value implementing [`Harness`](crate::Harness):
///
/// ```
/// // In a test file: one test per case against the in-memory reference backend.
/// lock_conformance::conformance_tests!(lock_conformance::memory::MemoryHarness::new());
/// # fn main() {}
/// ```
///
/// Each test is named after its case (`a1_try_acquire_free`, …) so that `cargo test a7`
/// runs one behaviour. Put the invocation in a test module of its own, or inside a `mod`,
/// when a test binary checks several harnesses.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::__with_cases!(__stamp_tests($make));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __stamp_tests {
    (($make:expr) $($group:ident :: $case:ident => $id:literal, $summary:literal;)*) => {
        $(
            #[doc = $summary]
            #[test]
            fn $case() {
                $crate::runner::block_on(async {
                    let harness = $make;
                    let result = $crate::cases::$group::$case(&harness).await;
                    $crate::runner::conclude($id, stringify!($case), result);
                });
            }
        )*
    };
}
