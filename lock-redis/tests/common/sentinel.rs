//! The conformance harness on Redis Sentinel: a primary, two replicas and three sentinels of
//! the case's own; every client finds the primary through the sentinels as an ACL user of
//! its own, so that one client can be cut off (its user disabled and its connections
//! killed on every data server) while the others go on.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lock_conformance::{
    Client, Entries, FaultResult, Faults, Harness, Inspector, LockKind, Property, SessionExpiry,
    Timing, Unproven, async_trait,
};
use lock_core::{LockError, LockProvider};
use lock_redis::{RedisConfig, RedisLockProvider, RedisStrategy};
use lock_testbed::servers::{
    RedisOptions, RedisSentinelOptions, RedisSentinelSet, ServerMode, free_port,
};
use redis::AsyncCommands;

use super::{
    ADMIN_PASSWORD, CLIENT_PASSWORD, TIMEOUT, admin_of, entries_at, failed, inspection_failed,
    on_each, replicated, session_cut, tag, timing, user_rules,
};

/// The lease of the clients: longer than a failover (the sentinels' second to call the
/// primary down, their vote, the clients' move), so that a holder keeps its lock through
/// one, as H5 asks. With the suite's 2 s lease, a failover under load outlasted it, and
/// with 5 s too beside other suites.
pub(crate) const SENTINEL_TTL: Duration = Duration::from_secs(8);

/// How long the sentinels of a suite's set wait before they call a silent primary down,
/// except while a case kills it ([`KILL_DOWN_AFTER`]): a failover is the kill's alone. With
/// the sentinels' usual second, a loaded machine had them fail a live primary over, which
/// took writes for seconds more until they demoted it: a holder renewed its lease there while
/// it ran out on the new primary, and another client took the lock (F1); a waiting
/// candidate's value ran out while its place did not (L5).
const QUIET_DOWN_AFTER: Duration = Duration::from_secs(60);

/// How long the sentinels wait before they call a killed primary down.
const KILL_DOWN_AFTER: Duration = Duration::from_secs(1);

/// The data servers' options: the admin password only; the clients' users are made per
/// client.
fn server_options() -> RedisOptions {
    RedisOptions::default().with_password(ADMIN_PASSWORD)
}

/// A primary with two replicas under three sentinels, started for a test as processes or
/// in containers, as `LOCK_TEST_SERVERS` says.
pub(crate) async fn start_set() -> RedisSentinelSet {
    start_set_down_after(KILL_DOWN_AFTER).await
}

/// [`start_set`], with sentinels that call a silent primary down after `down_after`.
async fn start_set_down_after(down_after: Duration) -> RedisSentinelSet {
    let servers = ServerMode::from_env().unwrap_or_else(|error| panic!("{error}"));
    let options = RedisSentinelOptions::default()
        .with_server(server_options())
        .with_servers(servers)
        .with_down_after(down_after);
    RedisSentinelSet::start(options)
        .await
        .unwrap_or_else(|error| panic!("a Redis Sentinel set: {error}"))
}

/// The indexes of the data servers that run.
async fn running(set: &RedisSentinelSet) -> FaultResult<Vec<usize>> {
    let mut running = Vec::new();
    for (index, server) in set.data_servers().iter().enumerate() {
        if server.is_running().await.map_err(failed)? {
            running.push(index);
        }
    }
    Ok(running)
}

/// Runs the admin command `args` on every data server that runs.
async fn on_every_server(set: &RedisSentinelSet, args: &[&str]) -> FaultResult {
    let addresses = running(set).await?.into_iter();
    on_each(addresses.map(|index| set.data_addresses()[index]), args).await
}

/// The conformance harness on a Sentinel set; see the module docs.
pub(crate) struct SentinelHarness {
    strategy: RedisStrategy,
    set: Arc<tokio::sync::Mutex<RedisSentinelSet>>,
    sentinel_url: String,
    clients: AtomicUsize,
}

/// Makes (or enables again) the user of every client made so far, `client-0` to `client-N`,
/// on every data server: ACL changes are not replicated, and a restart loses them.
async fn restore_users(set: &RedisSentinelSet, clients: usize) -> FaultResult {
    for client in 0..clients {
        let rules = user_rules(&format!("client-{client}"), true);
        let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
        on_every_server(set, &rules).await?;
    }
    Ok(())
}

impl SentinelHarness {
    pub(crate) async fn new(strategy: RedisStrategy) -> Self {
        let set = start_set_down_after(QUIET_DOWN_AFTER).await;
        SentinelHarness {
            strategy,
            sentinel_url: set.url(None),
            set: Arc::new(tokio::sync::Mutex::new(set)),
            clients: AtomicUsize::new(0),
        }
    }

    /// The configuration of a client logging in as `user`.
    fn config(&self, user: &str, password: &str) -> RedisConfig {
        let login = self.sentinel_url.replacen(
            "redis+sentinel://",
            &format!("redis+sentinel://{user}:{password}@"),
            1,
        );
        RedisConfig::from_url(&login)
            .unwrap()
            .with_ttl(SENTINEL_TTL)
            .with_strategy(self.strategy)
            .with_timeout(TIMEOUT)
    }

    async fn client_with(&self, prefix: &str) -> Result<Client, LockError> {
        let user = format!("client-{}", self.clients.fetch_add(1, Ordering::SeqCst));
        {
            let set = self.set.lock().await;
            let rules = user_rules(&user, true);
            let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
            on_every_server(&set, &rules)
                .await
                .unwrap_or_else(|error| panic!("the client's user: {error}"));
        }
        let config = self.config(&user, CLIENT_PASSWORD).with_key_prefix(prefix);
        // Just after an outage the sentinels may still flag the primary down: connecting
        // then is a retryable error, as it would be for any client; a case's new client
        // waits it out (at most 10 s).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let provider = loop {
            match RedisLockProvider::connect(config.clone()).await {
                Err(error) if error.is_retryable() && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                connected => break connected?,
            }
        };
        let expiry = Arc::new(CutOff {
            set: Arc::clone(&self.set),
            user,
        });
        Ok(Client::new(Arc::new(provider), expiry))
    }

    /// An admin connection to the primary the sentinels name now.
    async fn primary_admin(&self) -> Result<redis::aio::ConnectionManager, String> {
        let primary = self.set.lock().await.primary().await;
        Ok(admin_of(primary.map_err(|error| error.to_string())?).await)
    }
}

/// One client's way to lose its session: its user disabled and its connections killed on
/// every data server for longer than its lease and its waiters' places, as a partition
/// would.
struct CutOff {
    set: Arc<tokio::sync::Mutex<RedisSentinelSet>>,
    user: String,
}

#[async_trait]
impl SessionExpiry for CutOff {
    async fn expire_session(&self) -> FaultResult {
        {
            let set = self.set.lock().await;
            let rules = user_rules(&self.user, false);
            let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
            on_every_server(&set, &rules).await?;
            on_every_server(&set, &["CLIENT", "KILL", "USER", &self.user]).await?;
        }
        tokio::time::sleep(session_cut(SENTINEL_TTL, TIMEOUT)).await;
        let set = self.set.lock().await;
        let rules = user_rules(&self.user, true);
        let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
        on_every_server(&set, &rules).await
    }
}

#[async_trait]
impl Harness for SentinelHarness {
    async fn client(&self) -> Result<Client, LockError> {
        self.client_with("lock").await
    }

    fn timing(&self) -> Timing {
        // A failover takes the sentinels' second to call the primary down, their vote, and
        // the clients' search for the new primary.
        let failover = Duration::from_secs(5);
        let timing = timing(SENTINEL_TTL);
        timing
            .with_loss_bound(timing.loss_bound + failover)
            .with_handoff_bound(timing.handoff_bound + failover)
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

    fn unproven(&self) -> Vec<Unproven> {
        vec![Unproven::new(
            Property::NoExpiredGrant,
            "the clients find the primary through the sentinels, which hand out the \
             servers' own addresses, so no proxy stands between a client and its \
             server to delay; the standalone harness proves it on the same lease code",
        )]
    }
}

#[async_trait]
impl Faults for SentinelHarness {
    async fn revoke(&self, name: &str) -> FaultResult<bool> {
        let mut admin = self.primary_admin().await.map_err(failed)?;
        let removed: u64 = admin
            .del(format!("{}:owner", tag(name)))
            .await
            .map_err(failed)?;
        Ok(removed == 1)
    }

    async fn delete_first_waiter(&self, name: &str) -> FaultResult {
        if self.strategy != RedisStrategy::Queue {
            return Err(lock_conformance::FaultError::Unsupported);
        }
        let mut admin = self.primary_admin().await.map_err(failed)?;
        let waiter: Option<String> = admin
            .lpop(format!("{}:queue", tag(name)), None)
            .await
            .map_err(failed)?;
        waiter.map(|_| ()).ok_or_else(|| failed("no waiter queued"))
    }

    /// Pauses every data server: the service stops answering (a paused primary alone would
    /// answer through its replicas once failed over, which only a kill asks for here).
    async fn pause_server(&self, duration: Duration) -> FaultResult {
        let set = self.set.lock().await;
        let running = running(&set).await?;
        for &index in &running {
            set.data_servers()[index].pause().await.map_err(failed)?;
        }
        tokio::time::sleep(duration).await;
        for &index in &running {
            set.data_servers()[index].resume().await.map_err(failed)?;
        }
        Ok(())
    }

    /// Restarts the primary (well within [`QUIET_DOWN_AFTER`], so the sentinels do not call
    /// it down): it comes back empty, and so do its replicas once they have synchronised
    /// again.
    async fn restart_server(&self) -> FaultResult {
        let mut set = self.set.lock().await;
        let index = set.primary_index().await.map_err(failed)?;
        let server = &mut set.data_servers_mut()[index];
        server.restart().await.map_err(failed)?;
        restore_users(&set, self.clients.load(Ordering::SeqCst)).await
    }

    /// Kills the primary, once its replicas hold all it wrote, and waits until the
    /// sentinels have promoted one of them (called down after [`KILL_DOWN_AFTER`] for
    /// this).
    async fn kill_leader(&self) -> FaultResult {
        let mut set = self.set.lock().await;
        let primary = set.primary().await.map_err(failed)?;
        replicated(primary, set.data_servers().len() - 1).await?;
        set.set_down_after(KILL_DOWN_AFTER).await.map_err(failed)?;
        set.kill_primary().await.map_err(failed)?;
        set.set_down_after(QUIET_DOWN_AFTER).await.map_err(failed)
    }

    async fn unreachable_provider(&self) -> FaultResult<Result<Arc<dyn LockProvider>, LockError>> {
        let port = free_port().map_err(failed)?;
        let url = format!("redis+sentinel://127.0.0.1:{port}/distlock");
        let config = RedisConfig::from_url(&url)
            .map_err(failed)?
            .with_timeout(Duration::from_secs(2));
        Ok(RedisLockProvider::connect(config)
            .await
            .map(|provider| Arc::new(provider) as Arc<dyn LockProvider>))
    }

    async fn wrong_credentials_provider(
        &self,
    ) -> FaultResult<Result<Arc<dyn LockProvider>, LockError>> {
        let config = self.config("client-0", "wrong");
        Ok(RedisLockProvider::connect(config)
            .await
            .map(|provider| Arc::new(provider) as Arc<dyn LockProvider>))
    }
}

#[async_trait]
impl Inspector for SentinelHarness {
    async fn entries(&self, name: &str) -> Result<Entries, LockError> {
        let mut admin = self
            .primary_admin()
            .await
            .map_err(|message| inspection_failed(name, message))?;
        entries_at(&mut admin, name).await
    }

    fn records_waiters(&self, kind: LockKind) -> bool {
        kind != LockKind::Mutex || self.strategy == RedisStrategy::Queue
    }
}
