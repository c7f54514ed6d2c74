//! Redis and Redis Sentinel in containers (feature `testcontainers`).

use std::time::Duration;

use testcontainers::{GenericImage, ImageExt};

use super::{RedisOptions, redis_url};
use crate::servers::ServerError;
use crate::servers::containers::{
    Container, DEFAULT_REDIS_IMAGE, REDIS_IMAGE_ENV, Redis, Sentinel, ServerSpec, on_free_port,
};
use crate::servers::probe::Probe;

impl Container<Redis> {
    /// Starts the image from [`REDIS_IMAGE_ENV`] (default [`DEFAULT_REDIS_IMAGE`]) with the
    /// password and ACL user of `opts`, and waits (bounded by `opts.startup_timeout`) until
    /// it answers `PING`. `opts.binary` is ignored.
    pub async fn start(opts: &RedisOptions) -> Result<Self, ServerError> {
        Self::start_with(opts, None).await
    }

    /// Starts the image from [`REDIS_IMAGE_ENV`] on the host's network, serving on
    /// `127.0.0.1:port`, with the password, ACL user and arguments of `opts`, and waits
    /// (bounded by `opts.startup_timeout`) until it answers `PING`: a data server of a
    /// [`RedisSentinelSet`](super::RedisSentinelSet) in containers, whose addresses the
    /// sentinels pass on to clients.
    /// A port taken meanwhile (the server exits) is replaced by another, a few times.
    pub async fn start_on_host(opts: &RedisOptions, port: u16) -> Result<Self, ServerError> {
        on_free_port(port, |port| Self::start_with(opts, Some(port))).await
    }

    /// Starts the image on its own network, its port 6379 published on a free loopback
    /// port; or with `host_port`, on the host's network serving on `127.0.0.1:host_port`.
    async fn start_with(opts: &RedisOptions, host_port: Option<u16>) -> Result<Self, ServerError> {
        let (port, bind) = match host_port {
            Some(port) => (port, "127.0.0.1"),
            None => (6379, "0.0.0.0"),
        };
        let port_arg = port.to_string();
        let mut cmd: Vec<String> = [
            "redis-server",
            "--port",
            &port_arg,
            "--bind",
            bind,
            "--protected-mode",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        .map(String::from)
        .to_vec();
        cmd.extend(opts.server_args());
        let kind = Redis {
            password: opts.password.clone(),
        };
        let spec = ServerSpec {
            server: "Redis".to_owned(),
            image: (REDIS_IMAGE_ENV, DEFAULT_REDIS_IMAGE),
            internal: port,
            probe: Probe::RedisPing {
                password: opts.password.clone(),
            },
            startup_timeout: opts.startup_timeout,
            host_port,
        };
        Self::launch(
            spec,
            |image: GenericImage| image.with_cmd(cmd.clone()),
            kind,
        )
        .await
    }

    /// `redis://[:password@]127.0.0.1:port`.
    pub fn url(&self) -> String {
        redis_url(
            "127.0.0.1",
            self.port(),
            None,
            self.kind.password.as_deref(),
        )
    }
}

impl Container<Sentinel> {
    /// Starts a Redis Sentinel from the image of [`REDIS_IMAGE_ENV`] on the host's network,
    /// serving on `127.0.0.1:port`, from the configuration `config` (written to a file in
    /// the container, which the sentinel rewrites as it learns; its `dir` should be
    /// `/tmp`), and waits (bounded by `startup_timeout`) until it answers `PING`.
    pub async fn start_on_host(
        config: impl Fn(u16) -> String,
        port: u16,
        startup_timeout: Duration,
    ) -> Result<Self, ServerError> {
        // A restarted container keeps the file its sentinel rewrote (what it learned).
        let script = "[ -s /tmp/sentinel.conf ] || printf '%s' \"$SENTINEL_CONF\" > \
                      /tmp/sentinel.conf; exec redis-server /tmp/sentinel.conf --sentinel";
        on_free_port(port, |port| {
            let config = config(port);
            let configure = move |image: GenericImage| {
                image
                    .with_env_var("SENTINEL_CONF", config.clone())
                    .with_cmd(["sh", "-c", script])
            };
            let spec = ServerSpec {
                server: "Redis Sentinel".to_owned(),
                image: (REDIS_IMAGE_ENV, DEFAULT_REDIS_IMAGE),
                internal: port,
                probe: Probe::RedisPing { password: None },
                startup_timeout,
                host_port: Some(port),
            };
            Self::launch(spec, configure, Sentinel)
        })
        .await
    }
}
