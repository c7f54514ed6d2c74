//! `distlock::connect` and `BackendConfig::from_url` for every scheme and feature set.

// Helpers outside `#[test]` functions are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use distlock::{BackendConfig, LockError};

fn config_error(url: &str) -> String {
    match BackendConfig::from_url(url) {
        Err(LockError::Config { message }) => message,
        other => panic!("expected a Config error for {url}, got {other:?}"),
    }
}

/// The "enabled features" list the facade reports for this build.
fn enabled() -> String {
    let features: Vec<&str> = [
        cfg!(feature = "memory").then_some("memory"),
        cfg!(feature = "zookeeper").then_some("zookeeper"),
        cfg!(feature = "redis").then_some("redis"),
        cfg!(feature = "etcd").then_some("etcd"),
        cfg!(feature = "postgres").then_some("postgres"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if features.is_empty() {
        "none".to_owned()
    } else {
        features.join(", ")
    }
}

#[test]
fn unknown_scheme_lists_the_supported_ones() {
    let e = config_error("consul://localhost:8500");
    assert!(e.contains("unknown URL scheme \"consul\""), "{e}");
    for scheme in [
        "memory://",
        "zk://",
        "zookeeper://",
        "redis://",
        "rediss://",
        "redlock://",
        "etcd://",
        "postgres://",
        "postgresql://",
    ] {
        assert!(e.contains(scheme), "{scheme} missing from: {e}");
    }
    assert!(
        e.contains(&format!("(enabled features: {})", enabled())),
        "{e}"
    );
}

#[test]
fn malformed_url_is_a_config_error() {
    assert!(config_error("localhost:2181").contains("no scheme"));
    assert!(config_error("").contains("no scheme"));
    assert!(config_error("memory://x#frag").contains("fragment"));
    assert!(config_error("zk://h1,,h2").contains("empty host"));
    assert!(!config_error("u:topsecret@host").contains("topsecret"));
}

#[tokio::test]
async fn connect_reports_url_errors() {
    let e = distlock::connect("nope://x").await.unwrap_err();
    assert!(matches!(e, LockError::Config { .. }), "{e}");
}

#[cfg(not(feature = "memory"))]
#[tokio::test]
async fn memory_scheme_needs_its_feature() {
    let e = config_error("memory://");
    assert_eq!(
        e,
        format!(
            "the \"memory\" scheme needs the \"memory\" feature of distlock (enabled features: {})",
            enabled()
        )
    );
    assert!(distlock::connect("memory://jobs").await.is_err());
}

#[cfg(not(feature = "zookeeper"))]
#[test]
fn zookeeper_schemes_need_their_feature() {
    for scheme in ["zk", "zookeeper"] {
        let e = config_error(&format!("{scheme}://localhost:2181"));
        assert_eq!(
            e,
            format!(
                "the \"{scheme}\" scheme needs the \"zookeeper\" feature of distlock \
                 (enabled features: {})",
                enabled()
            )
        );
    }
}

#[cfg(not(feature = "redis"))]
#[test]
fn redis_schemes_need_their_feature() {
    for scheme in ["redis", "rediss", "redlock"] {
        let e = config_error(&format!("{scheme}://localhost"));
        assert_eq!(
            e,
            format!(
                "the \"{scheme}\" scheme needs the \"redis\" feature of distlock \
                 (enabled features: {})",
                enabled()
            )
        );
    }
}

#[cfg(not(feature = "etcd"))]
#[test]
fn etcd_scheme_needs_its_feature() {
    let e = config_error("etcd://localhost:2379");
    assert_eq!(
        e,
        format!(
            "the \"etcd\" scheme needs the \"etcd\" feature of distlock (enabled features: {})",
            enabled()
        )
    );
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_urls_are_read_by_the_etcd_backend() {
    use distlock::etcd::{EtcdConfig, EtcdStrategy};
    let config = BackendConfig::from_url("etcd://e1:2380,e2/apps?strategy=prefix").unwrap();
    assert_eq!(config.backend(), "etcd");
    let expected = EtcdConfig::new(["e1:2380", "e2:2379"])
        .with_prefix("/apps")
        .with_strategy(EtcdStrategy::WholeQueue);
    assert_eq!(config, BackendConfig::Etcd(expected));
    let e = config_error("etcd://u:topsecret@e1?lease_ttl=1s");
    assert!(e.contains("lease_ttl") && !e.contains("topsecret"), "{e}");
}

#[cfg(not(feature = "postgres"))]
#[test]
fn postgres_scheme_needs_its_feature() {
    let e = config_error("postgres://localhost/app");
    assert_eq!(
        e,
        format!(
            "the \"postgres\" scheme needs the \"postgres\" feature of distlock (enabled \
             features: {})",
            enabled()
        )
    );
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_urls_are_read_by_the_postgres_backend() {
    use distlock::postgres::{PostgresConfig, PostgresStrategy};
    let url = "postgresql://locker@db1:5433/app?strategy=polling&application_name=jobs";
    let config = BackendConfig::from_url(url).unwrap();
    assert_eq!(config.backend(), "postgres");
    let mut expected =
        PostgresConfig::new("postgresql://locker@db1:5433/app?application_name=jobs");
    expected.strategy = PostgresStrategy::Polling;
    assert_eq!(config, BackendConfig::Postgres(expected));
    let e = config_error("postgres://u:topsecret@db1?keepalive=0s");
    assert!(e.contains("keepalive") && !e.contains("topsecret"), "{e}");
    let e = config_error("postgres://u:topsecret@db1?no_such_option=1");
    assert!(
        e.contains("no_such_option") && !e.contains("topsecret"),
        "{e}"
    );
}

#[cfg(feature = "memory")]
mod memory {
    use std::sync::Arc;
    use std::time::Duration;

    use distlock::{BackendConfig, LockError, LockProvider, MemoryConfig};

    use super::config_error;

    #[test]
    fn accepted_forms() {
        for (url, expected) in [
            ("memory://", MemoryConfig::new()),
            ("MEMORY://", MemoryConfig::new()),
            ("memory:///", MemoryConfig::new()),
            ("memory://jobs", MemoryConfig::new().with_server("jobs")),
            (
                "memory://jobs?namespace=tests",
                MemoryConfig::new()
                    .with_server("jobs")
                    .with_namespace("tests"),
            ),
            (
                "memory://?namespace=a%2Fb",
                MemoryConfig::new().with_namespace("a/b"),
            ),
        ] {
            assert_eq!(
                BackendConfig::from_url(url).unwrap(),
                BackendConfig::Memory(expected.clone()),
                "{url}"
            );
            assert_eq!(MemoryConfig::from_url(url).unwrap(), expected, "{url}");
        }
        assert_eq!(
            BackendConfig::from_url("memory://").unwrap().backend(),
            "memory"
        );
    }

    #[test]
    fn malformed_memory_urls() {
        for (url, expected) in [
            ("memory://jobs:1", "must not have a port"),
            ("memory://a,b", "at most one server"),
            ("memory://jobs/x", "no path"),
            ("memory://u:topsecret@jobs", "no user name or password"),
            ("memory://jobs?ns=x", "unknown parameter \"ns\""),
            ("memory://jobs?namespace", "no value"),
        ] {
            let e = config_error(url);
            assert!(e.contains(expected), "{url}: {e}");
            assert!(!e.contains("topsecret"), "{url}: {e}");
        }
        let e = MemoryConfig::from_url("zk://h").unwrap_err().to_string();
        assert!(e.contains("expected memory://"), "{e}");
    }

    async fn holds(provider: &Arc<dyn LockProvider>, name: &str) -> distlock::Guard {
        provider
            .lock(name)
            .unwrap()
            .acquire(Some(Duration::from_secs(5)))
            .await
            .unwrap()
    }

    async fn is_free(provider: &Arc<dyn LockProvider>, name: &str) -> bool {
        provider
            .lock(name)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_some()
    }

    #[tokio::test]
    async fn named_servers_are_shared() {
        let a = distlock::connect("memory://connect-test-shared")
            .await
            .unwrap();
        let b = distlock::connect("memory://connect-test-shared")
            .await
            .unwrap();
        assert_eq!(a.backend(), "memory");
        let mut guard = holds(&a, "job").await;
        assert!(!is_free(&b, "job").await, "the same named server is shared");
        guard.release().await.unwrap();
        assert!(is_free(&b, "job").await);
    }

    #[tokio::test]
    async fn different_names_are_different_servers() {
        let a = distlock::connect("memory://connect-test-one")
            .await
            .unwrap();
        let b = distlock::connect("memory://connect-test-two")
            .await
            .unwrap();
        let _guard = holds(&a, "job").await;
        assert!(is_free(&b, "job").await);
    }

    #[tokio::test]
    async fn unnamed_servers_are_private() {
        let a = distlock::connect("memory://").await.unwrap();
        let b = distlock::connect("memory://").await.unwrap();
        let _guard = holds(&a, "job").await;
        assert!(
            is_free(&b, "job").await,
            "memory:// is a new private server"
        );
        assert!(!is_free(&a, "job").await, "not re-entrant");
    }

    #[tokio::test]
    async fn namespaces_keep_names_apart() {
        let a = distlock::connect("memory://connect-test-ns?namespace=a")
            .await
            .unwrap();
        let a2 = distlock::connect("memory://connect-test-ns?namespace=a")
            .await
            .unwrap();
        let b = distlock::connect("memory://connect-test-ns?namespace=b")
            .await
            .unwrap();
        let _guard = holds(&a, "job").await;
        assert!(!is_free(&a2, "job").await);
        assert!(is_free(&b, "job").await);
    }

    #[tokio::test]
    async fn connect_via_config() {
        let provider = BackendConfig::Memory(MemoryConfig::new().with_server("connect-test-cfg"))
            .connect()
            .await
            .unwrap();
        let other = distlock::connect("memory://connect-test-cfg")
            .await
            .unwrap();
        let _guard = holds(&provider, "x").await;
        assert!(!is_free(&other, "x").await);
        let e = provider.lock("").unwrap_err();
        assert!(matches!(e, LockError::InvalidName { .. }), "{e}");
    }
}

#[cfg(feature = "zookeeper")]
mod zookeeper {
    use std::time::Duration;

    use distlock::zookeeper::{ZkConfig, ZkStrategy};
    use distlock::{BackendConfig, LockError};

    use super::config_error;

    #[test]
    fn accepted_forms() {
        let BackendConfig::ZooKeeper(config) = BackendConfig::from_url(
            "zk://app:pw@zk1,zk2:2182/apps?session_timeout=6s&strategy=children",
        )
        .unwrap() else {
            panic!("not a ZooKeeper config");
        };
        assert_eq!(config.hosts, ["zk1:2181", "zk2:2182"]);
        assert_eq!(config.chroot.as_deref(), Some("/apps"));
        assert_eq!(config.session_timeout, Duration::from_secs(6));
        assert_eq!(config.strategy, ZkStrategy::WholeQueue);
        assert_eq!(
            BackendConfig::from_url("zookeeper://localhost").unwrap(),
            BackendConfig::ZooKeeper(ZkConfig::new(["localhost:2181"]))
        );
        assert_eq!(
            BackendConfig::from_url("zk://localhost").unwrap().backend(),
            "zookeeper"
        );
    }

    #[test]
    fn malformed_zookeeper_urls() {
        for (url, expected) in [
            ("zk://", "no host"),
            ("zk://h/apps/", "chroot"),
            ("zk://h?session_timeout=0s", "session_timeout"),
            ("zk://h?acl=creator", "credentials"),
            ("zk://h?bogus=1", "unknown parameter"),
            ("zk://u:topsecret@h?strategy=x", "strategy"),
        ] {
            let e = config_error(url);
            assert!(e.contains(expected), "{url}: {e}");
            assert!(!e.contains("topsecret"), "{url}: {e}");
        }
    }

    #[tokio::test]
    async fn an_unreachable_ensemble_is_a_bounded_retryable_connection_error() {
        let port = lock_testbed::servers::free_port().unwrap();
        let started = std::time::Instant::now();
        let e = distlock::connect(&format!("zk://127.0.0.1:{port}?connect_timeout=1s"))
            .await
            .unwrap_err();
        assert!(matches!(e, LockError::Connection { .. }), "{e}");
        assert!(e.is_retryable());
        assert!(
            e.to_string().contains(&port.to_string()),
            "names the address: {e}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "took {:?}",
            started.elapsed()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_real_server_serves_locks_through_the_facade() {
        let server = lock_testbed::servers::shared_zk().unwrap();
        let url = format!("zk://{}?session_timeout=2s", server.connect_string());
        let (a, b) = (
            distlock::connect(&url).await.unwrap(),
            distlock::connect(&url).await.unwrap(),
        );
        assert_eq!(a.backend(), "zookeeper");
        let name = lock_conformance::unique_name("facade");
        let mut held = a.lock(&name).unwrap().try_acquire().await.unwrap().unwrap();
        assert!(
            b.lock(&name)
                .unwrap()
                .try_acquire()
                .await
                .unwrap()
                .is_none()
        );
        held.release().await.unwrap();
        let mut next = b.lock(&name).unwrap().try_acquire().await.unwrap().unwrap();
        assert!(next.fencing_token() > held.fencing_token());
        next.release().await.unwrap();
    }
}

#[cfg(feature = "redis")]
mod redis {
    use std::time::Duration;

    use distlock::redis::{RedisConfig, RedisServer, RedisStrategy, RedlockConfig};
    use distlock::{BackendConfig, LockError};

    use super::config_error;

    #[test]
    fn accepted_forms() {
        assert_eq!(
            BackendConfig::from_url("redis://localhost").unwrap(),
            BackendConfig::Redis(RedisConfig::new(RedisServer::new("localhost")))
        );
        let BackendConfig::Redis(config) =
            BackendConfig::from_url("rediss://:pw@cache:6380/2?ttl=5s&strategy=pubsub").unwrap()
        else {
            panic!("not a Redis config");
        };
        assert!(config.server.tls);
        assert_eq!(config.server.port, 6380);
        assert_eq!(config.server.db, 2);
        assert_eq!(config.lease.ttl, Duration::from_secs(5));
        assert_eq!(config.strategy, RedisStrategy::PubSub);
        let BackendConfig::Redlock(config) =
            BackendConfig::from_url("redlock://r1,r2,r3?retry_count=1").unwrap()
        else {
            panic!("not a Redlock config");
        };
        assert_eq!(config.servers.len(), 3);
        assert_eq!(config.retry_count, 1);
        assert_eq!(
            BackendConfig::from_url("redlock://r1").unwrap(),
            BackendConfig::Redlock(RedlockConfig::new([RedisServer::new("r1")]))
        );
        assert_eq!(
            BackendConfig::from_url("redis://h").unwrap().backend(),
            "redis"
        );
        assert_eq!(
            BackendConfig::from_url("rediss://h").unwrap().backend(),
            "redis"
        );
        assert_eq!(
            BackendConfig::from_url("redlock://h").unwrap().backend(),
            "redlock"
        );
    }

    #[test]
    fn malformed_redis_urls() {
        for (url, expected) in [
            ("redis://", "no host"),
            ("redis://a,b", "2 hosts"),
            ("redis://h/x", "database number"),
            ("redis://h?ttl=10ms", "ttl"),
            ("rediss://h?prefix=%7B", "prefix"),
            ("redis://u:topsecret@h?strategy=x", "strategy"),
            ("redlock://", "no host"),
            ("redlock://r1?drift_factor=2", "drift_factor"),
            ("redlock://u:topsecret@r1?tls=maybe", "true or false"),
            ("redlock://r1?strategy=queue", "unknown parameter"),
        ] {
            let e = config_error(url);
            assert!(e.contains(expected), "{url}: {e}");
            assert!(!e.contains("topsecret"), "{url}: {e}");
        }
    }

    #[tokio::test]
    async fn an_unreadable_tls_authority_is_a_config_error() {
        let e = distlock::connect("rediss://localhost?tls_ca=/nonexistent/ca.pem")
            .await
            .unwrap_err();
        assert!(matches!(e, LockError::Config { .. }), "{e}");
        assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn real_servers_serve_locks_through_the_facade() {
        use lock_testbed::servers::{RedisOptions, RedisServer};

        let mut servers = Vec::new();
        for _ in 0..3 {
            servers.push(RedisServer::start(RedisOptions::default()).await.unwrap());
        }
        let port = |i: usize| servers[i].port();
        let single = format!("redis://127.0.0.1:{}?ttl=2s", port(0));
        let redlock = format!(
            "redlock://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}?ttl=2s",
            port(0),
            port(1),
            port(2)
        );
        for (url, backend) in [(single, "redis"), (redlock, "redlock")] {
            let (a, b) = (
                distlock::connect(&url).await.unwrap(),
                distlock::connect(&url).await.unwrap(),
            );
            assert_eq!(a.backend(), backend);
            let name = lock_conformance::unique_name("facade");
            let mut held = a.lock(&name).unwrap().try_acquire().await.unwrap().unwrap();
            assert!(
                b.lock(&name)
                    .unwrap()
                    .try_acquire()
                    .await
                    .unwrap()
                    .is_none(),
                "{backend}: a second holder"
            );
            held.release().await.unwrap();
            let mut next = b.lock(&name).unwrap().try_acquire().await.unwrap().unwrap();
            next.release().await.unwrap();
        }
    }

    #[tokio::test]
    async fn an_unreachable_server_is_a_bounded_retryable_connection_error() {
        let port = lock_testbed::servers::free_port().unwrap();
        for url in [
            format!("redis://127.0.0.1:{port}?timeout=1s"),
            format!("redlock://127.0.0.1:{port}?timeout=1s"),
        ] {
            let started = std::time::Instant::now();
            let e = distlock::connect(&url).await.unwrap_err();
            assert!(matches!(e, LockError::Connection { .. }), "{url}: {e}");
            assert!(e.is_retryable(), "{url}");
            assert!(
                started.elapsed() < std::time::Duration::from_secs(5),
                "{url}: took {:?}",
                started.elapsed()
            );
        }
    }
}

/// A planted password shows in no configuration's `Debug` and in no error, whichever way it
/// was given (in the URL, or in a `password_file`), for every scheme built in.
#[test]
fn no_configuration_shows_its_password() {
    const PLANTED: &str = "pl4nted-S3cret";
    let file = std::env::temp_dir().join(format!("distlock-planted-{}", std::process::id()));
    std::fs::write(&file, format!("{PLANTED}\n")).unwrap();
    let file = file.display().to_string();
    // (the password in the URL, the same URL for a password_file, whether it is built in)
    let schemes = [
        (
            "zk://app:{PW}@h1:2181,h2/apps",
            "zk://app@h1:2181,h2/apps",
            cfg!(feature = "zookeeper"),
        ),
        (
            "redis://app:{PW}@h:6379/1",
            "redis://app@h:6379/1",
            cfg!(feature = "redis"),
        ),
        ("rediss://:{PW}@h", "rediss://h", cfg!(feature = "redis")),
        (
            "redis+sentinel://app:{PW}@s1,s2/primary",
            "redis+sentinel://app@s1,s2/primary",
            cfg!(feature = "redis"),
        ),
        (
            "redis+cluster://app:{PW}@n1,n2",
            "redis+cluster://app@n1,n2",
            cfg!(feature = "redis"),
        ),
        (
            "redlock://app:{PW}@r1,r2,r3",
            "redlock://app@r1,r2,r3",
            cfg!(feature = "redis"),
        ),
        (
            "etcd://app:{PW}@e1:2379",
            "etcd://app@e1:2379",
            cfg!(feature = "etcd"),
        ),
        (
            "postgres://app:{PW}@db/app",
            "postgres://app@db/app",
            cfg!(feature = "postgres"),
        ),
    ];
    for (with_password, without, built) in schemes {
        for url in [
            with_password.replace("{PW}", PLANTED),
            format!("{without}?password_file={file}"),
        ] {
            let shown = match BackendConfig::from_url(&url) {
                Ok(config) => format!("{config:?}"),
                Err(error) => {
                    assert!(!built, "{url}: {error}");
                    format!("{error} {error:?}")
                }
            };
            assert!(!shown.contains(PLANTED), "{url}: {shown}");
            let bad = format!("{url}{}bogus=1", if url.contains('?') { '&' } else { '?' });
            let error = BackendConfig::from_url(&bad).unwrap_err();
            let shown = format!("{error} {error:?}");
            assert!(!shown.contains(PLANTED), "{bad}: {shown}");
        }
    }
    std::fs::remove_file(file).unwrap();
}
