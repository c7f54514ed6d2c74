//! A network of its own for the members of a cluster in containers — a ZooKeeper ensemble,
//! an etcd cluster — where a member can really be cut off from the others.
//!
//! Each member is a container on two networks: the engine's default bridge, through which
//! its client port is published on `127.0.0.1`, and the cluster's own network, which
//! carries the members' traffic among themselves (they find each other there by the names
//! `zookeeper1`, `zookeeper2`, ... or `etcd1`, `etcd2`, ...). [`ClusterNetwork::partition`] disconnects a
//! member from the cluster's network only: it loses its peers while its clients stay
//! connected to it, as in a real partition between server racks.
//! [`heal`](ClusterNetwork::heal) connects it again.

use std::collections::HashMap;

use testcontainers::bollard::Docker;
use testcontainers::bollard::models::{
    EndpointSettings, NetworkConnectRequest, NetworkCreateRequest, NetworkDisconnectRequest,
};
use tracing::info;

use super::{LABEL, container_error, label_value};
use crate::servers::ServerError;
use crate::servers::process::Watchdog;

/// The watchdog script: wait until the test process is gone (its end of the pipe on our
/// stdin closes), then remove the network, retrying while the members' own watchdogs are
/// still removing them. `$1` is the network's name.
const NETWORK_WATCHDOG_SCRIPT: &str = "read -r _ignored; n=0; \
    until docker network rm \"$1\" >/dev/null 2>&1; do \
    n=$((n+1)); [ $n -ge 50 ] && exit 1; sleep 0.2; done; exit 0";

/// A cluster's own network (see the module docs); its members' names there are `hosts`
/// and their number from 1. Dropped, it is removed (by its watchdog, which retries while
/// members still use it); the watchdog does the same when the test process ends without
/// dropping it. Drop the members first.
#[derive(Debug)]
pub(crate) struct ClusterNetwork {
    name: String,
    docker: Docker,
    hosts: String,
    _watchdog: Watchdog,
}

/// Member `index`'s name on a cluster's network whose hosts are `hosts1`, `hosts2`, ...
pub(crate) fn host_name(hosts: &str, index: usize) -> String {
    format!("{hosts}{}", index + 1)
}

impl ClusterNetwork {
    /// A new network whose members will be called `hosts1`, `hosts2`, ...
    pub(crate) async fn create(hosts: String) -> Result<Self, ServerError> {
        let docker = Docker::connect_with_defaults().map_err(container_error)?;
        let name = format!(
            "distlock-test-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        );
        let request = NetworkCreateRequest {
            name: name.clone(),
            driver: Some("bridge".to_owned()),
            labels: Some(HashMap::from([(LABEL.to_owned(), label_value())])),
            ..Default::default()
        };
        docker
            .create_network(request)
            .await
            .map_err(container_error)?;
        let watchdog = Watchdog::spawn(NETWORK_WATCHDOG_SCRIPT, "network", &name);
        Ok(ClusterNetwork {
            name,
            docker,
            hosts,
            _watchdog: watchdog,
        })
    }

    /// The network's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Cuts the container `id`, member `index`, off from the network (`docker network
    /// disconnect`). Its clients stay connected to it, through the published port.
    pub(crate) async fn partition(&self, id: &str, index: usize) -> Result<(), ServerError> {
        let request = NetworkDisconnectRequest {
            container: id.to_owned(),
            force: Some(true),
        };
        self.docker
            .disconnect_network(&self.name, request)
            .await
            .map_err(container_error)?;
        info!(member = index, network = %self.name, "member partitioned");
        Ok(())
    }

    /// Connects the container `id` to the network as member `index`, with its name there
    /// (`docker network connect`): to join, or to heal a partition.
    pub(crate) async fn heal(&self, id: &str, index: usize) -> Result<(), ServerError> {
        let request = NetworkConnectRequest {
            container: id.to_owned(),
            endpoint_config: Some(EndpointSettings {
                aliases: Some(vec![host_name(&self.hosts, index)]),
                ..Default::default()
            }),
        };
        self.docker
            .connect_network(&self.name, request)
            .await
            .map_err(container_error)?;
        info!(member = index, network = %self.name, "member connected");
        Ok(())
    }
}
