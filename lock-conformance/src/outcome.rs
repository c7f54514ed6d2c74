//! What a case returns.

use std::fmt;

use lock_core::LockError;

use crate::harness::{FaultError, Harness, Property};

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
    /// The property the harness declared it cannot prove ([`Harness::unproven`]): the
    /// verdict reports the case as not proven, by the harness's word, rather than as a
    /// failure under `LOCK_CONFORMANCE_STRICT=1`.
    pub declared_unproven: Option<Property>,
}

impl Skip {
    /// A skip for `reason` that proves nothing and fails nothing.
    pub fn because(reason: impl Into<String>) -> Self {
        Skip {
            reason: reason.into(),
            declared_capability: None,
            declared_unproven: None,
        }
    }

    /// The backend does not declare `capability`: nothing to prove.
    pub fn not_declared(capability: &'static str) -> Self {
        Skip::because(format!("the backend does not declare {capability}"))
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
            declared_capability: declared,
            ..Skip::because(reason)
        }
    }

    /// The harness of `h` lacks the hooks that prove `property` of a capability the backend
    /// declares: not proven by the harness's declaration ([`Harness::unproven`]), else a
    /// failure under `LOCK_CONFORMANCE_STRICT=1`.
    pub fn unproven(h: &dyn Harness, property: Property) -> Self {
        let declared = h
            .unproven()
            .into_iter()
            .find(|unproven| unproven.property == property);
        match declared {
            Some(unproven) => Skip {
                declared_unproven: Some(property),
                ..Skip::because(format!(
                    "{property} ({}) is not proven, as the harness declares: {}",
                    property.capability(),
                    unproven.why
                ))
            },
            None => Skip {
                declared_capability: Some(property.capability()),
                ..Skip::because(format!(
                    "the harness offers no {} hook and does not declare {property} unproven, \
                     so the declared capability {} is not proven",
                    property.hooks(),
                    property.capability()
                ))
            },
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
