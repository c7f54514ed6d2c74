//! [`ServerMode`]: where the tests' servers run, chosen by [`SERVERS_ENV`].

use super::ServerError;

/// The environment variable choosing where the tests' servers run: `processes` (the
/// default) or `containers` (needs the `testcontainers` feature and a container engine
/// with the image `scripts/ensure-docker` builds).
pub const SERVERS_ENV: &str = "LOCK_TEST_SERVERS";

/// Where [`Target::start`](super::Target::start) runs a server.
///
/// ```
/// use lock_testbed::servers::ServerMode;
///
/// // `LOCK_TEST_SERVERS` unset or empty: processes.
/// # if std::env::var_os("LOCK_TEST_SERVERS").is_none() {
/// assert_eq!(ServerMode::from_env().unwrap(), ServerMode::Processes);
/// # }
/// assert_eq!(ServerMode::parse("containers").unwrap(), ServerMode::Containers);
/// assert!(ServerMode::parse("vms").is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerMode {
    /// Child processes of the test, on free loopback ports: fast, and what the fault tests
    /// that signal a server's pid use.
    Processes,
    /// Containers of the image `containers::DEFAULT_IMAGE` (feature `testcontainers`),
    /// their client ports published on loopback; faults go
    /// through the engine (`docker pause`, a killed and restarted container).
    Containers,
}

impl ServerMode {
    /// The mode [`SERVERS_ENV`] names; [`ServerMode::Processes`] when it is unset or empty.
    pub fn from_env() -> Result<Self, ServerError> {
        match std::env::var(SERVERS_ENV) {
            Ok(value) => Self::parse(&value),
            Err(_) => Ok(Self::Processes),
        }
    }

    /// `processes` or `containers` (white space around it ignored; empty is `processes`).
    pub fn parse(value: &str) -> Result<Self, ServerError> {
        match value.trim() {
            "" | "processes" => Ok(Self::Processes),
            "containers" => Ok(Self::Containers),
            other => Err(ServerError::InvalidSetting {
                variable: SERVERS_ENV.to_owned(),
                value: other.to_owned(),
                expected: "`processes` or `containers`".to_owned(),
            }),
        }
    }
}
