//! Redlock against three real servers of the test's own, some of them killed: a majority
//! keeps granting and renewing; without one, acquisitions fail fast, within the validity
//! window, and leave no partial grant.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr,
    reason = "test code: a failed set-up or check must fail the test; the figures are printed"
)]

mod common;

use std::time::Duration;

use common::{REDLOCK_TTL, admin, redlock_config, start_server, tag};
use lock_conformance::unique_name;
use lock_core::{LockError, LockProvider};
use lock_redis::RedlockProvider;
use lock_testbed::servers::RedisServer;
use redis::AsyncCommands;
use tokio::time::{Instant, sleep};

/// Whether each live server (by index) has the owner key of `name`.
async fn owners(admins: &mut [Option<redis::aio::ConnectionManager>], name: &str) -> Vec<bool> {
    let mut found = Vec::new();
    for admin in admins.iter_mut() {
        found.push(match admin {
            Some(admin) => admin
                .exists::<_, bool>(format!("{}:owner", tag(name)))
                .await
                .unwrap(),
            None => false,
        });
    }
    found
}

/// Three servers of the test's own, and their ports.
async fn three_servers() -> (Vec<RedisServer>, Vec<u16>) {
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(start_server().await);
    }
    let ports = servers.iter().map(RedisServer::port).collect();
    (servers, ports)
}

/// A Redlock client of the servers at `ports`.
async fn connect(ports: &[u16]) -> RedlockProvider {
    RedlockProvider::connect(redlock_config(ports))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_grants_and_a_minority_fails_fast_without_partial_grants() {
    let (mut servers, ports) = three_servers().await;
    let mut admins = Vec::new();
    for server in &servers {
        admins.push(Some(admin(server).await));
    }
    let provider = connect(&ports).await;
    let other = connect(&ports).await;
    let name = unique_name("redlock-kill");
    let lock = provider.lock(&name).unwrap();

    // All three up: a grant holds the key everywhere.
    let mut guard = lock.try_acquire().await.unwrap().expect("a free lock");
    assert_eq!(owners(&mut admins, &name).await, [true, true, true]);
    guard.release().await.unwrap();

    // One killed while held: the holder keeps renewing on the other two.
    let mut guard = lock.try_acquire().await.unwrap().expect("a free lock");
    servers[0].kill();
    admins[0] = None;
    sleep(REDLOCK_TTL * 3).await;
    assert!(
        !guard.is_lost(),
        "a holder lost its lock with two of three servers alive"
    );
    assert_eq!(owners(&mut admins, &name).await, [false, true, true]);
    assert!(
        other
            .lock(&name)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "a second holder with two of three servers alive"
    );
    guard.release().await.unwrap();
    assert_eq!(owners(&mut admins, &name).await, [false, false, false]);

    // One of three down: new grants still succeed.
    let asked = Instant::now();
    let mut guard = lock
        .try_acquire()
        .await
        .unwrap()
        .expect("a grant from two of three");
    let granted_in = asked.elapsed();
    assert_eq!(owners(&mut admins, &name).await, [false, true, true]);
    guard.release().await.unwrap();

    // Two of three down: a bounded, retryable error within the validity window, and no
    // vote left on the survivor.
    servers[1].kill();
    admins[1] = None;
    for (what, timeout) in [
        ("try", Some(Duration::ZERO)),
        ("acquire", Some(Duration::from_secs(10))),
    ] {
        let asked = Instant::now();
        let result = lock.acquire(timeout).await;
        let took = asked.elapsed();
        match result {
            Err(error @ LockError::Connection { .. }) => {
                assert!(error.is_retryable(), "{what}: {error}");
            }
            Err(other) if what == "try" && matches!(other, LockError::Timeout { .. }) => {
                panic!("{what}: a minority reported busy, not unreachable")
            }
            other => panic!("{what}: expected a connection error, got {other:?}"),
        }
        assert!(
            took < REDLOCK_TTL,
            "{what}: failing took {took:?}, longer than the validity window {REDLOCK_TTL:?}"
        );
        assert_eq!(
            owners(&mut admins, &name).await,
            [false, false, false],
            "{what}: a partial grant was left"
        );
        eprintln!("redlock: two of three servers down: {what} failed in {took:?}");
    }

    // Back to a majority: grants work again.
    servers[1].restart().await.unwrap();
    let mut guard = lock
        .acquire(Some(Duration::from_secs(5)))
        .await
        .expect("a grant once a majority is back");
    guard.release().await.unwrap();
    eprintln!("redlock: one of three servers down: granted in {granted_in:?}");
}

/// A grant's token is above every earlier grant's, whichever majority granted them. Server
/// 0 has counted far ahead of the others; a grant by all three reports its count, and its
/// second round raises the other two to it, so that the next grant, by servers 1 and 2 with
/// server 0 gone, counts past it. Without the second round that grant reported 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_from_one_majority_to_another() {
    let (mut servers, ports) = three_servers().await;
    let mut admins = Vec::new();
    for server in &servers {
        admins.push(admin(server).await);
    }
    let provider = connect(&ports).await;
    let name = unique_name("redlock-tokens");
    let fence = format!("{}:fence", tag(&name));
    let _: () = admins[0].set(&fence, 100).await.unwrap();
    let lock = provider.lock(&name).unwrap();

    let mut first = lock.try_acquire().await.unwrap().expect("a free lock");
    let first_token = first.fencing_token().0;
    assert_eq!(
        first_token, 101,
        "the grant reports its majority's largest count"
    );
    for admin in &mut admins[1..] {
        let counter: u64 = admin.get(&fence).await.unwrap();
        assert!(
            counter >= first_token,
            "a counter of the majority was left at {counter}, below the grant's {first_token}"
        );
    }
    first.release().await.unwrap();

    servers[0].kill();
    let mut second = lock.try_acquire().await.unwrap().expect("a free lock");
    let second_token = second.fencing_token().0;
    assert!(
        second_token > first_token,
        "servers 1 and 2 granted {second_token} after {first_token}"
    );
    second.release().await.unwrap();
    eprintln!("redlock tokens: {first_token} by all three, then {second_token} by two");
}

/// A server that does not answer costs a grant one round budget, not two: the second round
/// goes only to the servers that voted. With a third of the ttl waited out twice, the grant
/// came back with so little validity that its first renewal, which waits out the silent
/// server too, came too late and the lock was lost at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_costs_a_grant_one_round() {
    let (servers, ports) = three_servers().await;
    let provider = connect(&ports).await;
    let name = unique_name("redlock-silent");
    let lock = provider.lock(&name).unwrap();
    // One round waits at most a third of the ttl for a server (the config's timeout is
    // longer).
    let budget = REDLOCK_TTL / 3;

    servers[0].pause().unwrap();
    let asked = Instant::now();
    let mut guard = lock.try_acquire().await.unwrap().expect("a free lock");
    let took = asked.elapsed();
    assert!(
        took < budget * 2,
        "the grant took {took:?}: the silent server was waited for twice (budget {budget:?})"
    );
    sleep(REDLOCK_TTL * 2).await;
    assert!(
        !guard.is_lost(),
        "the lock was lost with two of three servers answering"
    );
    guard.release().await.unwrap();
    servers[0].resume().unwrap();
    eprintln!("redlock with a silent server: granted in {took:?}");
}
