use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use super::*;
use crate::{Guard, LossReason};

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
    let providers: Vec<_> = (0..5).map(|_| server.provider()).collect();
    for (client, provider) in providers.iter().enumerate() {
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
async fn the_queue_lists_the_holder_then_the_waiters_in_line() {
    let server = MemoryServer::new();
    let holder = server.provider();
    let lock = holder.lock("listed").unwrap();
    let free = lock.queue().await.unwrap();
    assert!(
        free.contenders.is_empty() && free.waiters_recorded,
        "{free:?}"
    );
    let mut guard = held(&holder, "listed").await;
    let mut waiting = Vec::new();
    for count in 1..=2 {
        let provider = server.provider();
        waiting.push(tokio::spawn(async move {
            let lock = provider.lock("listed").unwrap();
            lock.acquire(None).await.unwrap().release().await.unwrap();
        }));
        until_waiters(&holder, "listed", count).await;
    }
    let queue = lock.queue().await.unwrap();
    let held_by = queue.holder().expect("a holder");
    assert_eq!(held_by.fencing_token, Some(guard.fencing_token()));
    let waiters: Vec<_> = queue.waiters().map(|w| w.place.clone()).collect();
    assert_eq!(waiters.len(), 2, "{queue:?}");
    let first_waiter = waiters[0].clone();
    guard.release().await.unwrap();
    // The first waiter listed is the next holder (it may have released already).
    let next = lock.queue().await.unwrap();
    let places: Vec<_> = next.contenders.iter().map(|c| c.place.clone()).collect();
    assert!(!places.contains(&held_by.place), "{next:?}");
    if let Some(holder) = next.holder() {
        assert!(
            holder.place == first_waiter || holder.place == waiters[1],
            "{next:?}"
        );
    }
    for task in waiting {
        task.await.unwrap();
    }
    assert!(lock.queue().await.unwrap().contenders.is_empty());
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
async fn the_provider_is_the_session() {
    let server = MemoryServer::new();
    let provider = server.provider();
    let lock = provider.lock("owned").unwrap();
    let guard = lock.try_acquire().await.unwrap().unwrap();
    let clone = provider.clone();
    drop(provider);
    assert!(
        !guard.is_lost(),
        "a clone of the provider keeps the session"
    );
    drop(clone);
    assert_eq!(
        guard.lost().reason(),
        Some(LossReason::SessionExpired),
        "the last handle closed the session"
    );
    assert!(
        is_free(&server, "owned").await,
        "the lock was freed with the session"
    );
    let err = lock.try_acquire().await.unwrap_err();
    assert!(
        matches!(err, LockError::SessionExpired { .. }),
        "a lock handle of a closed provider fails loudly: {err}"
    );
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

mod read_write {
    use super::*;
    use crate::DistributedRwLock;

    fn rw(provider: &MemoryLockProvider, name: &str) -> Arc<dyn DistributedRwLock> {
        provider.rw_lock(name).unwrap()
    }

    #[tokio::test]
    async fn readers_share_and_a_writer_excludes() {
        let server = MemoryServer::new();
        let (a, b, c) = (server.provider(), server.provider(), server.provider());
        let mut r1 = rw(&a, "rw").try_read().await.unwrap().unwrap();
        let mut r2 = rw(&b, "rw")
            .try_read()
            .await
            .unwrap()
            .expect("readers share");
        assert!(
            rw(&c, "rw").try_write().await.unwrap().is_none(),
            "a writer waits for readers"
        );
        r1.release().await.unwrap();
        r2.release().await.unwrap();
        let mut w = rw(&c, "rw")
            .try_write()
            .await
            .unwrap()
            .expect("free for a writer");
        assert!(
            rw(&a, "rw").try_read().await.unwrap().is_none(),
            "a writer excludes readers"
        );
        assert!(
            rw(&b, "rw").try_write().await.unwrap().is_none(),
            "a writer excludes writers"
        );
        assert!(w.fencing_token() > r2.fencing_token());
        w.release().await.unwrap();
        assert_eq!(server.active_locks(), 0);
    }

    #[tokio::test]
    async fn a_waiting_writer_blocks_later_readers_and_readers_behind_it_enter_together() {
        let server = MemoryServer::new();
        let (a, b) = (server.provider(), server.provider());
        let mut first_reader = rw(&a, "fair").try_read().await.unwrap().unwrap();
        let writer_lock = rw(&b, "fair");
        let writer = tokio::spawn(async move { writer_lock.write(None).await });
        until_entries(&a, "fair", (1, 1)).await;
        // A reader arriving after the waiting writer queues behind it.
        let late: Vec<_> = (0..3).map(|_| server.provider()).collect();
        let mut readers = Vec::new();
        for provider in &late {
            let lock = rw(provider, "fair");
            readers.push(tokio::spawn(async move { lock.read(None).await }));
        }
        until_entries(&a, "fair", (1, 4)).await;
        assert!(
            rw(&a, "fair").try_read().await.unwrap().is_none(),
            "no reader jumps a waiting writer"
        );
        first_reader.release().await.unwrap();
        let mut w = tokio::time::timeout(Duration::from_secs(5), writer)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        until_entries(&a, "fair", (1, 3)).await;
        w.release().await.unwrap();
        // All three readers enter together.
        until_entries(&a, "fair", (3, 0)).await;
        for reader in readers {
            let mut guard = reader.await.unwrap().unwrap();
            guard.release().await.unwrap();
        }
        assert_eq!(server.active_locks(), 0);
    }

    #[tokio::test]
    async fn a_writer_that_gives_up_lets_the_readers_behind_it_in() {
        let server = MemoryServer::new();
        let (a, b, c) = (server.provider(), server.provider(), server.provider());
        let mut reader = rw(&a, "giveup").try_read().await.unwrap().unwrap();
        let writer_lock = rw(&b, "giveup");
        let writer =
            tokio::spawn(async move { writer_lock.write(Some(Duration::from_millis(100))).await });
        until_entries(&a, "giveup", (1, 1)).await;
        let late_lock = rw(&c, "giveup");
        let late = tokio::spawn(async move { late_lock.read(None).await });
        until_entries(&a, "giveup", (1, 2)).await;
        assert!(matches!(
            writer.await.unwrap(),
            Err(LockError::Timeout { .. })
        ));
        let mut late = tokio::time::timeout(Duration::from_secs(5), late)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        until_entries(&a, "giveup", (2, 0)).await;
        late.release().await.unwrap();
        reader.release().await.unwrap();
        assert_eq!(server.active_locks(), 0);
    }

    #[tokio::test]
    async fn the_write_side_is_a_lock_and_families_are_apart() {
        let server = MemoryServer::new();
        let (a, b) = (server.provider(), server.provider());
        let write_lock = rw(&a, "side").write_lock();
        let mut w = write_lock.try_acquire().await.unwrap().unwrap();
        assert!(rw(&b, "side").try_read().await.unwrap().is_none());
        let mut mutex = b
            .lock("side")
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .expect("the mutex of the same name is another lock");
        w.release().await.unwrap();
        mutex.release().await.unwrap();
    }

    async fn until_entries(provider: &MemoryLockProvider, name: &str, expected: (usize, usize)) {
        let start = Instant::now();
        while provider.entries(name).unwrap() != expected {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "never saw {expected:?} for {name}; last {:?}",
                provider.entries(name).unwrap()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

mod semaphore {
    use super::*;

    #[tokio::test]
    async fn n_permits_then_busy_then_the_next_in() {
        let server = MemoryServer::new();
        let clients: Vec<_> = (0..4).map(|_| server.provider()).collect();
        let mut permits = Vec::new();
        for client in &clients[..3] {
            permits.push(
                client
                    .semaphore("pool", 3)
                    .unwrap()
                    .try_acquire()
                    .await
                    .unwrap()
                    .expect("a permit is free"),
            );
        }
        let fourth = clients[3].semaphore("pool", 3).unwrap();
        assert!(
            fourth.try_acquire().await.unwrap().is_none(),
            "no fourth permit"
        );
        let waiting = tokio::spawn(async move { fourth.acquire(None).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        let mut first = permits.remove(0);
        first.release().await.unwrap();
        let mut next = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(next.fencing_token() > first.fencing_token());
        next.release().await.unwrap();
        for mut permit in permits {
            permit.release().await.unwrap();
        }
        assert_eq!(server.active_locks(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrency_never_exceeds_n_and_reaches_n() {
        const N: u32 = 3;
        let server = MemoryServer::new();
        let providers: Vec<_> = (0..8).map(|_| server.provider()).collect();
        let current = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for provider in &providers {
            let semaphore = provider.semaphore("stress", N).unwrap();
            let (current, peak) = (current.clone(), peak.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..20 {
                    let mut permit = semaphore.acquire(None).await.unwrap();
                    let now = current.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    current.fetch_sub(1, Ordering::SeqCst);
                    permit.release().await.unwrap();
                }
            }));
        }
        for task in tasks {
            tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .unwrap()
                .unwrap();
        }
        assert_eq!(
            peak.load(Ordering::SeqCst),
            N as usize,
            "never above N, and N reached"
        );
    }

    #[tokio::test]
    async fn bad_permit_counts_are_invalid_arguments() {
        let server = MemoryServer::new();
        let (a, b) = (server.provider(), server.provider());
        assert!(matches!(
            a.semaphore("s", 0),
            Err(LockError::InvalidArgument { .. })
        ));
        let mut held = a
            .semaphore("s", 2)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .unwrap();
        let mismatch = b
            .semaphore("s", 5)
            .unwrap()
            .try_acquire()
            .await
            .unwrap_err();
        assert!(mismatch.to_string().contains("2 permits"), "{mismatch}");
        assert!(
            b.semaphore("s", 2).unwrap().as_lock().is_err(),
            "a two-permit semaphore is not a lock"
        );
        held.release().await.unwrap();
        // Once idle, a semaphore of that name can start over with another count.
        let one = b.semaphore("s", 1).unwrap().as_lock().unwrap();
        let mut guard = one.try_acquire().await.unwrap().unwrap();
        assert!(
            a.semaphore("s", 1)
                .unwrap()
                .try_acquire()
                .await
                .unwrap()
                .is_none()
        );
        guard.release().await.unwrap();
    }

    #[tokio::test]
    async fn permits_are_lost_with_their_session() {
        let server = MemoryServer::new();
        let (a, b) = (server.provider(), server.provider());
        let permit = a
            .semaphore("sess", 1)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .unwrap();
        a.expire_session();
        assert_eq!(permit.lost().reason(), Some(LossReason::SessionExpired));
        let mut next = b
            .semaphore("sess", 1)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .expect("freed with the session");
        next.release().await.unwrap();
    }
}

/// A lock of the kit, observed at its attempt, records what the same lock observed through
/// `dyn DistributedLock` records: the same series, with the same counts, for a grant, a
/// busy try, a timeout, a cancelled wait and a dropped guard.
#[test]
fn a_kit_lock_is_observed_as_any_lock_is() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    // Both recorders live to the end: a thread knows a recorder by its address (see
    // `lock_core::observe`), and a second one made where the first was dropped would be
    // taken for it.
    let recorders = [DebuggingRecorder::new(), DebuggingRecorder::new()];
    let recorded = |through_dyn: bool| {
        let recorder = &recorders[usize::from(through_dyn)];
        let snapshotter = recorder.snapshotter();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        metrics::with_local_recorder(recorder, || {
            runtime.block_on(async {
                let provider = MemoryServer::new().provider();
                let handle = provider
                    .shared
                    .handle(Family::Mutex, "observed", 1)
                    .unwrap();
                let lock = Arc::new(MemoryLock(handle));
                let lock = match through_dyn {
                    true => crate::observe::observe_lock(
                        lock as Arc<dyn DistributedLock>,
                        "memory",
                        "fifo",
                    ),
                    false => crate::observe::observe_lock(lock, "memory", "fifo"),
                };
                let guard = lock.acquire(None).await.unwrap();
                assert!(lock.try_acquire().await.unwrap().is_none());
                let waited = lock.acquire(Some(Duration::from_millis(5))).await;
                assert!(
                    matches!(waited, Err(LockError::Timeout { .. })),
                    "{waited:?}"
                );
                let wait = tokio::time::timeout(Duration::from_millis(5), lock.acquire(None));
                assert!(wait.await.is_err(), "the wait was cut short");
                drop(guard);
            });
        });
        let mut series: Vec<String> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| match value {
                // The times differ from run to run; their number does not.
                DebugValue::Histogram(values) => format!("{key:?} {} values", values.len()),
                value => format!("{key:?} {value:?}"),
            })
            .collect();
        series.sort();
        series
    };
    let through_dyn = recorded(true);
    for outcome in ["granted", "busy", "timeout", "cancelled"] {
        let label = format!("{outcome:?}");
        assert!(
            through_dyn
                .iter()
                .any(|s| s.contains(&label) && s.contains("Counter(1)")),
            "{outcome} missing: {through_dyn:#?}"
        );
    }
    assert_eq!(recorded(false), through_dyn);
}
