//! What the etcd test binaries share: one etcd server per binary, a raw client for looking
//! at and acting on the keys, and the conformance harness.
#![allow(dead_code, reason = "each test binary uses a part of this module")]
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    reason = "test fixtures: a failed set-up must fail the test"
)]

pub(crate) mod cluster;

use std::sync::{Arc, Weak};
use std::time::Duration;

use cluster::SharedCluster;
use etcd_client::{Client as EtcdClient, GetOptions, Permission, SortOrder, SortTarget};
use lock_conformance::{
    Client, ClientFaults, Entries, FaultError, FaultResult, Faults, Harness, Inspector, LockKind,
    Property, SessionExpiry, Timing, Unproven, async_trait,
};
use lock_core::{LockError, LockName, LockProvider};
use lock_etcd::{EtcdConfig, EtcdLockProvider, EtcdStrategy};
use lock_testbed::proxy::{FaultProxy, ProxyGroup, ReplyKind};
use lock_testbed::servers::{EtcdOptions, EtcdTarget, free_port, shared_etcd};

/// Short leases so that crash and expiry cases finish quickly (etcd's leases are whole
/// seconds; its minimum is a few election timeouts, well under this), yet long enough that
/// the suites' load on two cores never holds a keep-alive back for a whole lease: at 2 s,
/// waiters' keys vanished with their expired leases there.
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(4);

/// The leases over a cluster: a leader's failover (an election timeout of 1 s, and up to
/// twice that) must fit in one, as in production.
pub(crate) const CLUSTER_LEASE_TTL: Duration = Duration::from_secs(5);

/// A raw client of `endpoint`.
pub(crate) async fn admin_client(endpoint: &str) -> EtcdClient {
    EtcdClient::connect([endpoint], None)
        .await
        .expect("an admin client")
}

/// The keys of the lock `name` under `prefix`, in create-revision order.
pub(crate) async fn contenders(admin: &EtcdClient, prefix: &str, name: &str) -> Vec<String> {
    keys(admin, &dir_of(prefix, name, "")).await
}

/// The directory of `name`'s lock of the kind whose directory ends in `suffix`.
fn dir_of(prefix: &str, name: &str, suffix: &str) -> String {
    let escaped = LockName::new(name).expect("a valid name").escaped();
    format!("{prefix}/{escaped}{suffix}/")
}

/// The keys under `dir`, in create-revision order. A listing that meets a connection to a
/// member killed or restarted meanwhile (a broken pipe) is made again, for up to 5 s.
pub(crate) async fn keys(admin: &EtcdClient, dir: &str) -> Vec<String> {
    let options = GetOptions::new()
        .with_prefix()
        .with_keys_only()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let found = loop {
        match admin.kv_client().get(dir, Some(options.clone())).await {
            Ok(found) => break found,
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => panic!("a listing: {error}"),
        }
    };
    found
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

/// The holders and waiters of a read-write lock's queue: the first writer holds alone;
/// otherwise the readers before the first writer hold.
fn rw_entries(queue: &[String]) -> Entries {
    let reader = |key: &String| key.contains("/read/");
    let holders = match queue.first() {
        None => 0,
        Some(first) if !reader(first) => 1,
        Some(_) => queue.iter().take_while(|key| reader(key)).count(),
    };
    Entries::new(holders, queue.len() - holders)
}

/// The holders and waiters of a semaphore: every lease is held but the one of the
/// contender holding the mutex (same last segment), which waits; every mutex contender
/// waits.
fn semaphore_entries(leases: &[String], locks: &[String]) -> Entries {
    let id = |key: &str| key.rsplit('/').next().unwrap_or_default().to_owned();
    let waiting: Vec<String> = locks.iter().map(|key| id(key)).collect();
    let holders = leases
        .iter()
        .filter(|lease| !waiting.contains(&id(lease)))
        .count();
    Entries::new(holders, locks.len())
}

/// The prefix the user of [`EtcdHarness::secured_server`] may lock under.
pub(crate) const SECURED_PREFIX: &str = "/distlock-secure";

/// The conformance harness, for one strategy.
///
/// Over the shared single server ([`EtcdHarness::new`]) it neither restarts nor kills it
/// (the server is shared by concurrent tests, so E4 is declared unproven there; the cluster
/// harness proves it), and `pause_server` makes the server stop answering this harness's
/// clients, the only clients the case has: their proxies keep the connections open and pass
/// nothing ([`ProxyGroup::pause`]), which is all a client sees of a paused server. Over a
/// [`SharedCluster`] ([`EtcdHarness::on_cluster`]), whose cases take turns:
///
/// - `pause_server` freezes every member, then lets them go on and waits for a leader;
/// - `kill_leader` kills the leader, waits for a new one, then restarts the killed member
///   and waits until it has rejoined;
/// - `restart_server` is a rolling restart, the leader last.
///
/// Either way, `wrong_credentials_provider` starts a server of its own with authentication
/// on.
pub(crate) struct EtcdHarness {
    strategy: EtcdStrategy,
    endpoints: Vec<String>,
    admin: EtcdClient,
    cluster: Option<&'static SharedCluster>,
    /// [`LEASE_TTL`], or [`CLUSTER_LEASE_TTL`] over a cluster.
    lease_ttl: Duration,
    /// Held for the harness's lifetime over a cluster: one case at a time.
    _turn: Option<tokio::sync::OwnedMutexGuard<()>>,
    /// The server with authentication on, once a case asked for it.
    secured: tokio::sync::OnceCell<EtcdTarget>,
    /// The proxies of every client of this harness: the server as the case sees it.
    server_as_seen: ProxyGroup,
}

impl EtcdHarness {
    /// A harness over the binary's shared server.
    pub(crate) async fn new(strategy: EtcdStrategy) -> Self {
        let endpoint = shared_etcd()
            .expect("etcd starts (Debian's etcd-server package, or a container)")
            .client_address();
        let admin = admin_client(&endpoint).await;
        EtcdHarness {
            strategy,
            endpoints: vec![endpoint],
            admin,
            cluster: None,
            lease_ttl: LEASE_TTL,
            _turn: None,
            secured: tokio::sync::OnceCell::new(),
            server_as_seen: ProxyGroup::default(),
        }
    }

    /// A harness over `cluster`, holding the cluster's turn until it is dropped. A member
    /// left killed or paused by an earlier case that failed half-way is brought back first,
    /// and the harness is ready once the cluster has a leader.
    pub(crate) async fn on_cluster(
        strategy: EtcdStrategy,
        cluster: &'static SharedCluster,
    ) -> Self {
        let turn = Arc::clone(&cluster.turn).lock_owned().await;
        cluster.recover().await.expect("the cluster serves");
        let admin = EtcdClient::connect(&cluster.endpoints, None)
            .await
            .expect("an admin client");
        EtcdHarness {
            strategy,
            endpoints: cluster.endpoints.clone(),
            admin,
            cluster: Some(cluster),
            lease_ttl: CLUSTER_LEASE_TTL,
            _turn: Some(turn),
            secured: tokio::sync::OnceCell::new(),
            server_as_seen: ProxyGroup::default(),
        }
    }

    /// The first server's endpoint.
    pub(crate) fn endpoint(&self) -> String {
        self.endpoints[0].clone()
    }

    fn cluster(&self) -> FaultResult<&'static SharedCluster> {
        self.cluster.ok_or(FaultError::Unsupported)
    }

    /// A server of this harness's own with authentication on: the user `root` (password
    /// `root`), and the user `locker` (password `right`) whose role may read and write
    /// under [`SECURED_PREFIX`] only.
    pub(crate) async fn secured_server(&self) -> FaultResult<&EtcdTarget> {
        self.secured
            .get_or_try_init(|| async {
                let failed = |what: &'static str| {
                    move |e: etcd_client::Error| FaultError::Failed(format!("{what}: {e}"))
                };
                let server = EtcdTarget::start(EtcdOptions::default())
                    .await
                    .map_err(|e| FaultError::Failed(e.to_string()))?;
                let mut admin = EtcdClient::connect([server.client_address()], None)
                    .await
                    .map_err(failed("an admin client"))?;
                admin
                    .user_add("root", "root", None)
                    .await
                    .map_err(failed("adding root"))?;
                admin
                    .user_grant_role("root", "root")
                    .await
                    .map_err(failed("making root root"))?;
                admin
                    .role_add("locker")
                    .await
                    .map_err(failed("adding the role"))?;
                let permission = Permission::read_write(format!("{SECURED_PREFIX}/")).with_prefix();
                admin
                    .role_grant_permission("locker", permission)
                    .await
                    .map_err(failed("granting the role"))?;
                admin
                    .user_add("locker", "right", None)
                    .await
                    .map_err(failed("adding the user"))?;
                admin
                    .user_grant_role("locker", "locker")
                    .await
                    .map_err(failed("granting the user its role"))?;
                admin
                    .auth_enable()
                    .await
                    .map_err(failed("turning authentication on"))?;
                Ok(server)
            })
            .await
    }

    /// A raw client of the server.
    pub(crate) fn admin(&self) -> &EtcdClient {
        &self.admin
    }

    pub(crate) fn config(&self, prefix: &str) -> EtcdConfig {
        EtcdConfig::new(self.endpoints.clone())
            .with_prefix(prefix)
            .with_strategy(self.strategy)
            .with_lease_ttl(self.lease_ttl)
            .with_timeout(Duration::from_secs(2))
    }

    /// A client that reaches the servers through fault proxies of its own.
    async fn client_with(&self, mut config: EtcdConfig) -> Result<Client, LockError> {
        let proxies = Arc::new(Proxies::start(&config.endpoints));
        for proxy in &proxies.0 {
            self.server_as_seen.add(proxy.control());
        }
        config.endpoints = proxies.endpoints();
        let provider = Arc::new(EtcdLockProvider::connect(config).await?);
        let session = Arc::new(LeaseRevoke {
            provider: Arc::downgrade(&provider),
            admin: self.admin.clone(),
        });
        Ok(Client::new(provider, session).with_faults(proxies))
    }
}

/// One client's fault proxies: one in front of each server. The client is given the
/// proxies' endpoints instead of the servers'.
pub(crate) struct Proxies(Vec<FaultProxy>);

impl Proxies {
    /// A proxy in front of each of `endpoints` (`http://127.0.0.1:port`).
    pub(crate) fn start(endpoints: &[String]) -> Self {
        Proxies(
            endpoints
                .iter()
                .map(|endpoint| {
                    let address = endpoint.trim_start_matches("http://");
                    let server = address.parse().expect("a server's socket address");
                    FaultProxy::start(server).expect("a fault proxy")
                })
                .collect(),
        )
    }

    /// Replies swallowed so far, on every proxy.
    pub(crate) fn swallowed(&self) -> u64 {
        self.0.iter().map(|proxy| proxy.stats().swallowed).sum()
    }

    /// The proxies' endpoints.
    pub(crate) fn endpoints(&self) -> Vec<String> {
        self.0
            .iter()
            .map(|proxy| format!("http://{}", proxy.address()))
            .collect()
    }
}

#[async_trait]
impl ClientFaults for Proxies {
    async fn cut_connection(&self) -> FaultResult {
        self.0.iter().for_each(|proxy| proxy.cut());
        Ok(())
    }

    async fn restore(&self) -> FaultResult {
        self.0.iter().for_each(|proxy| proxy.pass());
        Ok(())
    }

    async fn delay_connection(&self, latency: Duration) -> FaultResult {
        self.0.iter().for_each(|proxy| proxy.delay(latency));
        Ok(())
    }

    /// gRPC replies are not told apart on the wire: the next thing a server sends on an
    /// open connection is dropped and that connection cut (armed on every open connection,
    /// the others disarmed once one has fired). The create sent right after is the
    /// client's next request, so it is nearly always its reply that goes missing; when a
    /// keep-alive's answer goes instead, that round is an ordinary connection loss.
    async fn lose_next_create_reply(&self) -> FaultResult {
        let armed: Vec<_> = self
            .0
            .iter()
            .filter(|proxy| proxy.stats().open > 0)
            .map(|proxy| proxy.swallow_next_reply(ReplyKind::AnyNextReply))
            .collect();
        if armed.is_empty() {
            return Err(FaultError::Failed(
                "the client has no open connection".into(),
            ));
        }
        tokio::spawn(async move {
            let fired = armed.iter().map(|handle| Box::pin(handle.wait()));
            futures_util::future::select_all(fired).await;
            armed.iter().for_each(|handle| {
                handle.disarm();
            });
        });
        Ok(())
    }
}

/// Ends a client's session as the server would when its lease ends: the lease is revoked
/// behind the provider's back, and the provider finds out from its keep-alive.
struct LeaseRevoke {
    provider: Weak<EtcdLockProvider>,
    admin: EtcdClient,
}

#[async_trait]
impl SessionExpiry for LeaseRevoke {
    async fn expire_session(&self) -> FaultResult {
        let lease = self
            .provider
            .upgrade()
            .and_then(|provider| provider.lease_id())
            .ok_or_else(|| FaultError::Failed("the client has no session".into()))?;
        self.admin
            .lease_client()
            .revoke(lease)
            .await
            .map(drop)
            .map_err(|e| FaultError::Failed(format!("revoking lease {lease:x}: {e}")))
    }
}

#[async_trait]
impl Harness for EtcdHarness {
    async fn client(&self) -> Result<Client, LockError> {
        self.client_with(self.config(EtcdConfig::DEFAULT_PREFIX))
            .await
    }

    fn timing(&self) -> Timing {
        Timing::default()
            .with_operation_slack(Duration::from_secs(1))
            .with_handoff_bound(Duration::from_secs(2))
            .with_loss_bound(self.lease_ttl * 3)
            .with_crash_release_bound(self.lease_ttl * 3)
            .with_short_timeout(Duration::from_millis(300))
    }

    fn faults(&self) -> Option<&dyn Faults> {
        Some(self)
    }

    fn inspector(&self) -> Option<&dyn Inspector> {
        Some(self)
    }

    async fn client_in_other_namespace(&self) -> Option<Result<Client, LockError>> {
        Some(self.client_with(self.config("/distlock-other")).await)
    }

    fn unproven(&self) -> Vec<Unproven> {
        if self.cluster.is_some() {
            return Vec::new();
        }
        vec![Unproven::new(
            Property::TokensSurviveRestart,
            "the single server is shared by the cases that run side by side, so it is not \
             restarted; the cluster harness (tests/cluster.rs) restarts its members",
        )]
    }
}

#[async_trait]
impl Faults for EtcdHarness {
    async fn revoke(&self, name: &str) -> FaultResult<bool> {
        let keys = contenders(&self.admin, EtcdConfig::DEFAULT_PREFIX, name).await;
        let Some(holder) = keys.first() else {
            return Ok(false);
        };
        self.admin
            .kv_client()
            .delete(holder.as_str(), None)
            .await
            .map_err(|e| FaultError::Failed(format!("deleting {holder}: {e}")))?;
        Ok(true)
    }

    async fn delete_first_waiter(&self, name: &str) -> FaultResult {
        if self.strategy == EtcdStrategy::Single {
            return Err(FaultError::Unsupported);
        }
        let keys = contenders(&self.admin, EtcdConfig::DEFAULT_PREFIX, name).await;
        let Some(waiter) = keys.get(1) else {
            return Err(FaultError::Failed(format!("no waiter in {keys:?}")));
        };
        self.admin
            .kv_client()
            .delete(waiter.as_str(), None)
            .await
            .map(drop)
            .map_err(|e| FaultError::Failed(format!("deleting {waiter}: {e}")))
    }

    async fn pause_server(&self, duration: Duration) -> FaultResult {
        match self.cluster {
            Some(cluster) => cluster.pause(duration).await,
            None => {
                self.server_as_seen.pause(duration).await;
                Ok(())
            }
        }
    }

    async fn restart_server(&self) -> FaultResult {
        self.cluster()?.restart().await
    }

    async fn kill_leader(&self) -> FaultResult {
        self.cluster()?.kill_leader().await
    }

    async fn wrong_credentials_provider(
        &self,
    ) -> FaultResult<Result<Arc<dyn LockProvider>, LockError>> {
        let server = self.secured_server().await?;
        let config = EtcdConfig::new([server.client_address()])
            .with_prefix(SECURED_PREFIX)
            .with_user("locker", "wrong")
            .with_timeout(Duration::from_secs(2));
        Ok(EtcdLockProvider::connect(config)
            .await
            .map(|provider| Arc::new(provider) as Arc<dyn LockProvider>))
    }

    async fn unreachable_provider(&self) -> FaultResult<Result<Arc<dyn LockProvider>, LockError>> {
        let port = free_port().map_err(|e| FaultError::Failed(e.to_string()))?;
        let config =
            EtcdConfig::new([format!("127.0.0.1:{port}")]).with_timeout(Duration::from_millis(500));
        Ok(EtcdLockProvider::connect(config)
            .await
            .map(|provider| Arc::new(provider) as Arc<dyn LockProvider>))
    }
}

#[async_trait]
impl Inspector for EtcdHarness {
    /// The entries of the mutex, the read-write lock, the semaphore and the election called
    /// `name` together: a case uses one kind per name. An election's first candidate leads
    /// (a holder), the others wait.
    async fn entries(&self, name: &str) -> Result<Entries, LockError> {
        let prefix = EtcdConfig::DEFAULT_PREFIX;
        let mutex = contenders(&self.admin, prefix, name).await;
        let rw = rw_entries(&keys(&self.admin, &dir_of(prefix, name, ".rwlock")).await);
        let semaphore = dir_of(prefix, name, ".semaphore");
        let semaphore = semaphore_entries(
            &keys(&self.admin, &format!("{semaphore}leases/")).await,
            &keys(&self.admin, &format!("{semaphore}locks/")).await,
        );
        let candidates = keys(&self.admin, &dir_of(prefix, name, ".election"))
            .await
            .len();
        Ok(Entries::new(
            mutex.len().min(1) + rw.holders + semaphore.holders + candidates.min(1),
            mutex.len().saturating_sub(1)
                + rw.waiters
                + semaphore.waiters
                + candidates.saturating_sub(1),
        ))
    }

    /// The single-key mutex's waiters write nothing; read-write locks and semaphores
    /// always queue.
    fn records_waiters(&self, kind: LockKind) -> bool {
        kind != LockKind::Mutex || self.strategy != EtcdStrategy::Single
    }
}
