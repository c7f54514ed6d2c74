//! What the PostgreSQL test binaries share: one server per binary, an admin connection for
//! looking at and acting on the server's locks, and the conformance harness.
#![allow(dead_code, reason = "each test binary uses a part of this module")]
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    reason = "test fixtures: a failed set-up must fail the test"
)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lock_conformance::{
    Client, ClientFaults, Entries, FaultError, FaultResult, Faults, Harness, Inspector, LockKind,
    Property, SessionExpiry, Timing, Unproven, async_trait,
};
use lock_core::{LockError, LockProvider};
use lock_postgres::{PostgresConfig, PostgresLockProvider, PostgresStrategy};
use lock_testbed::proxy::{FaultProxy, ProxyGroup, ReplyKind};
use lock_testbed::servers::{PostgresOptions, PostgresTarget, free_port, shared_postgres};
use tokio_postgres::NoTls;

/// The keepalive of the harness's clients: a lost holder is noticed within about two
/// seconds. At 1 s, a holder's check waiting a second for its answer under the suites'
/// load on two cores made it give up a lock it held.
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(2);

/// The schema of [`Harness::client_in_other_namespace`]'s clients.
pub(crate) const OTHER_SCHEMA: &str = "distlock_other";

/// A connection to `url`, its driver spawned.
pub(crate) async fn admin_client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("an admin connection");
    tokio::spawn(connection);
    client
}

/// The server's address in `url` (`postgres://user[:password]@host:port/db`).
pub(crate) fn server_address(url: &str) -> SocketAddr {
    let authority = url
        .trim_start_matches("postgres://")
        .split('/')
        .next()
        .expect("an authority");
    let host_port = authority.rsplit('@').next().expect("host:port");
    host_port.parse().expect("a socket address")
}

/// `pg_locks l` joined with the advisory locks `k(key, permit)` of the name whose key text
/// is `$1`: its mutex, read-write lock and election (0, 1, 4), its semaphore's queue (2)
/// and its semaphore's first 100 permits (3, `permit`).
const LOCKS_OF_NAME: &str = "pg_locks l CROSS JOIN (\
     SELECT hashtextextended($1, kind) AS key, false AS permit FROM unnest('{0,1,2,4}'::int8[]) kind \
     UNION ALL SELECT hashtextextended($1 || '/' || i, 3), true FROM generate_series(0, 99) i\
     ) AS k WHERE l.locktype = 'advisory' AND l.objsubid = 1 \
     AND l.classid = ((k.key >> 32) & 4294967295)::oid AND l.objid = (k.key & 4294967295)::oid";

/// Counts (`select`) over [`LOCKS_OF_NAME`] for `name` in `schema`, of the rows that also
/// meet `condition`.
async fn count_locks(
    admin: &tokio_postgres::Client,
    (select, condition): (&str, &str),
    schema: &str,
    name: &str,
) -> Vec<usize> {
    let key = format!("{schema}/{name}");
    let statement = format!("SELECT {select} FROM {LOCKS_OF_NAME} AND {condition}");
    let row = admin
        .query_one(&statement, &[&key])
        .await
        .expect("a look at pg_locks");
    (0..row.len())
        .map(|i| usize::try_from(row.get::<_, i64>(i)).unwrap_or_default())
        .collect()
}

/// The locks of `name` in `schema`, as `pg_locks` shows them: how many are held, and how
/// many wait. A semaphore's permits held are its holders, and every contender of its queue
/// (its head, which looks for a permit, too) waits.
pub(crate) async fn advisory_locks(
    admin: &tokio_postgres::Client,
    schema: &str,
    name: &str,
) -> (usize, usize) {
    let select = "count(*) FILTER (WHERE l.granted AND (k.permit OR k.key <> \
                  hashtextextended($1, 2))), count(*) FILTER (WHERE NOT l.granted OR k.key = \
                  hashtextextended($1, 2))";
    let counts = count_locks(admin, (select, "true"), schema, name).await;
    (counts[0], counts[1])
}

/// Terminates the server processes that hold a lock of `name` in `schema`; returns how
/// many there were.
pub(crate) async fn terminate_holders(
    admin: &tokio_postgres::Client,
    schema: &str,
    name: &str,
) -> usize {
    let select = "count(pg_terminate_backend(l.pid))";
    count_locks(admin, (select, "l.granted"), schema, name).await[0]
}

/// Terminates every connection whose `application_name` is `application`, and waits (up to
/// 5 s) until the server has none left.
pub(crate) async fn terminate_application(
    admin: &tokio_postgres::Client,
    application: &str,
) -> FaultResult {
    let failed = |e: tokio_postgres::Error| FaultError::Failed(format!("terminating: {e}"));
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&application],
        )
        .await
        .map_err(failed)?;
    for _ in 0..100 {
        let left: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[&application],
            )
            .await
            .map_err(failed)?
            .get(0);
        if left == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(FaultError::Failed(format!(
        "connections of {application} still there after 5 s"
    )))
}

/// Releases `held`, then checks that `next` takes `name` at once, with a larger token, and
/// releases it.
pub(crate) async fn hand_over(held: &mut lock_core::Guard, next: &dyn LockProvider, name: &str) {
    held.release().await.unwrap();
    let mut taken = next
        .lock(name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("free after the release");
    assert!(taken.fencing_token() > held.fencing_token());
    taken.release().await.unwrap();
}

/// The conformance harness, for one strategy, over the binary's shared server.
///
/// Each client reaches the server through a fault proxy of its own, with an
/// `application_name` of its own: its session ends when the harness terminates that
/// name's connections (as the server does when the process dies), and `pause_server`
/// makes the proxies pass nothing. The server is shared by the cases that run side by
/// side, so it is not restarted here (`tests/faults.rs` restarts one of its own).
pub(crate) struct PgHarness {
    strategy: PostgresStrategy,
    url: String,
    admin: tokio_postgres::Client,
    server_as_seen: ProxyGroup,
    /// The server with a password, once a case asked for it.
    secured: tokio::sync::OnceCell<PostgresTarget>,
}

impl PgHarness {
    /// A harness over the binary's shared server.
    pub(crate) async fn new(strategy: PostgresStrategy) -> Self {
        let url = shared_postgres()
            .expect("PostgreSQL starts (Debian's postgresql package, or a container)")
            .url();
        let admin = admin_client(&url).await;
        admin
            .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {OTHER_SCHEMA}"))
            .await
            .or_else(|error| {
                // Two harnesses creating it at once: the other one made it.
                if error.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) {
                    Ok(())
                } else {
                    Err(error)
                }
            })
            .expect("the other namespace's schema");
        PgHarness {
            strategy,
            url,
            admin,
            server_as_seen: ProxyGroup::default(),
            secured: tokio::sync::OnceCell::new(),
        }
    }

    /// The admin connection.
    pub(crate) fn admin(&self) -> &tokio_postgres::Client {
        &self.admin
    }

    /// The server's URL, as the superuser.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// The configuration of a client reaching the server at `address`, as `application`.
    pub(crate) fn config_at(
        &self,
        address: SocketAddr,
        application: &str,
        schema: &str,
    ) -> PostgresConfig {
        let mut config = PostgresConfig::new(format!(
            "postgres://postgres@{address}/postgres?application_name={application}"
        ));
        config.schema = schema.to_owned();
        config.strategy = self.strategy;
        config.keepalive = KEEPALIVE;
        config.timeout = Duration::from_secs(2);
        config
    }

    /// A client in `schema` that reaches the server through a fault proxy of its own.
    async fn client_in(&self, schema: &str) -> Result<Client, LockError> {
        let proxy = FaultProxy::start(server_address(&self.url)).expect("a fault proxy");
        self.server_as_seen.add(proxy.control());
        let application = format!("distlock-test-{}", uuid::Uuid::new_v4().simple());
        let config = self.config_at(proxy.address(), &application, schema);
        let provider = Arc::new(PostgresLockProvider::connect(config).await?);
        let session = Arc::new(Terminate {
            admin: admin_client(&self.url).await,
            application,
        });
        Ok(Client::new(provider, session).with_faults(Arc::new(Proxy(proxy))))
    }
}

/// One client's fault proxy.
struct Proxy(FaultProxy);

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

    /// The reply to the client's next statement that takes an advisory lock: the server
    /// grants it, the client sees its connection drop, the server the connection end.
    async fn lose_next_create_reply(&self) -> FaultResult {
        let _armed = self
            .0
            .swallow_next_reply(ReplyKind::PgStatement("pg_try_advisory"));
        Ok(())
    }
}

/// Ends a client's session as the server does when the client's process dies: every
/// connection of the client is terminated.
struct Terminate {
    admin: tokio_postgres::Client,
    application: String,
}

#[async_trait]
impl SessionExpiry for Terminate {
    async fn expire_session(&self) -> FaultResult {
        terminate_application(&self.admin, &self.application).await
    }
}

#[async_trait]
impl Harness for PgHarness {
    async fn client(&self) -> Result<Client, LockError> {
        self.client_in(PostgresConfig::DEFAULT_SCHEMA).await
    }

    fn timing(&self) -> Timing {
        Timing::default()
            .with_operation_slack(Duration::from_secs(1))
            .with_handoff_bound(Duration::from_secs(2))
            .with_loss_bound(KEEPALIVE * 3)
            .with_crash_release_bound(KEEPALIVE * 2 + Duration::from_secs(2))
            .with_short_timeout(Duration::from_millis(300))
    }

    fn faults(&self) -> Option<&dyn Faults> {
        Some(self)
    }

    fn inspector(&self) -> Option<&dyn Inspector> {
        Some(self)
    }

    async fn client_in_other_namespace(&self) -> Option<Result<Client, LockError>> {
        Some(self.client_in(OTHER_SCHEMA).await)
    }

    fn unproven(&self) -> Vec<Unproven> {
        vec![Unproven::new(
            Property::TokensSurviveRestart,
            "the server is shared by the cases that run side by side, so it is not \
             restarted; tests/faults.rs restarts a server of its own",
        )]
    }
}

#[async_trait]
impl Faults for PgHarness {
    /// Terminates the holder's connection, as `pg_terminate_backend` by an operator.
    async fn revoke(&self, name: &str) -> FaultResult<bool> {
        Ok(terminate_holders(&self.admin, PostgresConfig::DEFAULT_SCHEMA, name).await > 0)
    }

    async fn pause_server(&self, duration: Duration) -> FaultResult {
        self.server_as_seen.pause(duration).await;
        Ok(())
    }

    async fn unreachable_provider(&self) -> FaultResult<Result<Arc<dyn LockProvider>, LockError>> {
        let port = free_port().map_err(|e| FaultError::Failed(e.to_string()))?;
        let mut config =
            PostgresConfig::new(format!("postgres://postgres@127.0.0.1:{port}/postgres"));
        config.timeout = Duration::from_millis(500);
        Ok(PostgresLockProvider::connect(config)
            .await
            .map(|provider| Arc::new(provider) as Arc<dyn LockProvider>))
    }

    async fn wrong_credentials_provider(
        &self,
    ) -> FaultResult<Result<Arc<dyn LockProvider>, LockError>> {
        let server = self
            .secured
            .get_or_try_init(|| async {
                PostgresTarget::start(PostgresOptions::default().with_password("right"))
                    .await
                    .map_err(|e| FaultError::Failed(e.to_string()))
            })
            .await?;
        let address = server_address(&server.url());
        let mut config =
            PostgresConfig::new(format!("postgres://postgres:wrong@{address}/postgres"));
        config.timeout = Duration::from_secs(2);
        Ok(PostgresLockProvider::connect(config)
            .await
            .map(|provider| Arc::new(provider) as Arc<dyn LockProvider>))
    }
}

#[async_trait]
impl Inspector for PgHarness {
    /// The locks of every kind called `name` together (a case uses one kind per name); see
    /// [`advisory_locks`].
    async fn entries(&self, name: &str) -> Result<Entries, LockError> {
        let (holders, waiters) =
            advisory_locks(&self.admin, PostgresConfig::DEFAULT_SCHEMA, name).await;
        Ok(Entries::new(holders, waiters))
    }

    /// Only the server's queue records waiters: the mutex's with `advisory`, and the
    /// read-write lock's always; the other strategies' mutex waiters wait at home.
    fn records_waiters(&self, kind: LockKind) -> bool {
        kind != LockKind::Mutex || self.strategy == PostgresStrategy::Advisory
    }
}
