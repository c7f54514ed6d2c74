//! What the ZooKeeper test binaries share: short sessions, fault proxies in front of every
//! server a client talks to, a raw look at lock directories, and the conformance harness
//! over the shared standalone server or over a shared ensemble.
#![allow(dead_code, reason = "each test binary uses a part of this module")]
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    reason = "test fixtures: a failed set-up must fail the test"
)]

use std::collections::HashMap;
use std::fmt::Debug;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use lock_conformance::{
    Client, ClientFaults, Entries, FaultError, FaultResult, Faults, Harness, Inspector, LockKind,
    Property, SessionExpiry, Timing, Unproven, async_trait, observe_until,
};
use lock_core::LockProvider;
use lock_core::{LockError, LockName};
use lock_testbed::certs;
use lock_testbed::proxy::{FaultProxy, ProxyGroup, ReplyKind, SwallowHandle};
use lock_testbed::servers::{
    ServerError, ServerMode, ZkEnsemble, ZkOptions, ZkServer, free_port, shared_zk,
};
use lock_zookeeper::{AclPolicy, DigestAuth, ZkConfig, ZkLockProvider, ZkStrategy};
use zookeeper_client::{Client as ZkClient, Error as ZkError};

/// Short sessions so that crash and expiry cases finish quickly (with a tickTime of 500 ms,
/// 1 s is the shortest session a server grants).
pub(crate) const SESSION_TIMEOUT: Duration = Duration::from_secs(2);

/// The sessions of the clients of a shared ensemble: long enough to outlast a leader's
/// failover (the survivors notice the death, elect, and the client reconnects), also when
/// the members are containers, whose published ports add a hop, on a loaded machine.
pub(crate) const ENSEMBLE_SESSION_TIMEOUT: Duration = Duration::from_secs(4);

/// The tickTime of every server these tests start.
pub(crate) const TICK_TIME: Duration = Duration::from_millis(500);

/// How the tests run ZooKeeper: tickTime [`TICK_TIME`], everything else at its default.
pub(crate) fn zk_options() -> ZkOptions {
    ZkOptions::default().with_tick_time(TICK_TIME)
}

static TLS_SERVER: OnceLock<Result<ZkServer, ServerError>> = OnceLock::new();

/// A standalone server (tickTime [`TICK_TIME`]) that serves TLS on a secure client port
/// beside its plain one, shared by one test binary's tests and started on first use, with
/// certificates made for it by a test authority (its [`trusted_authority`] is the clients'
/// `tls_ca`). Like `shared_zk`, it lives in a static, tied to no test's runtime.
///
/// [`trusted_authority`]: ZkServer::trusted_authority
pub(crate) fn tls_server() -> &'static ZkServer {
    let started = TLS_SERVER.get_or_init(|| {
        // The server copies what it needs into its own directory.
        let dir = tempfile::tempdir()?;
        certs::authority(dir.path(), "ca")?;
        certs::server_certificate(dir.path(), "ca")?;
        ZkServer::start_blocking(zk_options().with_tls(dir.path(), false))
    });
    match started {
        Ok(server) => server,
        Err(error) => panic!("a ZooKeeper server with TLS: {error}"),
    }
}

/// The directory of the lock `name` under `root`, as the provider names it.
pub(crate) fn lock_dir(root: &str, name: &str) -> String {
    format!(
        "{root}/{}",
        LockName::new(name).expect("a valid lock name").escaped()
    )
}

/// The sequence number a contender's name ends with (ten digits or more), if any.
pub(crate) fn sequence(child: &str) -> Option<i64> {
    let head = child.trim_end_matches(|c: char| c.is_ascii_digit());
    let digits = &child[head.len()..];
    (digits.len() >= 10).then(|| digits.parse().ok())?
}

/// Runs a read on `admin`, retrying connection losses for a few seconds (the admin client
/// may be reconnecting after a failover).
async fn admin_call<T, F, Fut>(mut call: F) -> Result<T, ZkError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ZkError>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match call().await {
            Err(ZkError::ConnectionLoss | ZkError::Timeout)
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

/// The children of `dir`; none when it does not exist.
pub(crate) async fn children(admin: &ZkClient, dir: &str) -> Result<Vec<String>, ZkError> {
    match admin_call(|| admin.list_children(dir)).await {
        Ok(children) => Ok(children),
        Err(ZkError::NoNode) => Ok(Vec::new()),
        Err(error) => Err(error),
    }
}

/// A raw client of `connect_string` for looking at and acting on the server's records.
pub(crate) async fn admin_client(connect_string: &str) -> ZkClient {
    admin_connect(connect_string)
        .await
        .expect("an admin client")
}

/// [`admin_client`], or why it could not connect.
async fn admin_connect(connect_string: &str) -> Result<ZkClient, ZkError> {
    ZkClient::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(connect_string)
        .await
}

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

/// The sequential nodes of `dir` in queue order, each with the session that owns it; none
/// when `dir` does not exist.
pub(crate) async fn owned_queue(
    admin: &ZkClient,
    dir: &str,
) -> Result<Vec<(String, i64)>, ZkError> {
    let mut queue: Vec<(i64, String)> = children(admin, dir)
        .await?
        .into_iter()
        .filter_map(|child| sequence(&child).map(|seq| (seq, child)))
        .collect();
    queue.sort();
    let mut owned = Vec::with_capacity(queue.len());
    for (_, child) in queue {
        // A node that left since the listing is left out.
        if let Some(stat) = admin_call(|| admin.check_stat(&format!("{dir}/{child}"))).await? {
            owned.push((child, stat.ephemeral_owner));
        }
    }
    Ok(owned)
}

/// The paths each session has a data watch on (a watch on a node's data or existence), from
/// the `wchc` four-letter word of the server at `answer`'s origin; `None` when the server
/// does not answer it (an external server that does not allow the word). The server does
/// not list child watches.
fn parse_wchc(answer: &str) -> Option<HashMap<i64, Vec<String>>> {
    let mut watches: HashMap<i64, Vec<String>> = HashMap::new();
    let mut session = None;
    for line in answer.lines().filter(|line| !line.trim().is_empty()) {
        match line.strip_prefix('\t') {
            Some(path) => watches
                .entry(session?)
                .or_default()
                .push(path.trim().to_owned()),
            None => {
                let hex = line.trim().strip_prefix("0x")?;
                session = Some(u64::from_str_radix(hex, 16).ok()? as i64);
            }
        }
    }
    Some(watches)
}

/// The data watches per session of the shared server (see [`parse_wchc`]).
pub(crate) async fn data_watches() -> Option<HashMap<i64, Vec<String>>> {
    let answer = shared_zk().ok()?.four_letter("wchc").await.ok()?;
    parse_wchc(&answer)
}

/// Whether `session` watches a node of `dir` other than `own` (the way a herd-free waiter
/// waits: on the node whose departure can let it in). `true` when the server does not
/// list its watches (`watches` is `None`): nothing more can be seen then.
pub(crate) fn watches_in(
    watches: Option<&HashMap<i64, Vec<String>>>,
    session: i64,
    dir: &str,
    own: &str,
) -> bool {
    let Some(watches) = watches else {
        return true;
    };
    watches.get(&session).is_some_and(|paths| {
        paths.iter().any(|path| {
            path.strip_prefix(dir)
                .and_then(|rest| rest.strip_prefix('/'))
                .is_some_and(|child| !child.is_empty() && child != own)
        })
    })
}

/// The providers among `providers` (by index) with a wake-up under way: one that has not
/// yet ended in a grant or in vain.
///
/// Each provider is first asked one question on its own session (its
/// [`contenders`](ZkLockProvider::contenders) of `name`): the server answers a session in
/// order, so once the answer is in, every watch notification the server had sent that
/// session before has reached the provider; then its metrics are read.
pub(crate) async fn waking(providers: &[Arc<ZkLockProvider>], name: &str) -> Vec<usize> {
    for provider in providers {
        // Only the round trip matters, not the answer.
        let _ = provider.contenders(name).await;
    }
    // Let the waiters just woken by a notification run before their metrics are read.
    tokio::task::yield_now().await;
    providers
        .iter()
        .enumerate()
        .filter(|(_, provider)| {
            let metrics = provider.metrics();
            metrics.wakeups > metrics.futile_wakeups + metrics.grants
        })
        .map(|(index, _)| index)
        .collect()
}

/// One client's fault proxies: one in front of each server of the ensemble (one for a
/// standalone server). The client is given the proxies' addresses instead of the servers'.
pub(crate) struct Proxies {
    proxies: Vec<FaultProxy>,
    /// The client's session timeout, for [`SessionExpiry::expire_session`].
    session_timeout: Duration,
    /// The client speaks TLS through them: they cannot read the replies they carry.
    encrypted: bool,
}

impl Proxies {
    /// A proxy in front of each of `servers`.
    pub(crate) fn start(servers: &[SocketAddr]) -> Self {
        Self::for_session(servers, SESSION_TIMEOUT)
    }

    /// A proxy in front of each of `servers`, for a client whose session times out after
    /// `session_timeout`.
    pub(crate) fn for_session(servers: &[SocketAddr], session_timeout: Duration) -> Self {
        Proxies {
            session_timeout,
            encrypted: false,
            proxies: servers
                .iter()
                .map(|server| FaultProxy::start(*server).expect("a fault proxy"))
                .collect(),
        }
    }

    /// The proxies' addresses, for the client's connect string.
    pub(crate) fn hosts(&self) -> Vec<String> {
        self.proxies
            .iter()
            .map(|proxy| proxy.address().to_string())
            .collect()
    }

    /// The proxy in front of the first server.
    pub(crate) fn first(&self) -> &FaultProxy {
        &self.proxies[0]
    }

    /// Closes the client's connections and refuses new ones, on every proxy.
    pub(crate) fn cut(&self) {
        self.proxies.iter().for_each(|proxy| proxy.cut());
    }

    /// Forwards again, on every proxy.
    pub(crate) fn pass(&self) {
        self.proxies.iter().for_each(|proxy| proxy.pass());
    }

    /// Arms the swallow of the next create reply on the proxy the client is connected
    /// through (the only one with an open connection), waiting a little for the client to
    /// be connected.
    pub(crate) async fn swallow_next_create(&self) -> FaultResult<SwallowHandle> {
        if let [only] = self.proxies.as_slice() {
            return Ok(only.swallow_next_reply(ReplyKind::ZkCreate));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let open: Vec<_> = self
                .proxies
                .iter()
                .filter(|proxy| proxy.stats().open > 0)
                .collect();
            if let [proxy] = open.as_slice() {
                return Ok(proxy.swallow_next_reply(ReplyKind::ZkCreate));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(FaultError::Failed(format!(
                    "the client has {} open connections; expected one",
                    open.len()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[async_trait]
impl SessionExpiry for Proxies {
    /// A partition longer than the session: the server expires the session, and the client
    /// learns it when it reconnects.
    async fn expire_session(&self) -> FaultResult {
        self.cut();
        // The server expires sessions on tick boundaries (tickTime 500 ms).
        tokio::time::sleep(self.session_timeout + Duration::from_millis(1500)).await;
        self.pass();
        Ok(())
    }
}

#[async_trait]
impl ClientFaults for Proxies {
    async fn cut_connection(&self) -> FaultResult {
        self.cut();
        Ok(())
    }

    async fn restore(&self) -> FaultResult {
        self.pass();
        Ok(())
    }

    async fn delay_connection(&self, latency: Duration) -> FaultResult {
        self.proxies.iter().for_each(|proxy| proxy.delay(latency));
        Ok(())
    }

    async fn lose_next_create_reply(&self) -> FaultResult {
        if self.encrypted {
            return Err(FaultError::Unsupported);
        }
        let _armed = self.swallow_next_create().await?;
        Ok(())
    }
}

/// The members of a shared ensemble: processes, or containers (`LOCK_TEST_SERVERS`).
type Members = ZkEnsemble;

/// How long the shared ensemble may take to elect a leader.
const ELECTION_BOUND: Duration = Duration::from_secs(30);

async fn start_members(n: usize) -> Result<Members, ServerError> {
    ZkEnsemble::start_in(ServerMode::from_env()?, n, zk_options()).await
}

/// An ensemble shared by the tests of one binary, and the turn they take on it.
///
/// Tests that share it run one at a time (see [`ZkHarness::on_ensemble`]): a leader killed
/// by one case must not disturb another case's timing.
///
/// Its members, processes or containers as `LOCK_TEST_SERVERS` says, are started and acted
/// on by a runtime of its own, which lives as long as they do: each test has a runtime of
/// its own that ends with the test, and nothing the ensemble's operations leave running (a
/// container's log stream, a pooled connection) may depend on one of those. Processes are
/// killed and containers removed when the test binary exits, however it exits.
pub(crate) struct SharedEnsemble {
    servers: Vec<SocketAddr>,
    members: tokio::sync::Mutex<Members>,
    turn: Arc<tokio::sync::Mutex<()>>,
    runtime: tokio::runtime::Runtime,
}

impl SharedEnsemble {
    /// Starts an ensemble of `n` members (tickTime [`TICK_TIME`]), blocking the calling
    /// thread only.
    pub(crate) fn start_blocking(n: usize) -> Result<Self, ServerError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("shared-ensemble")
            .enable_all()
            .build()
            .expect("a runtime for the shared ensemble");
        let started = std::thread::scope(|scope| {
            scope
                .spawn(|| runtime.block_on(start_members(n)))
                .join()
                .expect("the thread starting the ensemble")
        });
        let members = match started {
            Ok(members) => members,
            Err(error) => {
                // Dropping a runtime blocks, which a test's runtime thread must not do.
                runtime.shutdown_background();
                return Err(error);
            }
        };
        let servers = (0..members.len())
            .map(|i| {
                members
                    .address(i)
                    .expect("a member's address")
                    .parse()
                    .expect("a socket address")
            })
            .collect();
        Ok(SharedEnsemble {
            servers,
            members: tokio::sync::Mutex::new(members),
            turn: Arc::new(tokio::sync::Mutex::new(())),
            runtime,
        })
    }

    fn connect_string(&self) -> String {
        self.servers
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Whether each member runs and the last lines of its log, for a failure message.
    async fn condition(&'static self) -> String {
        self.on_members(|members: &mut Members| Box::pin(async move { members.condition().await }))
            .await
    }

    /// Runs `operation` on the members, on the ensemble's own runtime.
    async fn on_members<T, F>(&'static self, operation: F) -> T
    where
        T: Send + 'static,
        F: for<'a> FnOnce(&'a mut Members) -> Pin<Box<dyn Future<Output = T> + Send + 'a>>
            + Send
            + 'static,
    {
        self.runtime
            .spawn(async move {
                let mut members = self.members.lock().await;
                operation(&mut members).await
            })
            .await
            .expect("an operation on the shared ensemble")
    }
}

fn failed(what: &str) -> impl FnOnce(ServerError) -> FaultError + '_ {
    move |error| FaultError::Failed(format!("{what}: {error}"))
}

/// The conformance harness: every client reaches the servers through proxies of its own.
///
/// Over the shared standalone server ([`ZkHarness::new`]) it neither restarts nor kills
/// servers (the server is shared by concurrent tests). Over a [`SharedEnsemble`]
/// ([`ZkHarness::on_ensemble`]):
///
/// - `kill_leader` kills the leader, waits for a new one, then restarts the killed member
///   and waits until it has rejoined, so that later cases keep a quorum of three;
/// - `restart_server` is a rolling restart of the whole ensemble: the followers, then the
///   leader, each killed, started again and waited for until it serves, so the ensemble
///   keeps a quorum throughout except for one leader election.
///
/// Either way `pause_server` makes the servers stop answering this harness's clients, the
/// only clients the case has: their proxies keep the connections open and pass nothing
/// ([`ProxyGroup::pause`]), which is all a client sees of a paused server, while the other
/// cases (over the shared server) go on. Over the shared standalone server E4 cannot restart
/// it and is declared unproven; the ensemble harness proves it.
pub(crate) struct ZkHarness {
    strategy: ZkStrategy,
    servers: Vec<SocketAddr>,
    connect_string: String,
    admin: ZkClient,
    ensemble: Option<&'static SharedEnsemble>,
    /// [`SESSION_TIMEOUT`], or [`ENSEMBLE_SESSION_TIMEOUT`] over an ensemble.
    session_timeout: Duration,
    /// Held for the harness's lifetime over an ensemble: one case at a time.
    _turn: Option<tokio::sync::OwnedMutexGuard<()>>,
    /// Over [`tls_server`]: the clients reach its secure port (the admin client its plain
    /// one).
    tls: Option<&'static ZkServer>,
    /// The proxies of every client of this harness: the servers as the case sees them.
    servers_as_seen: ProxyGroup,
}

impl ZkHarness {
    /// A harness over the shared standalone server.
    pub(crate) async fn new(strategy: ZkStrategy) -> Self {
        let server = shared_zk().expect("a ZooKeeper server for the tests");
        let connect_string = server.connect_string();
        let servers = connect_string
            .split(',')
            .map(|host| host.parse().expect("the shared server's address"))
            .collect();
        let admin = match admin_connect(&connect_string).await {
            Ok(admin) => admin,
            Err(error) => panic!("an admin client: {error}; {}", server.condition().await),
        };
        ZkHarness {
            strategy,
            servers,
            connect_string,
            admin,
            ensemble: None,
            session_timeout: SESSION_TIMEOUT,
            _turn: None,
            tls: None,
            servers_as_seen: ProxyGroup::default(),
        }
    }

    /// A harness over [`tls_server`]: its clients connect over TLS (`zks://`, trusting
    /// the test authority) to the secure port, through proxies that carry the encrypted
    /// bytes (and so cannot lose a particular reply); the admin client uses the plain port.
    pub(crate) async fn over_tls(strategy: ZkStrategy) -> Self {
        let server = tls_server();
        let secure = server
            .secure_connect_string()
            .expect("a secure client port");
        let connect_string = server.connect_string();
        let admin = match admin_connect(&connect_string).await {
            Ok(admin) => admin,
            Err(error) => panic!("an admin client: {error}; {}", server.condition()),
        };
        ZkHarness {
            strategy,
            servers: vec![secure.parse().expect("the secure port's address")],
            connect_string,
            admin,
            ensemble: None,
            session_timeout: SESSION_TIMEOUT,
            _turn: None,
            tls: Some(server),
            servers_as_seen: ProxyGroup::default(),
        }
    }

    /// A harness over `ensemble`, holding the ensemble's turn until it is dropped. A member
    /// left killed by an earlier case that failed half-way is restarted first, and the
    /// harness is ready once the ensemble has a leader.
    pub(crate) async fn on_ensemble(
        strategy: ZkStrategy,
        ensemble: &'static SharedEnsemble,
    ) -> Self {
        let turn = Arc::clone(&ensemble.turn).lock_owned().await;
        ensemble
            .on_members(|members: &mut Members| {
                Box::pin(async move {
                    for i in 0..members.len() {
                        if !members.is_running(i).await.expect("a member") {
                            members
                                .restart(i)
                                .await
                                .expect("restarting a killed member");
                        }
                    }
                    // A case before may have paused or killed the leader: this one starts
                    // once the ensemble serves again.
                    if let Err(error) = members.wait_for_leader(ELECTION_BOUND).await {
                        panic!("an ensemble leader: {error}; {}", members.condition().await);
                    }
                })
            })
            .await;
        let connect_string = ensemble.connect_string();
        let admin = match admin_connect(&connect_string).await {
            Ok(admin) => admin,
            Err(error) => panic!(
                "an admin client of the ensemble: {error}; {}",
                ensemble.condition().await
            ),
        };
        ZkHarness {
            strategy,
            servers: ensemble.servers.clone(),
            connect_string,
            admin,
            ensemble: Some(ensemble),
            session_timeout: ENSEMBLE_SESSION_TIMEOUT,
            _turn: Some(turn),
            tls: None,
            servers_as_seen: ProxyGroup::default(),
        }
    }

    fn config(&self, root: &str) -> ZkConfig {
        let config = ZkConfig::new(self.servers.iter().map(ToString::to_string))
            .with_strategy(self.strategy)
            .with_session_timeout(self.session_timeout)
            .with_root(root);
        match self.tls.and_then(ZkServer::trusted_authority) {
            Some(authority) => config.with_tls(true).with_tls_ca(authority),
            None => config,
        }
    }

    /// A client that reaches the servers through proxies of its own.
    async fn client_with(&self, config: ZkConfig) -> Result<Client, LockError> {
        Ok(self.typed_client_with(config).await?.0)
    }

    /// [`client_with`](Self::client_with), and the client's provider as what it is.
    async fn typed_client_with(
        &self,
        config: ZkConfig,
    ) -> Result<(Client, Arc<ZkLockProvider>), LockError> {
        let mut proxies = Proxies::for_session(&self.servers, self.session_timeout);
        proxies.encrypted = self.tls.is_some();
        for proxy in &proxies.proxies {
            self.servers_as_seen.add(proxy.control());
        }
        let mut config = config;
        config.hosts = proxies.hosts();
        let provider = Arc::new(ZkLockProvider::connect(config).await?);
        let proxies = Arc::new(proxies);
        let client = Client::new(
            Arc::clone(&provider) as Arc<dyn LockProvider>,
            proxies.clone(),
        )
        .with_faults(proxies);
        Ok((client, provider))
    }

    /// A client as [`Harness::client`] makes it, and its provider as what it is (for
    /// [`waking`]).
    pub(crate) async fn zk_client(&self) -> Result<(Client, Arc<ZkLockProvider>), LockError> {
        self.typed_client_with(self.config(ZkConfig::DEFAULT_ROOT))
            .await
    }

    /// The same harness, its clients with sessions of `timeout` (at most 20 ticks, what
    /// the test servers grant).
    pub(crate) fn with_session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// The harness's own client of the servers, for looking at and changing nodes directly.
    pub(crate) fn admin(&self) -> &ZkClient {
        &self.admin
    }

    /// The sequential nodes of `dir` in queue order, each with its owner session.
    pub(crate) async fn owned_queue(&self, dir: &str) -> Vec<(String, i64)> {
        owned_queue(&self.admin, dir)
            .await
            .unwrap_or_else(|error| panic!("listing {dir}: {error}"))
    }

    /// The children of `dir`; none when it does not exist.
    pub(crate) async fn children(&self, dir: &str) -> Vec<String> {
        children(&self.admin, dir)
            .await
            .unwrap_or_else(|error| panic!("listing {dir}: {error}"))
    }

    /// The data watches per session of the servers (see [`parse_wchc`]): the shared
    /// server's, or every ensemble member's; `None` when a server does not list them.
    pub(crate) async fn data_watches(&self) -> Option<HashMap<i64, Vec<String>>> {
        if let Some(server) = self.tls {
            return parse_wchc(&server.four_letter("wchc").await.ok()?);
        }
        let Some(shared) = self.ensemble else {
            return data_watches().await;
        };
        let answers = shared
            .on_members(|members: &mut Members| {
                Box::pin(async move {
                    let mut answers = Vec::new();
                    for index in 0..members.len() {
                        answers.push(members.four_letter(index, "wchc").await.ok()?);
                    }
                    Some(answers)
                })
            })
            .await?;
        let mut all: HashMap<i64, Vec<String>> = HashMap::new();
        for answer in answers {
            for (session, paths) in parse_wchc(&answer)? {
                all.entry(session).or_default().extend(paths);
            }
        }
        Some(all)
    }

    /// The sequential children of `dir`, in queue order.
    async fn queue(&self, dir: &str) -> Result<Vec<String>, LockError> {
        let children = children(&self.admin, dir)
            .await
            .map_err(|error| LockError::other("test", error.to_string()).for_lock(dir))?;
        let mut queue: Vec<(i64, String)> = children
            .into_iter()
            .filter_map(|child| sequence(&child).map(|seq| (seq, format!("{dir}/{child}"))))
            .collect();
        queue.sort();
        Ok(queue.into_iter().map(|(_, path)| path).collect())
    }

    /// The contenders of the mutex `name`, in queue order.
    async fn contenders(&self, name: &str) -> Result<Vec<String>, LockError> {
        let dir = lock_dir(ZkConfig::DEFAULT_ROOT, name);
        let mut queue: Vec<(i64, String)> = self
            .queue(&dir)
            .await?
            .into_iter()
            .enumerate()
            .map(|(i, path)| (i as i64, path))
            .collect();
        let single = format!("{dir}/lock");
        if matches!(
            admin_call(|| self.admin.check_stat(&single)).await,
            Ok(Some(_))
        ) {
            queue.insert(0, (i64::MIN, single));
        }
        Ok(queue.into_iter().map(|(_, path)| path).collect())
    }

    fn ensemble(&self) -> FaultResult<&'static SharedEnsemble> {
        self.ensemble.ok_or(FaultError::Unsupported)
    }
}

#[async_trait]
impl Harness for ZkHarness {
    async fn client(&self) -> Result<Client, LockError> {
        self.client_with(self.config(ZkConfig::DEFAULT_ROOT)).await
    }

    fn timing(&self) -> Timing {
        Timing::default()
            .with_operation_slack(Duration::from_secs(1))
            .with_handoff_bound(Duration::from_secs(2))
            .with_loss_bound(self.session_timeout * 4)
            .with_crash_release_bound(self.session_timeout * 2)
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
        if self.ensemble.is_some() {
            return Vec::new();
        }
        vec![Unproven::new(
            Property::TokensSurviveRestart,
            "the standalone server is shared by the cases that run side by side, so it is not \
             restarted; the ensemble harness (tests/ensemble.rs) restarts its members",
        )]
    }
}

#[async_trait]
impl Faults for ZkHarness {
    async fn revoke(&self, name: &str) -> FaultResult<bool> {
        let queue = self
            .contenders(name)
            .await
            .map_err(|e| FaultError::Failed(e.to_string()))?;
        let Some(holder) = queue.first() else {
            return Ok(false);
        };
        self.admin
            .delete(holder, None)
            .await
            .map_err(|e| FaultError::Failed(format!("deleting {holder}: {e}")))?;
        Ok(true)
    }

    async fn delete_first_waiter(&self, name: &str) -> FaultResult {
        let queue = self
            .contenders(name)
            .await
            .map_err(|e| FaultError::Failed(e.to_string()))?;
        let Some(waiter) = queue.get(1) else {
            return Err(FaultError::Unsupported);
        };
        self.admin
            .delete(waiter, None)
            .await
            .map_err(|e| FaultError::Failed(format!("deleting {waiter}: {e}")))
    }

    async fn pause_server(&self, duration: Duration) -> FaultResult {
        self.servers_as_seen.pause(duration).await;
        Ok(())
    }

    async fn restart_server(&self) -> FaultResult {
        self.ensemble()?
            .on_members(|members: &mut Members| {
                Box::pin(async move {
                    let leader = members
                        .wait_for_leader(ELECTION_BOUND)
                        .await
                        .map_err(failed("the leader before the restart"))?;
                    let order: Vec<usize> = (0..members.len())
                        .filter(|&i| i != leader)
                        .chain(std::iter::once(leader))
                        .collect();
                    for member in order {
                        members
                            .restart(member)
                            .await
                            .map_err(failed("restarting a member"))?;
                        members
                            .wait_for_leader(ELECTION_BOUND)
                            .await
                            .map_err(failed("a leader during the rolling restart"))?;
                    }
                    Ok(())
                })
            })
            .await
    }

    async fn kill_leader(&self) -> FaultResult {
        self.ensemble()?
            .on_members(|members: &mut Members| {
                Box::pin(async move {
                    let leader = members
                        .wait_for_leader(ELECTION_BOUND)
                        .await
                        .map_err(failed("the leader to kill"))?;
                    members
                        .kill(leader)
                        .await
                        .map_err(failed("killing the leader"))?;
                    let new_leader = members
                        .wait_for_leader(ELECTION_BOUND)
                        .await
                        .map_err(failed("a new leader"))?;
                    if new_leader == leader {
                        return Err(FaultError::Failed(format!(
                            "member {leader} was killed yet reports itself leader"
                        )));
                    }
                    // Back as a follower: the later cases keep a quorum of three.
                    members
                        .restart(leader)
                        .await
                        .map_err(failed("restarting the killed leader"))
                })
            })
            .await
    }

    async fn unreachable_provider(&self) -> FaultResult<Result<Arc<dyn LockProvider>, LockError>> {
        let port = free_port().map_err(|e| FaultError::Failed(e.to_string()))?;
        let config = ZkConfig::new([format!("127.0.0.1:{port}")])
            .with_strategy(self.strategy)
            .with_connect_timeout(Duration::from_secs(2));
        // Directly: a proxy would make it reachable.
        Ok(ZkLockProvider::connect(config)
            .await
            .map(|provider| Arc::new(provider) as Arc<dyn LockProvider>))
    }

    async fn wrong_credentials_provider(
        &self,
    ) -> FaultResult<Result<Arc<dyn LockProvider>, LockError>> {
        // The root is created by the rightful user with a creator-only ACL.
        let root = "/distlock-secure";
        let rightful = self
            .config(root)
            .with_auth(DigestAuth::new("locker", "right"))
            .with_acl(AclPolicy::CreatorAll);
        let owner = ZkLockProvider::connect(rightful)
            .await
            .map_err(|e| FaultError::Failed(e.to_string()))?;
        let probe = lock_core::LockProvider::lock(&owner, "h2-probe")
            .map_err(|e| FaultError::Failed(e.to_string()))?;
        let mut guard = probe
            .acquire(None)
            .await
            .map_err(|e| FaultError::Failed(e.to_string()))?;
        guard
            .release()
            .await
            .map_err(|e| FaultError::Failed(e.to_string()))?;
        // The root stays (persistent parent of the container directories).
        let wrong = self
            .config(root)
            .with_auth(DigestAuth::new("locker", "wrong"))
            .with_acl(AclPolicy::CreatorAll);
        // Directly: no fault on the wire is wanted here.
        Ok(ZkLockProvider::connect(wrong)
            .await
            .map(|provider| Arc::new(provider) as Arc<dyn LockProvider>))
    }
}

/// The uuid part of a protected node's name or path (Curator's `_c_<uuid>-…`, kazoo's
/// `<hex>__…`).
pub(crate) fn uuid_of(path: &str) -> &str {
    let child = path.rsplit('/').next().unwrap_or(path);
    match child.strip_prefix("_c_") {
        Some(rest) => rest.get(..36).unwrap_or(rest),
        None => child.split("__").next().unwrap_or(child),
    }
}

/// The holders and waiters among a read-write lock's contenders, in queue order: the
/// leading readers hold together, or the leading writer alone.
pub(crate) fn rw_entries(queue: &[String]) -> Entries {
    let reader = |node: &String| node.contains("__READ__") || node.contains("__rlock__");
    let holders = match queue.first() {
        None => 0,
        Some(first) if !reader(first) => 1,
        Some(_) => queue.iter().take_while(|node| reader(node)).count(),
    };
    Entries::new(holders, queue.len() - holders)
}

/// The holders and waiters of a semaphore: every lease is held but the one of the
/// contender holding the semaphore's mutex (same uuid), which waits; every mutex contender
/// waits.
pub(crate) fn semaphore_entries(leases: &[String], locks: &[String]) -> Entries {
    let waiting: Vec<&str> = locks.iter().map(|node| uuid_of(node)).collect();
    let holders = leases
        .iter()
        .filter(|lease| !waiting.contains(&uuid_of(lease)))
        .count();
    Entries::new(holders, locks.len())
}

#[async_trait]
impl Inspector for ZkHarness {
    /// The entries of the mutex, the read-write lock, the semaphore and the election called
    /// `name` together: a case uses one kind per name. An election's first candidate leads
    /// (a holder), the others wait.
    async fn entries(&self, name: &str) -> Result<Entries, LockError> {
        let mutex = self.contenders(name).await?;
        let dir = lock_dir(ZkConfig::DEFAULT_ROOT, name);
        let rw = rw_entries(&self.queue(&format!("{dir}.rwlock")).await?);
        let semaphore = semaphore_entries(
            &self.queue(&format!("{dir}.semaphore/leases")).await?,
            &self.queue(&format!("{dir}.semaphore/locks")).await?,
        );
        let candidates = self.queue(&format!("{dir}.election")).await?.len();
        Ok(Entries::new(
            mutex.len().min(1) + rw.holders + semaphore.holders + candidates.min(1),
            mutex.len().saturating_sub(1)
                + rw.waiters
                + semaphore.waiters
                + candidates.saturating_sub(1),
        ))
    }

    fn records_waiters(&self, kind: LockKind) -> bool {
        // The single-node mutex's waiters only watch the lock node; read-write locks and
        // semaphores always queue with sequential nodes.
        kind != LockKind::Mutex || self.strategy != ZkStrategy::SingleNode
    }
}
