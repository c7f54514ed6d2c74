use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use super::*;

/// Generous slack for a loaded 2-core machine; bounds are "no earlier than t, not much later".
const SLACK: Duration = Duration::from_millis(500);

async fn held(provider: &MemoryLockProvider, name: &str) -> Guard {
    provider
        .lock(name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("lock should be free")
}

async fn is_free(server: &MemoryServer, name: &str) -> bool {
    let probe = server.provider();
    let guard = probe.lock(name).unwrap().try_acquire().await.unwrap();
    guard.is_some()
}

/// Waits (bounded) until `name` has `count` waiters.
async fn until_waiters(provider: &MemoryLockProvider, name: &str, count: usize) {
    let start = Instant::now();
    while provider.waiters(name).unwrap() != count {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "never saw {count} waiters"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_under_fifty_concurrent_tasks() {
    let server = MemoryServer::new();
    let occupancy = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let grants = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for client in 0..5 {
        let provider = server.provider();
        for _ in 0..10 {
            let lock = provider.lock("contended").unwrap();
            let (occupancy, peak, grants) = (occupancy.clone(), peak.clone(), grants.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..20 {
                    let mut guard = if (client + round) % 3 == 0 {
                        loop {
                            if let Some(guard) = lock.try_acquire().await.unwrap() {
                                break guard;
                            }
                            tokio::task::yield_now().await;
                        }
                    } else {
                        lock.acquire(Some(Duration::from_secs(30))).await.unwrap()
                    };
                    let now = occupancy.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    occupancy.fetch_sub(1, Ordering::SeqCst);
                    grants.fetch_add(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    let all = async {
        for task in tasks {
            task.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("every task finishes");
    assert_eq!(peak.load(Ordering::SeqCst), 1, "occupancy never above one");
    assert_eq!(grants.load(Ordering::SeqCst), 5 * 10 * 20);
    assert_eq!(server.active_locks(), 0, "no residue");
}

#[tokio::test]
async fn waiters_are_granted_in_fifo_order() {
    let server = MemoryServer::new();
    let holder = server.provider();
    let mut first = held(&holder, "fifo").await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let provider = server.provider();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let mut guard = provider.lock("fifo").unwrap().acquire(None).await.unwrap();
            order.lock().unwrap().push(i);
            tokio::task::yield_now().await;
            guard.release().await.unwrap();
        }));
        until_waiters(&holder, "fifo", i + 1).await;
    }
    first.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..8).collect::<Vec<_>>());
}

#[tokio::test]
async fn timeout_bounds_and_no_residue() {
    let server = MemoryServer::new();
    let (a, b) = (server.provider(), server.provider());
    let guard = held(&a, "t").await;
    let token = guard.fencing_token();
    let lock = b.lock("t").unwrap();
    for wait in [Duration::from_millis(50), Duration::from_millis(200)] {
        let start = Instant::now();
        let err = lock.acquire(Some(wait)).await.unwrap_err();
        let took = start.elapsed();
        assert!(
            matches!(err, LockError::Timeout { waited, .. } if waited == wait),
            "{err}"
        );
        assert!(took >= wait, "timed out early: {took:?} < {wait:?}");
        assert!(took < wait + SLACK, "timed out late: {took:?}");
        assert_eq!(a.waiters("t").unwrap(), 0, "timeout leaves no waiter");
        assert_eq!(a.holder("t").unwrap(), Some(token), "holder untouched");
    }
    let msg = lock
        .acquire(Some(Duration::from_millis(1)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("memory") && msg.contains("\"t\""),
        "message names backend and lock: {msg}"
    );
}

#[tokio::test]
async fn zero_timeout_is_one_try() {
    let server = MemoryServer::new();
    let (a, b) = (server.provider(), server.provider());
    let lock = b.lock("z").unwrap();
    let mut free = lock.acquire(Some(Duration::ZERO)).await.unwrap();
    free.release().await.unwrap();
    let _held = held(&a, "z").await;
    let start = Instant::now();
    let err = lock.acquire(Some(Duration::ZERO)).await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }));
    assert!(start.elapsed() < SLACK);
    assert_eq!(a.waiters("z").unwrap(), 0);
}

#[tokio::test]
async fn huge_timeouts_wait_without_overflow() {
    let server = MemoryServer::new();
    let (a, b) = (server.provider(), server.provider());
    let mut guard = held(&a, "huge").await;
    for huge in [
        Duration::MAX,
        Duration::from_secs(u64::MAX / 2),
        Duration::from_secs(1 << 40),
    ] {
        let lock = b.lock("huge").unwrap();
        let waiting = tokio::spawn(async move {
            lock.acquire(Some(huge))
                .await
                .map(|mut g| async move { g.release().await })
        });
        until_waiters(&a, "huge", 1).await;
        guard.release().await.unwrap();
        let next = waiting.await.unwrap().expect("granted after release");
        next.await.unwrap();
        guard = held(&a, "huge").await;
    }
}

/// Polls `future` `polls` times with a waker that does nothing; returns its output if it
/// completed.
fn poll_times<F: Future>(future: std::pin::Pin<&mut F>, polls: usize) -> Option<F::Output> {
    let mut context = Context::from_waker(Waker::noop());
    let mut future = future;
    for _ in 0..polls {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return Some(output);
        }
    }
    None
}

#[tokio::test]
async fn cancel_at_every_await_point_leaves_nothing() {
    let server = MemoryServer::new();
    let (holder, waiter, other) = (server.provider(), server.provider(), server.provider());
    // With the holder releasing just before the drop (the grant races the cancel), and not.
    for release_before_drop in [false, true] {
        for polls in 0..6 {
            let mut guard = held(&holder, "cancel").await;
            let lock = waiter.lock("cancel").unwrap();
            let mut future = Box::pin(lock.acquire(None));
            assert!(
                poll_times(future.as_mut(), polls).is_none(),
                "cannot win while held"
            );
            let queued = holder.waiters("cancel").unwrap();
            assert_eq!(queued, usize::from(polls > 0));
            // A contender queued behind the cancelled one must not be stranded.
            let behind = {
                let lock = other.lock("cancel").unwrap();
                tokio::spawn(async move { lock.acquire(Some(Duration::from_secs(10))).await })
            };
            until_waiters(&holder, "cancel", queued + 1).await;
            if release_before_drop {
                guard.release().await.unwrap();
            }
            drop(future);
            let expected = usize::from(!release_before_drop);
            assert_eq!(
                holder.waiters("cancel").unwrap(),
                expected,
                "no residue of the cancelled waiter (polls={polls}, release={release_before_drop})"
            );
            guard.release().await.unwrap();
            let mut next = tokio::time::timeout(Duration::from_secs(5), behind)
                .await
                .expect("the next contender is not stranded")
                .unwrap()
                .unwrap();
            next.release().await.unwrap();
            assert!(
                is_free(&server, "cancel").await,
                "nothing held after the cancel"
            );
            assert_eq!(server.active_locks(), 0);
        }
    }
}

#[tokio::test]
async fn cancel_racing_a_grant_passes_the_lock_on() {
    let server = MemoryServer::new();
    let (a, b, c) = (server.provider(), server.provider(), server.provider());
    let mut guard = held(&a, "race").await;
    let lock_b = b.lock("race").unwrap();
    let mut cancelled = Box::pin(lock_b.acquire(None));
    assert!(poll_times(cancelled.as_mut(), 1).is_none());
    let lock_c = c.lock("race").unwrap();
    let next = tokio::spawn(async move { lock_c.acquire(None).await });
    until_waiters(&a, "race", 2).await;
    guard.release().await.unwrap(); // grants to b, which never polls again
    assert!(a.holder("race").unwrap().is_some());
    drop(cancelled);
    let mut got = tokio::time::timeout(Duration::from_secs(5), next)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(a.holder("race").unwrap(), Some(got.fencing_token()));
    got.release().await.unwrap();
    assert_eq!(server.active_locks(), 0);
}

#[tokio::test]
async fn conditional_release_after_revoke() {
    let server = MemoryServer::new();
    let (a, b) = (server.provider(), server.provider());
    let mut stale = held(&a, "r").await;
    let lost = stale.lost();
    assert_eq!(b.revoke("r").unwrap(), Some(stale.fencing_token()));
    assert_eq!(lost.reason(), Some(LossReason::Revoked));
    let mut fresh = held(&b, "r").await;
    let err = stale.release().await.unwrap_err();
    assert!(
        matches!(
            err,
            LockError::Lost {
                reason: LossReason::Revoked,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        a.holder("r").unwrap(),
        Some(fresh.fencing_token()),
        "new holder untouched"
    );
    drop(stale);
    assert_eq!(
        a.holder("r").unwrap(),
        Some(fresh.fencing_token()),
        "dropping the stale guard is harmless"
    );
    assert!(!fresh.is_lost());
    fresh.release().await.unwrap();
    assert_eq!(b.revoke("r").unwrap(), None, "nothing to revoke");
}

#[tokio::test]
async fn revoke_hands_the_lock_to_the_next_waiter() {
    let server = MemoryServer::new();
    let (a, b) = (server.provider(), server.provider());
    let _stale = held(&a, "rh").await;
    let lock = b.lock("rh").unwrap();
    let waiting = tokio::spawn(async move { lock.acquire(None).await });
    until_waiters(&a, "rh", 1).await;
    a.revoke("rh").unwrap();
    let mut next = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    next.release().await.unwrap();
}

#[tokio::test]
async fn fencing_tokens_strictly_increase() {
    let server = MemoryServer::new();
    let clients = [server.provider(), server.provider(), server.provider()];
    let mut last = FencingToken(0);
    for round in 0..30 {
        let client = &clients[round % 3];
        let mut guard = client.lock("f").unwrap().acquire(None).await.unwrap();
        assert!(
            guard.fencing_token() > last,
            "{:?} after {last:?}",
            guard.fencing_token()
        );
        last = guard.fencing_token();
        match round % 3 {
            0 => guard.release().await.unwrap(),
            1 => drop(guard),
            _ => {
                clients[0].revoke("f").unwrap();
                assert!(guard.release().await.is_err());
            }
        }
    }
}

#[tokio::test]
async fn lost_signal_seen_late_and_never_fired_by_release() {
    let server = MemoryServer::new();
    let a = server.provider();
    let mut guard = held(&a, "l").await;
    let watcher = {
        let lost = guard.lost();
        tokio::spawn(async move { lost.wait().await })
    };
    guard.release().await.unwrap();
    assert!(!guard.is_lost(), "a release never fires the signal");
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), watcher)
            .await
            .unwrap()
            .unwrap(),
        None
    );
    guard.release().await.unwrap(); // twice: no-op

    let dropped = held(&a, "l").await;
    let signal = dropped.lost();
    drop(dropped);
    assert!(!signal.is_lost(), "a drop never fires the signal");
    assert_eq!(signal.wait().await, None);

    let revoked = held(&a, "l").await;
    a.revoke("l").unwrap();
    let late = revoked.lost(); // subscribed after the loss
    assert!(late.is_lost());
    assert_eq!(late.wait().await, Some(LossReason::Revoked));
}

#[tokio::test]
async fn release_twice_or_drop_after_release_leaves_a_later_holder_alone() {
    let server = MemoryServer::new();
    let (a, b) = (server.provider(), server.provider());
    let mut first = held(&a, "twice").await;
    first.release().await.unwrap();
    let later = held(&b, "twice").await;
    first.release().await.unwrap();
    assert!(first.is_released());
    drop(first);
    assert_eq!(a.holder("twice").unwrap(), Some(later.fencing_token()));
}

#[tokio::test]
async fn drop_without_release_frees_the_lock() {
    let server = MemoryServer::new();
    let a = server.provider();
    drop(held(&a, "d").await);
    assert!(is_free(&server, "d").await);
}

#[tokio::test]
async fn not_reentrant() {
    let server = MemoryServer::new();
    let a = server.provider();
    let lock = a.lock("re").unwrap();
    let _guard = lock.try_acquire().await.unwrap().unwrap();
    assert!(lock.try_acquire().await.unwrap().is_none());
    assert!(matches!(
        lock.acquire(Some(Duration::from_millis(20))).await,
        Err(LockError::Timeout { .. })
    ));
}

#[tokio::test]
async fn session_end_frees_locks_and_fails_waiters() {
    let server = MemoryServer::new();
    let observer = server.provider();
    // Provider dropped while its guard is forgotten: the lock is freed anyway.
    {
        let doomed = server.provider();
        std::mem::forget(held(&doomed, "s").await);
    }
    assert!(is_free(&server, "s").await, "freed when the client died");

    // A kept guard of an ended session reports the loss.
    let client = server.provider();
    let mut guard = held(&client, "s").await;
    let lock = client.lock("s2").unwrap();
    let _other = held(&observer, "s2").await;
    let waiting = tokio::spawn(async move { lock.acquire(None).await });
    until_waiters(&observer, "s2", 1).await;
    client.expire_session();
    assert_eq!(guard.lost().reason(), Some(LossReason::SessionExpired));
    let err = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, LockError::SessionExpired { .. }), "{err}");
    assert_eq!(
        observer.waiters("s2").unwrap(),
        0,
        "an expired waiter never wins later"
    );
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    // The provider opens a new session for new acquisitions.
    let mut again = held(&client, "s").await;
    again.release().await.unwrap();
}

#[tokio::test]
async fn namespaces_are_independent_and_names_case_sensitive() {
    let server = MemoryServer::new();
    let (x, y) = (server.provider_in("x"), server.provider_in("y"));
    let _a = held(&x, "n").await;
    let _b = held(&y, "n").await;
    let _c = held(&x, "N").await;
    assert!(x.lock("n").unwrap().try_acquire().await.unwrap().is_none());
}

#[tokio::test]
async fn invalid_names_are_rejected_with_reasons() {
    let provider = MemoryLockProvider::new();
    for (name, reason) in [("", "empty"), ("a\0b", "NUL"), ("a\nb", "control")] {
        let err = provider.lock(name).unwrap_err();
        assert!(matches!(err, LockError::InvalidName { .. }));
        assert!(err.to_string().contains(reason), "{err}");
    }
    assert!(provider.revoke("").is_err());
}

#[tokio::test]
async fn a_release_with_waiters_wakes_exactly_one() {
    let server = MemoryServer::new();
    let holder = server.provider();
    let mut guard = held(&holder, "herd").await;
    let waiters: Vec<_> = (0..20).map(|_| server.provider()).collect();
    let mut tasks = Vec::new();
    for provider in &waiters {
        let lock = provider.lock("herd").unwrap();
        tasks.push(tokio::spawn(async move { lock.acquire(None).await }));
    }
    until_waiters(&holder, "herd", 20).await;
    let before: Vec<_> = waiters.iter().map(|p| p.metrics()).collect();
    guard.release().await.unwrap();
    // Exactly one task finishes with a guard.
    let start = Instant::now();
    while holder.waiters("herd").unwrap() != 19 {
        assert!(start.elapsed() < Duration::from_secs(5));
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let woken: u64 = waiters
        .iter()
        .zip(&before)
        .map(|(p, b)| p.metrics().since(b).wakeups)
        .sum();
    assert_eq!(woken, 1, "herd-free: one wake-up per release");
    for task in tasks {
        task.abort();
    }
}

#[test]
fn capabilities_declare_the_contract() {
    let caps = MemoryLockProvider::new().capabilities();
    assert_eq!(caps.fencing, Fencing::Monotonic);
    assert!(caps.lost_detection && caps.fifo);
    assert_eq!(caps.wait, WaitKind::NotifyOne);
    assert_eq!(caps.crash_release_bound, Some(Duration::ZERO));
}

#[tokio::test]
async fn debug_everywhere() {
    let provider = MemoryLockProvider::new();
    let lock = provider.lock("dbg").unwrap();
    let guard = lock.try_acquire().await.unwrap().unwrap();
    for text in [
        format!("{provider:?}"),
        format!("{lock:?}"),
        format!("{guard:?}"),
        format!("{:?}", provider.server()),
    ] {
        assert!(!text.is_empty());
    }
    assert!(format!("{guard:?}").contains("dbg"));
}
