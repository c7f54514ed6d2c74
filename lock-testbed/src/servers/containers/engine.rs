//! The container engine: where it is, whether it answers, whether it has an image.

use std::path::PathBuf;
use std::time::Duration;

use testcontainers::bollard::errors::Error as BollardError;
use testcontainers::bollard::{API_DEFAULT_VERSION, Docker};
use tracing::debug;

use super::{DEFAULT_IMAGE, container_error};
use crate::servers::{
    EtcdOptions, PostgresOptions, RedisOptions, ServerError, ServerSpec, ZkOptions,
};

/// The bound on asking the engine whether it is there.
const ENGINE_PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Where a container engine is expected: `DOCKER_HOST`, or the usual socket paths.
///
/// ```no_run
/// use lock_testbed::servers::containers::ContainerEngine;
///
/// # async fn demo() -> Result<(), lock_testbed::servers::ServerError> {
/// let engine = ContainerEngine::from_env()?;
/// engine.check().await?; // NoContainerEngine when nothing answers
/// let present = engine.has_image("redis", "7").await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ContainerEngine {
    address: EngineAddress,
}

#[derive(Debug, Clone)]
enum EngineAddress {
    Unix(PathBuf),
    Tcp(String),
    /// A scheme this module cannot probe (e.g. `ssh://`): left to testcontainers.
    Other(String),
}

impl ContainerEngine {
    /// The engine `DOCKER_HOST` names, or the first Docker socket that exists;
    /// [`ServerError::NoContainerEngine`] when there is neither.
    pub fn from_env() -> Result<Self, ServerError> {
        if let Ok(host) = std::env::var("DOCKER_HOST")
            && !host.trim().is_empty()
        {
            return Ok(Self::at(&host));
        }
        let mut candidates = vec![PathBuf::from("/var/run/docker.sock")];
        if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR") {
            candidates.push(PathBuf::from(runtime).join(".docker/run/docker.sock"));
        }
        if let Some(home) = std::env::var_os("HOME") {
            let home = PathBuf::from(home);
            candidates.push(home.join(".docker/run/docker.sock"));
            candidates.push(home.join(".docker/desktop/docker.sock"));
        }
        match candidates.iter().find(|p| p.exists()) {
            Some(path) => Ok(Self {
                address: EngineAddress::Unix(path.clone()),
            }),
            None => Err(ServerError::NoContainerEngine {
                detail: format!(
                    "DOCKER_HOST is not set and no Docker socket exists (looked for {})",
                    candidates
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        }
    }

    /// The engine at `docker_host`, written as `DOCKER_HOST` would be (`unix:///path`,
    /// `tcp://host:port`).
    pub fn at(docker_host: &str) -> Self {
        let host = docker_host.trim();
        let address = if let Some(path) = host.strip_prefix("unix://") {
            EngineAddress::Unix(PathBuf::from(path))
        } else if let Some(addr) = host.strip_prefix("tcp://") {
            EngineAddress::Tcp(addr.trim_end_matches('/').to_owned())
        } else {
            EngineAddress::Other(host.to_owned())
        };
        Self { address }
    }

    /// A client of the engine whose requests are bounded by [`ENGINE_PROBE_TIMEOUT`]; `None`
    /// for an address this module cannot speak to, which is left to testcontainers.
    fn client(&self) -> Result<Option<Docker>, ServerError> {
        let timeout = ENGINE_PROBE_TIMEOUT.as_secs();
        let client = match &self.address {
            EngineAddress::Unix(socket) => {
                Docker::connect_with_unix(&socket.to_string_lossy(), timeout, API_DEFAULT_VERSION)
            }
            EngineAddress::Tcp(addr) => {
                let url = format!("tcp://{addr}");
                Docker::connect_with_http(&url, timeout, API_DEFAULT_VERSION)
            }
            EngineAddress::Other(host) => {
                debug!(%host, "cannot probe this DOCKER_HOST scheme; leaving it to testcontainers");
                return Ok(None);
            }
        };
        client
            .map(Some)
            .map_err(|error| self.no_engine(format!("cannot be spoken to: {error}")))
    }

    fn no_engine(&self, why: String) -> ServerError {
        ServerError::NoContainerEngine {
            detail: format!("{:?} {why}", self.address),
        }
    }

    /// Checks, within a few seconds, that the engine answers a ping;
    /// [`ServerError::NoContainerEngine`] (with where it looked) otherwise.
    pub async fn check(&self) -> Result<(), ServerError> {
        debug!(engine = ?self.address, "probing the container engine");
        let Some(docker) = self.client()? else {
            return Ok(());
        };
        match tokio::time::timeout(ENGINE_PROBE_TIMEOUT, docker.ping()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(self.no_engine(format!("does not answer a ping: {error}"))),
            Err(_) => Err(self.no_engine(format!(
                "did not answer a ping within {ENGINE_PROBE_TIMEOUT:?}"
            ))),
        }
    }

    /// Whether the engine has the image `name:tag` locally (`true` where this module cannot
    /// ask). This module starts a container only after this check, so it never asks the
    /// engine to pull: a missing image is [`ServerError::MissingImage`].
    pub async fn has_image(&self, name: &str, tag: &str) -> Result<bool, ServerError> {
        let Some(docker) = self.client()? else {
            return Ok(true);
        };
        let image = format!("{name}:{tag}");
        match tokio::time::timeout(ENGINE_PROBE_TIMEOUT, docker.inspect_image(&image)).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(BollardError::DockerResponseServerError {
                status_code: 404, ..
            })) => Ok(false),
            Ok(Err(BollardError::DockerResponseServerError {
                status_code,
                message,
            })) => Err(container_error(format!(
                "the engine answered {status_code} when asked for the image {image}: {message}"
            ))),
            Ok(Err(error)) => Err(self.no_engine(format!("does not answer: {error}"))),
            Err(_) => Err(self.no_engine(format!(
                "did not answer about the image {image} within {ENGINE_PROBE_TIMEOUT:?}"
            ))),
        }
    }
}

impl ContainerEngine {
    /// The image named by `image` (`(variable, default)`, see [`image_from_env`]) as
    /// `(name, tag)`; [`ServerError::MissingImage`] when the engine lacks it.
    pub(crate) async fn require_image(
        &self,
        image: (&str, &str),
    ) -> Result<(String, String), ServerError> {
        let (name, tag) = image_from_env(image.0, image.1);
        if self.has_image(&name, &tag).await? {
            Ok((name, tag))
        } else {
            Err(ServerError::MissingImage {
                image: format!("{name}:{tag}"),
                hint: IMAGE_HINT.to_owned(),
            })
        }
    }
}

/// Checks, within a few seconds, that servers can run in containers here: an engine answers
/// (else [`ServerError::NoContainerEngine`]) and has the ZooKeeper, Redis, etcd and
/// PostgreSQL images (else [`ServerError::MissingImage`]). Tests skip with the error as the reason, except under
/// `LOCK_CONFORMANCE_STRICT`.
///
/// ```no_run
/// # async fn demo() {
/// if let Err(why) = lock_testbed::servers::containers::check_ready().await {
///     eprintln!("skipped: {why}");
/// }
/// # }
/// ```
pub async fn check_ready() -> Result<(), ServerError> {
    let engine = ContainerEngine::from_env()?;
    engine.check().await?;
    for variable in [
        ZkOptions::IMAGE_ENV,
        RedisOptions::IMAGE_ENV,
        EtcdOptions::IMAGE_ENV,
        PostgresOptions::IMAGE_ENV,
    ] {
        engine.require_image((variable, DEFAULT_IMAGE)).await?;
    }
    Ok(())
}

/// How to get a missing image, for [`ServerError::MissingImage`].
const IMAGE_HINT: &str = "build the default image with scripts/ensure-docker (in the distlock \
    repository), or name an image the engine has, laid out as Debian's packages, in \
    LOCK_TEST_ZK_IMAGE / LOCK_TEST_REDIS_IMAGE / LOCK_TEST_ETCD_IMAGE / LOCK_TEST_POSTGRES_IMAGE";

/// Checks, within a few seconds, that the container engine found by
/// [`ContainerEngine::from_env`] answers `GET /_ping`.
///
/// Returns [`ServerError::NoContainerEngine`] (with where it looked) otherwise.
pub async fn check_engine() -> Result<(), ServerError> {
    ContainerEngine::from_env()?.check().await
}

/// Splits `name[:tag]` (a registry `host:port/` prefix is not mistaken for a tag).
fn image_from_env(var: &str, default: &str) -> (String, String) {
    let spec = std::env::var(var)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| default.to_owned());
    let spec = spec.trim();
    let slash = spec.rfind('/').map_or(0, |i| i + 1);
    match spec[slash..].rfind(':') {
        Some(colon) => {
            let at = slash + colon;
            (spec[..at].to_owned(), spec[at + 1..].to_owned())
        }
        None => (spec.to_owned(), "latest".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::image_from_env;

    #[test]
    fn image_spec_parsing() {
        let parse = |spec: &str| image_from_env("LOCK_CONFORMANCE_UNSET_IMAGE_VAR", spec);
        assert_eq!(parse("redis:7"), ("redis".into(), "7".into()));
        assert_eq!(parse("redis"), ("redis".into(), "latest".into()));
        assert_eq!(
            parse("reg.example:5000/zk/zookeeper:3.8"),
            ("reg.example:5000/zk/zookeeper".into(), "3.8".into())
        );
        assert_eq!(
            parse("reg.example:5000/redis"),
            ("reg.example:5000/redis".into(), "latest".into())
        );
    }
}
