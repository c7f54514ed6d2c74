//! etcd in containers (feature `testcontainers`): a single-member cluster, or a cluster on
//! a network of its own.

use testcontainers::{GenericImage, ImageExt};

use super::{EtcdOptions, MemberLayout, member_args};
use crate::servers::ServerError;
use crate::servers::containers::{
    ClusterNetwork, Container, DEFAULT_ETCD_IMAGE, ETCD_IMAGE_ENV, Etcd, EtcdContainer, ServerSpec,
    host_name,
};
use crate::servers::members::Members;
use crate::servers::probe::Probe;

/// Where etcd keeps its data in a container (it survives a restart of the container).
const ETCD_DATA_DIR: &str = "/var/tmp/etcd";

/// What an etcd container is, for [`Container::create`].
fn etcd_spec(server: String, opts: &EtcdOptions) -> ServerSpec {
    ServerSpec {
        server,
        image: (ETCD_IMAGE_ENV, DEFAULT_ETCD_IMAGE),
        internal: 2379,
        probe: Probe::EtcdHealth,
        startup_timeout: opts.startup_timeout,
        host_port: None,
    }
}

/// The command line of the member `name` of `cluster` (names and peer URLs), listening for
/// peers on `listen_peer` and known to them as `advertise_peer`; its clients reach it
/// through the published port.
fn etcd_command(
    opts: &EtcdOptions,
    name: &str,
    listen_peer: &str,
    advertise_peer: &str,
    cluster: &[(String, String)],
) -> Vec<String> {
    let layout = MemberLayout {
        name,
        data_dir: ETCD_DATA_DIR,
        listen_client: "http://0.0.0.0:2379",
        advertise_client: "http://127.0.0.1:2379",
        listen_peer,
        advertise_peer,
        cluster,
    };
    let mut cmd = vec!["etcd".to_owned()];
    cmd.extend(member_args(opts, &layout, None));
    cmd
}

impl Container<Etcd> {
    /// Starts the image from [`ETCD_IMAGE_ENV`] (default [`DEFAULT_ETCD_IMAGE`]) as a
    /// single-member cluster with the heartbeat, election timeout and extra arguments of
    /// `opts`, and waits (bounded by `opts.startup_timeout`) until `GET /health` says it is
    /// healthy. `opts.binary` is ignored.
    pub async fn start(opts: &EtcdOptions) -> Result<Self, ServerError> {
        let cmd = etcd_command(
            opts,
            "n1",
            "http://127.0.0.1:2380",
            "http://127.0.0.1:2380",
            &[("n1".to_owned(), "http://127.0.0.1:2380".to_owned())],
        );
        let configure = |image: GenericImage| image.with_cmd(cmd.clone());
        Self::launch(etcd_spec("etcd".to_owned(), opts), configure, Etcd).await
    }

    /// Creates cluster member `index` of the cluster whose members are `hosts` on its
    /// network (member `i` named `n{i + 1}`), without waiting for it: it starts etcd once
    /// every host resolves, i.e. once every member is on the cluster's network.
    pub(crate) async fn create_member(
        opts: &EtcdOptions,
        hosts: &[String],
        index: usize,
    ) -> Result<Self, ServerError> {
        let peer_url = |host: &str| format!("http://{host}:2380");
        let cluster: Vec<(String, String)> = (1..=hosts.len())
            .zip(hosts)
            .map(|(i, host)| (format!("n{i}"), peer_url(host)))
            .collect();
        let (name, host) = match (cluster.get(index), hosts.get(index)) {
            (Some((name, _)), Some(host)) => (name, host),
            _ => {
                return Err(ServerError::NoSuchMember {
                    index,
                    len: hosts.len(),
                });
            }
        };
        let cmd = etcd_command(opts, name, "http://0.0.0.0:2380", &peer_url(host), &cluster);
        // Bounded: a member whose network never comes exits, and its start-up probe says so.
        let script = format!(
            "n=0; until getent hosts {hosts} >/dev/null 2>&1; do n=$((n+1)); \
             if [ $n -ge 600 ]; then echo 'the cluster network never came' >&2; exit 1; fi; \
             sleep 0.1; done; exec {cmd}",
            hosts = hosts.join(" "),
            cmd = cmd.join(" "),
        );
        let configure = |image: GenericImage| {
            image.with_cmd(["sh".to_owned(), "-c".to_owned(), script.clone()])
        };
        Self::create(
            etcd_spec(format!("etcd member {index}"), opts),
            configure,
            Etcd,
        )
        .await
    }

    /// `http://127.0.0.1:port`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.socket_addr())
    }
}

/// `n` members on a new network, each started once it joined, then waited for (each
/// bounded by [`EtcdOptions::startup_timeout`]).
pub(super) async fn start_cluster(
    n: usize,
    opts: &EtcdOptions,
) -> Result<Members<Etcd>, ServerError> {
    let mut members = Members::on_network(ClusterNetwork::create("etcd").await?);
    let hosts: Vec<String> = (0..n).map(|i| host_name("etcd", i)).collect();
    for index in 0..n {
        members
            .join(EtcdContainer::create_member(opts, &hosts, index).await?)
            .await?;
    }
    members
        .wait_all(&Probe::EtcdHealth, opts.startup_timeout)
        .await?;
    Ok(members)
}
