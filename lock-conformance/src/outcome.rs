//! What a case returns.

use std::fmt;

use lock_core::LockError;

use crate::harness::FaultError;

/// A case that did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Every check held.
    Passed,
    /// The case could not run against this backend or harness.
    Skipped(Skip),
}

/// Why a case was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Skip {
    /// Printed with the test's output.
    pub reason: String,
    /// The capability the backend *declares* whose case could not run (the harness lacks a
    /// hook). Under `LOCK_CONFORMANCE_STRICT=1` such a skip is a failure: a declared
    /// capability must be proven.
    pub declared_capability: Option<&'static str>,
}

impl Skip {
    /// The backend does not declare `capability`: nothing to prove.
    pub fn not_declared(capability: &'static str) -> Self {
        Skip {
            reason: format!("the backend does not declare {capability}"),
            declared_capability: None,
        }
    }

    /// The harness lacks `hook`. `declared` names the declared capability that this case
    /// would prove, if any.
    pub fn missing_hook(hook: &str, declared: Option<&'static str>) -> Self {
        let reason = match declared {
            Some(capability) => format!(
                "the harness offers no {hook} hook, so the declared capability {capability} is not proven here"
            ),
            None => format!("the harness offers no {hook} hook"),
        };
        Skip {
            reason,
            declared_capability: declared,
        }
    }
}

/// A broken invariant, with what was expected and what happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseFailure {
    /// The explanation.
    pub message: String,
}

impl CaseFailure {
    /// A failure with `message`.
    pub fn new(message: impl Into<String>) -> Self {
        CaseFailure {
            message: message.into(),
        }
    }
}

impl fmt::Display for CaseFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CaseFailure {}

impl From<LockError> for CaseFailure {
    fn from(error: LockError) -> Self {
        CaseFailure::new(format!("unexpected error: {error}"))
    }
}

impl From<FaultError> for CaseFailure {
    fn from(error: FaultError) -> Self {
        CaseFailure::new(error.to_string())
    }
}

/// What every case returns.
pub type CaseResult = Result<Outcome, CaseFailure>;

/// Adds what was being done to an error.
pub trait Context<T> {
    /// Wraps the error as a [`CaseFailure`] saying what failed.
    fn context(self, what: &str) -> Result<T, CaseFailure>;
}

impl<T, E: fmt::Display> Context<T> for Result<T, E> {
    fn context(self, what: &str) -> Result<T, CaseFailure> {
        self.map_err(|error| CaseFailure::new(format!("{what}: {error}")))
    }
}

/// Returns a [`CaseFailure`] from the enclosing case unless `condition` holds.
#[macro_export]
macro_rules! ensure {
    ($condition:expr, $($message:tt)+) => {
        if !$condition {
            return Err($crate::CaseFailure::new(format!($($message)+)));
        }
    };
}
