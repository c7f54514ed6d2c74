//! How a stamped test runs a case and reports its outcome.

use std::cell::RefCell;
use std::future::Future;
use std::io::Write;

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

/// The environment variable naming a directory where every stamped test records its
/// case's outcome, one line per case, for a tally after the run (`scripts/test` prints
/// one). Each test process writes `<pid>.tsv` there: the harness (the package and the
/// module the tests were stamped in), the case's id and name, `passed`, `unchecked` (passed
/// with checks not made), `unproven` (a property the harness declares it cannot prove),
/// `skipped` or `failed`, and the reason.
pub const REPORT_ENV: &str = "LOCK_CONFORMANCE_REPORT";

tokio::task_local! {
    /// The checks the running case could not make (see [`not_checked`]).
    static NOT_CHECKED: RefCell<Vec<&'static str>>;
}

/// Notes that the running case could not make `check` for lack of a harness hook (the
/// residue checks without an [`Inspector`](crate::Inspector)): the case still passes on
/// what it could check, the verdict says what it could not, and under
/// [`STRICT_ENV`] the case fails.
pub(crate) fn not_checked(check: &'static str) {
    let _ = NOT_CHECKED.try_with(|notes| {
        let mut notes = notes.borrow_mut();
        if !notes.contains(&check) {
            notes.push(check);
        }
    });
}

/// Runs a case's future, collecting the checks it could not make.
#[doc(hidden)]
pub async fn run_case<F: Future<Output = CaseResult>>(case: F) -> (CaseResult, Vec<&'static str>) {
    NOT_CHECKED
        .scope(RefCell::new(Vec::new()), async {
            let result = case.await;
            (result, NOT_CHECKED.with(RefCell::take))
        })
        .await
}

/// A stamped test's case, to be concluded: dropped before [`conclude`](Self::conclude) (a
/// panic while the harness was made or the case ran), it records the case as failed, so
/// that the verdict's tally agrees with the test's.
#[doc(hidden)]
#[derive(Debug)]
pub struct Recording {
    harness: &'static str,
    id: &'static str,
    name: &'static str,
    concluded: bool,
}

impl Recording {
    /// The case `id` (`name`) of `harness`, not yet concluded.
    pub fn new(harness: &'static str, id: &'static str, name: &'static str) -> Self {
        Recording {
            harness,
            id,
            name,
            concluded: false,
        }
    }

    /// Concludes the case: see [`conclude`].
    pub fn conclude(mut self, result: CaseResult, not_checked: &[&'static str]) {
        self.concluded = true;
        conclude(self.harness, self.id, self.name, result, not_checked);
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        if !self.concluded {
            record(
                self.harness,
                self.id,
                self.name,
                "failed",
                "panicked before the case concluded",
            );
        }
    }
}

/// Turns a case's result into the test's result: panics on failures and, in strict mode,
/// on skips of declared capabilities and on checks not made; records the outcome (see
/// [`REPORT_ENV`]).
///
/// A skip is written straight to the process's standard error, past the test harness's
/// capture, so that it shows between the passing tests instead of being hidden with
/// their output: a skipped case is no proof, and must not look like one.
#[allow(
    clippy::panic,
    reason = "this is the test runner: a failed case must fail the test"
)]
fn conclude(harness: &str, id: &str, name: &str, result: CaseResult, not_checked: &[&'static str]) {
    match result {
        Ok(Outcome::Passed) if not_checked.is_empty() => {
            record(harness, id, name, "passed", "");
        }
        Ok(Outcome::Passed) => {
            let reason = format!("not checked: {}", not_checked.join(", "));
            if strict() {
                record(harness, id, name, "failed", &reason);
                panic!("{id} {name}: under {STRICT_ENV}=1 every check must be made; {reason}");
            }
            record(harness, id, name, "unchecked", &reason);
            let _ = writeln!(
                std::io::stderr().lock(),
                "lock-conformance: PASSED WITH CHECKS NOT MADE {id} {name} ({harness}): {reason}"
            );
        }
        Ok(Outcome::Skipped(skip)) if skip.declared_unproven.is_some() => {
            record(harness, id, name, "unproven", &skip.reason);
            // Past the capture: see above. A failed write loses only the notice.
            let _ = writeln!(
                std::io::stderr().lock(),
                "lock-conformance: NOT PROVEN (declared by the harness) {id} {name} ({harness}): {}",
                skip.reason
            );
        }
        Ok(Outcome::Skipped(skip)) => {
            let strict_failure = skip.declared_capability.filter(|_| strict());
            let outcome = if strict_failure.is_some() {
                "failed"
            } else {
                "skipped"
            };
            record(harness, id, name, outcome, &skip.reason);
            if let Some(capability) = strict_failure {
                panic!(
                    "{id} {name}: skipped under {STRICT_ENV}=1 although the backend declares {capability}: {}",
                    skip.reason
                );
            }
            // Past the capture: see above. A failed write loses only the notice.
            let _ = writeln!(
                std::io::stderr().lock(),
                "lock-conformance: SKIPPED {id} {name} ({harness}): {}",
                skip.reason
            );
        }
        Err(failure) => {
            record(harness, id, name, "failed", &failure.to_string());
            panic!("{id} {name} failed: {failure}");
        }
    }
}

/// Appends one line to this process's report file, if [`REPORT_ENV`] names a directory.
/// One write per line, in append mode: the lines of parallel tests do not interleave.
fn record(harness: &str, id: &str, name: &str, outcome: &str, reason: &str) {
    let Some(dir) = std::env::var_os(REPORT_ENV) else {
        return;
    };
    let clean = |text: &str| text.replace(['\t', '\n', '\r'], " ");
    let line = format!(
        "{}\t{id}\t{name}\t{outcome}\t{}\n",
        clean(harness),
        clean(reason)
    );
    let path = std::path::Path::new(&dir).join(format!("{}.tsv", std::process::id()));
    let written = std::fs::create_dir_all(&dir).and_then(|()| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?
            .write_all(line.as_bytes())
    });
    if let Err(error) = written {
        tracing::warn!(path = %path.display(), %error, "lock-conformance: cannot record an outcome");
    }
}

/// The environment variable that narrows a
/// [`conformance_suite!`](crate::conformance_suite!) run to some cases: their ids or names,
/// comma-separated (`A7,b1_timeout_bounds`).
pub const CASES_ENV: &str = "LOCK_CONFORMANCE_CASES";

/// The environment variable that overrides how many cases a
/// [`conformance_suite!`](crate::conformance_suite!) runs at once (for a runner that
/// already runs several suites side by side).
pub const AT_ONCE_ENV: &str = "LOCK_CONFORMANCE_AT_ONCE";

/// The environment variable that sets how many rounds each client of case M1 takes its sets
/// (100 for the two clients asking in opposite orders, 20 for the five asking at random, by
/// default): `LOCK_CONFORMANCE_CASES=M1 LOCK_CONFORMANCE_MULTI_ROUNDS=200` is the long
/// run of five clients taking random sets over four names.
pub const MULTI_ROUNDS_ENV: &str = "LOCK_CONFORMANCE_MULTI_ROUNDS";

/// The rounds [`MULTI_ROUNDS_ENV`] asks for, or `default`.
pub(crate) fn multi_rounds(default: usize) -> usize {
    std::env::var(MULTI_ROUNDS_ENV)
        .ok()
        .and_then(|rounds| rounds.trim().parse().ok())
        .filter(|&rounds| rounds > 0)
        .unwrap_or(default)
}

/// Runs every case of the suite (or those [`CASES_ENV`] names), each on a harness of its
/// own that `make` builds, `at_once` at a time (or as [`AT_ONCE_ENV`] says), one suite at a
/// time in a process, and records each as a stamped test's; then fails naming the cases
/// that failed. See
/// [`conformance_suite!`](crate::conformance_suite!).
#[doc(hidden)]
#[allow(
    clippy::panic,
    reason = "this is the test runner: a failed case must fail the test"
)]
pub fn run_suite<H, M, F>(harness: &'static str, at_once: usize, make: M)
where
    H: crate::Harness + 'static,
    M: Fn() -> F + Send + Sync + 'static,
    F: Future<Output = H> + Send + 'static,
{
    let wanted: Option<Vec<String>> = std::env::var(CASES_ENV).ok().map(|cases| {
        cases
            .split(',')
            .map(|case| case.trim().to_owned())
            .collect()
    });
    // One suite at a time in a process: the cases of two suites (two strategies of one
    // backend, say) on one server would meet, since some cases use fixed names (G1).
    static ONE_SUITE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_suite = ONE_SUITE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let at_once = std::env::var(AT_ONCE_ENV)
        .ok()
        .and_then(|at_once| at_once.trim().parse().ok())
        .unwrap_or(at_once);
    let make = std::sync::Arc::new(make);
    let failed = block_on(async move {
        let turns = std::sync::Arc::new(tokio::sync::Semaphore::new(at_once.max(1)));
        let mut running = tokio::task::JoinSet::new();
        let cases = crate::cases::CASES.iter().filter(|case| {
            wanted.as_ref().is_none_or(|wanted| {
                wanted
                    .iter()
                    .any(|one| case.id.eq_ignore_ascii_case(one) || case.name == one)
            })
        });
        for case in cases {
            let (turns, make) = (std::sync::Arc::clone(&turns), std::sync::Arc::clone(&make));
            running.spawn(async move {
                let _turn = turns.acquire_owned().await;
                // A task of its own, so that a failed case (a panic) is this case's alone.
                let ran = tokio::spawn(async move {
                    let recording = Recording::new(harness, case.id, case.name);
                    let harness = make().await;
                    let (result, not_checked) = run_case((case.run)(&harness)).await;
                    recording.conclude(result, &not_checked);
                });
                ran.await.err().map(|_| case.name)
            });
        }
        let mut failed = Vec::new();
        while let Some(done) = running.join_next().await {
            if let Ok(Some(name)) = done {
                failed.push(name);
            }
        }
        failed
    });
    if !failed.is_empty() {
        panic!("{harness}: failed cases {failed:?} (their panics are above)");
    }
}

/// Stamps one test, `conformance_suite`, that runs every case of the suite for a harness,
/// `at_once` cases at a time, each on a harness of its own (the second argument, evaluated
/// in an async block, as [`conformance_tests!`](crate::conformance_tests!)'s). For suites
/// whose cases wait on servers and timers far more than they compute; each case is
/// recorded for the verdict as a stamped test's, and [`CASES_ENV`] runs some of them only.
///
/// ```
/// lock_conformance::conformance_suite!(4, lock_conformance::memory::MemoryHarness::new());
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! conformance_suite {
    ($at_once:expr, $make:expr) => {
        /// Every case of the conformance suite, side by side.
        #[test]
        fn conformance_suite() {
            $crate::runner::run_suite(
                concat!(env!("CARGO_PKG_NAME"), " ", module_path!()),
                $at_once,
                || async { $make },
            );
        }
    };
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
                let recording = $crate::runner::Recording::new(
                    concat!(env!("CARGO_PKG_NAME"), " ", module_path!()),
                    $id,
                    stringify!($case),
                );
                $crate::runner::block_on(async {
                    let harness = $make;
                    let (result, not_checked) =
                        $crate::runner::run_case($crate::cases::$group::$case(&harness)).await;
                    recording.conclude(result, &not_checked);
                });
            }
        )*
    };
}
