//! ZooKeeper in containers (feature `testcontainers`): one server, or an ensemble on a
//! network of its own, from the same `zoo.cfg` a process gets.

use std::path::Path;
use std::time::Duration;

use testcontainers::{ContainerRequest, GenericImage, ImageExt};

use super::{MAIN_CLASS, ZkOptions, zoo_cfg};
use crate::servers::ServerError;
use crate::servers::containers::{
    ClusterNetwork, Container, DEFAULT_ZK_IMAGE, ServerSpec, ZK_IMAGE_ENV, ZkContainer, ZooKeeper,
    host_name,
};
use crate::servers::members::Members;
use crate::servers::probe::{Probe, four_letter};

/// The quorum and election ports of a member on the ensemble's network.
const QUORUM_PORT: u16 = 2888;
const ELECTION_PORT: u16 = 3888;

/// ZooKeeper's class path in an image laid out as Debian's packages.
const CONTAINER_ZK_CLASSPATH: &str =
    "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar";

/// Where ZooKeeper keeps its data in a container (it survives a restart of the container).
const ZK_DATA_DIR: &str = "/var/tmp/zookeeper";

/// The command line of a ZooKeeper container: `prelude`, then write the configuration (it
/// travels in the environment, `ZOO_CFG`) and run the server with `opts.jvm_args`.
fn zk_script(opts: &ZkOptions, prelude: &str) -> String {
    format!(
        "{prelude}mkdir -p {ZK_DATA_DIR} && printf '%s' \"$ZOO_CFG\" > /etc/zoo.cfg && \
         exec java {} -cp {CONTAINER_ZK_CLASSPATH} {MAIN_CLASS} /etc/zoo.cfg",
        opts.jvm_args.join(" ")
    )
}

fn zk_spec(server: String, opts: &ZkOptions) -> ServerSpec {
    ServerSpec {
        server,
        image: (ZK_IMAGE_ENV, DEFAULT_ZK_IMAGE),
        internal: 2181,
        probe: Probe::ZkServing,
        startup_timeout: opts.startup_timeout,
        host_port: None,
    }
}

fn zk_configure(
    cfg: String,
    script: String,
) -> impl Fn(GenericImage) -> ContainerRequest<GenericImage> {
    move |image: GenericImage| {
        image.with_env_var("ZOO_CFG", cfg.clone()).with_cmd([
            "sh".to_owned(),
            "-c".to_owned(),
            script.clone(),
        ])
    }
}

impl Container<ZooKeeper> {
    /// Starts the image from [`ZK_IMAGE_ENV`] (default [`DEFAULT_ZK_IMAGE`]) with the
    /// `zoo.cfg` a local process would get (`tick_time`, `config`, every four-letter word
    /// allowed; the client port open to the engine's network) and `jvm_args`, and waits
    /// (bounded by `opts.startup_timeout`) until it serves. The image's Java and
    /// `/usr/share/java` jars are used: `opts.java`, `opts.jar` and `opts.logging_jar` are
    /// for local processes.
    pub async fn start(opts: &ZkOptions) -> Result<Self, ServerError> {
        if opts.tls.is_some() {
            return Err(ServerError::Unsupported {
                operation: "TLS".to_owned(),
                reason: "a ZooKeeper container serves plain connections only; start a \
                         ZkServer process for TLS"
                    .to_owned(),
            });
        }
        let cfg = zoo_cfg(opts, Path::new(ZK_DATA_DIR), 2181, "0.0.0.0", &[]);
        let script = zk_script(opts, "");
        Self::launch(
            zk_spec("ZooKeeper".to_owned(), opts),
            zk_configure(cfg, script),
            ZooKeeper,
        )
        .await
    }

    /// Creates ensemble member `index` (`myid` index + 1) of `servers` (`host:quorum:election`
    /// lines) without waiting for it: it starts ZooKeeper once every host of `servers`
    /// resolves, i.e. once every member is on the ensemble's network.
    pub(crate) async fn create_member(
        opts: &ZkOptions,
        servers: &[String],
        index: usize,
    ) -> Result<Self, ServerError> {
        let cfg = zoo_cfg(opts, Path::new(ZK_DATA_DIR), 2181, "0.0.0.0", servers);
        let hosts: Vec<&str> = servers
            .iter()
            .filter_map(|server| server.split(':').next())
            .collect();
        // Bounded: a member whose network never comes exits, and its start-up probe says so.
        let prelude = format!(
            "n=0; until getent hosts {hosts} >/dev/null 2>&1; do n=$((n+1)); \
             if [ $n -ge 600 ]; then echo 'the ensemble network never came' >&2; exit 1; fi; \
             sleep 0.1; done; mkdir -p {ZK_DATA_DIR} && echo {myid} > {ZK_DATA_DIR}/myid && ",
            hosts = hosts.join(" "),
            myid = index + 1,
        );
        Self::create(
            zk_spec(format!("ZooKeeper member {index}"), opts),
            zk_configure(cfg, zk_script(opts, &prelude)),
            ZooKeeper,
        )
        .await
    }

    /// `127.0.0.1:port`.
    pub fn connect_string(&self) -> String {
        self.socket_addr().to_string()
    }

    /// Sends a four-letter word (bounded by 5 s).
    pub async fn four_letter(&self, word: &str) -> Result<String, ServerError> {
        four_letter(&self.connect_string(), word, Duration::from_secs(5)).await
    }
}

/// `n` members on a new network, each started once it joined, then waited for (each
/// bounded by [`ZkOptions::startup_timeout`]).
pub(super) async fn start_ensemble(
    n: usize,
    opts: ZkOptions,
) -> Result<Members<ZooKeeper>, ServerError> {
    let mut members = Members::on_network(ClusterNetwork::create("zk").await?);
    let servers: Vec<String> = (0..n)
        .map(|i| format!("{}:{QUORUM_PORT}:{ELECTION_PORT}", host_name("zk", i)))
        .collect();
    let opts = opts.with_config("quorumListenOnAllIPs", "true");
    for index in 0..n {
        members
            .join(ZkContainer::create_member(&opts, &servers, index).await?)
            .await?;
    }
    members
        .wait_all(&Probe::ZkServing, opts.startup_timeout)
        .await?;
    Ok(members)
}
