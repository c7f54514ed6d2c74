//! The server kinds that run as sets of members, as type parameters: a
//! [`ZkEnsemble`](super::ZkEnsemble) is `Members<ZooKeeper>`, an
//! [`EtcdCluster`](super::EtcdCluster) `Members<Etcd>`, and their containers
//! `Container<ZooKeeper>` and `Container<Etcd>`.

/// ZooKeeper, as a kind of server.
#[derive(Debug)]
#[non_exhaustive]
pub struct ZooKeeper;

/// etcd, as a kind of server.
#[derive(Debug)]
#[non_exhaustive]
pub struct Etcd;
