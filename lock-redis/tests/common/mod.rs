//! What the Redis test binaries share: a server of the case's own (password, and an ACL
//! user limited to the lock keys), fault proxies in front of every client, a raw look at
//! the keys, and the conformance harness.
#![allow(dead_code, reason = "each test binary uses a part of this module")]
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    reason = "test fixtures: a failed set-up must fail the test"
)]

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use lock_conformance::{
    Client, ClientFaults, Entries, FaultError, FaultResult, Faults, Harness, Inspector, LockKind,
    SessionExpiry, Timing, async_trait, observe_until,
};
use lock_core::{LockError, LockName, LockProvider};
use lock_redis::{
    LeaseOptions, RedisConfig, RedisLockProvider, RedisServer as ServerConfig, RedisStrategy,
};
use lock_testbed::proxy::{FaultProxy, ReplyKind};
use lock_testbed::servers::{RedisOptions, RedisServer, RedisTarget, free_port};
use redis::AsyncCommands;

pub(crate) mod cluster;
pub(crate) mod sentinel;

/// How long the cases let one operation take (the suite's operation slack).
const OPERATION_SLACK: Duration = Duration::from_secs(1);

/// The lease of the test clients: short, so that expiry cases finish quickly, but long
/// enough that a renewal may take the operation slack. The watchdog renews every ttl/3 and
/// the lease runs out 2/3 ttl after that, so the lease has to be at least 1.5 times the
/// slack; with 1 s, one slow renewal (667 ms) on a loaded machine lost a healthy lock.
pub(crate) const TTL: Duration = Duration::from_secs(2);
const _: () = assert!(TTL.as_millis() * 2 > OPERATION_SLACK.as_millis() * 3);

/// The lease of the Redlock test clients. Redlock waits at most a third of its lease for a
/// round of votes (a slow server must not eat the validity), so with this lease a round may
/// take the operation slack, as one request to a single server may. With a 1 s lease a round had
/// 333 ms, and a heavily loaded machine failed grants and releases the suite allows.
pub(crate) const REDLOCK_TTL: Duration = Duration::from_secs(3);
/// How long a partition must last to end a client's session: its holds' leases and its
/// queued waiters' places, which the server keeps for three refresh periods (ttl/3, at most
/// 2 s), the request `timeout` and a second after the waiter's last refresh; and a second
/// more.
pub(crate) fn session_cut(ttl: Duration, timeout: Duration) -> Duration {
    let refresh = (ttl / 3).clamp(Duration::from_millis(10), Duration::from_secs(2));
    (ttl * 2).max(refresh * 3 + timeout + Duration::from_secs(2))
}

/// The request timeout of the test clients.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(2);

/// The admin password of every test server.
pub(crate) const ADMIN_PASSWORD: &str = "admin-secret";
/// The ACL user the clients use: every command, but only the keys of the `lock…` prefixes.
pub(crate) const LOCK_USER: &str = "locker";
pub(crate) const LOCK_PASSWORD: &str = "locker-secret";

/// [`observe_until`], panicking with its failure: what the last observation was when
/// `bound` ran out.
pub(crate) async fn wait_until<T, F, Fut>(
    bound: Duration,
    what: &str,
    observe: F,
    done: impl Fn(&T) -> bool,
) -> T
where
    T: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    observe_until(bound, what, observe, done)
        .await
        .unwrap_or_else(|failure| panic!("{failure}"))
}

/// The end of `guard`'s lease, as this process sees it.
pub(crate) fn valid_until(guard: &lock_core::Guard) -> tokio::time::Instant {
    tokio::time::Instant::from_std(guard.valid_until().expect("a lease guard has a validity"))
}

/// Waits until the watchdog has renewed `guard` `renewals` times (its validity moved on);
/// returns the last validity. Panics if it does not within `bound`.
pub(crate) async fn expect_renewals(
    guard: &lock_core::Guard,
    renewals: usize,
    bound: Duration,
) -> tokio::time::Instant {
    let began = tokio::time::Instant::now();
    let mut last = valid_until(guard);
    let mut seen = 0;
    while seen < renewals {
        assert!(
            began.elapsed() < bound,
            "{seen} renewals in {bound:?}, expected {renewals}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = valid_until(guard);
        if now > last {
            seen += 1;
            last = now;
        }
    }
    last
}

/// Waits (at most 5 s) until nothing of the lock `name` is left on `h`'s servers.
pub(crate) async fn expect_nothing_left(h: &dyn Inspector, name: &str) {
    wait_until(
        Duration::from_secs(5),
        "nothing left of the lock",
        || async { h.entries(name).await.unwrap() },
        |entries| *entries == Entries::new(0, 0),
    )
    .await;
}

/// How the tests run Redis: an admin password, and the ACL user limited to the lock keys.
fn server_options() -> RedisOptions {
    RedisOptions::default()
        .with_password(ADMIN_PASSWORD)
        .with_acl_user(LOCK_USER, LOCK_PASSWORD, "{lock*")
}

/// A test server process (for the tests that signal its pid).
pub(crate) async fn start_server() -> RedisServer {
    RedisServer::start(server_options())
        .await
        .expect("a Redis server")
}

/// A test server where `LOCK_TEST_SERVERS` says: a process, or a container.
pub(crate) async fn start_target() -> RedisTarget {
    RedisTarget::start(server_options())
        .await
        .unwrap_or_else(|error| panic!("a Redis server: {error}"))
}

/// A raw connection to `server` as the admin; it reconnects after a restart.
pub(crate) async fn admin(server: &RedisServer) -> redis::aio::ConnectionManager {
    admin_at(&server.url()).await
}

/// A raw connection to the server at `url`; it reconnects after a restart.
pub(crate) async fn admin_at(url: &str) -> redis::aio::ConnectionManager {
    redis::Client::open(url)
        .unwrap()
        .get_connection_manager()
        .await
        .expect("an admin connection")
}

/// The loopback port of a server started here.
fn port_of(target: &RedisTarget) -> u16 {
    target
        .socket_addr()
        .expect("a server started here has an address")
        .port()
}

/// The client configuration for a server (or proxy) at `port`, as the ACL user.
pub(crate) fn config(port: u16, strategy: RedisStrategy) -> RedisConfig {
    RedisConfig::new(
        ServerConfig::new("127.0.0.1")
            .with_port(port)
            .with_username(LOCK_USER)
            .with_password(LOCK_PASSWORD),
    )
    .with_ttl(TTL)
    .with_strategy(strategy)
    .with_timeout(TIMEOUT)
}

/// The hash tag of the lock `name` under the default prefix.
pub(crate) fn tag(name: &str) -> String {
    LeaseOptions::default().hash_tag(&LockName::new(name).unwrap())
}

/// Every key of the lock `name` on the server, sorted, but the receipt of the last release
/// (`:released`, which expires a lease's length after it).
pub(crate) async fn keys_of(admin: &mut redis::aio::ConnectionManager, name: &str) -> Vec<String> {
    let pattern = format!("{}*", tag(name).replace('[', "\\[").replace('?', "\\?"));
    let mut keys: Vec<String> = admin.keys(pattern).await.unwrap();
    keys.retain(|key| !key.ends_with(":released"));
    keys.sort();
    keys
}

/// The bounds of both harnesses, from their lease `ttl`.
pub(crate) fn timing(ttl: Duration) -> Timing {
    Timing::default()
        .with_operation_slack(OPERATION_SLACK)
        .with_handoff_bound(Duration::from_secs(2))
        .with_loss_bound(ttl * 3)
        .with_crash_release_bound(ttl * 2)
        .with_short_timeout(Duration::from_millis(300))
}

/// One client's fault proxy.
pub(crate) struct Proxy(pub(crate) FaultProxy);

#[async_trait]
impl SessionExpiry for Proxy {
    /// A partition longer than the lease and a waiter's place: both expire on the server.
    async fn expire_session(&self) -> FaultResult {
        self.0.cut();
        tokio::time::sleep(session_cut(TTL, TIMEOUT)).await;
        self.0.pass();
        Ok(())
    }
}

#[async_trait]
impl ClientFaults for Proxy {
    async fn cut_connection(&self) -> FaultResult {
        self.0.cut();
        Ok(())
    }

    async fn restore(&self) -> FaultResult {
        self.0.pass();
        Ok(())
    }

    async fn delay_connection(&self, latency: Duration) -> FaultResult {
        self.0.delay(latency);
        Ok(())
    }

    async fn lose_next_create_reply(&self) -> FaultResult {
        let _armed = self.0.swallow_next_reply(ReplyKind::AnyNextReply);
        Ok(())
    }
}

/// The conformance harness: a server of its own (a process, or a container under
/// `LOCK_TEST_SERVERS=containers`), so that pausing or restarting it disturbs no other
/// case; every client reaches it through a proxy of its own.
pub(crate) struct RedisHarness {
    strategy: RedisStrategy,
    server: tokio::sync::Mutex<RedisTarget>,
    port: u16,
    admin: redis::aio::ConnectionManager,
}

impl RedisHarness {
    pub(crate) async fn new(strategy: RedisStrategy) -> Self {
        let server = start_target().await;
        let admin = admin_at(&server.url()).await;
        RedisHarness {
            strategy,
            port: port_of(&server),
            server: tokio::sync::Mutex::new(server),
            admin,
        }
    }

    async fn client_with(&self, prefix: &str) -> Result<Client, LockError> {
        let proxy = FaultProxy::start(([127, 0, 0, 1], self.port).into()).expect("a fault proxy");
        let config = config(proxy.address().port(), self.strategy).with_key_prefix(prefix);
        let provider = RedisLockProvider::connect(config).await?;
        let proxy = Arc::new(Proxy(proxy));
        Ok(Client::new(Arc::new(provider), proxy.clone()).with_faults(proxy))
    }

    fn admin(&self) -> redis::aio::ConnectionManager {
        self.admin.clone()
    }
}

pub(crate) fn failed(error: impl std::fmt::Display) -> FaultError {
    FaultError::Failed(error.to_string())
}

#[async_trait]
impl Harness for RedisHarness {
    async fn client(&self) -> Result<Client, LockError> {
        self.client_with("lock").await
    }

    fn timing(&self) -> Timing {
        timing(TTL)
    }

    fn faults(&self) -> Option<&dyn Faults> {
        Some(self)
    }

    fn inspector(&self) -> Option<&dyn Inspector> {
        Some(self)
    }

    async fn client_in_other_namespace(&self) -> Option<Result<Client, LockError>> {
        // The ACL user may use `{lock*` keys only: `lock-other` matches.
        Some(self.client_with("lock-other").await)
    }
}

#[async_trait]
impl Faults for RedisHarness {
    async fn revoke(&self, name: &str) -> FaultResult<bool> {
        let removed: u64 = self
            .admin()
            .del(format!("{}:owner", tag(name)))
            .await
            .map_err(failed)?;
        Ok(removed == 1)
    }

    async fn delete_first_waiter(&self, name: &str) -> FaultResult {
        if self.strategy != RedisStrategy::Queue {
            return Err(FaultError::Unsupported);
        }
        let waiter: Option<String> = self
            .admin()
            .lpop(format!("{}:queue", tag(name)), None)
            .await
            .map_err(failed)?;
        match waiter {
            Some(_) => Ok(()),
            None => Err(FaultError::Failed("no waiter queued".into())),
        }
    }

    async fn pause_server(&self, duration: Duration) -> FaultResult {
        let server = self.server.lock().await;
        server.pause().await.map_err(failed)?;
        tokio::time::sleep(duration).await;
        server.resume().await.map_err(failed)
    }

    async fn restart_server(&self) -> FaultResult {
        self.server.lock().await.restart().await.map_err(failed)
    }

    async fn unreachable_provider(&self) -> FaultResult<Result<Arc<dyn LockProvider>, LockError>> {
        let port = free_port().map_err(failed)?;
        Ok(RedisLockProvider::connect(config(port, self.strategy))
            .await
            .map(|provider| Arc::new(provider) as Arc<dyn LockProvider>))
    }

    async fn wrong_credentials_provider(
        &self,
    ) -> FaultResult<Result<Arc<dyn LockProvider>, LockError>> {
        let mut config = config(self.port, self.strategy);
        config.server.password = Some("wrong".into());
        Ok(RedisLockProvider::connect(config)
            .await
            .map(|provider| Arc::new(provider) as Arc<dyn LockProvider>))
    }
}

#[async_trait]
impl Inspector for RedisHarness {
    /// The lock's holder and queue, the election's, the read-write lock's and the
    /// semaphore's of the same name; a candidate's value left without its place or lease,
    /// or a record of the last leader left without any value, counts as a waiter (residue).
    async fn entries(&self, name: &str) -> Result<Entries, LockError> {
        entries_at(&mut self.admin(), name).await
    }

    fn records_waiters(&self, kind: LockKind) -> bool {
        kind != LockKind::Mutex || self.strategy == RedisStrategy::Queue
    }
}

/// The error of an inspection of the lock `name` that the server did not answer.
pub(crate) fn inspection_failed(name: &str, error: impl std::fmt::Display) -> LockError {
    LockError::other("test", error.to_string()).for_lock(name)
}

/// The password of every Sentinel or Cluster client's ACL user.
pub(crate) const CLIENT_PASSWORD: &str = "client-secret";

/// The ACL rule the crate docs give for a user limited to the locks (password `s3cret`).
pub(crate) const DOCUMENTED_ACL_RULE: &str = "on >s3cret ~{lock* &{lock* +@scripting +get +set \
     +del +exists +incr +pexpire +pttl +time +lpop +rpush +lrem +lindex +lpos +llen +blpop \
     +hget +hset +hdel +zadd +zscore +zrange +zrangebyscore +zrem +zremrangebyscore +publish \
     +subscribe +unsubscribe +ping";

/// What the crate docs add to [`DOCUMENTED_ACL_RULE`] on a Redis Cluster.
pub(crate) const DOCUMENTED_CLUSTER_ACL_RULE: &str = "+cluster|slots +spublish +ssubscribe \
     +sunsubscribe";

/// The ACL rules of a client user: every command and channel, the `{lock*` keys only.
pub(crate) fn user_rules(user: &str, on: bool) -> Vec<String> {
    [
        "ACL",
        "SETUSER",
        user,
        if on { "on" } else { "off" },
        &format!(">{CLIENT_PASSWORD}"),
        "~{lock*",
        "&*",
        "+@all",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A raw admin connection to the server at `address`.
pub(crate) async fn admin_of(address: std::net::SocketAddr) -> redis::aio::ConnectionManager {
    admin_at(&format!("redis://:{ADMIN_PASSWORD}@{address}")).await
}

/// Waits (at most 30 s) until `replicas` replicas of the primary at `primary` hold all it
/// wrote (`WAIT`): a failover then loses nothing. H5 asks that a holder keep its lock
/// through a failover, which asynchronous replication promises only for writes that
/// reached a replica (what it does not promise is measured apart: see the README's safety
/// section); on a loaded machine, a grant a moment old had not always. A replica just
/// pointed at a new primary may still be copying it, and a demoted primary is told to follow
/// the new one only when a sentinel next looks at it (every 10 s), then copies it whole.
pub(crate) async fn replicated(primary: std::net::SocketAddr, replicas: usize) -> FaultResult {
    let mut admin = admin_of(primary).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        // Short waits: the admin connection's requests time out.
        let acknowledged: usize = redis::cmd("WAIT")
            .arg(replicas)
            .arg(200)
            .query_async(&mut admin)
            .await
            .unwrap_or_default();
        if acknowledged >= replicas {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(failed(format!(
                "{acknowledged} of {replicas} replicas of {primary} caught up within 30 s"
            )));
        }
    }
}

/// Runs the admin command `args` on the server at each of `addresses` (ACL changes, for
/// one, are each server's own).
pub(crate) async fn on_each(
    addresses: impl IntoIterator<Item = std::net::SocketAddr>,
    args: &[&str],
) -> FaultResult {
    for address in addresses {
        let mut admin = admin_of(address).await;
        let mut command = redis::cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        command
            .query_async::<redis::Value>(&mut admin)
            .await
            .map_err(failed)?;
    }
    Ok(())
}

/// Where the keys of a hash tag live: on one server, or on the cluster node that serves the
/// tag's slot.
#[async_trait]
pub(crate) trait AdminFor: Sync {
    /// An admin connection to the server holding the keys tagged `tag`.
    async fn admin_for(&self, tag: &str) -> Result<redis::aio::ConnectionManager, String>;
}

#[async_trait]
impl AdminFor for redis::aio::ConnectionManager {
    async fn admin_for(&self, _tag: &str) -> Result<redis::aio::ConnectionManager, String> {
        Ok(self.clone())
    }
}

/// The holder and waiters of the lock `name` on the server `admin` reaches, and of the
/// election, read-write lock and semaphore of the same name (see [`RedisHarness`]'s
/// inspector).
pub(crate) async fn entries_at(
    admin: &mut redis::aio::ConnectionManager,
    name: &str,
) -> Result<Entries, LockError> {
    entries_by(&admin.clone(), name).await
}

/// [`entries_at`], each kind's keys asked of the server `admins` names for their tag.
pub(crate) async fn entries_by(admins: &dyn AdminFor, name: &str) -> Result<Entries, LockError> {
    let fail = |error: String| inspection_failed(name, error);
    let tag = tag(name);
    let mut admin = admins.admin_for(&tag).await.map_err(fail)?;
    let (holders, waiters): (u64, u64) = redis::pipe()
        .exists(format!("{tag}:owner"))
        .llen(format!("{tag}:queue"))
        .query_async(&mut admin)
        .await
        .map_err(|error| fail(error.to_string()))?;
    let election = format!("{}.election}}", tag.trim_end_matches('}'));
    let glob: String = election
        .chars()
        .flat_map(|c| match c {
            '*' | '?' | '[' | ']' | '\\' => vec!['\\', c],
            c => vec![c],
        })
        .collect();
    let mut admin = admins.admin_for(&election).await.map_err(fail)?;
    let fetched: redis::RedisResult<(u64, u64, Vec<String>, u64)> = redis::pipe()
        .exists(format!("{election}:owner"))
        .llen(format!("{election}:queue"))
        .keys(format!("{glob}:v:*"))
        .exists(format!("{election}:leader"))
        .query_async(&mut admin)
        .await;
    let (leaders, candidates, values, last_leader) =
        fetched.map_err(|error| fail(error.to_string()))?;
    // The read-write lock's and the semaphore's holders whose leases still run, and their
    // waiters.
    let mut permit_holders = 0;
    let mut permit_waiters = 0;
    for kind in ["rwlock", "semaphore"] {
        let permits = format!("{}.{kind}}}", tag.trim_end_matches('}'));
        let mut admin = admins.admin_for(&permits).await.map_err(fail)?;
        let counted: redis::RedisResult<(u64, u64)> = redis::Script::new(
            "local t = redis.call('TIME')
             local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
             return {redis.call('ZCOUNT', KEYS[1], now, '+inf'), redis.call('LLEN', KEYS[2])}",
        )
        .key(format!("{permits}:holders"))
        .key(format!("{permits}:queue"))
        .invoke_async(&mut admin)
        .await;
        let (live, queued) = counted.map_err(|error| fail(error.to_string()))?;
        permit_holders += live;
        permit_waiters += queued;
    }
    let stray_values = (values.len() as u64).saturating_sub(leaders + candidates);
    let stray_last_leader = u64::from(values.is_empty()) * last_leader;
    Ok(Entries::new(
        (holders + leaders + permit_holders) as usize,
        (waiters + candidates + permit_waiters + stray_values + stray_last_leader) as usize,
    ))
}

/// The client configuration for Redlock over servers (or proxies) at `ports`.
pub(crate) fn redlock_config(ports: &[u16]) -> lock_redis::RedlockConfig {
    lock_redis::RedlockConfig::new(ports.iter().map(|port| {
        ServerConfig::new("127.0.0.1")
            .with_port(*port)
            .with_username(LOCK_USER)
            .with_password(LOCK_PASSWORD)
    }))
    .with_ttl(REDLOCK_TTL)
    .with_retry_delay(Duration::from_millis(50))
    .with_timeout(Duration::from_secs(2))
}

/// One Redlock client's fault proxies, one in front of each server.
pub(crate) struct Proxies(pub(crate) Vec<FaultProxy>);

impl Proxies {
    pub(crate) fn start(ports: &[u16]) -> Self {
        Proxies(
            ports
                .iter()
                .map(|port| {
                    FaultProxy::start(([127, 0, 0, 1], *port).into()).expect("a fault proxy")
                })
                .collect(),
        )
    }

    pub(crate) fn ports(&self) -> Vec<u16> {
        self.0.iter().map(|proxy| proxy.address().port()).collect()
    }
}

#[async_trait]
impl SessionExpiry for Proxies {
    /// A partition from every server, longer than the lease.
    async fn expire_session(&self) -> FaultResult {
        self.0.iter().for_each(|proxy| proxy.cut());
        tokio::time::sleep(REDLOCK_TTL * 2).await;
        self.0.iter().for_each(|proxy| proxy.pass());
        Ok(())
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

    async fn lose_next_create_reply(&self) -> FaultResult {
        for proxy in &self.0 {
            let _armed = proxy.swallow_next_reply(ReplyKind::AnyNextReply);
        }
        Ok(())
    }
}

/// The conformance harness for Redlock: three servers of the case's own (processes, or
/// containers under `LOCK_TEST_SERVERS=containers`).
pub(crate) struct RedlockHarness {
    servers: tokio::sync::Mutex<Vec<RedisTarget>>,
    ports: Vec<u16>,
    admins: Vec<redis::aio::ConnectionManager>,
}

impl RedlockHarness {
    pub(crate) async fn new() -> Self {
        let mut servers = Vec::new();
        let mut admins = Vec::new();
        for _ in 0..3 {
            let server = start_target().await;
            admins.push(admin_at(&server.url()).await);
            servers.push(server);
        }
        RedlockHarness {
            ports: servers.iter().map(port_of).collect(),
            servers: tokio::sync::Mutex::new(servers),
            admins,
        }
    }

    async fn client_with(&self, prefix: &str) -> Result<Client, LockError> {
        let proxies = Proxies::start(&self.ports);
        let config = redlock_config(&proxies.ports()).with_key_prefix(prefix);
        let provider = lock_redis::RedlockProvider::connect(config).await?;
        let proxies = Arc::new(proxies);
        Ok(Client::new(Arc::new(provider), proxies.clone()).with_faults(proxies))
    }
}

#[async_trait]
impl Harness for RedlockHarness {
    async fn client(&self) -> Result<Client, LockError> {
        self.client_with("lock").await
    }

    fn timing(&self) -> Timing {
        timing(REDLOCK_TTL)
    }

    fn faults(&self) -> Option<&dyn Faults> {
        Some(self)
    }

    fn inspector(&self) -> Option<&dyn Inspector> {
        Some(self)
    }

    async fn client_in_other_namespace(&self) -> Option<Result<Client, LockError>> {
        Some(self.client_with("lock-other").await)
    }
}

#[async_trait]
impl Faults for RedlockHarness {
    /// Deletes the owner key on every server.
    async fn revoke(&self, name: &str) -> FaultResult<bool> {
        let mut removed = 0;
        for admin in &self.admins {
            let count: u64 = admin
                .clone()
                .del(format!("{}:owner", tag(name)))
                .await
                .map_err(failed)?;
            removed += count;
        }
        Ok(removed > 0)
    }

    /// Pauses every server.
    async fn pause_server(&self, duration: Duration) -> FaultResult {
        let servers = self.servers.lock().await;
        for server in servers.iter() {
            server.pause().await.map_err(failed)?;
        }
        tokio::time::sleep(duration).await;
        for server in servers.iter() {
            server.resume().await.map_err(failed)?;
        }
        Ok(())
    }

    /// Restarts every server (their data is lost).
    async fn restart_server(&self) -> FaultResult {
        let mut servers = self.servers.lock().await;
        for server in servers.iter_mut() {
            server.restart().await.map_err(failed)?;
        }
        Ok(())
    }

    async fn unreachable_provider(&self) -> FaultResult<Result<Arc<dyn LockProvider>, LockError>> {
        let ports = (0..3)
            .map(|_| free_port().map_err(failed))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(lock_redis::RedlockProvider::connect(redlock_config(&ports))
            .await
            .map(|provider| Arc::new(provider) as Arc<dyn LockProvider>))
    }

    async fn wrong_credentials_provider(
        &self,
    ) -> FaultResult<Result<Arc<dyn LockProvider>, LockError>> {
        let mut config = redlock_config(&self.ports);
        for server in &mut config.servers {
            server.password = Some("wrong".into());
        }
        Ok(lock_redis::RedlockProvider::connect(config)
            .await
            .map(|provider| Arc::new(provider) as Arc<dyn LockProvider>))
    }
}

#[async_trait]
impl Inspector for RedlockHarness {
    /// A holder when any server has the owner key; Redlock's waiters leave no entries.
    async fn entries(&self, name: &str) -> Result<Entries, LockError> {
        let mut holders = 0;
        for admin in &self.admins {
            let exists: u64 = admin
                .clone()
                .exists(format!("{}:owner", tag(name)))
                .await
                .map_err(|error| inspection_failed(name, error))?;
            holders = holders.max(exists as usize);
        }
        Ok(Entries::new(holders, 0))
    }

    fn records_waiters(&self, _kind: LockKind) -> bool {
        false
    }
}
